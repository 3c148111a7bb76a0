"""A learner's script on fresh ranks (:class:`workshop_lib.launching.ranks.Ranks`; two unless the item says otherwise) as
``torchrun --nnodes=N --nproc_per_node=1`` would start it (LOCAL_RANK 0 on each, the store hosted here, Gloo on CPU),
as ``python script.py`` runs it (the script's folder first on ``sys.path``), watched and recorded (:func:`run_item`),
stopped as soon as it cannot end well (:func:`_why_stop`).

Why not under torchrun itself: the script runs as ``__main__`` with torchrun's variables and the recorder attached
from outside, as ``torchrun -m`` would attach it, but a real torchrun costs each run a fresh interpreter per rank and
an agent (a bare 2-rank torchrun took 6-8.5 s on 2 cores, measured 2026-12-06), and ``check --all`` makes 12 runs
(6, and the probes of the data at 1 and 3 ranks) within its 15 s; forked ranks start from this process's imports."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import runpy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from workshop_lib.debug import hangreport, hangwatch
from workshop_lib.debug.hangreport import RECORD_VARIABLE
from workshop_lib.debug.launchenv import launch_variables
from workshop_lib.engine.recorder import Recorder, recording
from workshop_lib.launching import ends
from workshop_lib.launching.ranks import Ranks
from workshop_lib.launching.spawning import start_method
from workshop_lib.paths import lab_root

WORLD = 2
LEFT_WAITING = 6.0  # seconds a rank may go on without news once another has ended
STALL = 15.0  # seconds without news from any rank
LIMIT = 60.0  # seconds for one item


@dataclass
class Item:
    """One run of one script: its argv, where its records go (``prefix``.rankR.jsonl ...), its working folder (None:
    the course's) and how many ranks run it."""

    script: Path
    argv: list[str]
    prefix: Path
    cwd: Path | None = None
    world: int = WORLD
    reads: int = 0  # > 0: a probe of the data alone (:class:`~workshop_lib.engine.recorder.Recorder`'s ``reads``)
    hang_after: float = 4.0  # seconds a collective may wait before the watch asks every rank where it is

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


# ----------------------------------------------------------------------------- one rank


def run_script(prefix: str, script: str, argv: list[str], hang_record: str, reads: int, hang_after: float) -> dict:
    """Run ``script`` as ``__main__`` with ``argv``, watched (``hang_after``) and recorded under ``prefix``; its end
    record (:func:`~workshop_lib.launching.ends.record`)."""
    script = os.path.abspath(script)
    rec = Recorder(prefix, reads)
    rec.add("start", line=False, pid=os.getpid(), argv=argv)
    saved_argv, sys.argv = sys.argv, [script, *argv]
    sys.path.insert(0, os.path.dirname(script))  # as `python script.py` puts it: its sibling modules import
    hangwatch.attach(threshold=hang_after, record=hang_record, poll=0.25)
    error: BaseException | None = None
    try:
        with recording(rec):
            runpy.run_path(script, run_name="__main__")
    except BaseException as err:  # every way out is an outcome to report
        error = err
        if isinstance(err, SystemExit) and isinstance(err.code, str):
            print(err.code, file=sys.stderr)  # as Python prints sys.exit("...") on its way out: the script's last words
    finally:
        sys.argv = saved_argv
        with contextlib.suppress(ValueError):
            sys.path.remove(os.path.dirname(script))
        hangwatch.detach()  # says this rank left; the next script gets a watch of its own
    still_joined = dist.is_available() and dist.is_initialized()
    end = ends.record(int(os.environ.get("RANK", 0)), error, within=script)
    sys.stdout.flush()
    sys.stderr.flush()  # what the script printed last, from this rank's log (run's logs): its own last words
    end = rec.add("end", line=end.pop("line", None), said=ends.last_lines(Path(f"{prefix}.log")), **end)
    rec.close()
    if still_joined:  # a script that never left
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return end


def run_item(item: dict) -> None:
    """One rank, in a process of its own (:class:`~workshop_lib.launching.ranks.Ranks` gives it its log): the course
    folder, one thread, then the script."""
    for name in item["unset"]:  # the checker's own launcher's variables: the script gets only the runner's
        os.environ.pop(name, None)
    os.chdir(item["cwd"])
    torch.set_num_threads(1)
    run_script(f"{item['prefix']}.rank{os.environ['RANK']}", item["script"], item["argv"], item["hang"], item["reads"],
               item["hang_after"])
    sys.stdout.flush()


# ----------------------------------------------------------------------------- the pair, from outside


def params(prefix: Path, events: list[dict]) -> list[np.ndarray]:
    """The parameters after each optimizer step of ``events``, as the recorder wrote them to PREFIX.params."""
    path = Path(f"{prefix}.params")
    flat = np.fromfile(path, dtype=np.float32) if path.is_file() else np.zeros(0, np.float32)
    vectors, start = [], 0
    for e in events:
        if e["kind"] == "step" and start + e["numel"] <= len(flat):
            vectors.append(flat[start:start + e["numel"]])
            start += e["numel"]
    return vectors


class Records:
    """What each of ``world`` ranks has recorded under PREFIX.rankR, read at each :meth:`update`, only what it appended
    (whole lines): its events; when it last wrote anything (its record or its parameters), and when the first rank
    ended (an ``end`` event)."""

    def __init__(self, prefix: Path, world: int):
        self.prefix, self.first_end = prefix, None
        self.events: dict[int, list[dict]] = {r: [] for r in range(world)}
        self.read, self.sizes, self.changed, self.ended = dict.fromkeys(self.events, 0), {}, {}, set()

    def update(self) -> None:
        now = time.monotonic()
        for rank, events in self.events.items():
            prefix = f"{self.prefix}.rank{rank}"
            try:
                with open(f"{prefix}.jsonl", "rb") as f:
                    f.seek(self.read[rank])
                    new = f.read()
            except FileNotFoundError:
                new = b""
            new = new[:new.rfind(b"\n") + 1]  # a line still being written is read whole next time
            self.read[rank] += len(new)
            events += (added := [json.loads(line) for line in new.splitlines()])
            if any(e["kind"] == "end" for e in added):
                self.ended.add(rank)
                self.first_end = self.first_end or now
            params = Path(f"{prefix}.params")
            size = (self.read[rank], params.stat().st_size if params.is_file() else 0)
            if self.sizes.get(rank) != size:
                self.sizes[rank], self.changed[rank] = size, now

    def quiet(self, rank: int) -> float:
        """Seconds since ``rank`` last wrote (or since the first rank ended, if that is later)."""
        now = time.monotonic()
        return now - max(self.changed.get(rank, now), self.first_end or 0.0)


def _why_stop(item: Item, progress: Records, started: float) -> str | None:
    """Why to stop the run now: the watch saw a rank wait for one that is still in the job, or for one that has
    ended; two ranks joined as one; a rank has ended and another is quiet; nobody is making progress; too long."""
    if hangreport.missing_rank(item.hang):
        return "hang"
    ended = progress.ended
    if ended and any(b["missing"] and set(b["missing"]) <= ended for b in hangreport.load(item.hang)):
        return "left"
    given = [next((e.get("given_rank") for e in ev if e["kind"] == "init"), "none") for ev in progress.events.values()]
    if "none" not in given and given[0] is not None and len(set(given)) < len(given):
        return "joined as one rank"
    world = range(item.world)
    if ended and any(r not in ended and progress.quiet(r) > LEFT_WAITING for r in world):
        return "left waiting"
    if all(progress.quiet(r) > STALL for r in world):
        return "stalled"
    if time.monotonic() - started > LIMIT:
        return "too long"
    return None


def rank_env(rank: int, port: int, world: int = WORLD) -> dict[str, str]:
    """What ``torchrun --nnodes=N --nproc_per_node=1`` gives each rank, its agent hosting the store; CPU only."""
    return launch_variables(rank, world, 1, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                            TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT=0, OMP_NUM_THREADS=1,
                            PYTHONUNBUFFERED=1, CUDA_VISIBLE_DEVICES="")  # Gloo on CPU, GPUs or not


@functools.cache
def _imports_of_a_first_step() -> None:
    """What a script's first optimizer imports on its first use (torch.optim's compiler checks import sympy: seconds
    on a loaded machine, in every rank, with nothing recorded meanwhile), imported here once: forked ranks inherit it."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)])


def run(item: Item) -> Run:
    """Run ``item`` on fresh ranks, stopping it as :func:`_why_stop` says; what the ranks did."""
    if start_method() == "fork":
        _imports_of_a_first_step()
    # The group's store, hosted here as torchrun's agent hosts it: every rank finds it listening.
    world = range(item.world)
    store = dist.TCPStore("127.0.0.1", 0, item.world, is_master=True, wait_for_workers=False)
    logs = [Path(f"{item.prefix}.rank{r}.log") for r in world]
    envs = {r: {**rank_env(r, store.port, item.world), RECORD_VARIABLE: str(item.hang)} for r in world}
    unset = [k for k in os.environ if k.startswith(("TORCHELASTIC_", "WORKSHOP_HANG")) and k not in envs[0]]
    spec = {"script": str(Path(item.script).resolve()), "argv": item.argv, "prefix": str(item.prefix),
            "hang": str(item.hang), "unset": unset, "cwd": str(item.cwd or lab_root()), "reads": item.reads,
            "hang_after": item.hang_after}
    ranks = Ranks(run_item, {r: (spec,) for r in world}, envs, start_method(), {r: str(logs[r]) for r in world})
    progress, started = Records(item.prefix, item.world), time.monotonic()
    try:
        ranks.start()
        done = ranks.wait(lambda: progress.update() or _why_stop(item, progress, started), every=0.05)
    finally:
        ranks.stop()
        del store
    progress.update()  # what the ranks wrote before they were stopped
    stopped = done if isinstance(done, str) and progress.ended != set(world) else None  # (else it ended after all,
    for rank in sorted(set(world) - progress.ended):  # while being stopped)
        _end_of_the_unended(item, rank, progress.events[rank], logs[rank], stopped,
                            done.failed if not isinstance(done, str) else {})
    progress.update()  # the end records just written
    output = "".join(log.read_text(errors="replace") for log in logs if log.is_file())
    weights = {r: params(Path(f"{item.prefix}.rank{r}"), progress.events[r]) for r in world}
    return Run(progress.events, weights, hangreport.load(item.hang), stopped, time.monotonic() - started, output)


def _end_of_the_unended(item: Item, rank: int, events: list[dict], log: Path, stopped: str | None,
                        died: dict[int, int | None]) -> None:
    """The end record (:mod:`~workshop_lib.launching.ends`) of a rank that started the script (its ``events``) and
    left none: its process died (:func:`~workshop_lib.launching.ends.killed`: its exit code, signal and last lines);
    else the runner stopped it (``stopped``; or at another rank's death): where the watch saw it wait (``waiting``),
    else ``timed out``. A rank that left no record at all never started the script
    (:func:`workshop_lib.engine.script.judge`)."""
    if not events:
        return
    if rank in died:
        end = ends.killed(rank, died[rank], log)
    else:
        end = next((e for e in ends.waiting(hangreport.load(item.hang)) if e["rank"] == rank),
                   ends.timed_out(rank))
        end["stopped"] = stopped or "another rank died"
    rec = Recorder(Path(f"{item.prefix}.rank{rank}"))
    rec.add("end", line=end.pop("line", None), **end)
    rec.close()
