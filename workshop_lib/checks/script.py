"""Check a learner's step script: run it on 2 ranks, watch what each did, name the first mistake in one line.

    python -m workshop_lib.check runs/mine/step2_sampler.py    # a file (its step from its name, or --step N)
    python -m workshop_lib.check --step 3                      # runs/mine/step3_*.py, else exercises/step3_*.py
    python -m workshop_lib.check --all                         # a table: every step, done / wrong / not started

The two ranks are two single-process "nodes" on 127.0.0.1, started without
torchrun's agent but with the rank variables ``torchrun --nnodes=2
--nproc_per_node=1`` would set: RANK 0 and 1, LOCAL_RANK 0 on both, so a local
rank used where the global rank belongs shows. Each rank runs the script's
``main`` inside :func:`workshop_lib.checks.rank.run_rank` (Gloo on CPU even where GPUs
exist, 200 molecules, 2 epochs). A run is stopped after 60 s, after 25 s
without progress, as soon as the ranks have joined wrongly, or once the
script's hang watch has named a rank that never arrived. Step 4 must also
leave a snapshot of the last epoch in its ``--out``. The line starts with a
tick when every lesson of the step holds; exit code 0, else 1.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from workshop_lib.checks import rules
from workshop_lib.checks.events import _of
from workshop_lib.debug import hangreport
from workshop_lib.errors import WorkshopError
from workshop_lib.lab.build import EXERCISES, MINE
from workshop_lib.lab.launch import free_port
from workshop_lib.lab.processes import kill_tree
from workshop_lib.paths import REPO_ROOT

STEPS = {1: "step1_process_group", 2: "step2_sampler", 3: "step3_ddp", 4: "step4_snapshots"}
TODO_LINE = 'raise NotImplementedError("fill in the TODO above")'
TICK, CROSS = "\N{CHECK MARK}", "\N{BALLOT X}"
WORLD, EPOCHS = 2, 2
ARGS = ["--limit", "200", "--epochs", str(EPOCHS), "--no-progress", "--no-tensorboard", "--timeout", "15"]
PASSED = {1: "both ranks joined the group, all-reduced, trained and left the group",
          2: "each rank read its own shard, reshuffled every epoch, and left the group",
          3: "DDP kept the replicas equal; rank 0 alone evaluated and saved the plain model; the logged loss is "
             "the mean over the ranks",
          4: "step 3's lessons hold, and rank 0 left a snapshot of the last epoch in --out"}


def step_of(path: Path, step: int | None = None) -> int:
    if step is not None:
        if step not in STEPS:
            raise WorkshopError(f"--step {step} has no script check; use one of {sorted(STEPS)}")
        return step
    m = re.search(r"step(\d)", Path(path).name)
    if not m or int(m.group(1)) not in STEPS:
        raise WorkshopError(f"cannot tell the step of {path} from its name; pass --step N (one of {sorted(STEPS)})")
    return int(m.group(1))


def default_script(step: int) -> Path:
    """The learner's version if write_script made one, else the exercise file."""
    mine = MINE / f"{STEPS[step]}.py"
    return mine if mine.is_file() else EXERCISES / f"{STEPS[step]}.py"


def not_started(path: Path, step: int) -> bool:
    """Every TODO of the exercise still raises NotImplementedError."""
    exercise = EXERCISES / f"{STEPS[step]}.py"
    todos = exercise.read_text().count(TODO_LINE) if exercise.is_file() else 0
    return todos > 0 and path.read_text().count(TODO_LINE) >= todos


