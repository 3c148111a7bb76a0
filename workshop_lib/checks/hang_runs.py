"""Running the hang labs of notebooks/05_when_it_hangs.ipynb: their cells on forked ranks, or their scripts in a terminal.

:func:`launch` runs a lab's cells (tagged ``script:hanglabN``) as last run, under the names ``shared-cell`` and
``train-cell``, and ``train()`` on two forked ranks with the hang watch (without, for :data:`TORCH_SPEAKS`);
:func:`terminal` runs its script under torchrun, with ``python -m workshop_lib.diagnose`` while it hangs.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import os
import queue
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.authoring import scripts, spans
from workshop_lib.config import TrainConfig
from workshop_lib.debug import hangreport
from workshop_lib.errors import WorkshopError, first_sentence
from workshop_lib.figures import sequences
from workshop_lib.paths import clone_root, lab_root

NOTEBOOK = "05_when_it_hangs.ipynb"
TIMEOUT = 60.0  # seconds before a lab run is stopped whatever happens (and its process group's timeout)
# Each lab's batch size: 16 makes 6 and 5 batches of lab 2's uneven shards (81 and 80 molecules); BatchNorm needs
# no batch of 1 (lab 4: shards of 161). The labs' names say nothing of their bugs.
BATCH = {"hanglab1": 32, "hanglab2": 16, "hanglab3": 32, "hanglab4": 48, "hanglab5": 32}
# The labs whose broken run has no watch: the group's timeout (s) ends it, and the learner reads torch's error; the
# terminal run (lab 3) has the same timeout, torch's error coming this long into the hang.
TORCH_SPEAKS, RAW_TIMEOUT = {"hanglab1"}, 3.0
DEBUG = {"hanglab5": "INFO"}  # TORCH_DISTRIBUTED_DEBUG for a lab's broken run: torch's error then names more
TRAIN_CELL, SHARED_CELL = "train-cell", "shared-cell"  # the names the lab's cells run under


@dataclass
class Run:
    """How one lab run ended, as its records say: finished (``results``: each rank's measures, from its record of
    calls), hung (``record``: the watch's blocks), or not (``ends``: the end record of each rank that raised, died,
    waited or did not finish in time, :mod:`workshop_lib.launching.ends`); what the labs read of the ends follows."""

    name: str
    results: list[dict] | None = None  # per rank, when all finished: {"steps", "spread", "wrapper", "find_unused"}
    record: list[dict] = field(default_factory=list)  # the hang watch's saved blocks, when the ranks hung
    ends: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    script: str | None = None  # the lab script a terminal run ran (its lines count from its train() too)

    @property
    def timed_out(self) -> bool:
        return any(end["how"] == "timed out" for end in self.ends)

    @property
    def errors(self) -> dict[int, str]:
        """rank -> the error that ended it (its first sentence), or its exit code."""
        return {end["rank"]: first_sentence(f"{end['type']}: {end['message']}", 200) if end["how"] == "raised" else
                f"exit code {end.get('code')}" for end in self.ends if end["how"] in ("raised", "exit", "killed")}

    @property
    def raised(self) -> dict[int, tuple[int, str, tuple[str, ...]]]:
        """rank -> where in train() it raised: the line, its code, the functions it was in below, outermost first."""
        return {end["rank"]: (below[0][1], below[0][3].split("  # ")[0], tuple(frame[2] for frame in below[1:]))
                for end in self.ends if (below := _below_train(end))}

    @property
    def messages(self) -> dict[int, str]:
        """rank -> its traceback from train() down, paths from torch/ or workshop_lib/, its error whole."""
        return {end["rank"]: "\n".join([*(f'  File "{_PACKAGE.sub("", file)}", line {line}, in {fn}\n    {code}'
                                          for file, line, fn, code in below), f"{end['type']}: {end['detail']}"])
                for end in self.ends if (below := _below_train(end))}


def _below_train(end: dict) -> list[list]:
    """A raise's frames from the innermost of train()'s down, the instruments' left out; none if it was not in train()."""
    stack = (end.get("frames") or []) if end["how"] == "raised" else []
    mine = [i for i, frame in enumerate(stack) if frame[0] == TRAIN_CELL]
    return [frame for frame in stack[mine[-1]:] if not any(x in frame[0] for x in _INSTRUMENTS)] if mine else []


def _lab(name: str) -> str:
    if name not in BATCH:
        raise WorkshopError(f"no hang lab named {name!r}; pick one of {', '.join(BATCH)}")
    return name


def _cells(name: str, notebook: str | Path) -> list[tuple[str, str]]:
    """(name to run it under, source as last run, else as saved) of each code cell of lab ``name``."""
    import nbformat

    path = Path(notebook) if Path(notebook).is_file() else clone_root("the hang labs") / "notebooks" / NOTEBOOK
    cells = [c for c in nbformat.read(path, as_version=4).cells
             if c.cell_type == "code" and name in scripts.script_names(c)]
    if not cells:
        raise WorkshopError(f"{path.name} has no code cell tagged {scripts.SCRIPT_TAG}{name}")
    return [(TRAIN_CELL if "def train(" in c.source else SHARED_CELL, scripts._ran.get(c.get("id"), c.source))
            for c in cells]


