"""Running the hang labs of notebooks/05_when_it_hangs.ipynb: their cells on forked ranks, or their scripts in a terminal.

:func:`launch` runs a lab's cells (tagged ``script:hanglabN``) as last run, under the names ``shared-cell`` and
``train-cell``, and ``train()`` on two forked ranks with the hang watch (without, for :data:`TORCH_SPEAKS`);
:func:`terminal` runs its script under torchrun, with ``python -m workshop_lib.diagnose`` while it hangs.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from workshop_lib.authoring import scripts, spans
from workshop_lib.config import TrainConfig
from workshop_lib.debug import hangreport
from workshop_lib.errors import WorkshopError, first_sentence
from workshop_lib.figures import sequences
from workshop_lib.paths import clone_root, lab_root

NOTEBOOK = "05_when_it_hangs.ipynb"
# Seconds a collective may wait before the watch explains it ("has waited 1 s"): a broken run's steps take
# milliseconds (a wait that was no deadlock runs again with a longer threshold); a fix's run must not be cut short.
HANG_AFTER, FIX_HANG_AFTER = 1.0, 8.0
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
    """How one lab run ended: finished (each rank's measures), hung (the watch's record), or failed (errors)."""

    name: str
    results: list[dict] | None = None  # per rank: {"steps", "spread", "wrapper", "find_unused"} when all finished
    record: list[dict] = field(default_factory=list)  # the hang watch's saved blocks, when the ranks hung
    errors: dict[int, str] = field(default_factory=dict)  # rank -> the error that ended it (its first sentence)
    messages: dict[int, str] = field(default_factory=dict)  # rank -> its traceback from train() down, error whole
    # rank -> (line of train() it raised at, its code, the functions it was in below train(), outermost first)
    raised: dict[int, tuple[int, str, tuple[str, ...]]] = field(default_factory=dict)
    timed_out: bool = False
    started: float = field(default_factory=time.time)
    script: str | None = None  # the lab script a terminal run ran (its lines count from its train() too)


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
    """In each forked rank: the lab's train(), then what the check measures itself (optimizer steps, replicas)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if debug:  # what TORCH_DISTRIBUTED_DEBUG=debug in the job's environment sets
        dist.set_debug_level(getattr(dist.DebugLevel, debug))

    steps, params, wrapper, find_unused = [], [], [], []

    def count(optimizer, args, kwargs):
        steps.append(1)
        params[:] = [p for group in optimizer.param_groups for p in group["params"]]

    def spy(model, *args, **kwargs):  # which model does evaluate() get?
        wrapper.append(isinstance(model, DDP))
        return evaluate(model, *args, **kwargs)

    def noted(self, *args, **kwargs):  # which options did train() give DDP?
        find_unused.append(bool(kwargs.get("find_unused_parameters")))
        construct(self, *args, **kwargs)

    os.chdir(lab_root())  # file names in the watch's report relative to the clone, as in a terminal
    evaluate, construct = train.__globals__.get("evaluate"), DDP.__init__
    if callable(evaluate):  # this rank's copy of the lab's namespace
        train.__globals__["evaluate"] = spy
    hook = register_optimizer_step_post_hook(count)
    try:
        with mock.patch.object(DDP, "__init__", noted):  # this forked rank's DDP only
            train(cfg, env.rank, env.world_size, env.device)
    finally:
        hook.remove()
    mine = torch.nn.utils.parameters_to_vector(params).detach() if params else torch.zeros(0)  # (P,)
    sizes: list = [None] * env.world_size
    dist.all_gather_object(sizes, mine.numel())
    spread = None
    if len(set(sizes)) == 1 and sizes[0]:
        everyone = [torch.empty_like(mine) for _ in range(env.world_size)]
        dist.all_gather(everyone, mine)
        spread = max((w - everyone[0]).abs().max().item() for w in everyone)
    return {"steps": len(steps), "spread": spread, "wrapper": any(wrapper), "find_unused": any(find_unused)}


def deadlocked(record: list[dict]) -> bool:
    """Every rank in a call, not all in the same one: a deadlock (else a rank was only slow to come, the machine busy)."""
    now = [a.get("current") for a in sequences.answers(record).values()]
    calls = {(c["op"], c["seq"], c["tensors"]) for c in now if c}
    return all(now) and len(calls) > 1


def launch(name: str, broken: bool, notebook: str | Path = NOTEBOOK, edit: Callable[[str], str] | None = None) -> Run:
    """Lab ``name``'s train() (``broken``: as the exercise gives it) on 2 forked ranks with the watch: how it ended (a
    broken run whose watch spoke before a deadlock runs again with a longer threshold)."""
    from workshop_lib.launching.forklaunch import HangError, LaunchTimeout, notebook_launch
    from workshop_lib.launching.launch import LaunchError

    train = load(_lab(name), broken, notebook, edit)["train"]
    cfg = TrainConfig(limit=447, epochs=1, batch_size=BATCH[name], timeout=TIMEOUT, tensorboard=False)
    started, speaks = time.time(), RAW_TIMEOUT if broken and name in TORCH_SPEAKS else None
    debug = DEBUG.get(name) if broken else None
    tries = (None,) if speaks else (HANG_AFTER, 2 * HANG_AFTER, 4 * HANG_AFTER) if broken else (FIX_HANG_AFTER,)
    for hang_after in tries:
        try:
            return Run(name, started=started, results=notebook_launch(
                _rank, 2, train, cfg, debug, timeout=TIMEOUT, hang_after=hang_after, group_timeout=speaks))
        except HangError as err:
            run = Run(name, record=hangreport.load(err.record), started=started)
            if not broken or deadlocked(run.record):
                return run
        except LaunchTimeout:
            return Run(name, timed_out=True, started=started)
        except LaunchError as err:
            return _failed(name, str(err), started)
    return run


