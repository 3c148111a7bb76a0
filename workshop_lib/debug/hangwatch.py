"""Where is every rank when a collective hangs? A watch attached from outside, on gloo and nccl alike.

``python -m workshop_lib.watch script.py`` (:mod:`workshop_lib.watch`) calls :func:`attach`; the script holds
no line of it. Each rank reads its record of calls (:func:`workshop_lib.debug.collectives.calls`: the Python
collectives, ``loss.backward()`` inside which DDP all-reduces in C++, DDP's ``forward`` where it broadcasts the
buffers, ``init_process_group``), the one the checker's recorder keeps too where both run. A daemon thread answers
the other ranks through its own client of the rendezvous store; when a collective has waited ``threshold`` seconds,
or failed, the rank asks every rank where it is and prints one block
(:mod:`workshop_lib.debug.hangreport`). On CUDA (NCCL) a collective queued but not finished on the GPU within
``threshold`` is reported too. ``faulthandler`` on SIGUSR1 serves ``python -m workshop_lib.diagnose``. When the
watch fails it prints one ``hangwatch warning:`` line and the job runs on unwatched. The per-rank side is
:class:`~workshop_lib.debug.rankwatch.Watch`. The default threshold is a quarter of the group's timeout, at most a
minute (a minute with torch's default timeouts): the timeout the script passes to ``init_process_group``, in the
record when the watch attaches before the script runs, else torch's documented default
(:func:`rankwatch.default_threshold`). With it the block also says that a report is not a failure.
The rank that printed the block adds one line each time the wait doubles (:func:`rankwatch.report_at`).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import sys
import threading

import torch.distributed as dist

from workshop_lib.debug import collectives
from workshop_lib.debug.launchenv import read_launch_env
from workshop_lib.debug.rankwatch import WARNING, Watch, store_gone, warn
from workshop_lib.errors import WorkshopError, first_line

__all__ = ["AFTER_VARIABLE", "WARNING", "Watch", "attach", "detach", "install", "warn"]

AFTER_VARIABLE = "WORKSHOP_HANG_AFTER"  # seconds a collective may wait: the same as ``--after``

_watch: Watch | None = None
_record = contextlib.ExitStack()  # the watch's use of the rank's record of calls, until detach
_count = 0  # watches started in this process: each talks under its own prefix of the store


def _threshold(threshold: float | None) -> float | None:
    """``threshold``, else WORKSHOP_HANG_AFTER, else None (the watch's own: :func:`rankwatch.default_threshold`);
    ValueError if not > 0."""
    if threshold is None and os.environ.get(AFTER_VARIABLE):
        try:
            threshold = float(os.environ[AFTER_VARIABLE])
        except ValueError:
            raise ValueError(repr(os.environ[AFTER_VARIABLE])) from None
    if threshold is not None and not threshold > 0:
        raise ValueError(repr(threshold))
    return threshold


def attach(threshold: float | None = None, record: str | None = None, poll: float = 0.5) -> Watch | None:
    """Watch this process's collectives, through torchrun's store, once the script joins its group (not in a world
    of one). ``threshold``: seconds before the diagnosis (default WORKSHOP_HANG_AFTER, else a quarter of the group's
    timeout, from 5 s to a minute); ``record``: a JSON file for it too (default WORKSHOP_HANG_RECORD)."""
    try:
        launch = read_launch_env()
        threshold = _threshold(threshold)
    except WorkshopError as err:
        warn(f"{err}; the job runs unwatched")
        return None
    except ValueError as err:
        warn(f"{AFTER_VARIABLE} must be a number of seconds above 0, not {err}; the job runs unwatched")
        return None
    if launch.world_size < 2:
        return None
    return _start(Watch(threshold, poll, record, prefix=f"hangwatch/{launch.restart_count}/{_count + 1}"))


def install(store: dist.Store, threshold: float | None = None, poll: float = 0.5,
            record: str | None = None) -> Watch | None:
    """Watch this rank's collectives through ``store``, for a rank that has joined its group (the fork launcher's)."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return _start(Watch(_threshold(threshold), poll, record, store, prefix=f"hangwatch/{_count + 1}"))


def _stderr_fd() -> int:
    """stderr's file descriptor (2 where sys.stderr is not a file: a notebook's stream, a test's capture)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return 2


def _start(watch: Watch) -> Watch:
    global _watch, _count
    detach()
    _count += 1
    _watch = watch
    watch.calls = _record.enter_context(collectives.calls())
    watch.calls.followers.append(watch)
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        faulthandler.register(signal.SIGUSR1, file=_stderr_fd(), all_threads=True)  # kill -USR1 PID: the stacks
    if _count == 1:
        atexit.register(detach)  # the rank's last answer says it left, even when the script ends without a word
    watch.thread.start()
    return watch


def detach() -> None:
    """Stop the watch: the rank's last answer says it left, and torch.distributed's functions are torch's own again
    (unless a recorder still keeps the record)."""
    global _watch
    watch, _watch = _watch, None
    if watch is None:
        return
    watch.stop.set()
    if watch.thread.is_alive() and watch.thread is not threading.current_thread():
        watch.thread.join(timeout=2 * watch.poll + 1)
    if watch in watch.calls.followers:
        watch.calls.followers.remove(watch)
    _record.close()
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        faulthandler.unregister(signal.SIGUSR1)
    if watch.joined.is_set():
        try:
            watch.say_left(watch.main_store)
            if watch.hosts_store:
                watch.others_left(2 * watch.poll + 2)
        except Exception as err:
            if not store_gone(err):
                warn(f"rank {watch.rank} could not say that it left ({type(err).__name__}: {first_line(err)})")
