"""Running a function defined in the notebook on N ranks, each with a ready process group.

:func:`notebook_launch` starts the ranks with torch's own elastic launcher (the
engine inside torchrun), and returns what each rank returned.

How the ranks start (:func:`start_method`): forked from the kernel on Linux (the
fastest: a rank inherits everything the kernel has imported and defined), spawned
elsewhere (macOS, where fork is unsafe, and Windows, which has none): a fresh
Python that gets the notebook's function, its arguments and what they use from
the notebook by value (cloudpickle, as loky and Ray ship functions), and sends
its result back the same way. ``WORKSHOP_START_METHOD=spawn`` forces spawn on
Linux: CI runs the notebooks so, the code path of macOS and Windows.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from workshop_lib.debug.patching import patched
from workshop_lib.errors import WorkshopError
from workshop_lib.lab import rank_logs, spawning, stopping
from workshop_lib.lab.launch import LaunchError
from workshop_lib.lab.processes import kill_tree
from workshop_lib.lab.spawning import start_method

# torch's launcher logs a failed rank's whole traceback to stderr ("E1202 ... api.py:836] ...");
# during a launch these loggers write to the launch's log file instead, which the error names.
_LAUNCHER_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
_KILL = getattr(signal, "SIGKILL", signal.SIGTERM)  # Windows has no SIGKILL: psutil's SIGTERM terminates there


class LaunchTimeout(LaunchError):
    """The ranks did not finish within the launch's timeout (and were killed); the message names the log file."""


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
    (Path(log_dir) / f"rank{launch.rank}.pid").write_text(str(os.getpid()))  # for _stop_ranks
    log = open(Path(log_dir) / f"rank{launch.rank}.log", "w", buffering=1)  # noqa: SIM115 (lives as long as the rank)
    os.dup2(log.fileno(), 1)  # C-level writes too (warnings from native code)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    shipped = isinstance(fn, bytes)
    if shipped:  # after the redirection: a function that cannot be rebuilt here says why in this rank's log
        fn, args = spawning.unpack(fn)
    # A forked rank must not resolve host names. If another thread of the kernel held glibc's resolver lock
    # at the fork (the launcher's TCP store serving the rank forked before), the child inherits it locked,
    # and its first getaddrinfo waits forever. So: a file store instead of TCP, and gloo on the loopback
    # interface by name (getifaddrs) instead of by this host's name (getaddrinfo).
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
    except BaseException:
        traceback.print_exc()  # into this rank's log: the error names the file
        raise
    finally:
        hangwatch.detach()  # its last answer: this rank left (a forked rank ends without running atexit)
        joining.leave()
        log.flush()


@contextlib.contextmanager
def _launcher_logs_to(path: Path):
    """Send torch's launcher loggers to ``path`` instead of the cell's stderr, for the duration of the block."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in _LAUNCHER_LOGGERS]
    saved = [(lg.propagate, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
        lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for lg, (propagate, level) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.propagate, lg.level = propagate, level
        handler.close()


def _hang_in_logs(log_dir: str) -> str | None:
    """One line from the hang watch's saved block (who waits where; who never arrived), once a watch has saved one."""
    from workshop_lib.debug import hangreport

    return hangreport.missing_rank(Path(log_dir) / "hang.json")


