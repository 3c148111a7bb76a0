"""Running a function defined in the notebook on N ranks, each with a ready process group.

:func:`notebook_launch` starts the ranks with ``torch.multiprocessing.start_processes``
(through :class:`workshop_lib.lab.ranks.Ranks`, the lab's one way to start ranks), and
returns what each rank returned.

How the ranks start (:func:`start_method`): forked from the kernel on Linux (the
fastest: a rank inherits everything the kernel has imported and defined), spawned
elsewhere (macOS, where fork is unsafe, and Windows, which has none): a fresh
Python that gets the notebook's function, its arguments and what they use from
the notebook by value (cloudpickle, as loky and Ray ship functions), and sends
its result back the same way. ``WORKSHOP_START_METHOD=spawn`` forces spawn on
Linux: CI runs the notebooks so, the code path of macOS and Windows.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from workshop_lib.errors import WorkshopError
from workshop_lib.lab import rank_logs, spawning
from workshop_lib.lab.launch import LaunchError
from workshop_lib.lab.ranks import Ranks, lab_env
from workshop_lib.lab.spawning import start_method


class LaunchTimeout(LaunchError):
    """The ranks did not finish within the launch's timeout (and were killed); the message names the log file."""


class RanksFailed(LaunchError):
    """A rank raised or died: ``failures``, a line per failed rank; ``details``, torch's whole message of each raise."""

    def __init__(self, message: str, failures: list[str], details: list[str]):
        super().__init__(message)
        self.failures, self.details = failures, details


class HangError(LaunchError):
    """The ranks hang in a collective that one of them never joined; ``diagnosis`` says who and where, in one line.

    ``record``: the file where the hang watch saved its block (:func:`workshop_lib.debug.hangreport.load`).
    """

    def __init__(self, message: str, diagnosis: str, record: Path | None = None):
        super().__init__(message)
        self.diagnosis, self.record = diagnosis, record


def _rank_main(fn: Callable | bytes, backend: str, timeout: float, hang_after: float | None, log_dir: str, *args):
    """What each rank runs: send its output to its own log, join the group, call ``fn(env, *args)``.

    A spawned rank gets ``fn`` as bytes (:func:`workshop_lib.lab.spawning.pack`: the function, its arguments
    and the notebook's source lines), and returns its result by value too.
    """
    # Objects inherited from the kernel are the kernel's: were this rank's garbage collector to free a cycle of
    # them (an earlier launch's store, agent or process group, held by a traceback), their C++ destructors would
    # run here, without the threads they belong to, and crash the rank (a SIGSEGV "Garbage-collecting", seen).
    gc.freeze()
    import torch.distributed as dist

    from workshop_lib.debug import hangwatch
    from workshop_lib.debug.launchenv import read_launch_env
    from workshop_lib.lab import joining

    # In a Jupyter kernel sys.stdout is the kernel's stream, which would relay every rank's
    # characters interleaved into the cell: each rank writes to its own file instead.
    launch = read_launch_env()
    log = open(Path(log_dir) / f"rank{launch.rank}.log", "w", buffering=1)  # noqa: SIM115 (lives as long as the rank)
    os.dup2(log.fileno(), 1)  # C-level writes too (warnings from native code)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    shipped = isinstance(fn, bytes)
    if shipped:  # after the redirection: a function that cannot be rebuilt here says why in this rank's log
        fn, args = spawning.unpack(fn)
    # A forked rank must not resolve host names. If another thread of the kernel held glibc's resolver lock
    # at the fork, the child inherits it locked, and its first getaddrinfo waits forever. So: a file store
    # instead of TCP, and gloo on the loopback interface by name (getifaddrs), not by this host's name.
    # (All ranks are on this machine, so a file store and the loopback serve a spawned rank as well.)
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)  # Windows: gloo's own choice
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    store = dist.FileStore(str(Path(log_dir) / "store"), launch.world_size)
    env = joining.join(backend, timeout, store=store)
    if hang_after is not None:  # a collective waiting this long: the watch writes who never arrived into the log
        hangwatch.install(store, threshold=hang_after, poll=0.25, record=str(Path(log_dir) / "hang.json"))
    try:
        result = fn(env, *args)
        return spawning.pack_result(result) if shipped else result
    except BaseException as err:
        traceback.print_exc()  # into this rank's log: the error names the file
        rank_logs.record_failure(log_dir, launch.rank, err)  # its one line, for the launch's error
        raise
    finally:
        hangwatch.detach()  # its last answer: this rank left (a forked rank ends without running atexit)
        joining.leave()
        log.flush()


