"""The one way the lab starts ranks from Python: ``torch.multiprocessing.start_processes``, as accelerate does.

:func:`~workshop_lib.lab.forklaunch.notebook_launch` and the script checker (:mod:`workshop_lib.checks.runner`) use
:class:`Ranks`; a step script runs under torchrun (:mod:`workshop_lib.lab.launch`). The caller polls, so its time
limit and the stop button are plain Python. Two things torch leaves to its caller are done here: a stop during the
start is held until every rank exists, and a failed rank ends the others at once (SIGKILL: a rank blocked in a
collective runs no signal handler, and ``ProcessContext.join`` would wait 30 s after SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.lab.processes import kill_tree

_STOPS = (signal.SIGINT, signal.SIGTERM)
_KILL = getattr(signal, "SIGKILL", signal.SIGTERM)  # Windows has no SIGKILL: psutil's SIGTERM terminates there


@contextlib.contextmanager
def _stops_held() -> Iterator[list[int]]:
    """During the block a stop is only noted (in the list yielded); the caller's handlers are back after it."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield []
        return
    seen: list[int] = []
    saved = {sig: signal.signal(sig, lambda signum, frame: seen.append(signum)) for sig in _STOPS}
    try:
        yield seen
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _run(index: int, entry: Callable, args: dict[int, tuple], envs: dict[int, dict[str, str]], folder: str) -> None:
    """What each rank runs: its variables, ``entry(*args[index])``, its result into ``folder`` (pickled)."""
    for sig in _STOPS:  # a forked rank inherits the held-stop handler: a stop ends it as it would any program
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    os.environ.update(envs[index])
    result = entry(*args[index])
    Path(folder, f"result{index}.tmp").write_bytes(pickle.dumps(result))
    os.replace(Path(folder, f"result{index}.tmp"), Path(folder, f"result{index}"))


@dataclass
class Result:
    """How the ranks ended: each one's return value (all returned), or the ranks that did not return."""

    values: dict[int, object] = field(default_factory=dict)
    failed: dict[int, int | None] = field(default_factory=dict)  # rank: exit code (negative: the signal)


class Ranks:
    """``entry(*args[r])`` in ``len(args)`` processes, ``envs[r]`` added to each one's environment.

    Call :meth:`start` inside the ``try`` whose handler calls :meth:`stop`: a stop during the start reaches the
    caller once every rank exists, and the handler then finds them all.
    """

    def __init__(self, entry: Callable, args: dict[int, tuple], envs: dict[int, dict[str, str]], method: str):
        self.entry, self.args, self.envs, self.method = entry, args, envs, method
        self._processes: list = []
        self._context = None
        self._dir = tempfile.mkdtemp(prefix="ranks-")  # each rank's result

    def start(self) -> None:
        import torch.multiprocessing as mp

        with _stops_held() as stopped:
            self._context = mp.start_processes(_run, (self.entry, self.args, self.envs, self._dir), len(self.args),
                                               join=False, start_method=self.method)
            self._processes = list(self._context.processes)
        for sig in stopped:  # now that every rank exists: to the caller's own handler (the stop button: KeyboardInterrupt)
            signal.raise_signal(sig)

    def pids(self) -> dict[int, int]:
        return {r: p.pid for r, p in enumerate(self._processes)}

    def poll(self) -> Result | None:
        """How they ended, once every rank returned or one did not (the others are then killed); else None."""
        ended = {r: p.exitcode for r, p in enumerate(self._processes) if p.exitcode is not None}
        failed = {r: code for r, code in ended.items() if not Path(self._dir, f"result{r}").exists()}
        if failed:
            self.stop()
            return Result(failed=failed)
        if len(ended) < len(self._processes):
            return None
        return Result(values={r: pickle.loads(Path(self._dir, f"result{r}").read_bytes()) for r in ended})

    def stop(self) -> None:
        """Kill the ranks that are left, and what they started, and reap them; safe to call twice."""
        for p in self._processes:
            if p.exitcode is None:
                kill_tree(p.pid, grace=0, first=_KILL)
        for p in self._processes:
            p.join(timeout=10)
        if self._context is not None:
            for path in self._context.error_files:  # torch's, written where a rank raised
                with contextlib.suppress(OSError):
                    os.unlink(path)
        shutil.rmtree(self._dir, ignore_errors=True)


def lab_env(rank: int, world_size: int, **extra: str) -> dict[str, str]:
    """The variables torchrun gives a worker that the lab's ranks need (one node), plus ``extra``."""
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
           "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.update(extra)
    return env
