"""Running a function defined in the notebook on N forked ranks, each with a ready process group.

:func:`notebook_launch` starts the ranks with torch's own elastic launcher (the
engine inside torchrun), and returns what each rank returned.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from workshop_lib.errors import WorkshopError
from workshop_lib.launch import TAIL_LINES, LaunchError, free_port


def _rank_main(fn: Callable, backend: str, timeout: float, log_dir: str, *args):
    """What each forked rank runs: send its output to its own log, join the group, call ``fn(env, *args)``."""
    from workshop_lib import distributed

    # In a Jupyter kernel sys.stdout is the kernel's stream, which would relay every rank's
    # characters interleaved into the cell: each rank writes to its own file instead.
    rank = distributed.read_launch_env().rank
    log = open(Path(log_dir) / f"rank{rank}.log", "w", buffering=1)  # noqa: SIM115 (lives as long as the rank)
    os.dup2(log.fileno(), 1)  # C-level writes too (warnings from native code)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    env = distributed.setup(backend, timeout)
    try:
        return fn(env, *args)
    finally:
        distributed.teardown()
        log.flush()


@contextlib.contextmanager
def _alarm(seconds: float, what: str):
    """Raise TimeoutError after ``seconds`` (main thread only; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"{what} did not finish within {seconds:g}s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def notebook_launch(fn: Callable, nprocs: int = 2, *args, timeout: float = 120, backend: str = "gloo") -> list:
    """Run ``fn(env, *args)`` on ``nprocs`` forked ranks; return each rank's result, in rank order.

    torch's elastic launcher (the engine inside torchrun) forks the ranks and
    hosts the rendezvous on a free local port; each rank then joins a process
    group (``distributed.setup``) and gets its DistEnv. What the ranks print
    goes to per-rank log files; rank 0's stdout is shown after the run, and
    a failure shows the tail of every rank's output.
    """
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if torch.cuda.is_initialized():
        raise WorkshopError("CUDA is already initialised in this kernel, and forked ranks cannot use it; "
                            "restart the kernel and call notebook_launch before any CUDA work, or use launch.torchrun")
    log_dir = tempfile.mkdtemp(prefix="notebook-launch-")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"nb{os.getpid()}-{time.time_ns()}",
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0,
                          monitor_interval=0.1, start_method="fork")
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",)}
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the forked ranks inherit it
    try:
        with _alarm(timeout, f"notebook_launch of {getattr(fn, '__name__', fn)}"):
            results = elastic_launch(config, _rank_main)(fn, backend, timeout, log_dir, *args)
    except ChildFailedError as err:
        raise LaunchError(_rank_failure(_first_failure(err), log_dir)) from None
    except TimeoutError as err:
        raise LaunchError(_rank_failure(str(err), log_dir)) from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
    _show_rank0(log_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    return [results[r] for r in sorted(results)]


def _first_failure(err) -> str:
    """'rank R raised X: message' and the last traceback lines, from the launcher's error."""
    rank, failure = err.get_first_failure()
    msg = failure.message
    if isinstance(msg, dict):
        stack = msg.get("extraInfo", {}).get("py_callstack", "").strip().splitlines()
        where = next((s.strip() for s in reversed(stack) if s.strip().startswith("File ")), "")
        return f"rank {rank} raised {msg.get('message', '?')}" + (f" ({where})" if where else "")
    return f"rank {rank} failed with exit code {failure.exitcode}"


def _rank_logs(log_dir: str) -> dict[int, str]:
    """{rank: everything it printed}."""
    return {int(p.stem[4:]): p.read_text() for p in sorted(Path(log_dir).glob("rank*.log"))}


def _show_rank0(log_dir: str) -> None:
    text = _rank_logs(log_dir).get(0, "")
    if text:
        print(text, end="" if text.endswith("\n") else "\n", flush=True)


def _rank_failure(what: str, log_dir: str) -> str:
    lines = [f"[rank {rank}] {line}" for rank, text in sorted(_rank_logs(log_dir).items()) for line in text.splitlines()]
    if not lines:
        return f"notebook_launch failed: {what}"
    return f"notebook_launch failed: {what}. Last lines:\n" + "\n".join(lines[-TAIL_LINES:])
