"""The hang lab of notebooks/05_when_it_hangs.ipynb: broken runs, and the checks of the learner's fixes.

Each lab script (cells tagged ``script:hangN_...`` in notebook 05) is a small
step 3 whose ``train()`` holds one classic bug. Its solution (solutions/) is the
fixed version; :func:`write_broken` puts the bug back, from :data:`LABS`, into
runs/hangs/. :func:`run_broken` launches that under torchrun with a short
timeout and prints what a learner reads: the watch's diagnosis and each rank's
error. :func:`check_fix` launches the learner's own version and says whether
the fix holds.
"""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.debug import hangreport
from workshop_lib.errors import WorkshopError, first_sentence
from workshop_lib.lab.build import MINE, SOLUTIONS, write_script
from workshop_lib.lab.launch import LaunchError, start_job, torchrun
from workshop_lib.lab.processes import kill_tree
from workshop_lib.paths import REPO_ROOT, write_atomic

NOTEBOOK = "05_when_it_hangs.ipynb"
BROKEN = REPO_ROOT / "runs" / "hangs"
ARGS = ("--limit", "447", "--epochs", "1", "--timeout", "8", "--no-tensorboard")  # 321 molecules to train on
JOB_TIMEOUT = 120.0  # seconds before launch.torchrun stops a lab job (start-up on a busy laptop included)


@dataclass(frozen=True)
class Lab:
    name: str  # the script: solutions/NAME.py, exercises/NAME.py
    fixed: str  # the line of the solution that the bug replaces (stripped)
    broken: str  # the line that replaces it in the broken version
    batch_size: int  # 32: 161 and 160 molecules make 6 and 5 batches when the shards are uneven


LABS = {lab.name: lab for lab in (
    Lab("hang1_rank0_only", "spread = replica_spread(model, world_size)  # an all_gather: every rank takes part",
        "spread = replica_spread(model, world_size) if rank == 0 else None  # only rank 0 prints it", 32),
    Lab("hang2_uneven", "sampler = DistributedSampler(splits.train, num_replicas=world_size, rank=rank, seed=cfg.seed)",
        "sampler = range(rank, len(splits.train), world_size)  # every world_size-th molecule", 32),
    Lab("hang3_shapes", "loss = torch.tensor([stats.loss], device=device)  # (1,) this rank's mean training loss",
        "loss = torch.tensor([stats.loss, stats.samples] if rank == 0 else [stats.loss], device=device)", 32),
    Lab("hang4_batchnorm_eval", "dev_auc = evaluate(model.module, make_eval_loader(splits.dev), device)",
        "dev_auc = evaluate(model, make_eval_loader(splits.dev), device)", 48),
    Lab("hang5_unused", "model = DDP(model, device_ids=device_ids, find_unused_parameters=True)",
        "model = DDP(model, device_ids=device_ids)", 32),
)}


def _lab(name: str) -> Lab:
    if name not in LABS:
        raise WorkshopError(f"no hang lab named {name!r}; pick one of {', '.join(LABS)}")
    return LABS[name]


def write_broken(name: str, source: Path | None = None) -> Path:
    """The lab's solution with its bug put back, as runs/hangs/NAME.py (``source``: another fixed version)."""
    lab = _lab(name)
    text = Path(source or SOLUTIONS / f"{name}.py").read_text()
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == lab.fixed]
    assert len(hits) == 1, f"{name}: expected the line {lab.fixed!r} once in the solution, found it {len(hits)} times"
    indent = lines[hits[0]][: len(lines[hits[0]]) - len(lines[hits[0]].lstrip())]
    lines[hits[0]] = f"{indent}{lab.broken}\n"
    BROKEN.mkdir(parents=True, exist_ok=True)
    out = BROKEN / f"{name}.py"
    text = "".join(lines).replace("# Generated from", "# The broken version of the lab, generated from", 1)
    write_atomic(out, text.encode())  # a job of the same lab may be starting from it: never half written
    return out


