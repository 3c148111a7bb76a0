"""The one way the lab starts ranks from Python: ``torch.multiprocessing.start_processes``.

:func:`notebook_launch <workshop_lib.lab.forklaunch.notebook_launch>` (a notebook's function on N ranks) and the
script checker (:mod:`workshop_lib.checks.runner`, a learner's script on 2 ranks) both start their ranks with
:class:`Ranks`, as accelerate's ``notebook_launcher`` does: each rank gets the variables torchrun would give it
(:func:`lab_env`). A step script runs as learners run it, under ``torchrun`` (:mod:`workshop_lib.lab.launch`).

The caller polls (:meth:`Ranks.poll`) in its own loop, so its time limit, a hang the watch has named and the stop
button (a KeyboardInterrupt in that loop) are plain Python, in the main thread, on every system. Two things are
done here that torch leaves to its caller:

- A stop (SIGINT, SIGTERM) that comes while the ranks are being started is held until they all exist (a handler
  that only notes it), then sent again to the caller's handler: raised inside a fork, Python could drop it, or
  leave a rank that nobody knows of.
- A rank that failed ends the others at once (SIGKILL): a rank blocked in a collective or a store's wait runs no
  Python signal handler, and ``ProcessContext.join`` would give it 30 s after SIGTERM.
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

    def is_failed(self) -> bool:
        return bool(self.failed)


class Ranks:
    """``entry(*args[r])`` in ``len(args)`` processes, with ``envs[r]`` added to each one's environment.

    Create it, then :meth:`start` inside the ``try`` whose handler calls :meth:`stop`: a stop that comes during the
    start reaches the caller once every rank exists, and the handler then finds them all.
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
