"""Where is every rank when a collective hangs? A watch attached from outside, on gloo and nccl alike.

A collective returns only when every rank of the group has entered it. When
one rank never does (it skipped it, it is somewhere else, it died), the others
wait until the process group's timeout and then fail with a message about
sockets. The watch makes the wait legible. It attaches from outside, as
cProfile does: ``python -m workshop_lib.watch script.py`` (:mod:`workshop_lib.watch`,
which calls :func:`attach`); the script holds no line of it.

* each rank records the collective it is in and the last one it finished (the
  op, its tensors' shapes and dtypes, and a per-rank sequence number), as an
  observer of :mod:`workshop_lib.debug.collectives` (call-through wrappers of
  ``torch.distributed``'s Python collectives); DDP's gradient all-reduce runs in
  C++ inside ``loss.backward()``, so for it the watch notices a backward that
  does not return;
* a daemon thread waits for the script's default process group, then answers
  questions through its own client of the rendezvous store (TCP, independent of
  the gloo or nccl connections that are stuck);
* when a rank has waited ``threshold`` seconds, or its collective fails, it asks
  every rank where it is (its main thread's Python stack) and prints one block
  (:mod:`workshop_lib.debug.hangreport`): who never arrived, where each rank is
  instead, and the first collective where the ranks' sequences differ;
* when the script's group is gone (``destroy_process_group``), or the process
  ends, the rank's last answer says that it left, so a rank still waiting names it.

It replaces no function of the script's in a way that changes what it does
(``destroy_process_group`` is torch's own), and when it fails it prints one
``hangwatch warning:`` line on stderr and the job runs on unwatched. The one
failure it keeps quiet is the expected one: the store gone at the end of the job.

On CUDA tensors (NCCL) a collective returns once it is queued on the GPU; the
watch records a CUDA event after it, and a collective whose event has not
completed within ``threshold`` is reported as waiting on the GPU. It also
registers ``faulthandler`` on SIGUSR1 (``kill -USR1 PID`` dumps every thread's
stack to the rank's stderr) for ``python -m workshop_lib.diagnose``. A job that
does not hang pays one store round-trip per ``poll`` seconds on a side thread and
about 15 µs per observed collective (``benchmarks/hangwatch_overhead.py``: no measurable change in a step).

The watch's per-rank side, its thread and the diagnosis, is :class:`~workshop_lib.debug.rankwatch.Watch`.
Of torch's private names it reads one, behind :func:`workshop_lib.debug.private.group_timeout`:
the default group's timeout, for the default threshold (a quarter of it; 30 min is
assumed where it cannot be read, and ``--after`` avoids the read). It observes
one, ``torch.distributed._broadcast_coalesced``, through the same call-through
wrapper as the public collectives: DDP's constructor and, with buffers
(BatchNorm), each forward broadcast through it, and a rank that never joins such
a broadcast is a classic hang.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import threading

import torch.distributed as dist

from workshop_lib.debug import collectives
from workshop_lib.debug.calls import Call
from workshop_lib.debug.hangreport import RECORD_VARIABLE
from workshop_lib.debug.launchenv import read_launch_env
from workshop_lib.debug.rankwatch import WARNING, Watch, store_gone, warn
from workshop_lib.errors import WorkshopError, first_line

__all__ = ["AFTER_VARIABLE", "WARNING", "Call", "Watch", "attach", "detach", "install", "uninstall", "warn"]

AFTER_VARIABLE = "WORKSHOP_HANG_AFTER"  # seconds a collective may wait: the same as ``--after``

_watch: Watch | None = None
_count = 0  # watches started in this process: each talks under its own prefix of the store


def _threshold(threshold: float | None) -> float | None:
    """``threshold``, else WORKSHOP_HANG_AFTER, else None (a quarter of the group's timeout); ValueError if not > 0."""
    if threshold is None and os.environ.get(AFTER_VARIABLE):
        try:
            threshold = float(os.environ[AFTER_VARIABLE])
        except ValueError:
            raise ValueError(repr(os.environ[AFTER_VARIABLE])) from None
    if threshold is not None and not threshold > 0:
        raise ValueError(repr(threshold))
    return threshold


def attach(threshold: float | None = None, record: str | None = None, poll: float = 0.5) -> Watch | None:
    """Watch this process's collectives from now on, for a script that has not joined its group yet.

    The watch waits (on its own thread) for the default process group, then talks
    through its own client of torchrun's rendezvous store (MASTER_ADDR:MASTER_PORT,
    under a prefix per restart). ``threshold``: seconds a collective may wait before
    the diagnosis is printed (default: the environment's WORKSHOP_HANG_AFTER, else a
    quarter of the group's timeout, at least 5). ``record``: a JSON file where the
    diagnosis is also saved (:func:`workshop_lib.debug.hangreport.load`; default:
    WORKSHOP_HANG_RECORD, else none). Does nothing in a world of one (no torchrun
    variables, or WORLD_SIZE=1). :func:`detach` stops it; so does the process's end.
    """
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
    return _start(Watch(threshold, poll, record or os.environ.get(RECORD_VARIABLE) or None,
                        prefix=f"hangwatch/{launch.restart_count}/{_count + 1}"))


def install(store: dist.Store, threshold: float | None = None, poll: float = 0.5,
            record: str | None = None) -> Watch | None:
    """Watch this rank's collectives, talking through ``store``: for code that holds a store and has joined a group.

    (The lab's fork launcher: its ranks join on a FileStore.) The arguments are
    :func:`attach`'s. Does nothing in a world of one.
    """
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return _start(Watch(_threshold(threshold), poll, record or os.environ.get(RECORD_VARIABLE) or None, store,
                        prefix=f"hangwatch/{_count + 1}"))


def _stderr_fd() -> int:
    """The file descriptor of stderr (2 where sys.stderr is not a file: a notebook's stream, a test's capture)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return 2


def _start(watch: Watch) -> Watch:
    global _watch, _count
    detach()
    _count += 1
    _watch = watch
    collectives.add(watch)
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        faulthandler.register(signal.SIGUSR1, file=_stderr_fd(), all_threads=True)  # kill -USR1 PID: the stacks
    if _count == 1:
        atexit.register(detach)  # the rank's last answer says it left, even when the script ends without a word
    watch.thread.start()
    return watch


def detach() -> None:
    """Stop the watch: the rank's last answer says it left, and torch.distributed's functions are torch's own again."""
    global _watch
    watch, _watch = _watch, None
    if watch is None:
        return
    watch.stop.set()
    if watch.thread.is_alive() and watch.thread is not threading.current_thread():
        watch.thread.join(timeout=2 * watch.poll + 1)
    collectives.remove(watch)
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


uninstall = detach  # the name the checks use