def _launch(script: Path, lab: Lab, timeout: float) -> tuple[bool, list[str]]:
    """(finished, every rank's lines) of one lab job; the command is printed, nothing else."""
    try:
        result = torchrun(script, nproc=2, args=[*ARGS, "--batch-size", lab.batch_size], out=False,
                          timeout=timeout, progress=False, show=None)
        return True, result.output
    except LaunchError as err:
        return False, err.output


_ERROR = re.compile(r"^\[rank (\d)\] \[rank\d\]: (\w+(?:Error|Exception)): (.*)$")


def errors(output: Sequence[str]) -> dict[int, str]:
    """{rank: the first line of the exception that ended it} (C++ source locations cut)."""
    found: dict[int, str] = {}
    for line in output:
        m = _ERROR.match(line)
        if m and int(m.group(1)) not in found:
            found[int(m.group(1))] = f"{m.group(2)}: {first_sentence(m.group(3), 150)}"
    return found


def diagnosis(output: Sequence[str]) -> list[str]:
    """The watch's block, without the rank labels."""
    return hangreport.block(output)


def run_broken(name: str, timeout: float = JOB_TIMEOUT) -> list[str]:
    """Launch the broken version of lab ``name`` on 2 ranks; print the diagnosis and how each rank ended.

    Returns every line the ranks printed.
    """
    lab = _lab(name)
    finished, output = _launch(write_broken(name), lab, timeout)
    print("the job finished (was the bug fixed in the solution too?)" if finished else "the job failed.")
    block = diagnosis(output)
    if block:
        print("\n".join(["hangwatch says:", *(f"  {line}" for line in block)]))
    for rank, error in sorted(errors(output).items()):
        print(f"rank {rank} ended with {error}")
    return output


def check_fix(name: str, script: Path | None = None, timeout: float = JOB_TIMEOUT) -> bool:
    """Run your version of lab ``name`` (written from this notebook's cells as you ran them); ✓ if it finishes."""
    lab = _lab(name)
    if script is None:
        script = write_script(NOTEBOOK, name) if Path(NOTEBOOK).is_file() else MINE / f"{name}.py"
    text = Path(script).read_text()
    if "NotImplementedError" in text:
        print(f"✗ {Path(script).name} still raises NotImplementedError: replace it with your fix and run the cell")
        return False
    if lab.broken in text:
        print(f"✗ the bug is still there: {lab.broken}")
        return False
    finished, output = _launch(Path(script), lab, timeout)
    if finished:
        last = [line for line in output if line.startswith("[rank 0] ") and line[9:].strip()][-1:]
        print(f"✓ the job finished on both ranks: {last[0][len('[rank 0] '):] if last else '(no output)'}")
        return True
    print("✗ the job still fails:")
    for line in diagnosis(output)[:3]:
        print(f"  {line}")
    for rank, error in sorted(errors(output).items()):
        print(f"  rank {rank} ended with {error}")
    sys.stdout.flush()
    return False


@contextlib.contextmanager
def background(name: str, pg_timeout: float = 60.0, wait: float = 90.0):
    """The broken lab ``name`` running under torchrun in the background until its ranks are stuck; stopped after.

    Yields the torchrun process (``.pid``); its ranks' output goes to a log file (``.log``).
    """
    lab = _lab(name)
    args = [a if a != ARGS[ARGS.index("--timeout") + 1] else str(pg_timeout) for a in ARGS]
    log = Path(tempfile.mkdtemp(prefix="hang-")) / "job.log"
    record = log.with_name("hang.json")
    with open(log, "w") as out:
        proc = start_job(write_broken(name), [*args, "--batch-size", lab.batch_size, "--no-progress"], 2,
                         stdout=out, env={hangreport.RECORD_VARIABLE: str(record)})
    proc.log = log
    try:
        deadline = time.monotonic() + wait
        while not hangreport.load(record):  # the watch has saved its block: the ranks are stuck
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text()[-2000:]
                raise WorkshopError(f"the background job did not get stuck as expected; its output:\n{tail}")
            time.sleep(0.5)
        yield proc
    finally:
        kill_tree(proc)