def destroy_outside_finally(source: str) -> int | None:
    """The line of a dist.destroy_process_group() call that is not inside a ``finally:``, if any."""
    tree = ast.parse(source)
    protected = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for stmt in node.finalbody:
                protected |= {id(n) for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                "destroy_process_group" and id(node) not in protected:
            return node.lineno
    return None


def _read(events: Path) -> list[dict]:
    if not events.is_file():
        return []
    return [json.loads(line) for line in events.read_text().splitlines() if line.strip().endswith("}")]


def run_as_two_nodes(scripts: Sequence[Path], workdir: Path, limit_s: float = 60, stall_s: float = 25) -> list[dict]:
    """Run each script in turn on two single-process nodes (one pair of processes for all of them).

    Returns, per script, {"ranks": events by rank, "stopped": bool, "output": the ranks' lines}. A run that
    joins wrongly, whose hang watch names a rank that never arrived, that makes no progress for ``stall_s``
    or outlives ``limit_s`` (per script) is stopped.
    """
    items = [{"name": f"learner_script_{i}", "script": str(Path(s).resolve()), "events": str(workdir / f"item{i}"),
              "argv": [*ARGS, "--out", str(workdir / f"out{i}")]} for i, s in enumerate(scripts)]
    items[0]["control_port"] = free_port()
    manifest = workdir / "manifest.json"
    manifest.write_text(json.dumps(items))
    procs, logs = [], []
    for rank in range(WORLD):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
        env.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE="1",
                   GROUP_RANK=str(rank), MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
                   CUDA_VISIBLE_DEVICES="")  # Gloo on CPU, GPUs or not: the rules expect CPU ranks
        log = open(workdir / f"rank{rank}.log", "w")  # noqa: SIM115 (closed below)
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "workshop_lib.checks.rank", str(manifest)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True))

    def events(i: int) -> dict[int, list[dict]]:
        return {r: _read(Path(f"{items[i]['events']}.rank{r}.jsonl")) for r in range(WORLD)}

    start = last_change = time.monotonic()
    sizes: list[int] = []
    stopped_at = None
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
            current = max((i for i in range(len(items)) if any(events(i).values())), default=0)
            # The last script's hang watch has named a rank that never arrived: its ranks will only wait for their
            # timeout now. (An earlier script's hang must run its course instead, since the same pair of processes
            # runs the scripts after it.)
            if current == len(items) - 1 and hangreport.missing_rank(f"{items[current]['events']}.hang.json"):
                stopped_at = current
                break
            ranks = events(current)
            now = [current, *(len(ev) for ev in ranks.values())]
            if now != sizes:
                sizes, last_change = now, time.monotonic()
            wrong_join = all(_of(ev, "init", phase="enter") for ev in ranks.values()) and \
                rules.joining(ranks, world_size=WORLD)
            if wrong_join or time.monotonic() - start > limit_s * len(items) or \
                    time.monotonic() - last_change > stall_s:
                stopped_at = current
                break
    finally:
        for p in procs:
            kill_tree(p, grace=0, first=signal.SIGKILL)
        for log in logs:
            log.close()
    output = "".join((workdir / f"rank{r}.log").read_text() for r in range(WORLD))
    return [{"ranks": events(i), "stopped": stopped_at == i, "output": output, "out": workdir / f"out{i}"}
            for i in range(len(items))]


def check_scripts(paths: Sequence[Path], steps: Sequence[int | None] | None = None) -> list[tuple[str, str]]:
    """('done' | 'wrong' | 'not started', one line) for each script; the ones to run share one pair of ranks."""
    paths = [Path(p) for p in paths]
    steps = list(steps or [None] * len(paths))
    results: list[tuple[str, str] | None] = [None] * len(paths)
    for i, path in enumerate(paths):
        if not path.is_file():
            raise WorkshopError(f"script {path} not found; pass the path of your step script (runs/mine/stepN_*.py)")
        steps[i] = step_of(path, steps[i])
        if not_started(path, steps[i]):
            results[i] = ("not started", f"{path.name}: not started (its TODOs still raise NotImplementedError)")
            continue
        try:
            ast.parse(path.read_text())
        except SyntaxError as err:
            results[i] = ("wrong", f"{path.name} line {err.lineno}: {err.msg}; fix the syntax")
    todo = [i for i, r in enumerate(results) if r is None]
    if todo:
        with tempfile.TemporaryDirectory(prefix="ddp-check-") as tmp:
            runs = run_as_two_nodes([paths[i] for i in todo], Path(tmp))
            for i, run in zip(todo, runs, strict=True):  # while the runs' --out folders are still there
                results[i] = _judge(paths[i], steps[i], run)
    return results