def _errors(message: str) -> dict[int, str]:
    """{rank: its error, first sentence} from notebook_launch's failure lines ('rank 0 raised X: ... (File ...)')."""
    found = {}
    for line in message.splitlines():
        if line.startswith("rank ") and " raised " in line:
            rank, error = line[5:].split(" raised ", 1)
            found[int(rank)] = first_sentence(error.split(" (File ")[0], 200)
        elif line.startswith("rank ") and " failed with " in line:
            found[int(line.split()[1])] = line.split(" failed with ", 1)[1]
    return found


_SECTION = re.compile(r"^===== rank (\d+)$", re.M)
_TRAIN_FRAME = re.compile(rf'^\s+File "{TRAIN_CELL}", line (\d+), in train$', re.M)
_FRAME = re.compile(r'^\s+File "(?:[^"]*/(?=(?:torch|workshop_lib)/))?([^"]*)", line \d+, in (\w+)$', re.M)
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*$", re.M)
# A frame of the watch's call-through wrappers (workshop_lib/debug/), with its code lines: not the learner's to read
_WATCH_FRAME = re.compile(r'^\s+File "[^"]*/workshop_lib/debug/[^"]*", line \d+, in \w+\n(?:(?!\s+File ")[ \t].*\n)*', re.M)


def tracebacks(text: str) -> tuple[dict[int, tuple[int, str, tuple[str, ...]]], dict[int, str]]:
    """From every rank's output (all.log): where in train() each rank raised (line, code, the functions below it),
    and its traceback from train() down, its error whole."""
    raised, messages = {}, {}
    parts = _SECTION.split(text)
    for rank, body in zip(parts[1::2], parts[2::2], strict=True):
        body = body.split("\n===== ", 1)[0]
        if not (frames := list(_TRAIN_FRAME.finditer(body))):
            continue
        line, error = int(frames[-1].group(1)), _ERROR_LINE.search(body, frames[-1].end())
        below = _WATCH_FRAME.sub("", body[frames[-1].start():error.start() if error else len(body)])
        raised[int(rank)] = (line, linecache.getline(TRAIN_CELL, line).strip().split("  # ")[0],
                             tuple(fn for _, fn in _FRAME.findall(below)[1:]))
        lines = _FRAME.sub(lambda m: m.group(0).replace(m.group(0).split('"')[1], m.group(1)), below).splitlines()
        lines += body[error.start():].splitlines() if error else []
        messages[int(rank)] = "\n".join(x for x in lines if x.strip() and not x.startswith(hangreport.PREFIX))
    return raised, messages


def _failed(name: str, message: str, started: float) -> Run:
    """A failed run: each rank's error, and from every rank's output, where each raised and its whole message."""
    run = Run(name, errors=_errors(message), started=started)
    log = message.rsplit("every rank's output: ", 1)[-1].strip() if "every rank's output: " in message else ""
    if log and Path(log).is_file():
        run.raised, run.messages = tracebacks(Path(log).read_text(errors="replace"))
    return run


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


def terminal(name: str, timeout: float = RAW_TIMEOUT, limit: float = 120.0) -> Run:
    """Lab ``name``'s exercise script under torchrun: prints the command, diagnose's stacks once the watch has seen a
    deadlock, then each rank's part of torch's error when the group's ``timeout`` ends it (``limit``: a hard stop)."""
    import subprocess

    from workshop_lib.debug import stacks
    from workshop_lib.launching.launch import start_job
    from workshop_lib.launching.processes import kill_tree

    script, root = f"exercises/{_lab(name)}.py", clone_root("the hang labs")
    command = terminal_command(name, timeout, watch=True)
    record = Path(tempfile.mkdtemp(prefix=f"{name}-")) / "hang.json"
    print(f"$ {command}", flush=True)
    run = Run(name, script=script)
    proc = start_job(root / script, _script_args(name, timeout), 2, env={
        hangreport.RECORD_VARIABLE: str(record), "WORKSHOP_HANG_AFTER": f"{HANG_AFTER:g}"}, watch=True)
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
        run.timed_out = True
    finally:
        kill_tree(proc, grace=5)
        reader.join(timeout=5)
    said = _torch_said(list(lines.queue), script)
    run.messages = {r: x[-1].strip() for r, x in said.items()}
    if said:
        print(f"{timeout:g} s into the hang, the group's timeout ends the job; torch's own error, as each rank "
              f"printed it (its last frame in the script, then the error):")
        print("\n".join(f"[rank{r}]:{x}" for r, text in sorted(said.items()) for x in text))
    elif run.timed_out:
        print(f"the job did not end within {limit:g} s; it was stopped")
    return run
