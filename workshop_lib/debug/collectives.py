"""The one place that wraps torch.distributed's functions, and a process's one record of the calls (:class:`Record`).

While a block of :func:`calls` runs, each of :data:`COLLECTIVES`, ``init_process_group``, ``torch.autograd.backward``
(DDP's gradient all-reduce runs in it, in C++) and ``DistributedDataParallel.forward`` where it broadcasts the buffers
first (:func:`ddp_broadcasts`) is wrapped, call-through (``unittest.mock.patch.object``): the record's ``enter`` runs
before, its ``leave`` after, and each call becomes one entry (:func:`entry`), which the checker's recorder keeps in its
events and the hang watch reads. Where a recorder keeps them, an async call's work handle comes back wrapped
(:class:`Handle`) and tells the record when the caller waits on it. A record that raises observes no more (one
warning line); the call goes on as if unobserved.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from datetime import timedelta
from unittest import mock

from workshop_lib.debug import frames
from workshop_lib.errors import first_line

# The Python collectives wrapped (those present in this torch)
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
               "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "send", "recv")
BACKWARD = "backward"  # the name a record gives torch.autograd.backward
DDP_FORWARD = "DDP.forward"  # DistributedDataParallel.forward, observed where it broadcasts the buffers first
INIT = "init_process_group"
HISTORY = 64  # the calls a record keeps for the hang watch, to find where the ranks' calls first differ
SMALL = 16  # a collective's tensor of at most this many elements is recorded by value (where a recorder keeps them)
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # workshop_lib/debug/


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
    """torch's own signature of ``op`` (torch.distributed's module, whatever stands in ``dist`` now)."""
    from torch.distributed import distributed_c10d

    return inspect.signature(getattr(distributed_c10d, op)) if hasattr(distributed_c10d, op) else None


def _given(op: str, args: tuple, kwargs: dict) -> dict:
    """The arguments the caller gave ``op``, by name; {} where they do not fit (torch's own error says so)."""
    signature = _signature(op)
    try:
        return signature.bind(*args, **kwargs).arguments if signature is not None else {}
    except TypeError:
        return {}


def facts(op: str, args: tuple, kwargs: dict) -> dict:
    """What a call was given: its first tensor's ``dtype``, ``shape`` and ``device`` (of a list's first, and ``count``
    the list's length; None for one tensor), the ReduceOp given (``op``: "SUM", "AVG" ...; None where left to its
    default, SUM) and ``async_op``. Part of each collective's entry (:func:`entry`)."""
    given = _given(op, args, kwargs)
    found = tensors_of(args, kwargs)
    first = found[0] if isinstance(found, list | tuple) else found
    reduce_op = given.get("op")
    return {"op": str(reduce_op).rsplit(".", 1)[-1] if reduce_op is not None else None,
            "async_op": bool(given.get("async_op", False)),
            "dtype": str(first.dtype).removeprefix("torch.") if first is not None else None,
            "shape": list(first.shape) if first is not None else None,
            "device": first.device.type if first is not None else None,
            "count": len(found) if isinstance(found, list | tuple) else None}


def joined(args: tuple, kwargs: dict) -> dict:
    """What ``init_process_group`` was given: ``backend`` (as text, "None" left out), ``store`` (given or not),
    ``timeout`` (seconds; None left out; as given where it is no timedelta, which torch refuses) and, where given,
    ``given_rank``, ``given_world_size``, ``given_init_method`` and ``given_device_id`` (as text), positional or not."""
    given = _given(INIT, args, kwargs)
    timeout = given.get("timeout")
    return {"backend": str(given.get("backend")), "store": "store" in given,
            "timeout": timeout.total_seconds() if isinstance(timeout, timedelta) else timeout,
            **{f"given_{k}": str(given[k]) if k == "device_id" else given[k]
               for k in ("rank", "world_size", "device_id", "init_method") if k in given}}


def small(tensor) -> list | None:
    """A tensor of at most :data:`SMALL` elements, by value (a copy to the CPU); else None."""
    import torch

    if isinstance(tensor, torch.Tensor) and tensor.numel() <= SMALL and not tensor.is_meta:  # meta: no values
        return tensor.detach().flatten().cpu().tolist()
    return None


def user_frames(frame) -> tuple[list[list], str]:
    """([file, line, function, code] of the learner's frames, outermost first; the innermost library function)."""
    stack = frames.since_fork(traceback.extract_stack(frame))
    while stack and stack[-1].filename.startswith(_HERE):  # the watch itself (a rank explaining from its main thread)
        stack.pop()
    inner = stack[-1].name if stack and frames.is_library(stack[-1].filename) else ""
    return [[frames.short(f.filename), f.lineno, f.name, (f.line or "").strip()] for f in frames.users(stack)], inner


def caller() -> str:
    """'f.py:25 in g()', and where g was called from, for the code that called the collective."""
    mine, _ = user_frames(sys._getframe(1))
    sites = [f"{f}:{n} in {fn}()" for f, n, fn, _ in mine[-2:]]
    return ", from ".join(reversed(sites)) or "?"


def kind_of(op: str) -> str:
    """The kind of entry a call makes: "collective", "backward", "forward" (DDP's buffer broadcast) or "init"."""
    return {BACKWARD: "backward", DDP_FORWARD: "forward", INIT: "init"}.get(op, "collective")


def entry(op: str, args: tuple, kwargs: dict, values: bool = False) -> dict:
    """The one description of a call, as a rank's :class:`Record` holds it (and numbers it): its ``kind``
    (:func:`kind_of`), ``name`` (the op), ``phase`` "enter", ``t`` (time.time()), ``where`` (:func:`caller`); for
    init_process_group what it was given (:func:`joined`); for the others ``tensors`` as a report says them (a
    collective's :func:`said` of its :func:`facts`, which it holds too, with its first tensor's ``data_ptr``, and with
    ``values``, ``before``: its :func:`small` values)."""
    kind = kind_of(op)
    made = {"kind": kind, "name": op, "phase": "enter", "t": round(time.time(), 3), "where": caller()}
    if kind == "init":
        return {**made, **joined(args, kwargs)}
    if kind != "collective":  # the device of its tensors (the loss; the forward's input): NCCL's work queued there
        return {**made, "tensors": ddp_broadcasts(args[0]) if kind == "forward" else "DDP's gradient buckets",
                "device": facts(op, args, kwargs)["device"]}
    fact, first = facts(op, args, kwargs), tensors_of(args, kwargs)
    made.update(fact, tensors=said(fact), data_ptr=first.data_ptr() if hasattr(first, "data_ptr") else None)
    return {**made, "before": small(first)} if values else made


def called(call: dict) -> str:
    """A call as a report names it: 'all_reduce #3', 'loss.backward()'."""
    return "loss.backward()" if call["kind"] == "backward" else f"{call['name']} #{call['seq']}"


def said(fact: dict) -> str:
    """``facts`` as a report says them: "float32[3]", "2 tensors, first float32[3]", "no tensor"."""
    if fact["dtype"] is None:
        return "no tensor"
    one = f"{fact['dtype']}{fact['shape']}"
    return one if fact["count"] is None else f"{fact['count']} tensors, first {one}"


def ddp_broadcasts(ddp) -> str | None:
    """What DDP's forward broadcasts before it runs the module, or None: its buffers (rank 0's, outside ``Join``)
    where ``will_sync_module_buffers()`` and no buffer hook replaces it (torch 2.13's ``_check_sync_bufs_pre_fwd``).

    The constructor's broadcast is not observed: most of the constructor's time is imports, not waiting.
    """
    if not ddp.will_sync_module_buffers() or getattr(ddp, "buffer_hook", None) is not None:
        return None
    return f"broadcasts {len(ddp.modules_buffers)} buffers"


def _quiet(ddp) -> bool:
    try:
        return ddp_broadcasts(ddp) is None
    except Exception:  # a torch without these public names: the forward goes unobserved
        return True


def _told(record: Record, method: str, *args):
    """``record.method(*args)``; a record that raises stops observing, in one line, and the call goes on unobserved."""
    if record.broken:
        return None
    try:
        return getattr(record, method)(*args)
    except Exception as err:  # the record must never change what the call does
        record.broken = True
        print(f"warning: the record of calls stopped observing torch.distributed ({type(err).__name__}: "
              f"{first_line(err)})", file=sys.stderr, flush=True)
        return None


def _wrap(op: str, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        record = _record
        if record is None or (op == DDP_FORWARD and _quiet(args[0])):
            return fn(*args, **kwargs)
        token = _told(record, "enter", op, args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            _told(record, "leave", token, error)
            raise
        _told(record, "leave", token, None)
        # torch's own callers keep their handle: DDP under Join hands it to its C++ reducer, which takes a Work only
        if token is not None and record.keeps and result is not None and op in COLLECTIVES and \
                not _from_torch(sys._getframe(1)):
            import torch.distributed as dist

            if isinstance(result, dist.Work):
                return Handle(result, record, token)
        return result

    return call


def _from_torch(frame) -> bool:
    """Whether ``frame`` is in torch's own code (torch.nn.parallel, torch.distributed.algorithms.join, ...)."""
    name = frame.f_globals.get("__name__", "")
    return name == "torch" or name.startswith("torch.")


class Handle:
    """An async collective's work handle as the call returned it, but for ``wait``, which also tells the record
    (``waited(token, error)``) that the caller waited on it; every other name is the handle's own. Not an instance of
    ``dist.Work``: only a recorder asks for it (the hang watch alone hands the script torch's own), and the workshop's
    code only waits on handles."""

    def __init__(self, work, record: Record, token):
        self._work, self._record, self._token = work, record, token

    def wait(self, *args, **kwargs):
        try:
            done = self._work.wait(*args, **kwargs)
        except BaseException as error:
            _told(self._record, "waited", self._token, error)
            raise
        _told(self._record, "waited", self._token, None)
        return done

    def __getattr__(self, name: str):
        return getattr(self._work, name)


class Record:
    """A rank's one record of calls, and the one observer of them in its process (:func:`calls`): each call of the
    thread that made it becomes an :func:`entry`, numbered: ``seq`` (a collective or DDP's forward: the rank's
    numbered calls so far), ``n`` (the calls of its name so far) and ``backward`` (the number of the backward() it
    runs in, None outside one). Each entry, and each event that follows it ("exit", "wait"), goes to every ``keep``
    (the checker's recorder keeps them in its events), whose presence also has a collective's values kept (``before``,
    ``after``); :attr:`recent` holds the last :data:`HISTORY` entries but init's, :attr:`latest` each name's last one.
    Each follower (the hang watch) is told each call that ends (``ended(entry, error)``; ``failed(error)`` if it raises).
    """

    def __init__(self):
        self.main = threading.get_ident()
        self.keeps: list[Callable[..., object]] = []  # keep(event, line: bool): the learner's line wanted with it
        self.followers: list = []
        self.recent: collections.deque = collections.deque(maxlen=HISTORY)
        self.latest: dict[str, dict] = {}
        self.open: list[dict] = []  # the calls entered and not left, innermost last
        self.seq = 0
        self.users = 0  # the blocks of calls() that use it
        self.broken = False  # it raised: it observes no more
        self.patches = contextlib.ExitStack()  # torch's functions wrapped, while it is the process's record

    @property
    def current(self) -> dict | None:
        """The innermost call this rank is in (init_process_group apart), or None. (Another thread may ask: ``open``
        is only appended to, or replaced.)"""
        calls = self.open
        return calls[-1] if calls else None

    def counts(self) -> dict[str, int]:
        """Calls entered so far, by name (init_process_group apart): each name's last entry's ``n``."""
        return {e["name"]: e["n"] for e in list(self.latest.values()) if e["kind"] != "init"}

    def last(self) -> dict | None:
        """The numbered call entered last."""
        return max((e for e in list(self.latest.values()) if e.get("seq")), key=lambda e: e["seq"], default=None)

    def enter(self, op: str, args: tuple, kwargs: dict):
        if threading.get_ident() != self.main:
            return None
        made = entry(op, args, kwargs, values=bool(self.keeps))
        made["n"] = self.latest.get(op, {}).get("n", 0) + 1
        if made["kind"] in ("collective", "forward"):
            self.seq += 1
            inside = [e["n"] for e in self.open if e["kind"] == "backward"]
            made.update(seq=self.seq, backward=inside[-1] if inside else None)
        for keep in self.keeps:  # before anyone else reads it: the recorder adds the learner's line to it
            keep(made, True)
        self.latest[op] = made
        if made["kind"] != "init":
            self.recent.append(made)
            self.open.append(made)
        return made, tensors_of(args, kwargs) if made["kind"] == "collective" else None

    def leave(self, token, error: BaseException | None) -> None:
        if token is None:
            return
        made, first = token
        self.open = [e for e in self.open if e is not made]
        if self.keeps:
            self._exited(made, first, error)
        for follower in list(self.followers):
            try:
                follower.ended(made, error)
            except Exception as err:  # a follower must never change what the call does
                self.followers.remove(follower)
                follower.failed(err)

    def _exited(self, made: dict, first, error: BaseException | None) -> None:
        """The event after an entry, to each keep: backward's end, a collective's or init's that returned."""
        import torch.distributed as dist

        then = {"kind": made["kind"], "name": made["name"], "phase": "exit"}
        if made["kind"] == "backward":
            then["ok"] = error is None
        elif made["kind"] == "collective" and error is None:
            then.update(seq=made["seq"], after=small(first))
        elif made["kind"] == "init" and error is None:
            then.update(rank=dist.get_rank(), world_size=dist.get_world_size())
        else:
            return
        for keep in self.keeps:
            keep(then, False)

    def waited(self, token, error: BaseException | None) -> None:
        """The caller waited on the handle of the async collective ``token``."""
        for keep in self.keeps:
            keep({"kind": "wait", "name": token[0]["name"], "seq": token[0]["seq"], "ok": error is None}, True)


_record: Record | None = None  # the process's record, while a block of calls() runs


@contextlib.contextmanager
def calls(keep: Callable[..., object] | None = None) -> Iterator[Record]:
    """This process's record of calls while the block runs: the one on (a watch's, a recorder's), else a new one,
    which wraps torch's functions until its last block ends; ``keep(event, line)`` (a recorder's) is given every
    entry and event while the block runs."""
    global _record
    if _record is None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        _record = Record()
        wrapped = [*((dist, name, name) for name in (*COLLECTIVES, INIT) if hasattr(dist, name)),
                   (torch.autograd, "backward", BACKWARD), (DistributedDataParallel, "forward", DDP_FORWARD)]
        for owner, name, op in wrapped:
            _record.patches.enter_context(mock.patch.object(owner, name, new=_wrap(op, getattr(owner, name))))
    record = _record
    record.users += 1
    if keep is not None:
        record.keeps.append(keep)
    try:
        yield record
    finally:
        if keep is not None:
            record.keeps.remove(keep)
        record.users -= 1
        if record.users == 0:
            _record = None
            record.patches.close()
