"""Watching one rank of a run from outside: what it read, stepped, evaluated, saved, and which collectives it called.

:func:`recording` attaches every observer for the duration of a block, and
takes them all off again. Each observer calls through to what it wraps and
changes nothing that function does; none adds a collective (the ranks' records
are compared afterwards, from their files):

* ``workshop_lib.data.load_splits``: which dataset object is the train, dev and
  heldout split, and a fingerprint of each (the domain's own function);
* ``TokenizedDataset.__getitem__``: each index fetched, per pass over a loader
  (``DataLoader.__iter__`` starts a pass and notes the loader's sampler);
* ``DistributedSampler.__init__`` and ``set_epoch``: the arguments as given, the
  values the sampler resolved;
* ``init_process_group``, ``destroy_process_group``, the learner's collectives
  (:mod:`workshop_lib.debug.collectives`) and ``loss.backward()``;
* ``DistributedDataParallel.__init__``, and a forward pre-hook on the wrapper
  (torch's public module hook) that counts the forwards through it;
* every optimizer step (``torch.optim.optimizer.register_optimizer_step_post_hook``):
  the parameters after it, appended to ``PREFIX.params`` as float32;
* ``binary_cross_entropy_with_logits`` (each training batch's loss),
  ``workshop_lib.metrics.evaluate``, ``torch.save`` and ``torch.load``.

Events go to ``PREFIX.jsonl``, one JSON object a line, each with ``kind`` and
the learner's ``line`` that led to it. The notebook checks use the same
observers in-process (:class:`Recorder` without a file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib.debug import collectives, frames
from workshop_lib.debug.patching import patched
from workshop_lib.lab.joining import let_gloo_finish

# The collectives recorded: those a learner's code calls itself (DDP's own run in C++ inside backward).
RECORDED = ("all_reduce", "all_gather", "broadcast", "barrier", "gather_object", "all_gather_object",
            "broadcast_object_list", "reduce", "gather", "scatter", "all_gather_into_tensor", "reduce_scatter_tensor",
            "monitored_barrier")
SMALL = 16  # a collective's tensor of at most this many elements is recorded by value, before and after


def _line() -> int | None:
    """The line of the learner's code that led here: the innermost frame outside torch and workshop_lib."""
    frame = frames.caller(core_is_library=True)
    return frame.lineno if frame is not None else None


def fingerprint(dataset) -> str:
    """A short hash of a split's molecules and labels: two ranks with the same split have the same one."""
    digest = hashlib.sha1()
    digest.update("\n".join(getattr(dataset, "smiles", [])).encode())
    labels = getattr(dataset, "labels", None)
    if isinstance(labels, torch.Tensor):
        digest.update(labels.numpy().tobytes())
    return digest.hexdigest()[:12]


def _rank() -> int | None:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def _keys(obj) -> list[str]:
    """The first keys of what was saved: a state_dict's, or a snapshot's model's."""
    if isinstance(obj, dict):
        if isinstance(obj.get("model"), dict):
            obj = obj["model"]
        return [str(k) for k in list(obj)[:3]]
    return [type(obj).__name__]


def _small(tensor) -> list | None:
    if isinstance(tensor, torch.Tensor) and tensor.numel() <= SMALL:
        return tensor.detach().flatten().cpu().tolist()
    return None


class Recorder:
    """One rank's events, in order; with a ``prefix``, also appended to PREFIX.jsonl (and PREFIX.params) as they happen."""

    def __init__(self, prefix: str | Path | None = None):
        self.events: list[dict] = []
        self._file = open(f"{prefix}.jsonl", "a", buffering=1) if prefix else None  # noqa: SIM115 (closed in close)
        self._params = open(f"{prefix}.params", "ab") if prefix else None  # noqa: SIM115
        self.splits: dict[int, str] = {}  # id(dataset) -> "train" | "dev" | "heldout"
        self.fetched: dict[str, list[int]] = {}  # split -> indices fetched since the last flush
        self.passes: dict[str, int] = {}  # split -> passes started
        self.losses: list[list[float]] = []  # [loss, molecules] of each training batch since the last step
        self.ddp_forwards = self.bypasses = self.backwards = self.steps = 0
        self.in_ddp = 0  # > 0 while a DDP wrapper's forward runs
        self.bypass_line: int | None = None  # the first training forward that went around the wrapper
        self.main, self.pid = threading.get_ident(), os.getpid()
        self.vectors: list[torch.Tensor] = []  # the parameters after each step (in memory, without a prefix)

    def add(self, kind: str, line: bool = True, **data) -> dict:
        event = {"kind": kind, "line": _line() if line else None, "t": round(time.time(), 3), **data}
        self.events.append(event)
        if self._file is not None:
            self._file.write(json.dumps(event, default=str) + "\n")
        return event

    def split_of(self, dataset) -> str | None:
        return self.splits.get(id(dataset))

    def flush_fetched(self) -> None:
        for split, indices in self.fetched.items():
            if indices:
                self.add("fetched", line=False, split=split, epoch_pass=self.passes.get(split, 0) - 1, indices=indices)
        self.fetched = {}

    def stepped(self, optimizer) -> None:
        """After an optimizer step: the parameters it updated, and what led to the step since the last one."""
        self.flush_fetched()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        vector = torch.cat([p.detach().flatten().float().cpu() for p in params]) if params else torch.zeros(0)
        if self._params is not None:
            self._params.write(vector.numpy().tobytes())
            self._params.flush()
        else:
            self.vectors.append(vector.clone())
        self.add("step", n=self.steps, epoch_pass=self.passes.get("train", 0) - 1, numel=int(vector.numel()),
                 ddp_forwards=self.ddp_forwards, bypasses=self.bypasses, backwards=self.backwards, losses=self.losses)
        self.steps += 1
        self.ddp_forwards = self.bypasses = self.backwards = 0
        self.losses = []

    def close(self) -> None:
        self.flush_fetched()
        for f in (self._file, self._params):
            if f is not None:
                f.close()
        self._file = self._params = None


