"""Running learner's scripts on two single-process "nodes", and stopping a run that can no longer end well.

The two ranks are started without torchrun's agent but with the variables
``torchrun --nnodes=2 --nproc_per_node=1`` would set: RANK 0 and 1, LOCAL_RANK 0
on both (a local rank used where the global rank belongs shows), Gloo on CPU
even where GPUs exist. One pair of processes (:mod:`workshop_lib.checks.rank`)
runs every item in turn, which saves each script the start of two Pythons. A
run is stopped (both processes killed) as soon as:

* the hang watch has saved a block where a rank waits for one still in the job;
* the ranks joined wrongly (two of them with the same ``rank=``);
* a rank has ended and another has made no progress for :data:`LEFT_WAITING` s;
* no rank has made progress for :data:`STALL` s, or the item outlived :data:`LIMIT` s.

A fresh pair then runs the items after it. What each rank recorded is read
back by :func:`load`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workshop_lib.debug import hangreport
from workshop_lib.lab.launch import free_port
from workshop_lib.lab.processes import kill_tree
from workshop_lib.lab.spawning import start_method
from workshop_lib.paths import lab_root

WORLD = 2
LEFT_WAITING = 6.0  # seconds a rank may go on without news once another has ended
STALL = 15.0  # seconds without news from any rank
LIMIT = 60.0  # seconds for one item


@dataclass
class Item:
    """One run of one script: its argv and where its records go (``prefix``.rankR.jsonl ...)."""

    script: Path
    argv: list[str]
    prefix: Path
    copy: tuple[Path, Path] | None = None  # rank 0 copies this folder to that one first (a run that continues another)
    needs: Item | None = None  # an item this one is pointless without: skipped when the runner had to stop that one

    @property
    def hang(self) -> Path:
        return Path(f"{self.prefix}.hang.json")


@dataclass
class Run:
    """What the ranks of one item did: each rank's events and parameters after each step, the watch's blocks."""

    ranks: dict[int, list[dict]]
    params: dict[int, list[np.ndarray]] = field(default_factory=dict)
    hang: list[dict] = field(default_factory=list)
    stopped: str | None = None  # why the runner stopped it, if it did
    seconds: float = 0.0
    output: str = ""


def _read(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _params(prefix: Path, events: list[dict]) -> list[np.ndarray]:
    path = Path(f"{prefix}.params")
    flat = np.fromfile(path, dtype=np.float32) if path.is_file() else np.zeros(0, np.float32)
    vectors, start = [], 0
    for e in events:
        if e["kind"] == "step" and start + e["numel"] <= len(flat):
            vectors.append(flat[start:start + e["numel"]])
            start += e["numel"]
    return vectors


def load(item: Item, stopped: str | None = None, seconds: float = 0.0, output: str = "") -> Run:
    ranks = {r: _read(Path(f"{item.prefix}.rank{r}.jsonl")) for r in range(WORLD)}
    params = {r: _params(Path(f"{item.prefix}.rank{r}"), ranks[r]) for r in range(WORLD)}
    return Run(ranks, params, hangreport.load(item.hang), stopped, seconds, output)


def _start(items: Sequence[Item], workdir: Path, first: int) -> list[subprocess.Popen]:
    manifest = workdir / f"manifest{first}.json"
    manifest.write_text(json.dumps([{"script": str(Path(i.script).resolve()), "argv": i.argv, "prefix": str(i.prefix),
                                     "hang": str(i.hang), "copy": [str(p) for p in i.copy] if i.copy else None}
                                    for i in items]))
    control = str(free_port())
    procs = []
    for rank in range(WORLD):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "WORKSHOP_HANG"))}
        env.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", CONTROL_PORT=control, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   CUDA_VISIBLE_DEVICES="")  # Gloo on CPU, GPUs or not
        if start_method() == "fork":
            procs.append(_Forked(manifest, rank, env, workdir / f"rank{rank}.log"))
            continue
        with open(workdir / f"rank{rank}.log", "a") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "workshop_lib.checks.rank", str(manifest)], env=env,
                                          stdout=log, stderr=subprocess.STDOUT, cwd=lab_root(),
                                          start_new_session=True))
    return procs


class _Forked:
    """A rank forked from this process, which has torch imported already: 2-3 s less than a fresh Python each.

    The child gets what the subprocess would: a session of its own, the log as stdout and stderr, the course
    folder, the environment, one thread. Gloo on the loopback by name: a forked process must not resolve host
    names (a lock another thread held at the fork stays locked in the child). Where fork is not safe
    (macOS, Windows, ``WORKSHOP_START_METHOD=spawn``) the ranks are fresh Pythons.
    """

    def __init__(self, manifest: Path, rank: int, env: dict[str, str], log: Path):
        import torch
        import torch._dynamo  # DDP and the optimizers import it on first use: once here, for both ranks

        from workshop_lib.checks.rank import run_rank

        folder = lab_root()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid:
            return
        try:  # the child: never returns
            gc.freeze()  # the parent's objects stay unfreed here (their destructors need its threads): as forklaunch
            os.setsid()
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives as the rank)
            os.chdir(folder)
            os.environ.clear()
            os.environ.update(env, GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"))
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            torch.set_num_threads(1)
            run_rank(manifest, rank, WORLD)  # ends in os._exit
        finally:
            os._exit(1)

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> None:
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)


class _Progress:
    """Which item the pair is in, when each of its ranks last wrote anything, and when the first one ended."""

    def __init__(self, items: Sequence[Item]):
        self.items, self.sizes, self.changed, self.first_end = items, {}, {}, {}

    def update(self, i: int) -> None:
        now = time.monotonic()
        for rank in range(WORLD):
            prefix = f"{self.items[i].prefix}.rank{rank}"
            size = sum(p.stat().st_size for p in (Path(f"{prefix}.jsonl"), Path(f"{prefix}.params")) if p.is_file())
            if self.sizes.get((i, rank)) != size:
                self.sizes[(i, rank)], self.changed[(i, rank)] = size, now
            if i not in self.first_end and _ended(self.items[i], rank):
                self.first_end[i] = now

    def quiet(self, i: int, rank: int) -> float:
        """Seconds since ``rank`` last wrote (or since the first rank ended, if that is later)."""
        now = time.monotonic()
        return now - max(self.changed.get((i, rank), now), self.first_end.get(i, 0.0))


def _ended(item: Item, rank: int) -> bool:
    path = Path(f"{item.prefix}.rank{rank}.jsonl")
    return path.is_file() and '"kind": "end"' in path.read_text()


def _why_stop(item: Item, progress: _Progress, i: int, started: float) -> str | None:
    if hangreport.missing_rank(item.hang):
        return "hang"
    ended = [r for r in range(WORLD) if _ended(item, r)]
    blocks = hangreport.load(item.hang)
    if ended and any(b["missing"] and set(b["missing"]) <= set(ended) for b in blocks):
        return "left"  # the watch says the ranks still waiting wait for ranks that have ended
    events = {r: _read(Path(f"{item.prefix}.rank{r}.jsonl")) for r in range(WORLD)}
    given = [next((e.get("given_rank") for e in ev if e["kind"] == "init"), "none") for ev in events.values()]
    if "none" not in given and given[0] is not None and len(set(given)) < len(given):
        return "joined as one rank"
    if ended and any(r not in ended and progress.quiet(i, r) > LEFT_WAITING for r in range(WORLD)):
        return "left waiting"
    if all(progress.quiet(i, r) > STALL for r in range(WORLD)):
        return "stalled"
    if time.monotonic() - started > LIMIT:
        return "too long"
    return None


def run(items: Sequence[Item], workdir: Path) -> list[Run]:
    """Run every item on two ranks, in turn; what each did (see :class:`Run`)."""
    runs: list[Run | None] = [None] * len(items)
    first = 0
    while first < len(items):
        procs = _start(items[first:], workdir, first)
        progress = _Progress(items)
        current, started, stopped = first, time.monotonic(), None
        try:
            while any(p.poll() is None for p in procs):
                time.sleep(0.1)
                while current < len(items) - 1 and all(_ended(items[current], r) for r in range(WORLD)):
                    runs[current] = load(items[current], seconds=time.monotonic() - started)
                    current, started = current + 1, time.monotonic()
                progress.update(current)
                stopped = _why_stop(items[current], progress, current, started)
                if stopped:
                    break
        finally:
            for p in procs:
                kill_tree(p.pid if isinstance(p, _Forked) else p, grace=0, first=signal.SIGKILL)
                if isinstance(p, _Forked):
                    p.wait()  # reaped here: kill_tree leaves this process's own children to it
        output = "".join((workdir / f"rank{r}.log").read_text() for r in range(WORLD))
        while current < len(items) and all(_ended(items[current], r) for r in range(WORLD)):
            runs[current] = load(items[current], seconds=time.monotonic() - started)
            current, started = current + 1, time.monotonic()
            if stopped:  # it ended after all, while being stopped: the items after it need a fresh pair
                break
        else:
            if current < len(items):  # stopped, or the pair died inside this item
                runs[current] = load(items[current], stopped or "died", time.monotonic() - started)
                current += 1
        for i in range(first, current):
            runs[i].output = output
        first = current
        while first < len(items) and items[first].needs is not None and \
                runs[items.index(items[first].needs)].stopped:  # no fresh pair for a run that would be moot
            runs[first] = Run({r: [] for r in range(WORLD)}, stopped="skipped")
            first += 1
    return runs  # type: ignore[return-value]
