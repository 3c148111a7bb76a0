"""Notebook 04a's two-node command: torchrun's parser reads it, each mistake is one line, and the right one runs.

That it runs (two torchrun agents here, one group of 2, each rank's line, the ✓) is 04a's cell nb04a-nodes-check:
check.two_node_command on the notebook's command, this module's GOOD; nbval compares its lines with the stored ones.
The script's own flags after it (GOOD + " --epochs 10") are parsed here; the run here uses the flags alone
(nodes.run_here), so a run of that spelling repeated 04a's.
"""

from __future__ import annotations

import pytest

from workshop_lib.checks import nodes
from workshop_lib.engine.common import CheckFailed

SCRIPT = "solutions/step4_snapshots.py"
GOOD = f"torchrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=node0:29500 --rdzv_id=job42 {SCRIPT}"


def verdict(command: str) -> str | None:
    return nodes.mistake(nodes.parse(command), SCRIPT)


@pytest.mark.parametrize("command", [
    GOOD,
    GOOD + " --epochs 10",  # the script's own flags follow it
    GOOD.replace("--rdzv_endpoint=node0:29500", "--rdzv-endpoint node0:29500").replace("nproc_per_node", "nproc-per-node"),
    GOOD.replace("--nnodes=2", "--nnodes=2:2").replace("torchrun", "python -m torch.distributed.run"),
    GOOD.replace(" --nproc_per_node=1", ""),  # 1 is the default
])
def test_the_right_command_in_any_spelling_passes(command):
    assert verdict(command) is None


@pytest.mark.parametrize(("command", "named"), [
    (f"python {SCRIPT}", "the command starts with 'python': start it with torchrun"),
    (GOOD.replace("--nnodes=2", "--nnodes=2 --bogus"), "torchrun would refuse it: unrecognized arguments: --bogus"),
])
def test_what_torchrun_would_refuse_is_named(command, named):
    with pytest.raises(CheckFailed) as err:
        nodes.parse(command)
    assert str(err.value) == named


@pytest.mark.parametrize(("change", "named"), [
    (("--nnodes=2", "--nnodes=2 --standalone"), "--standalone starts a rendezvous of its own on this node"),
    (("--nnodes=2", "--nnodes=1"), "--nnodes=1: the job has 2 nodes"),
    (("--nnodes=2", "--nnodes=1:2"), "--nnodes=1:2: the job has 2 nodes"),
    (("--rdzv_backend=c10d ", ""), "the rendezvous is static (torchrun's default), where each node needs its own"),
    (("--nnodes=2", "--nnodes=2 --node_rank=1"), "--node_rank is for the static rendezvous"),
    (("--rdzv_endpoint=node0:29500 ", ""), "no --rdzv_endpoint: the host:port where the agents meet"),
    (("node0:29500", "localhost:29500"), "--rdzv_endpoint=localhost:29500: on node 1, localhost is node 1 itself"),
    (("node0:29500", "node0"), "--rdzv_endpoint=node0 has no port"),
    (("--rdzv_id=job42 ", ""), "no --rdzv_id: an id for the job"),
    (("--nproc_per_node=1", "--nproc_per_node=4"), "--nproc_per_node=4: the nodes of this exercise have one CPU"),
    ((SCRIPT, "solutions/step3_ddp.py"), "the script is solutions/step3_ddp.py; the job trains " + SCRIPT),
])
def test_each_mistake_is_one_line(change, named):
    message = verdict(GOOD.replace(*change))
    assert message is not None and message.startswith(named), message
    assert "\n" not in message


def test_only_the_endpoint_changes_when_it_runs_here():
    flags = nodes.parse(GOOD.replace("--rdzv_endpoint=node0:29500", "--rdzv-endpoint node0:29500")).flags
    assert nodes._flags_here(flags, "127.0.0.1:1234") == [
        "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", "--rdzv-endpoint=127.0.0.1:1234", "--rdzv_id=job42"]


def test_every_one_process_node_started_on_one_machine_in_the_docs_sets_one_thread():
    """torchrun sets OMP_NUM_THREADS=1 only for more than one process a node: two one-process "nodes" on one machine
    would each run a thread per core (docs/reference/machines.md measures it)."""
    from tests.conftest import REPO

    found = [line for page in (REPO / "docs").rglob("*.md") for line in page.read_text().splitlines()
             if "--nnodes=2" in line and "--nproc_per_node=1" in line and "127.0.0.1" in line]
    assert found and all(line.startswith("OMP_NUM_THREADS=1 torchrun ") for line in found), found
