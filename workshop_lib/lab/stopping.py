"""How a launch from the kernel stops: the stop button, its time limit, a hang that the watch names.

:func:`notebook_launch <workshop_lib.lab.forklaunch.notebook_launch>` runs torch's elastic launcher in the
kernel's main thread; these contexts surround it. torch's launcher turns SIGINT (the stop button) into a
SignalException and then gives the ranks up to 30 s to leave: :func:`short_grace` makes that 2 s, since a
rank blocked in a collective or a store's wait runs no Python signal handler and would sit out the rest.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from workshop_lib.debug.patching import patched

GRACE = 2.0  # seconds a stopped rank gets to leave before SIGKILL (torch's launcher: 30)


@contextlib.contextmanager
def short_grace(seconds: float = GRACE) -> Iterator[None]:
    """During the block, torch's launcher gives stopped ranks ``seconds`` to leave, not 30 s, then kills them.

    Seen in the suite: a stop while one rank waited in its store for the other kept the cell busy 31 s.
    """
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    def make(original):
        def _shutdown(self, death_sig=signal.SIGTERM, timeout=30):
            return original(self, death_sig, timeout=min(timeout, seconds))

        return _shutdown

    with patched(LocalElasticAgent, "_shutdown", make):
        yield


@contextlib.contextmanager
def own_signal_handlers():
    """Give SIGINT and SIGTERM their handlers back after the launch, and lose no stop during it.

    torch's launcher installs its own (they turn the signal into a SignalException
    that stops the ranks) and leaves them in place: without this, the kernel's
    stop button would raise SignalException instead of KeyboardInterrupt ever after.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from torch.distributed.elastic.multiprocessing.api import SignalException

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    unraisable = sys.unraisablehook

    def keep(seen) -> None:
        # A stop that lands while the launcher forks a rank runs its handler inside an at-fork hook of the parent
        # (logging's _releaseLock), where Python drops the exception ("Exception ignored in ..."), and the launch
        # would go on: the watchdog's next tick raises it again.
        if isinstance(seen.exc_value, (KeyboardInterrupt, SignalException, TimeoutError, HangSeen)):
            _dropped.append(seen.exc_value)
            if _ticking and isinstance(seen.exc_value, TimeoutError | HangSeen):  # its tick stopped the timer
                signal.setitimer(signal.ITIMER_REAL, 0.5, 0.5)
        else:
            unraisable(seen)

    _dropped.clear()
    sys.unraisablehook = keep
    try:
        yield
    finally:
        sys.unraisablehook = unraisable
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def watchdog(seconds: float, what: str, before: Callable[[bool], None], hang: Callable[[], str | None] | None = None):
    """Raise TimeoutError after ``seconds``, or HangSeen once ``hang()`` names a hang; ``before(timed_out)`` first.

    It ticks twice a second: ``hang`` is polled, and an exception that Python dropped meanwhile (see
    :func:`own_signal_handlers`) is raised again. Main thread only; elsewhere no limit.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return
    deadline = time.monotonic() + seconds

    def tick(signum, frame):
        if _dropped:  # a stop (or a tick) that Python dropped while the launcher forked: now it counts
            raise _dropped.pop()
        now = time.monotonic()
        if now >= deadline:
            signal.setitimer(signal.ITIMER_REAL, 0)
            before(True)
            raise TimeoutError(f"{what} did not finish within {seconds:g}s")
        found = hang() if hang is not None else None
        if found:  # the watch saves its block whole, after printing it
            signal.setitimer(signal.ITIMER_REAL, 0)
            before(False)
            raise HangSeen(found)

    global _ticking
    old = signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, 0.5, 0.5)
    _ticking = True
    try:
        yield
    finally:
        _ticking = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class HangSeen(Exception):
    """Raised by the watchdog when a rank's log holds the hang watch's diagnosis."""


_dropped: list[BaseException] = []  # raised in an at-fork hook, where Python drops it: the watchdog raises it again
_ticking = False  # a _watchdog's timer is set
