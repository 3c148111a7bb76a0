"""The one way the lab starts ranks from Python: ``torch.multiprocessing.start_processes``, as accelerate does.

:func:`~workshop_lib.launching.forklaunch.notebook_launch` and the script checker (:mod:`workshop_lib.engine.runner`) use
:class:`Ranks`; a step script runs under torchrun (:mod:`workshop_lib.launching.launch`). The caller polls, so its time
limit is plain Python. The stop button is the launch's own (:class:`_StopButton`): from :meth:`Ranks.start` to
:meth:`Ranks.stop`, SIGINT kills every rank and raises KeyboardInterrupt in the caller, whatever SIGINT did in this
process before (a kernel's KeyboardInterrupt; SIG_DFL, which would kill the launcher and leave its ranks; SIG_IGN,
which a shell gives a command it starts with ``&``, and under which ``_thread.interrupt_main()`` does nothing).
A failed rank ends the others at once too. Both kill with SIGKILL: a rank blocked in a store or a collective runs
no signal handler, and ``ProcessContext.join`` would wait 30 s after SIGTERM.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.launching.processes import kill_tree
from workshop_lib.paths import write_atomic

_STOPS = (signal.SIGINT, signal.SIGTERM)
_KILL = getattr(signal, "SIGKILL", signal.SIGTERM)  # Windows has no SIGKILL: psutil's SIGTERM terminates there


class _StopButton:
    """SIGINT during a launch: every rank killed first, then a KeyboardInterrupt where the caller is, once.

    :meth:`take` makes SIGINT the launch's (the caller's handler is set aside), :meth:`give_back` restores it. While
    ranks are being started or reaped (:meth:`held`) SIGINT and SIGTERM are only noted, and honoured after the
    block, when every rank exists or none is left: a rank forked but not yet registered is never missed. A press
    after the one honoured asks for the stop already under way, and changes nothing. Signals reach the main thread
    only: from another thread the caller's handlers stay as they are.
    """

    def __init__(self, processes: list):
        self.processes = processes  # the launch's ranks, as they start
        self.caller: dict[int, object] = {}  # the caller's SIGINT handler while the launch has SIGINT
        self.holding, self.noted, self.honoured = False, [], False

    def take(self) -> None:
        if threading.current_thread() is threading.main_thread() and not self.caller:
            self.caller[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)

    def give_back(self) -> None:
        if self.caller:
            _restore(signal.SIGINT, self.caller.pop(signal.SIGINT))

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        saved = {sig: signal.signal(sig, self._on_signal) for sig in _STOPS}
        self.holding = True
        try:
            yield
        finally:
            for sig, handler in saved.items():  # before holding ends: a press in between is noted, then honoured
                _restore(sig, handler)
            self.holding = False
        noted, self.noted = dict.fromkeys(self.noted), []  # (an error in the block: noted until the next hold ends)
        for sig in noted:
            self._honour(sig)

    def _on_signal(self, signum: int, frame) -> None:
        if self.holding:
            self.noted.append(signum)
        else:
            self._honour(signum)

    def _honour(self, signum: int) -> None:
        if signum != signal.SIGINT:  # SIGTERM, noted while held: to the caller's own handler, back in place
            signal.raise_signal(signum)
        elif not self.honoured:
            self.honoured = True
            try:
                _kill(self.processes)  # before anything else runs: the KeyboardInterrupt may land anywhere in the caller
            finally:
                self.give_back()
            raise KeyboardInterrupt


def _kill(processes: list) -> None:
    for p in processes:
        if p.exitcode is None:
            kill_tree(p.pid, grace=0, first=_KILL)


def _restore(sig: int, handler) -> None:
    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # None: set outside Python


def _run(index: int, entry: Callable, args: dict[int, tuple], envs: dict[int, dict[str, str]], folder: str,
         logs: dict[int, str] | None) -> None:
    """What each rank runs: its variables, its output into its own log (``logs``), ``entry(*args[index])``, its result
    into ``folder`` (pickled)."""
    # Objects inherited from the parent are the parent's: were this rank's garbage collector to free a cycle of them
    # (an earlier launch's store, agent or process group, held by a traceback), their C++ destructors would run here,
    # without the threads they belong to, and crash the rank (a SIGSEGV "Garbage-collecting", seen).
    gc.freeze()
    for sig in _STOPS:  # a forked rank inherits the launcher's held stop: here a stop ends it as it would any program
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    os.environ.update(envs[index])
    # A forked rank resolves no host name (another thread's lock on glibc's resolver is inherited held: forklaunch's
    # store): gloo on the loopback interface by name, not by this host's name (all ranks are on this machine).
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)  # Windows: gloo's own choice
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    if logs:  # in a Jupyter kernel sys.stdout relays every rank's characters, interleaved, into the cell
        log = open(logs[index], "a", buffering=1)  # noqa: SIM115 (lives as long as the rank)
        os.dup2(log.fileno(), 1)  # C-level writes too (warnings from native code)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        if faulthandler.is_enabled():  # a fatal error's dump into this rank's log, not the fd the parent gave it
            faulthandler.enable(file=log)
    write_atomic(Path(folder, f"result{index}"), pickle.dumps(entry(*args[index])))  # poll sees it whole or not


@dataclass
class Result:
    """How the ranks ended: each one's return value (all returned), or the ranks that did not return."""

    values: dict[int, object] = field(default_factory=dict)
    failed: dict[int, int | None] = field(default_factory=dict)  # rank: exit code (negative: the signal)


class Ranks:
    """``entry(*args[r])`` in ``len(args)`` processes, ``envs[r]`` added to each one's environment, its output into
    the file ``logs[r]`` (if given).

    Call :meth:`start` inside the ``try`` whose ``finally`` calls :meth:`stop`: the stop button's span (module docstring).
    """

    def __init__(self, entry: Callable, args: dict[int, tuple], envs: dict[int, dict[str, str]], method: str,
                 logs: dict[int, str] | None = None):
        self.entry, self.args, self.envs, self.method, self.logs = entry, args, envs, method, logs
        self._processes: list = []
        self._context = None
        self._dir = tempfile.mkdtemp(prefix="ranks-")  # each rank's result
        self._button = _StopButton(self._processes)  # not self: no cycle keeps a dropped launch's pipes open

    def start(self) -> None:
        import torch.multiprocessing as mp

        self._button.take()
        with self._button.held():  # a press during the forks: honoured once every rank is known
            self._context = mp.start_processes(_run, (self.entry, self.args, self.envs, self._dir, self.logs),
                                               len(self.args), join=False, start_method=self.method)
            self._processes[:] = self._context.processes

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

    def wait(self, why_stop: Callable[[], str | None], every: float) -> Result | str:
        """Poll every ``every`` s until the ranks are done (how they ended) or ``why_stop()`` names a reason to stop
        them (then they are killed, and the reason returned)."""
        while (done := self.poll()) is None:
            if reason := why_stop():
                self.stop()
                return reason
            time.sleep(every)
        return done

    def stop(self) -> None:
        """Kill the ranks that are left, and what they started, reap them, give SIGINT back; safe to call twice."""
        with self._button.held():  # a press now is honoured after the reaping, not in the middle of it
            _kill(self._processes)
            for p in self._processes:
                p.join(timeout=10)
            if self._context is not None:
                for path in self._context.error_files:  # torch's, written where a rank raised
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            shutil.rmtree(self._dir, ignore_errors=True)
        self._button.give_back()
