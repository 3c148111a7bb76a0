"""A function defined in the notebook, run on N ranks that each join a process group: :func:`notebook_launch`.

The ranks start through :class:`workshop_lib.launching.ranks.Ranks`: forked on Linux, spawned elsewhere (or where
``WORKSHOP_START_METHOD=spawn``), the function then sent by value (:mod:`workshop_lib.launching.spawning`).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from workshop_lib.debug import hangreport
from workshop_lib.debug.launchenv import launch_variables
from workshop_lib.errors import WorkshopError
from workshop_lib.launching import ends, spawning
from workshop_lib.launching.launch import LaunchError
from workshop_lib.launching.ranks import Ranks


class RanksFailed(LaunchError):
    """A rank raised or died: ``ends``, the record of each rank that did (:mod:`~.ends`), the culprits first."""

    def __init__(self, message: str, ends: list[dict]):
        super().__init__(message)
        self.ends = ends


class LaunchTimeout(RanksFailed):
    """The ranks did not finish within the launch's timeout (and were killed); the message names the log file."""


class HangError(RanksFailed):
    """The ranks hang in a collective one of them never joined: ``diagnosis`` in one line, ``record`` the watch's file,
    ``ends`` where each rank waited."""

    def __init__(self, message: str, ends: list[dict], diagnosis: str, record: Path):
        super().__init__(message, ends)
        self.diagnosis, self.record = diagnosis, record


# Seconds a collective may wait in a check (whose ranks each take a second or two) before the hang watch names the
# rank that never arrived, and the check stops there instead of at its timeout: the launcher's one default.
HANG_AFTER = 8.0


def _rank_main(fn: Callable | bytes, backend: str | None, timeout: float, hang_after: float | None, log_dir: str, *args):
    """What each rank runs: join the group, ``fn(env, *args)`` (bytes: spawned, by value); its end record if it raises."""
    import torch.distributed as dist

    from workshop_lib.debug import hangwatch
    from workshop_lib.debug.launchenv import read_launch_env
    from workshop_lib.launching import joining

    launch = read_launch_env()
    shipped = isinstance(fn, bytes)
    if shipped:  # a function that cannot be rebuilt here says why in this rank's log
        fn, args = spawning.unpack(fn)
    env = None  # backend None: fn joins a group itself (a learner's setup, through torchrun's variables)
    if backend is not None:  # not a TCPStore as the checker's: torch names each TCP peer by a reverse lookup (getnameinfo)
        # in the launcher's store thread and in each rank, and a rank forked while that thread holds glibc's resolver
        # lock waits in it for ever (2026-12-07, glibc 2.36: 7 of 25 launches of 8 ranks, 1 of 300 of 3; this one 0 of 150)
        store = dist.FileStore(str(Path(log_dir) / "store"), launch.world_size)
        env = joining.join(backend, timeout, store=store)
    if hang_after is not None and backend is not None:  # a collective waiting this long: the watch writes who never
        hangwatch.install(store, threshold=hang_after, poll=0.25, record=str(Path(log_dir) / "hang.json"))  # arrived
    try:
        result = fn(env, *args)
        if shipped:  # by value: a class defined in the notebook comes back as that class
            import cloudpickle

            return cloudpickle.dumps(result)
        return result
    except BaseException as err:
        traceback.print_exc()  # into this rank's log: the error names the file
        (Path(log_dir) / f"rank{launch.rank}.end").write_text(json.dumps(ends.record(launch.rank, err)))
        raise
    finally:
        hangwatch.detach()  # its last answer: this rank left (a forked rank ends without running atexit)
        joining.leave()
        sys.stdout.flush()


def _ended(log_dir: Path, failed: dict[int, int | None]) -> list[dict]:
    """Every rank that raised or died, the culprits first (:func:`ends.culprits_first`): its own record
    (:func:`ends.record`), else, for a rank that died without one, :func:`ends.killed` at the time its log was last
    written (a peer's "Connection reset by peer" so comes after the death that caused it)."""
    found = {int(path.stem[4:]): json.loads(path.read_text()) for path in log_dir.glob("rank*.end")}
    for rank, code in failed.items():
        if rank not in found:
            found[rank] = ends.killed(rank, code, log_dir / f"rank{rank}.log")
    return ends.culprits_first(list(found.values()))