def _hang_in_logs(log_dir: str) -> str | None:
    """One line from the hang watch's saved block (who waits where; who never arrived), once a watch has saved one."""
    from workshop_lib.debug import hangreport

    return hangreport.missing_rank(Path(log_dir) / "hang.json")


def notebook_launch(fn: Callable, nprocs: int = 2, *args, timeout: float = 120, backend: str = "gloo",
                    hang_after: float | None = None, group_timeout: float | None = None) -> list:
    """Run ``fn(env, *args)`` on ``nprocs`` ranks; return each rank's result, in rank order.

    ``torch.multiprocessing.start_processes`` (:class:`workshop_lib.lab.ranks.Ranks`) starts the ranks, forked on
    Linux, else spawned with ``fn`` and ``args`` sent by value (:func:`start_method`), with the variables torchrun
    would set; each rank then joins a process group (:func:`workshop_lib.lab.joining.join`) and gets its DistEnv.
    What the ranks print goes to per-rank log files; rank 0's output is shown after the run. A failure raises a
    LaunchError with one line per failed rank and the name of the file that holds every rank's output. The stop
    button stops every rank at once.

    ``hang_after``: seconds a collective may wait before the ranks count as hung
    (:mod:`workshop_lib.debug.hangwatch` then names the rank that never arrived, and a
    HangError stops the launch early); None waits out ``timeout``. ``group_timeout``: the process group's own
    timeout, when it is to end a hang before ``timeout`` does (torch's error then says where each rank waited).
    """
    import torch

    method = start_method()  # fork on Linux (WSL included); spawn on macOS and Windows, or where forced
    if method == "fork" and torch.cuda.is_initialized():
        raise WorkshopError("CUDA is already initialised in this kernel, and forked ranks cannot use it; "
                            "restart the kernel and call notebook_launch before any CUDA work, or use launch.torchrun")
    name = getattr(fn, "__name__", repr(fn))
    if method == "spawn":  # a fresh Python cannot import a function defined in a cell: it gets it by value
        fn, args = spawning.pack(fn, args, name), ()
    log_dir = tempfile.mkdtemp(prefix="notebook-launch-")
    ranks = Ranks(_rank_main, {r: (fn, backend, group_timeout or timeout, hang_after, log_dir, *args)
                               for r in range(nprocs)}, {r: lab_env(r, nprocs) for r in range(nprocs)}, method)
    gc.freeze()  # the kernel's objects, garbage too, out of the forked ranks' collections (see _rank_main)
    try:
        ranks.start()
        done = _wait(ranks, name, timeout, log_dir, hang_after)
    except KeyboardInterrupt:  # the stop button (the ranks are stopped below)
        raise KeyboardInterrupt(f"notebook_launch of {name} interrupted; every rank stopped") from None
    finally:
        ranks.stop()
        gc.unfreeze()
    if done.is_failed():
        lines = rank_logs.failures(log_dir, done)
        raise RanksFailed(rank_logs.failure_report(name, lines, log_dir), lines, rank_logs.details(log_dir))
    rank_logs.show_rank0(log_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    return [spawning.unpack_result(done.values[r]) if method == "spawn" else done.values[r] for r in sorted(done.values)]


def _wait(ranks: Ranks, name: str, timeout: float, log_dir: str, hang_after: float | None):
    """Poll the ranks until they are done, the time is up, or the watch has named a hang (then stop them)."""
    deadline = time.monotonic() + timeout
    while (done := ranks.poll()) is None:
        if time.monotonic() > deadline:
            rank_logs.dump_stacks(Path(log_dir) / "stacks.log")  # where each rank was, before they are killed
            ranks.stop()
            raise LaunchTimeout(rank_logs.failure_report(name, [f"notebook_launch of {name} did not finish within "
                                                                f"{timeout:g}s"], log_dir))
        hang = _hang_in_logs(log_dir) if hang_after is not None else None
        if hang:  # the watch saves its block whole, after printing it
            ranks.stop()
            raise HangError(rank_logs.failure_report(name, [f"the ranks hang: {hang}"], log_dir), hang,
                            Path(log_dir) / "hang.json")
        time.sleep(0.02)
    return done