def check_script(path: Path, step: int | None = None) -> tuple[str, str]:
    return check_scripts([path], [step])[0]


def on_a_gpu_node(path: Path, step: int) -> str | None:
    """What the CPU run cannot show: the script's GPU choices, as a made-up rank 3 of 4 with local rank 1.

    The notebook checks for the same lines run on the script's own functions: step 1's ``main`` (backend,
    device, set_device, init arguments) and step 3's ``wrap`` (device_ids). Nothing is started.
    """
    import contextlib
    import io

    from workshop_lib.checks import common, ddp, group, rank

    module = rank._load(path.resolve(), f"learner_gpu_{step}")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if step == 1:
                group.process_group(module.main)
            if step in (3, 4):
                ddp.ddp_ids(module.wrap)
    except common.CheckFailed as err:
        return str(err)
    return None


def snapshot_mistake(out: Path) -> str | None:
    """Step 4: after a run of EPOCHS epochs, OUT/snapshot.pt must hold the last one (resuming is 04a's check)."""
    from workshop_lib import checkpoint

    path = Path(out) / checkpoint.SNAPSHOT
    if not path.is_file():
        return (f"no {checkpoint.SNAPSHOT} in --out after the run: call checkpoint.save(...) at the end of every "
                f"epoch, on every rank (global rank 0 writes the file)")
    try:
        epoch = checkpoint.read(path)["epoch"]
    except WorkshopError as err:
        return str(err)
    if epoch != EPOCHS - 1:
        return (f"the snapshot holds epoch {epoch + 1} of {EPOCHS}: save at the end of every epoch, inside the "
                f"epoch loop")
    return None


def _judge(path: Path, step: int, run: dict) -> tuple[str, str]:
    ranks = run["ranks"]
    if not any(ranks.values()):
        tail = [line for line in run["output"].splitlines() if line.strip()][-1:] or ["no output"]
        return "wrong", f"{path.name}: the ranks did not start ({tail[0][:200]})"
    message = rules.first_mistake(step, ranks, world_size=WORLD, epochs=EPOCHS, timed_out=run["stopped"])
    if message is None:
        line = destroy_outside_finally(path.read_text())
        if line is not None:
            message = (f"dist.destroy_process_group() at line {line} is not in a finally: an error before it would "
                       f"leave the group behind; put it in the finally of a try around the work")
    if message is None and step == 4:
        message = snapshot_mistake(run["out"])
    if message is None:
        message = on_a_gpu_node(path, step)
    if message is not None:
        return "wrong", f"{path.name}: {message}"
    return "done", f"{path.name}: {PASSED[step]}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workshop_lib.check", description=__doc__.splitlines()[0])
    p.add_argument("script", nargs="?", type=Path, help="your step script (default: runs/mine/stepN_*.py)")
    p.add_argument("--step", type=int, help="the step the script is (default: from its name)")
    p.add_argument("--all", action="store_true", help="check every step's script; print a table")
    args = p.parse_args(argv)
    if args.all:
        paths = [default_script(step) for step in STEPS]
        rows = []
        for step, path, (status, line) in zip(STEPS, paths, check_scripts(paths, list(STEPS)), strict=True):
            shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
            rows.append((f"step {step}", str(shown), status, "" if status != "wrong" else line.split(": ", 1)[1]))
        width = max(len(r[1]) for r in rows)
        print(f"{'step':<7} {'script':<{width}}  {'status':<11} mistake")
        for step, shown, status, why in rows:
            print(f"{step:<7} {shown:<{width}}  {status:<11} {why}".rstrip())
        return 0 if all(r[2] == "done" for r in rows) else 1
    if args.script is None and args.step is None:
        raise WorkshopError("nothing to check; pass your script's path, --step N, or --all")
    path = args.script or default_script(step_of(Path("."), args.step))
    status, line = check_script(path, args.step)
    print(f"{TICK if status == 'done' else CROSS} {line}", flush=True)
    return 0 if status == "done" else 1


def _exit_with_verdict(argv: Sequence[str] | None = None) -> None:
    raise SystemExit(main(argv))  # 0 done, 1 a mistake; run_cli makes a usage error exit code 2
