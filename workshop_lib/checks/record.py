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
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

_LIBRARY = (str(Path(__file__).parent), str(Path(torch.__file__).parent), "<frozen ", "/contextlib.py",
            "/runpy.py", "/importlib/")
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "barrier", "gather_object", "all_gather_object",
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
    """The line of the learner's code that led here: the innermost frame outside torch and this library."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not any(part in frame.filename for part in _LIBRARY):
            return frame.lineno
    return None


def _keys(obj) -> list[str]:
    """The first keys of what was saved: a state_dict's, or a snapshot's model's."""
    if isinstance(obj, dict):
        if isinstance(obj.get("model"), dict):
            obj = obj["model"]
        return [str(k) for k in list(obj)[:3]]
    return [type(obj).__name__]


@contextlib.contextmanager
def spying(rec: Recorder, namespace: dict | None = None) -> Iterator[Recorder]:
    """Record this process's distributed calls while the block runs; ``namespace``: also patch its ``evaluate``."""
    import workshop_lib.train as train_module

    patches: list[tuple[object, str, object]] = []

    def patch(owner, name, make):
        real = getattr(owner, name)
        patches.append((owner, name, real))
        setattr(owner, name, make(real))

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

    def collective(name):
        def make(real):
            def spy(*args, **kw):
                op = kw.get("op", args[1] if name == "all_reduce" and len(args) > 1 else None)
                first = args[0] if args else None
                before = first.detach().flatten()[:4].tolist() if isinstance(first, torch.Tensor) else None
                rec.add("collective", name=name, phase="enter", op=str(op).rsplit(".", 1)[-1] if op else None,
                        before=before)
                out = real(*args, **kw)
                after = first.detach().flatten()[:4].tolist() if isinstance(first, torch.Tensor) else None
                rec.add("collective", name=name, phase="exit", after=after)
                return out
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

    def evaluate(real):
        def spy(model, *args, **kw):
            rec.add("evaluate", model=type(model).__name__)
            return real(model, *args, **kw)
        return spy

    patch(dist, "init_process_group", init)
    patch(dist, "destroy_process_group", simple("destroy"))
    patch(torch.cuda, "set_device", simple("set_device"))
    for name in COLLECTIVES:
        patch(dist, name, collective(name))
    patch(DistributedSampler, "__init__", sampler_init)
    patch(DistributedSampler, "set_epoch", set_epoch)
    patch(DistributedSampler, "__iter__", sampler_iter)
    patch(DistributedDataParallel, "__init__", ddp_init)
    patch(torch, "save", save)
    patch(train_module, "evaluate", evaluate)
    if namespace is not None and "evaluate" in namespace:
        patch_ns = namespace
        patches.append((None, "evaluate", patch_ns["evaluate"]))
        patch_ns["evaluate"] = evaluate(patch_ns["evaluate"])
    try:
        yield rec
    finally:
        for owner, name, real in reversed(patches):
            if owner is None:
                namespace[name] = real
            else:
                setattr(owner, name, real)


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

    namespace[name] = spy
