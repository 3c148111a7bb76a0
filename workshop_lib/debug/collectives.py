"""The one place that wraps torch.distributed's collectives: observers see each call enter and leave.

The hang watch and the checks register observers (:func:`observing`, or :func:`add` and :func:`remove`). While
one is registered, each of :data:`COLLECTIVES`, ``torch.autograd.backward`` (DDP's gradient all-reduce runs in
it, in C++) and ``DistributedDataParallel.forward`` where it broadcasts the buffers first (:func:`ddp_broadcasts`)
is wrapped, call-through (``unittest.mock.patch.object``): ``enter(op, args, kwargs)`` runs before,
``leave(token, error)`` after; for an observer with ``waited(token, error)``, an async call's work handle comes back
wrapped (:class:`Handle`) and tells it when the caller waits on it. An observer that raises is dropped (its
``failed(error)``, else one warning line); the call goes on as if unobserved. :func:`facts` is the one description of
what a call was given (its tensors' dtype, shape and device; the ReduceOp; async_op), for every observer.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Protocol
from unittest import mock

from workshop_lib.errors import first_line

# The Python collectives wrapped (those present in this torch)
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
               "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "send", "recv")
BACKWARD = "backward"  # the op name observers see for torch.autograd.backward
DDP_FORWARD = "DDP.forward"  # DistributedDataParallel.forward, observed where it broadcasts the buffers first


def first_difference(sequences: Mapping[int, Sequence[Hashable]]) -> int | None:
    """Where the ranks' sequences of calls part: the first position (0-based) where they differ, or where one rank
    has no more; None if all agree. The one such function: the checker, the hang watch and 05's figure use it."""
    longest = max((len(s) for s in sequences.values()), default=0)
    for i in range(longest):
        if len({s[i] if i < len(s) else None for s in sequences.values()}) > 1:
            return i
    return None


def tensors_of(args: tuple, kwargs: dict):
    """The call's first tensor, or first list of tensors (all_gather's output), among its arguments; else None."""
    import torch

    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) or (isinstance(a, list | tuple) and a and all(isinstance(t, torch.Tensor)
                                                                                      for t in a)):
            return a
    return None


@functools.cache
def _signature(op: str) -> inspect.Signature | None:
    import torch.distributed as dist

    return inspect.signature(getattr(dist, op)) if op in COLLECTIVES and hasattr(dist, op) else None


def facts(op: str, args: tuple, kwargs: dict) -> dict:
    """What a call was given: its first tensor's ``dtype``, ``shape`` and ``device`` (of a list's first, and ``count``
    the list's length; None for one tensor), the ReduceOp given (``op``: "SUM", "AVG" ...; None where left to its
    default, SUM) and ``async_op``. The record's collective events and the hang watch's calls both say it."""
    signature = _signature(op)
    try:
        given = signature.bind(*args, **kwargs).arguments if signature is not None else {}
    except TypeError:  # torch's own error says so when the call runs
        given = {}
    found = tensors_of(args, kwargs)
    first = found[0] if isinstance(found, list | tuple) else found
    reduce_op = given.get("op")
    return {"op": str(reduce_op).rsplit(".", 1)[-1] if reduce_op is not None else None,
            "async_op": bool(given.get("async_op", False)),
            "dtype": str(first.dtype).removeprefix("torch.") if first is not None else None,
            "shape": list(first.shape) if first is not None else None,
            "device": first.device.type if first is not None else None,
            "count": len(found) if isinstance(found, list | tuple) else None}


def said(fact: dict) -> str:
    """``facts`` as a report says them: "float32[3]", "2 tensors, first float32[3]", "no tensor"."""
    if fact["dtype"] is None:
        return "no tensor"
    one = f"{fact['dtype']}{fact['shape']}"
    return one if fact["count"] is None else f"{fact['count']} tensors, first {one}"


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


def ddp_broadcasts(ddp) -> str | None:
    """What DDP's forward broadcasts before it runs the module, or None: its buffers (rank 0's, outside ``Join``)
    where ``will_sync_module_buffers()`` and no buffer hook replaces it (torch 2.13's ``_check_sync_bufs_pre_fwd``).

    The constructor's broadcast is not observed: most of the constructor's time is imports, not waiting.
    """
    if not ddp.will_sync_module_buffers() or getattr(ddp, "buffer_hook", None) is not None:
        return None
    return f"broadcasts {len(ddp.modules_buffers)} buffers"


def _wrap(op: str, fn):
    @functools.wraps(fn)
    def collective(*args, **kwargs):
        if op == DDP_FORWARD:
            try:
                quiet = ddp_broadcasts(args[0]) is None
            except Exception:  # a torch without these public names: the forward goes unobserved
                quiet = True
            if quiet:
                return fn(*args, **kwargs)
        seen = []
        for observer in list(_observers):
            try:
                seen.append((observer, observer.enter(op, args, kwargs)))
            except Exception as err:  # an observer must never change what the call does
                _drop(observer, err)
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            _tell(seen, "leave", error)
            raise
        _tell(seen, "leave", None)
        waiting = [(observer, token) for observer, token in seen if hasattr(observer, "waited")]
        # torch's own callers keep their handle: DDP under Join hands it to its C++ reducer, which takes a Work only
        if waiting and result is not None and op in COLLECTIVES and not _from_torch(sys._getframe(1)):
            import torch.distributed as dist

            if isinstance(result, dist.Work):
                return Handle(result, waiting)
        return result

    return collective


def _from_torch(frame) -> bool:
    """Whether ``frame`` is in torch's own code (torch.nn.parallel, torch.distributed.algorithms.join, ...)."""
    name = frame.f_globals.get("__name__", "")
    return name == "torch" or name.startswith("torch.")


def _tell(seen: list, method: str, error: BaseException | None) -> None:
    for observer, token in reversed(seen):
        if observer in _observers:
            try:
                getattr(observer, method)(token, error)
            except Exception as err:
                _drop(observer, err)


class Handle:
    """An async collective's work handle as the call returned it, but for ``wait``, which also tells the observers
    that asked (their ``waited(token, error)``) that the caller waited on it; every other name is the handle's own.
    Not an instance of ``dist.Work``: only the recorder asks for it, and the workshop's code only waits on handles."""

    def __init__(self, work, seen: list):
        self._work, self._seen = work, seen

    def wait(self, *args, **kwargs):
        try:
            done = self._work.wait(*args, **kwargs)
        except BaseException as error:
            _tell(self._seen, "waited", error)
            raise
        _tell(self._seen, "waited", None)
        return done

    def __getattr__(self, name: str):
        return getattr(self._work, name)


def add(observer: Observer) -> None:
    """Start telling ``observer`` about every collective; the first observer wraps torch's functions."""
    global _patches
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if _patches is None:
        _patches = contextlib.ExitStack()
        wrapped = [*((dist, name, name) for name in COLLECTIVES if hasattr(dist, name)),
                   (torch.autograd, "backward", BACKWARD), (DistributedDataParallel, "forward", DDP_FORWARD)]
        for owner, name, op in wrapped:
            _patches.enter_context(mock.patch.object(owner, name, new=_wrap(op, getattr(owner, name))))
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