def load(name: str, broken: bool, notebook: str | Path = NOTEBOOK, edit: Callable[[str], str] | None = None) -> dict:
    """Lab ``name``'s cells run into a fresh namespace, as exercise (``broken``) or solution; ``edit``: train()'s text."""
    namespace: dict = {"__name__": f"lab_{name}"}
    for label, source in _cells(_lab(name), notebook):
        text = spans.exercise_source(source, label) if broken else spans.solution_source(source, label)
        text = edit(text) if edit and label == TRAIN_CELL else text
        linecache.cache[label] = (len(text), None, text.splitlines(keepends=True), label)  # the watch shows lines
        exec(compile(text, label, "exec"), namespace)
    if not callable(namespace.get("train")):
        raise WorkshopError(f"lab {name}'s cells define no train(); run its cell as it was given")
    return namespace


def _rank(env, train: Callable, cfg: TrainConfig, debug: str | None = None) -> dict:
    """In each forked rank: the lab's train(), recorded (:mod:`workshop_lib.engine.recorder`: its optimizer steps, the
    options DDP was given, the model evaluate() got); its record, and its weights after its last step."""
    import torch.distributed as dist

    from workshop_lib import metrics
    from workshop_lib.engine import recorder, runner

    if debug:  # what TORCH_DISTRIBUTED_DEBUG=debug in the job's environment sets
        dist.set_debug_level(getattr(dist.DebugLevel, debug))
    os.chdir(lab_root())  # file names in the watch's report relative to the clone, as in a terminal
    folder = Path(tempfile.mkdtemp(prefix="hanglab-"))
    rec, imported = recorder.Recorder(folder / "rank"), metrics.evaluate
    try:
        with recorder.recording(rec):
            if train.__globals__.get("evaluate") is imported:  # the lab's cells imported it before the record's
                train.__globals__["evaluate"] = metrics.evaluate  # observer was on: this rank's copy gets the observer
            train(cfg, env.rank, env.world_size, env.device)
        rec.close()
        weights = runner.params(folder / "rank", rec.events)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"events": rec.events, "weights": weights[-1] if weights else None}


def _measured(returned: list[dict]) -> list[dict]:
    """Each rank's measures, read from its record: its optimizer steps, the replicas' spread after the last one (None:
    a rank that took none, or models of different sizes), whether evaluate() got the DDP wrapper, and whether DDP was
    given find_unused_parameters=True."""
    from workshop_lib.engine import recorder

    weights = [r["weights"] for r in returned]
    spread = recorder.spreads({r: [w] for r, w in enumerate(weights)})[0] if all(w is not None for w in weights) \
        else None
    spread = spread if spread is not None and math.isfinite(spread) else None
    return [{"steps": len(recorder.steps(r["events"])), "spread": spread,
             "wrapper": any(e["model"] == "DistributedDataParallel" for e in r["events"] if e["kind"] == "evaluate"),
             "find_unused": any(e["find_unused"] for e in r["events"] if e["kind"] == "ddp")} for r in returned]


def deadlocked(record: list[dict]) -> bool:
    """Every rank in a call, not all in the same one: a deadlock (else a rank was only slow to come, the machine busy)."""
    now = [a.get("current") for a in sequences.answers(record).values()]
    calls = {(c["name"], c.get("seq"), c["tensors"]) for c in now if c}
    return all(now) and len(calls) > 1


def launch(name: str, broken: bool, notebook: str | Path = NOTEBOOK, edit: Callable[[str], str] | None = None,
           hang_after: float = 1.0) -> Run:
    """Lab ``name``'s train() (``broken``: as the exercise gives it) on 2 forked ranks with the watch: how it ended.

    ``hang_after``: the seconds a broken run's collective may wait before the watch explains it ("has waited 1 s"):
    its steps take milliseconds (a wait that was no deadlock runs again, with twice and four times as long). A fix's
    run waits the launcher's :data:`~workshop_lib.launching.forklaunch.HANG_AFTER`: it must not be cut short."""
    from workshop_lib.launching import forklaunch

    train = load(_lab(name), broken, notebook, edit)["train"]
    cfg = TrainConfig(limit=447, epochs=1, batch_size=BATCH[name], timeout=TIMEOUT, tensorboard=False)
    started, speaks = time.time(), RAW_TIMEOUT if broken and name in TORCH_SPEAKS else None
    debug = DEBUG.get(name) if broken else None
    tries = (None,) if speaks else (hang_after, 2 * hang_after, 4 * hang_after) if broken else (forklaunch.HANG_AFTER,)
    for wait in tries:
        try:
            return Run(name, started=started, results=_measured(forklaunch.notebook_launch(
                _rank, 2, train, cfg, debug, timeout=TIMEOUT, hang_after=wait, group_timeout=speaks)))
        except forklaunch.HangError as err:
            run = Run(name, record=hangreport.load(err.record), ends=err.ends, started=started)
            if not broken or deadlocked(run.record):
                return run
        except forklaunch.RanksFailed as err:  # a LaunchTimeout too: its ends say "timed out"
            return Run(name, ends=err.ends, started=started)
    return run


