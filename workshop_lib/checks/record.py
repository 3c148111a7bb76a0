"""Watching what one rank does: the calls that make a script distributed, recorded as they happen.

Used by the exercise checks: :mod:`workshop_lib.checks.script` runs a learner's step
script on two ranks, each inside :func:`run_rank`; the notebook checks run the
learner's functions on forked ranks under :func:`spying`. Either way every rank
records, in order, its calls to ``init_process_group``, ``destroy_process_group``,
``torch.cuda.set_device``, the collectives (on entry and on return), the
``DistributedSampler`` it built, each ``set_epoch`` and each read of the sampler,
the DDP wrap, ``evaluate`` and ``torch.save``. :mod:`workshop_lib.checks.rules`
reads the records and names the mistake.

"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from workshop_lib.debug import collectives, frames
from workshop_lib.debug.patching import patched

# The collectives recorded: the ones a learner's script calls itself (not DDP's own, nor backward).
RECORDED = ("all_reduce", "all_gather", "broadcast", "barrier", "gather_object", "all_gather_object",
               "broadcast_object_list", "reduce", "gather", "scatter")


class Recorder:
    """Events of one rank, in order; appended to a file (one JSON object a line) as they happen, if given one."""

    def __init__(self, path: Path | None = None):
        self.events: list[dict] = []
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (lives as long as the rank)

    def add(self, kind: str, **data) -> dict:
        event = {"kind": kind, "line": _caller_line(), **data}
        self.events.append(event)
        if self._file is not None:
            self._file.write(json.dumps(event, default=str) + "\n")
            self._file.flush()
        return event


def _caller_line() -> int | None:
    """The line of the learner's code that led here: the innermost frame outside torch and workshop_lib."""
    frame = frames.caller(core_is_library=True)
    return frame.lineno if frame is not None else None


def _keys(obj) -> list[str]:
    """The first keys of what was saved: a state_dict's, or a snapshot's model's."""
    if isinstance(obj, dict):
        if isinstance(obj.get("model"), dict):
            obj = obj["model"]
        return [str(k) for k in list(obj)[:3]]
    return [type(obj).__name__]


class Collectives:
    """The recorder's observer of :mod:`workshop_lib.debug.collectives`: each call of :data:`RECORDED`, in and out."""

    def __init__(self, rec: Recorder):
        self.rec = rec

    def enter(self, op: str, args: tuple, kwargs: dict) -> tuple | None:
        if op not in RECORDED:
            return None
        reduce_op = kwargs.get("op", args[1] if op == "all_reduce" and len(args) > 1 else None)
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        self.rec.add("collective", name=op, phase="enter", op=str(reduce_op).rsplit(".", 1)[-1] if reduce_op else None,
                     before=_head(first))
        return op, first

    def leave(self, token: tuple | None, error: BaseException | None) -> None:
        if token is not None and error is None:
            op, first = token
            self.rec.add("collective", name=op, phase="exit", after=_head(first))


def _head(tensor: torch.Tensor | None) -> list | None:
    return tensor.detach().flatten()[:4].tolist() if tensor is not None else None


def _spies(rec: Recorder) -> list[tuple[object, str, Callable]]:
    """(owner, name, make(original) -> replacement) for every call :func:`spying` records besides the collectives."""

    def init(real):
        def spy(backend=None, *args, **kw):
            rec.add("init", backend=str(backend), rank=kw.get("rank"), world_size=kw.get("world_size"), phase="enter")
            out = real(backend, *args, **kw)
            rec.add("init", phase="exit")
            return out
        return spy

    def simple(kind):
        def make(real):
            def spy(*args, **kw):
                rec.add(kind, args=[str(a) for a in args])
                return real(*args, **kw)
            return spy
        return make

    def sampler_init(real):
        def spy(self, dataset, num_replicas=None, rank=None, *args, **kw):
            initialized = dist.is_available() and dist.is_initialized()
            rec.add("sampler", num_replicas=num_replicas, rank=rank, group=initialized)
            real(self, dataset, num_replicas, rank, *args, **kw)
            rec.add("sampler_made", num_replicas=self.num_replicas, rank=self.rank, shuffle=self.shuffle)
        return spy

    def set_epoch(real):
        def spy(self, epoch):
            rec.add("set_epoch", epoch=int(epoch))
            return real(self, epoch)
        return spy

    def sampler_iter(real):
        def spy(self):
            rec.add("read_sampler", epoch=self.epoch)
            return real(self)
        return spy

    def ddp_init(real):
        def spy(self, module, device_ids=None, *args, **kw):
            params = {p.device.type for p in module.parameters()}
            rec.add("ddp", device_ids=device_ids, devices=sorted(params))
            return real(self, module, device_ids, *args, **kw)
        return spy

    def save(real):
        def spy(obj, f, *args, **kw):
            if isinstance(f, (str, os.PathLike)):
                rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
                rec.add("save", path=str(f), keys=_keys(obj), rank=rank)
            return real(obj, f, *args, **kw)
        return spy

    return [(dist, "init_process_group", init), (dist, "destroy_process_group", simple("destroy")),
            (torch.cuda, "set_device", simple("set_device")), (DistributedSampler, "__init__", sampler_init),
            (DistributedSampler, "set_epoch", set_epoch), (DistributedSampler, "__iter__", sampler_iter),
            (DistributedDataParallel, "__init__", ddp_init), (torch, "save", save)]


def _evaluate(rec: Recorder):
    def make(real):
        def spy(model, *args, **kw):
            rec.add("evaluate", model=type(model).__name__)
            return real(model, *args, **kw)
        return spy
    return make


@contextlib.contextmanager
def spying(rec: Recorder, namespace: dict | None = None) -> Iterator[Recorder]:
    """Record this process's distributed calls while the block runs; ``namespace``: also patch its ``evaluate``."""
    import workshop_lib.train as train_module

    with contextlib.ExitStack() as patches:
        for owner, name, make in _spies(rec):
            patches.enter_context(patched(owner, name, make))
        patches.enter_context(patched(train_module, "evaluate", _evaluate(rec)))
        if namespace is not None and "evaluate" in namespace:
            patches.enter_context(patched(namespace, "evaluate", _evaluate(rec)))
        patches.enter_context(collectives.observing(Collectives(rec)))
        yield rec


def record_calls(rec: Recorder, namespace: dict, name: str) -> None:
    """Wrap ``namespace[name]`` (a learner's function) so that each call's arguments and result are recorded."""
    real = namespace.get(name)
    if not callable(real):
        return

    def spy(*args, **kw):
        start = len(rec.events)
        result = real(*args, **kw)
        ops = [e.get("op") for e in rec.events[start:] if e["kind"] == "collective" and e["phase"] == "enter"]
        rec.add("call", name=name, args=[a if isinstance(a, (int, float)) else None for a in args], ops=ops,
                result=result if isinstance(result, (int, float)) else None)
        return result

    namespace[name] = spy  # for the rank's whole life: the script's module is the rank's own