def notebook_launch(fn: Callable, nprocs: int = 2, *args, timeout: float = 120, backend: str = "gloo",
                    hang_after: float | None = None) -> list:
    """Run ``fn(env, *args)`` on ``nprocs`` ranks; return each rank's result, in rank order.

    torch's elastic launcher (the engine inside torchrun) starts the ranks (forked
    on Linux, else spawned with ``fn`` and ``args`` sent by value: :func:`start_method`) and
    hosts the rendezvous on a free local port; each rank then joins a process
    group (:func:`workshop_lib.lab.joining.join`) and gets its DistEnv. What the ranks print
    goes to per-rank log files; rank 0's output is shown after the run. A
    failure raises a LaunchError with one line per failed rank and the name of
    the file that holds every rank's output and the launcher's log.

    ``hang_after``: seconds a collective may wait before the ranks count as hung
    (:mod:`workshop_lib.debug.hangwatch` then names the rank that never arrived, and a
    HangError stops the launch early); None waits out ``timeout``.
    """
    import torch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    method = start_method()  # fork on Linux (WSL included); spawn on macOS and Windows, or where forced
    if method == "fork" and torch.cuda.is_initialized():
        raise WorkshopError("CUDA is already initialised in this kernel, and forked ranks cannot use it; "
                            "restart the kernel and call notebook_launch before any CUDA work, or use launch.torchrun")
    name = getattr(fn, "__name__", repr(fn))
    if method == "spawn":  # a fresh Python cannot import a function defined in a cell: it gets it by value
        fn, args = spawning.pack(fn, args, name), ()
        if os.name == "posix":  # spawn's helper process, started now: not one of this launch's, which a stop kills
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
    log_dir = tempfile.mkdtemp(prefix="notebook-launch-")
    # Port 0: the rendezvous store binds a free port itself (as torchrun --standalone does).
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"nb{os.getpid()}-{time.time_ns()}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=0.02, start_method=method)
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",)}
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the ranks inherit it
    before = _descendants()
    gc.freeze()  # the kernel's objects, garbage too, out of the forked ranks' collections (see _rank_main)
    try:
        with _launcher_logs_to(Path(log_dir) / "launcher.log"), \
                stopping.watchdog(timeout, f"notebook_launch of {name}", lambda timed_out: _stop_ranks(log_dir, timed_out),
                                  None if hang_after is None else lambda: _hang_in_logs(log_dir)), \
                stopping.own_signal_handlers(), stopping.short_grace(), _lean_rendezvous():
            results = elastic_launch(config, _rank_main)(fn, backend, timeout, hang_after, log_dir, *args)
    except ChildFailedError as err:
        raise LaunchError(rank_logs.failure_report(name, rank_logs.failures(err), log_dir)) from None
    except TimeoutError as err:
        raise LaunchTimeout(rank_logs.failure_report(name, [str(err)], log_dir)) from None
    except stopping.HangSeen as hang:
        raise HangError(rank_logs.failure_report(name, [f"the ranks hang: {hang}"], log_dir), str(hang),
                        Path(log_dir) / "hang.json") from None
    except SignalException:  # the stop button (SIGINT): the launcher stops the ranks it has registered
        _stop_new_descendants(before)  # and a press during start-up may leave one it had not registered yet
        raise KeyboardInterrupt(f"notebook_launch of {name} interrupted; every rank stopped") from None
    finally:
        gc.unfreeze()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
    rank_logs.show_rank0(log_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    return [spawning.unpack_result(results[r]) if method == "spawn" else results[r] for r in sorted(results)]


@contextlib.contextmanager
def _lean_rendezvous():
    """torch's rendezvous for one agent, without two costs that only matter to several nodes or to nobody.

    - The random 0-0.3 s it sleeps before its first round skews the agents of several nodes so that they do not
      reach the store at once; a notebook launch has one agent. The sleep was about 40% of a launch of 2 ranks
      here (0.4 s, 0.24 s without it). The fixed delays (1 s between polls of a rendezvous still forming) stay.
    - Each of its log records names the calling method through ``inspect.stack()``, which reads the source of
      every frame on the stack and searches ``sys.modules`` for each: about 9 records a launch, 14 ms each in a
      small process and more in a kernel or a test run, whose stacks are deep and whose modules are many. The
      same name comes from the frame itself.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def no_skew(original):
        return lambda seconds: None if isinstance(seconds, tuple) else original(seconds)

    def method_name(original):
        def get_method_name(depth: int = 2) -> str:  # torch's: inspect.stack()[depth].function
            try:
                return sys._getframe(depth).f_code.co_name
            except ValueError:  # a stack shallower than depth
                return "no_method_name"
        return get_method_name

    with patched(dynamic_rendezvous, "_delay", no_skew), patched(dynamic_rendezvous, "get_method_name", method_name):
        yield


def _descendants() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_new_descendants(before: set[int]) -> None:
    """Kill every process this kernel started since ``before`` (and what they started): none outlives a stop."""
    for pid in sorted(_descendants() - before):
        kill_tree(pid, grace=0, first=_KILL)


def _stop_ranks(log_dir: str, stacks: bool) -> None:
    """Before the launch is abandoned: record where each rank is stuck (on a timeout), then kill the ranks.

    The launcher would send SIGTERM and wait 30 s: a rank blocked inside a collective
    runs no Python signal handler, so it would sit out the whole grace period.
    """
    import psutil

    if stacks:
        rank_logs.dump_stacks(Path(log_dir) / "stacks.log")
    for pid_file in Path(log_dir).glob("rank*.pid"):
        with contextlib.suppress(ValueError, psutil.Error):
            pid = int(pid_file.read_text())
            if psutil.Process(pid).ppid() == os.getpid():  # still our child, not a recycled pid
                kill_tree(pid, grace=0, first=_KILL)