# The files of what watches and records a rank from outside, whose frames are left out of its traceback
_INSTRUMENTS = (f"{os.sep}workshop_lib{os.sep}debug{os.sep}", f"{os.sep}workshop_lib{os.sep}engine{os.sep}recorder.py")
_PACKAGE = re.compile(r"^.*/(?=(?:torch|workshop_lib)/)")  # a path from torch/ or workshop_lib/ on, as py-spy says it


def train_offset(script: str) -> int:
    """How many lines come before ``def train(`` in a lab script: a line of the script minus this is the cell's."""
    lines = (clone_root("the hang labs") / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines) if line.startswith("def train("))


# ------------------------------------------------------------------------------------------ in a terminal

def _script_args(name: str, timeout: float) -> list[str]:
    return ["--limit", "447", "--epochs", "1", "--batch-size", str(BATCH[_lab(name)]), "--timeout", f"{timeout:g}"]


def terminal_command(name: str, timeout: float = 60.0, watch: bool = False) -> str:
    """The command that runs lab ``name``'s exercise script in a terminal (the repository's folder, its venv active)."""
    from workshop_lib.launching.launch import torchrun_command

    return torchrun_command(f"exercises/{name}.py", 2, watch=watch, args=_script_args(name, timeout))


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*$")  # torch's printed error, in a terminal


def _torch_said(lines: list[str], script: str) -> dict[int, list[str]]:
    """Each rank's last line of ``script`` in its traceback (two lines: where, and the code) and its error line."""
    said: dict[int, list[str]] = {}
    by_rank: dict[int, list[str]] = {}
    for m in filter(None, (re.match(r"^\[rank(\d+)\]:(.*)$", line.rstrip("\n")) for line in lines)):
        by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    for rank, text in sorted(by_rank.items()):
        where = [i for i, x in enumerate(text) if x.strip().startswith("File ") and script in x]
        error = [x for x in text if _ERROR_LINE.match(x.strip())]
        if where and error:
            i = where[-1]
            said[rank] = [text[i].replace(str(lab_root()) + os.sep, ""), text[i + 1] if i + 1 < len(text) else "",
                          error[-1]]
    return said


def terminal(name: str, timeout: float = RAW_TIMEOUT, limit: float = 120.0, hang_after: float = 1.0) -> Run:
    """Lab ``name``'s exercise script under torchrun: prints the command, diagnose's stacks once the watch has seen a
    deadlock (after ``hang_after`` s), then each rank's part of torch's error when the group's ``timeout`` ends it
    (``limit``: a hard stop)."""
    import subprocess

    from workshop_lib.debug import stacks
    from workshop_lib.launching import ends
    from workshop_lib.launching.launch import start_job
    from workshop_lib.launching.processes import kill_tree

    script, root = f"exercises/{_lab(name)}.py", clone_root("the hang labs")
    command = terminal_command(name, timeout, watch=True)
    record = Path(tempfile.mkdtemp(prefix=f"{name}-")) / "hang.json"
    print(f"$ {command}", flush=True)
    run = Run(name, script=script)
    proc = start_job(root / script, _script_args(name, timeout), 2, env={
        hangreport.RECORD_VARIABLE: str(record), "WORKSHOP_HANG_AFTER": f"{hang_after:g}"}, watch=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()
    deadline = time.monotonic() + limit
    try:
        while proc.poll() is None and time.monotonic() < deadline and not run.record:
            time.sleep(0.2)
            run.record = next(([b] for b in hangreport.load(record) if b.get("answers") and deadlocked([b])), [])
        if run.record and proc.poll() is None:
            print("$ python -m workshop_lib.diagnose", flush=True)
            with contextlib.chdir(root):  # py-spy shortens file names; diagnose reads them from the clone, as there
                stacks.main([str(proc.pid), "--width", "56"])
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        run.ends = [ends.timed_out(rank) for rank in range(2)]
    finally:
        kill_tree(proc, grace=5)
        reader.join(timeout=5)
    said = _torch_said(list(lines.queue), script)
    if said:
        print(f"{timeout:g} s into the hang, the group's timeout ends the job; torch's own error, as each rank "
              f"printed it (its last frame in the script, then the error):")
        print("\n".join(f"[rank{r}]:{x}" for r, text in sorted(said.items()) for x in text))
    elif run.timed_out:
        print(f"the job did not end within {limit:g} s; it was stopped")
    return run