class Collectives:
    """An observer of :mod:`workshop_lib.debug.collectives`: the learner's collectives and backward(), in and out."""

    def __init__(self, rec: Recorder):
        self.rec, self.seq = rec, 0

    def enter(self, op: str, args: tuple, kwargs: dict):
        if threading.get_ident() != self.rec.main:
            return None
        if op == collectives.BACKWARD:
            self.rec.backwards += 1
            self.rec.add("backward", phase="enter")
            return ("backward", None)
        if op not in RECORDED:
            return None
        self.seq += 1
        self.rec.flush_fetched()
        at = {"all_reduce": 1, "reduce": 2}.get(op)  # where the ReduceOp goes among the positional arguments
        reduce_op = kwargs.get("op", args[at] if at is not None and len(args) > at else None)
        first = args[0] if args else kwargs.get("tensor")
        self.rec.add("collective", name=op, phase="enter", seq=self.seq,
                     op=str(reduce_op).rsplit(".", 1)[-1] if reduce_op is not None else None, before=_small(first))
        return (op, first)

    def leave(self, token, error: BaseException | None) -> None:
        if token is None:
            return
        op, first = token
        if op == "backward":
            self.rec.add("backward", line=False, phase="exit", ok=error is None)
        elif error is None:
            self.rec.add("collective", line=False, name=op, phase="exit", seq=self.seq, after=_small(first))


