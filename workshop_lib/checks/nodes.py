"""Notebook 04a's two-node torchrun command: read with torchrun's own parser (:func:`mistake`), then run twice here
as two nodes meeting at the rendezvous (on 127.0.0.1, a free port), this module in place of the training script."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

from workshop_lib.engine.common import CheckFailed, verdict
from workshop_lib.launching.launch import free_port, start_job
from workshop_lib.launching.processes import kill_tree

TORCHRUN = ("torchrun", "python -m torch.distributed.run", "python3 -m torch.distributed.run")


def parse(command: str):
    """torchrun's view of ``command`` (an argparse Namespace), or CheckFailed saying why torchrun would refuse it."""
    from torch.distributed.run import get_args_parser

    words = shlex.split(command.replace("\\\n", " "))
    start = next((len(t.split()) for t in TORCHRUN if words[:len(t.split())] == t.split()), None)
    if start is None:
        raise CheckFailed(f"the command starts with {' '.join(words[:1]) or 'nothing'!r}: start it with torchrun")
    parser = get_args_parser()

    def refuse(message: str):
        raise CheckFailed(f"torchrun would refuse it: {message}")

    parser.error = refuse
    args = parser.parse_args(words[start:])
    args.flags = words[start:words.index(args.training_script, start)]  # torchrun's own, as written
    return args


def mistake(args, script: str) -> str | None:
    """What keeps this command from making one group of two nodes (or from running ``script``); None if nothing."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    if args.standalone:
        return ("--standalone starts a rendezvous of its own on this node, which the other node cannot find; leave "
                "it out and name a shared one with --rdzv_backend=c10d and --rdzv_endpoint")
    if args.nnodes not in ("2", "2:2"):
        return (f"--nnodes={args.nnodes}: the job has 2 nodes, and each agent starts its workers once --nnodes "
                "agents have joined the rendezvous")
    if args.rdzv_backend != "c10d":
        return (f"the rendezvous is {args.rdzv_backend} (torchrun's default), where each node needs its own "
                "--node_rank: for one command that every node runs, use --rdzv_backend=c10d")
    if args.node_rank != 0 or any(f.startswith(("--node_rank", "--node-rank")) for f in args.flags):
        return "--node_rank is for the static rendezvous; c10d numbers the nodes as they join: leave it out"
    if not args.rdzv_endpoint:
        return "no --rdzv_endpoint: the host:port where the agents meet, node0:29500 here (node 0 hosts it)"
    host, port = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=-1)
    if host in ("localhost", "127.0.0.1", "::1"):
        return (f"--rdzv_endpoint={args.rdzv_endpoint}: on node 1, {host} is node 1 itself; give the address every "
                "node can reach, node0")
    if port <= 0:
        return f"--rdzv_endpoint={args.rdzv_endpoint} has no port: add one, node0:29500"
    if args.rdzv_id == "none":
        return "no --rdzv_id: an id for the job, the same on every node, so that two jobs at one endpoint stay apart"
    if args.nproc_per_node != "1":
        return f"--nproc_per_node={args.nproc_per_node}: the nodes of this exercise have one CPU each: 1 process per node"
    if Path(args.training_script).as_posix() != script:
        return f"the script is {args.training_script}; the job trains {script}"
    return None


def _flags_here(flags: list[str], endpoint: str) -> list[str]:
    """The learner's torchrun flags, with the rendezvous endpoint replaced by ``endpoint``."""
    out = []
    for i, flag in enumerate(flags):
        name = flag.split("=", 1)[0]
        if name in ("--rdzv_endpoint", "--rdzv-endpoint"):
            out.append(f"--rdzv-endpoint={endpoint}")
        elif not (i and flags[i - 1] in ("--rdzv_endpoint", "--rdzv-endpoint")):  # not the value of one given apart
            out.append(flag)
    return out


def run_here(args, timeout: float = 60) -> list[str]:
    """Start the command twice on this machine, as two nodes; every rank's line, sorted. CheckFailed if it fails."""
    endpoint = f"127.0.0.1:{free_port()}"  # both agents think they host it: the first binds, the other connects
    # the learner's flags as written, the endpoint on this machine; a node of this exercise has one CPU: one thread
    agents = [start_job("workshop_lib.checks.nodes", (), None, _flags_here(args.flags, endpoint), standalone=False,
                        module=True, env={"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}) for _ in range(2)]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for agent in agents:
            try:
                outputs.append(agent.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise CheckFailed(f"the two agents had not finished after {timeout:g}s: they never formed one group "
                                  "(do both use the same --rdzv_id and --rdzv_endpoint?)") from None
    finally:
        for agent in agents:
            kill_tree(agent, grace=0)
    for node, (agent, (output, _)) in enumerate(zip(agents, outputs, strict=True)):
        if agent.returncode != 0:
            last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
            raise CheckFailed(f"node {node}'s torchrun failed with exit code {agent.returncode}: {last[0][:200]}")
    return sorted(line for stdout, _ in outputs for line in stdout.splitlines() if line.startswith("node "))


def two_node_command(command: str, script: str = "solutions/step4_snapshots.py", timeout: float = 60) -> None:
    """Check the learner's two-node command; then run it as two nodes here and print what each rank said."""
    args = parse(command)
    wrong = mistake(args, script)
    if wrong is not None:
        raise CheckFailed(wrong)
    print(f"the same command twice on this machine, as two nodes (the endpoint on 127.0.0.1, and in place of "
          f"{script} a script where each rank all-reduces a 1):")
    lines = run_here(args, timeout)
    for line in lines:
        print("  " + line)
    verdict(None if len(lines) == 2 and all(line.endswith("= 2") for line in lines) else
            f"expected 2 ranks, each with all_reduce = 2; the ranks said: {lines}",
            "two agents met at one c10d rendezvous and formed one group of 2 ranks: every node runs this command")


def _whoami() -> None:
    """What each rank runs in the check: join the group, all-reduce a one, say who it is."""
    import torch
    import torch.distributed as dist

    from workshop_lib.launching import joining

    env = joining.join("gloo", timeout=30)
    try:
        total = torch.ones(1)
        dist.all_reduce(total)  # a 1 from every rank, on both nodes
        line = (f"node {os.environ['GROUP_RANK']}, local rank {env.local_rank} -> global rank {env.rank} of "
                f"{env.world_size}; all_reduce(1) = {total.item():.0f}\n")
        os.write(1, line.encode())  # one write: the ranks of a node share this stdout
    finally:
        joining.leave()


if __name__ == "__main__":
    _whoami()