def notebook_launch(fn: Callable, nprocs: int = 2, *args, timeout: float = 120, backend: str | None = "gloo",
                    hang_after: float | None = None, group_timeout: float | None = None) -> list:
    """Run ``fn(env, *args)`` on ``nprocs`` ranks; return each rank's result, in rank order, and show rank 0's output.

    A failure raises a LaunchError, a line per failed rank and the file with every rank's output; the stop button
    stops every rank. ``hang_after``: seconds a collective may wait before the hang watch names the rank that never
    came (a HangError). ``group_timeout``: the process group's own timeout, if it is to end a hang first.
    ``backend=None``: the ranks join no group, and ``fn(None, *args)`` joins one itself (no hang watch then).
    """
    import torch

    method = spawning.start_method()
    if method == "fork" and torch.cuda.is_initialized():
        raise WorkshopError("CUDA is already initialised in this kernel, and forked ranks cannot use it; "
                            "restart the kernel and call notebook_launch before any CUDA work, or use launch.torchrun")
    name = getattr(fn, "__name__", repr(fn))
    if method == "spawn":  # a fresh Python cannot import a function defined in a cell: it gets it by value
        fn, args = spawning.pack(fn, args, name), ()
    log_dir = tempfile.mkdtemp(prefix="notebook-launch-")
    world, threads = range(nprocs), os.environ.get("OMP_NUM_THREADS", "1")  # torchrun's variables, one node
    ranks = Ranks(_rank_main, {r: (fn, backend, group_timeout or timeout, hang_after, log_dir, *args) for r in world},
                  {r: launch_variables(r, nprocs, OMP_NUM_THREADS=threads) for r in world}, method,
                  {r: str(Path(log_dir) / f"rank{r}.log") for r in world})
    try:
        try:
            gc.freeze()  # the kernel's objects, garbage too, out of the forked ranks' collections (see ranks._run)
            ranks.start()  # from here to ranks.stop(), the stop button kills every rank, then raises (ranks.py)
            done = ranks.wait(functools.partial(_why_stop, ranks, time.monotonic() + timeout, log_dir, hang_after), 0.02)
        finally:
            ranks.stop()
            gc.unfreeze()
    except KeyboardInterrupt:  # the stop button, wherever it landed: every rank is gone by now
        raise KeyboardInterrupt(f"notebook_launch of {name} interrupted; every rank stopped") from None
    record = Path(log_dir) / "hang.json"
    if done == "timeout":
        raise LaunchTimeout(_report(name, [f"notebook_launch of {name} did not finish within {timeout:g}s"], log_dir),
                            [ends.timed_out(r) for r in range(nprocs)])
    if isinstance(done, str):  # the watch saves its block whole, after printing it
        raise HangError(_report(name, [f"the ranks hang: {done}"], log_dir), ends.waiting(hangreport.load(record)),
                        done, record)
    if done.failed:
        ended = _ended(Path(log_dir), done.failed)
        raise RanksFailed(_report(name, list(map(ends.summary, ended)), log_dir), ended)
    shown = _rank_logs(log_dir).get(0, "")
    if shown:
        print(shown, end="" if shown.endswith("\n") else "\n", flush=True)
    shutil.rmtree(log_dir, ignore_errors=True)
    values = [done.values[r] for r in sorted(done.values)]
    return [pickle.loads(v) for v in values] if method == "spawn" else values


def _why_stop(ranks: Ranks, deadline: float, log_dir: str, hang_after: float | None) -> str | None:
    """"timeout" once the time is up (where each rank was saved first, as ``diagnose`` shows it), or the watch's line
    once it has named a hang."""
    from workshop_lib.debug import stacks

    if time.monotonic() > deadline:
        (Path(log_dir) / "stacks.log").write_text(stacks.side_by_side(stacks.stacks(ranks.pids()), width=60))
        return "timeout"
    return hangreport.missing_rank(Path(log_dir) / "hang.json") if hang_after is not None else None


def _rank_logs(log_dir: str) -> dict[int, str]:
    """{rank: everything it printed}."""
    return {int(p.stem[4:]): p.read_text(errors="replace") for p in sorted(Path(log_dir).glob("rank*.log"))}


def _report(name: str, failures: list[str], log_dir: str) -> str:
    """The failed ranks, one line each, and the file with every rank's output (kept for reading)."""
    path = Path(log_dir) / "all.log"
    parts = [f"===== rank {rank}\n{text}" for rank, text in sorted(_rank_logs(log_dir).items())]
    stacks = Path(log_dir) / "stacks.log"
    if stacks.is_file():  # after a timeout: where every process was
        parts.append(f"===== stacks at the timeout\n{stacks.read_text(errors='replace')}")
    path.write_text("\n".join(parts))
    return "\n".join([f"notebook_launch of {name} failed:", *failures, f"every rank's output: {path}"])