def _observers(rec: Recorder) -> list[tuple[object, str, object]]:
    """(owner, name, make(original) -> observer that calls through) for everything :func:`recording` watches."""
    import workshop_lib.data as data
    import workshop_lib.metrics as metrics

    def load_splits(real):
        def observe(*args, **kw):
            splits = real(*args, **kw)
            for name in ("train", "dev", "heldout"):
                rec.splits[id(getattr(splits, name))] = name
            rec.add("splits", **{name: {"n": len(getattr(splits, name)), "fp": fingerprint(getattr(splits, name))}
                                 for name in ("train", "dev", "heldout")})
            return splits
        return observe

    def getitem(real):
        def observe(self, i):
            split = rec.splits.get(id(self))
            if split is not None and os.getpid() != rec.pid:  # a DataLoader worker (forked): straight to the file
                rec.add("fetched", line=False, split=split, epoch_pass=rec.passes.get(split, 0) - 1, indices=[int(i)])
            elif split is not None and threading.get_ident() == rec.main:
                rec.fetched.setdefault(split, []).append(int(i))
            return real(self, i)
        return observe

    def loader_iter(real):
        def observe(self):
            split = rec.split_of(self.dataset)
            if split is not None:
                rec.flush_fetched()
                rec.passes[split] = rec.passes.get(split, 0) + 1
                s = self.sampler
                rec.add("pass", split=split, epoch_pass=rec.passes[split] - 1, sampler=type(s).__name__,
                        sampler_id=id(s) if isinstance(s, DistributedSampler) else None,
                        sampler_epoch=getattr(s, "epoch", None) if isinstance(s, DistributedSampler) else None,
                        workers=self.num_workers)
            return real(self)
        return observe

    def sampler_init(real):
        def observe(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, *args, **kw):
            real(self, dataset, num_replicas, rank, shuffle, seed, *args, **kw)
            rec.add("sampler", split=rec.split_of(dataset), id=id(self), given_replicas=num_replicas,
                    given_rank=rank, num_replicas=self.num_replicas, rank=self.rank, shuffle=self.shuffle,
                    seed=self.seed, n=len(dataset), local_rank=os.environ.get("LOCAL_RANK"))
        return observe

    def set_epoch(real):
        def observe(self, epoch):
            rec.add("set_epoch", id=id(self), split=rec.split_of(self.dataset), epoch=int(epoch))
            return real(self, epoch)
        return observe

    def init(real):
        def observe(backend=None, *args, **kw):
            given = {k: kw[k] for k in ("rank", "world_size", "device_id", "init_method") if k in kw}
            rec.add("init", phase="enter", backend=str(backend), store="store" in kw, timeout="timeout" in kw,
                    **{f"given_{k}": str(v) if k == "device_id" else v for k, v in given.items()})
            out = real(backend, *args, **kw)
            rec.add("init", line=False, phase="exit", rank=dist.get_rank(), world_size=dist.get_world_size())
            return out
        return observe

    def destroy(real):
        def observe(*args, **kw):
            rec.flush_fetched()
            rec.add("destroy")
            # Gloo on torch 2.13 can deadlock here right after a collective (workshop_lib.lab.joining.let_gloo_finish
            # says why); seen 1 run in 12 of step 4. A moment's sleep first, so that the checker judges the script.
            let_gloo_finish()
            return real(*args, **kw)
        return observe

    def ddp_init(real):
        def observe(self, module, device_ids=None, *args, **kw):
            real(self, module, device_ids, *args, **kw)
            rec.add("ddp", device_ids=[str(d) for d in device_ids] if device_ids is not None else None,
                    find_unused=bool(kw.get("find_unused_parameters", False)))

            def before(module, inputs):  # a training forward through the wrapper, where DDP prepares its all-reduce
                if torch.is_grad_enabled() and module.training:
                    rec.ddp_forwards += 1
                rec.in_ddp += 1

            def after(module, inputs, output):
                rec.in_ddp -= 1

            def inner(module, inputs):  # the plain model's forward: inside the wrapper's, or around it
                if rec.in_ddp == 0 and torch.is_grad_enabled() and module.training:
                    rec.bypasses += 1
                    if rec.bypass_line is None:
                        mine = frames.users(traceback.extract_stack(), core_is_library=True)[-2:]
                        rec.bypass_line = mine[-1].lineno if mine else None
                        rec.add("bypass", line=False, at=rec.bypass_line, function=mine[-1].name if mine else None,
                                called_from=mine[0].lineno if len(mine) > 1 else None)
            self.register_forward_pre_hook(before)
            self.register_forward_hook(after)
            self.module.register_forward_pre_hook(inner)
        return observe

    def loss(real):
        def observe(input, target, *args, **kw):
            out = real(input, target, *args, **kw)
            if out.dim() == 0 and torch.is_grad_enabled() and threading.get_ident() == rec.main:
                rec.losses.append([float(out.detach()), int(target.numel())])
            return out
        return observe

    def evaluate(real):
        def observe(model, loader, *args, **kw):
            rec.flush_fetched()
            rec.add("evaluate", model=type(model).__name__, split=rec.split_of(getattr(loader, "dataset", None)))
            return real(model, loader, *args, **kw)
        return observe

    def save(real):
        def observe(obj, f, *args, **kw):
            path = str(f) if isinstance(f, str | os.PathLike) else None
            epoch = obj.get("epoch") if isinstance(obj, dict) and isinstance(obj.get("epoch"), int) else None
            rec.add("save", path=path, keys=_keys(obj), rank=_rank(), epoch=epoch)
            return real(obj, f, *args, **kw)
        return observe

    def load(real):
        def observe(f, *args, **kw):
            rec.add("load", path=str(f) if isinstance(f, str | os.PathLike) else None, rank=_rank())
            return real(f, *args, **kw)
        return observe

    return [(data, "load_splits", load_splits), (data.TokenizedDataset, "__getitem__", getitem),
            (DataLoader, "__iter__", loader_iter), (DistributedSampler, "__init__", sampler_init),
            (DistributedSampler, "set_epoch", set_epoch), (dist, "init_process_group", init),
            (dist, "destroy_process_group", destroy), (DistributedDataParallel, "__init__", ddp_init),
            (F, "binary_cross_entropy_with_logits", loss), (metrics, "evaluate", evaluate),
            (torch, "save", save), (torch, "load", load)]


@contextlib.contextmanager
def recording(rec: Recorder) -> Iterator[Recorder]:
    """Attach every observer (see the module's docstring) while the block runs; take them all off after."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    with contextlib.ExitStack() as stack:
        for owner, name, make in _observers(rec):
            stack.enter_context(patched(owner, name, make))
        stack.enter_context(collectives.observing(Collectives(rec)))
        hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: rec.stepped(optimizer))
        stack.callback(hook.remove)
        stack.callback(rec.flush_fetched)
        yield rec
