"""The one place that wraps torch.distributed's collectives: observers see each call enter and leave.

The hang watch (:mod:`workshop_lib.debug.hangwatch`) and the exercise checks
(:mod:`workshop_lib.checks.record`) both need to know which collective a rank is
in. Each registers an *observer* here, with :func:`observing` (a block) or
:func:`add` and :func:`remove`; while at least one is registered, every
collective in :data:`COLLECTIVES` (and ``torch.autograd.backward``, inside which
DDP's gradient all-reduce runs in C++) is wrapped once, and each observer's
``enter(op, args, kwargs)`` runs before the call and ``leave(token, error)``
after it, ``token`` being what ``enter`` returned. When the last observer goes,
torch's functions are put back (:func:`workshop_lib.debug.patching.patched`).

The wrappers are strictly call-through: torch's function gets the same
arguments, and its result or its error is the caller's. An observer that
raises is dropped (its ``failed(error)`` is called if it has one, else one
warning line goes to stderr); the call it was observing goes on as if unobserved.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Protocol

from workshop_lib.debug.patching import patched
from workshop_lib.errors import first_line

# The Python collectives wrapped (those present in this torch); _broadcast_coalesced (private) is what DDP calls in
# its constructor and, with buffers (BatchNorm), at the start of each forward.
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
               "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "send", "recv", "_broadcast_coalesced")
BACKWARD = "backward"  # the op name observers see for torch.autograd.backward


class Observer(Protocol):
    def enter(self, op: str, args: tuple, kwargs: dict) -> object: ...
    def leave(self, token: object, error: BaseException | None) -> None: ...


_observers: list[Observer] = []
_patches: contextlib.ExitStack | None = None


def _drop(observer: Observer, err: Exception) -> None:
    """``observer`` raised: stop telling it anything, and say so once."""
    remove(observer)
    failed = getattr(observer, "failed", None)
    try:
        if callable(failed):
            failed(err)
            return
    except Exception:  # its own report failed too: the line below says it
        pass
    print(f"warning: {type(observer).__name__} stopped observing torch.distributed's collectives "
          f"({type(err).__name__}: {first_line(err)})", file=sys.stderr, flush=True)


def _wrap(op: str, fn):
    @functools.wraps(fn)
    def collective(*args, **kwargs):
        seen = []
        for observer in list(_observers):
            try:
                seen.append((observer, observer.enter(op, args, kwargs)))
            except Exception as err:  # an observer must never change what the call does
                _drop(observer, err)
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            _left(seen, error)
            raise
        _left(seen, None)
        return result

    return collective


def _left(seen: list, error: BaseException | None) -> None:
    for observer, token in reversed(seen):
        if observer in _observers:
            try:
                observer.leave(token, error)
            except Exception as err:
                _drop(observer, err)


def add(observer: Observer) -> None:
    """Start telling ``observer`` about every collective; the first observer wraps torch's functions."""
    global _patches
    import torch
    import torch.distributed as dist

    if _patches is None:
        _patches = contextlib.ExitStack()
        for name in COLLECTIVES:
            if hasattr(dist, name):
                _patches.enter_context(patched(dist, name, functools.partial(_wrap, name)))
        _patches.enter_context(patched(torch.autograd, "backward", functools.partial(_wrap, BACKWARD)))
    _observers.append(observer)


def remove(observer: Observer) -> None:
    """Stop telling ``observer``; the last one to go puts torch's functions back. Unknown observers are ignored."""
    global _patches
    if observer in _observers:
        _observers.remove(observer)
    if not _observers and _patches is not None:
        patches, _patches = _patches, None
        patches.close()


@contextlib.contextmanager
def observing(observer: Observer) -> Iterator[Observer]:
    """``observer`` sees every collective while the block runs."""
    add(observer)
    try:
        yield observer
    finally:
        remove(observer)
