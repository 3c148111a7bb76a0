"""Running learner's scripts on two single-process "nodes", and stopping a run that can no longer end well.

Each run (an :class:`Item`) gets two fresh ranks from the lab's one launcher
(:class:`workshop_lib.lab.ranks.Ranks`: forked from this process where fork is
safe, else spawned), with the variables ``torchrun --nnodes=2 --nproc_per_node=1``
would set: RANK 0 and 1, LOCAL_RANK 0 on both (a local rank used where the global
rank belongs shows), the group's store hosted here as torchrun's agent hosts it,
Gloo on CPU even where GPUs exist. Each rank runs :func:`workshop_lib.checks.rank.run_item`.
A run is stopped (both processes killed) as soon as:

* the hang watch has saved a block where a rank waits for one still in the job;
* the ranks joined wrongly (two of them with the same ``rank=``);
* a rank has ended and another has made no progress for :data:`LEFT_WAITING` s;
* no rank has made progress for :data:`STALL` s, or the item outlived :data:`LIMIT` s.

What each rank recorded is read back by :func:`load`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workshop_lib.debug import hangreport
from workshop_lib.debug.hangreport import RECORD_VARIABLE
from workshop_lib.lab.ranks import Ranks
from workshop_lib.lab.spawning import start_method

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
    copy: tuple[Path, Path] | None = None  # the runner copies this folder to that one first (a run that continues another)
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


class _Progress:
    """When each rank last wrote anything, and when the first one ended."""

    def __init__(self, item: Item):
        self.item, self.sizes, self.changed, self.first_end = item, {}, {}, None

    def update(self) -> None:
        now = time.monotonic()
        for rank in range(WORLD):
            prefix = f"{self.item.prefix}.rank{rank}"
            size = sum(p.stat().st_size for p in (Path(f"{prefix}.jsonl"), Path(f"{prefix}.params")) if p.is_file())
            if self.sizes.get(rank) != size:
                self.sizes[rank], self.changed[rank] = size, now
            if self.first_end is None and _ended(self.item, rank):
                self.first_end = now

    def quiet(self, rank: int) -> float:
        """Seconds since ``rank`` last wrote (or since the first rank ended, if that is later)."""
        now = time.monotonic()
        return now - max(self.changed.get(rank, now), self.first_end or 0.0)


def _ended(item: Item, rank: int) -> bool:
    path = Path(f"{item.prefix}.rank{rank}.jsonl")
    return path.is_file() and '"kind": "end"' in path.read_text()


def _why_stop(item: Item, progress: _Progress, started: float) -> str | None:
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
    if ended and any(r not in ended and progress.quiet(r) > LEFT_WAITING for r in range(WORLD)):
        return "left waiting"
    if all(progress.quiet(r) > STALL for r in range(WORLD)):
        return "stalled"
    if time.monotonic() - started > LIMIT:
        return "too long"
    return None


def _env(rank: int, port: int) -> dict[str, str]:
    """What ``torchrun --nnodes=2 --nproc_per_node=1`` gives each rank, its agent hosting the store; CPU only."""
    return {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(WORLD), "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}  # Gloo on CPU, GPUs or not


def run_one(item: Item) -> Run:
    """Run ``item`` on two ranks (:class:`workshop_lib.lab.ranks.Ranks`), stopping it as the module says."""
    import torch.distributed as dist

    from workshop_lib.checks.rank import run_item

    if item.copy:  # a run that continues another's --out gets a copy of it (the original stays)
        shutil.copytree(*item.copy, dirs_exist_ok=True)
    # The group's store, hosted here as torchrun's agent hosts it: both ranks find it listening.
    store = dist.TCPStore("127.0.0.1", 0, WORLD, is_master=True, wait_for_workers=False)
    logs = [Path(f"{item.prefix}.rank{r}.log") for r in range(WORLD)]
    envs = {r: _env(r, store.port) for r in range(WORLD)}
    unset = [k for k in os.environ if k.startswith(("TORCHELASTIC_", "WORKSHOP_HANG")) and k not in envs[0]]
    spec = {"script": str(Path(item.script).resolve()), "argv": item.argv, "prefix": str(item.prefix),
            "hang": str(item.hang), "unset": unset}
    for r in range(WORLD):
        envs[r][RECORD_VARIABLE] = str(item.hang)
    ranks = Ranks(run_item, {r: (spec, str(logs[r])) for r in range(WORLD)}, envs, start_method())
    progress, started, stopped = _Progress(item), time.monotonic(), None
    try:
        ranks.start()
        while ranks.poll() is None:
            time.sleep(0.05)
            progress.update()
            stopped = _why_stop(item, progress, started)
            if stopped:
                break
    finally:
        ranks.stop()
        del store
    ended = all(_ended(item, r) for r in range(WORLD))
    if stopped is None and not ended:  # a rank's process ended without the script's end: killed, or crashed in C
        stopped = "died"
    elif stopped is not None and ended:  # it ended after all, while being stopped
        stopped = None
    output = "".join(log.read_text(errors="replace") for log in logs if log.is_file())
    return load(item, stopped, time.monotonic() - started, output)


def run(items: Sequence[Item], workdir: Path) -> list[Run]:
    """Run every item on two fresh ranks, in turn; what each did (see :class:`Run`)."""
    runs: list[Run] = []
    for item in items:
        if item.needs is not None and runs[items.index(item.needs)].stopped:  # no run that would be moot
            runs.append(Run({r: [] for r in range(WORLD)}, stopped="skipped"))
        else:
            runs.append(run_one(item))
    return runs
