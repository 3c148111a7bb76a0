"""Watching one rank from outside: what it read, stepped, evaluated, saved, and which collectives it called.

:func:`recording` attaches an observer to each public function of :data:`OBSERVED`, the one table of what is watched
(``unittest.mock.patch.object``), to the collectives and ``loss.backward()``, and to every optimizer step (torch's
step post-hook); each calls through and changes nothing the function does, adding no collective."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import traceback
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib import data, metrics
from workshop_lib.checks.recorder import RECORDED, Collectives, Recorder  # noqa: F401 (also record.RECORDED)
from workshop_lib.debug import collectives, frames
from workshop_lib.lab.joining import let_gloo_finish


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


def _before(note):
    """A wrapper that calls ``note(rec, *args, **kw)``, then the original with the same arguments."""
    def wrap(rec: Recorder, real):
        def observe(*args, **kw):
            note(rec, *args, **kw)
            return real(*args, **kw)
        return observe
    return wrap


def _load_splits(rec: Recorder, real):
    def observe(*args, **kw):
        splits = real(*args, **kw)
        for name in ("train", "dev", "heldout"):
            rec.splits[id(getattr(splits, name))] = name
        rec.add("splits", **{name: {"n": len(getattr(splits, name)), "fp": fingerprint(getattr(splits, name))}
                             for name in ("train", "dev", "heldout")})
        return splits
    return observe


def _getitem(rec: Recorder, dataset, i) -> None:
    split = rec.splits.get(id(dataset))
    if split is not None and os.getpid() != rec.pid:  # a DataLoader worker (forked): straight to the file
        rec.add("fetched", line=False, split=split, epoch_pass=rec.passes.get(split, 0) - 1, indices=[int(i)])
    elif split is not None and threading.get_ident() == rec.main:
        rec.fetched.setdefault(split, []).append(int(i))


def _loader_iter(rec: Recorder, loader) -> None:
    split = rec.split_of(loader.dataset)
    if split is not None:
        rec.flush_fetched()
        rec.passes[split] = rec.passes.get(split, 0) + 1
        s = loader.sampler
        rec.add("pass", split=split, epoch_pass=rec.passes[split] - 1, sampler=type(s).__name__,
                sampler_id=id(s) if isinstance(s, DistributedSampler) else None,
                sampler_epoch=getattr(s, "epoch", None) if isinstance(s, DistributedSampler) else None,
                workers=loader.num_workers)


def _sampler_init(rec: Recorder, real):
    def observe(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, *args, **kw):
        real(self, dataset, num_replicas, rank, shuffle, seed, *args, **kw)
        rec.add("sampler", split=rec.split_of(dataset), id=id(self), given_replicas=num_replicas,
                given_rank=rank, num_replicas=self.num_replicas, rank=self.rank, shuffle=self.shuffle,
                seed=self.seed, n=len(dataset), local_rank=os.environ.get("LOCAL_RANK"))
    return observe


def _set_epoch(rec: Recorder, sampler, epoch) -> None:
    rec.add("set_epoch", id=id(sampler), split=rec.split_of(sampler.dataset), epoch=int(epoch))


def _init(rec: Recorder, real):
    def observe(backend=None, *args, **kw):
        given = {k: kw[k] for k in ("rank", "world_size", "device_id", "init_method") if k in kw}
        rec.add("init", phase="enter", backend=str(backend), store="store" in kw, timeout="timeout" in kw,
                **{f"given_{k}": str(v) if k == "device_id" else v for k, v in given.items()})
        out = real(backend, *args, **kw)
        rec.add("init", line=False, phase="exit", rank=dist.get_rank(), world_size=dist.get_world_size())
        return out
    return observe


def _destroy(rec: Recorder, *args, **kw) -> None:
    rec.flush_fetched()
    rec.add("destroy")
    # Gloo on torch 2.13 can deadlock here right after a collective (workshop_lib.lab.joining.let_gloo_finish
    # says why); seen 1 run in 12 of step 4. A moment's sleep first, so that the checker judges the script.
    let_gloo_finish()


def _ddp_init(rec: Recorder, real):
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


def _loss(rec: Recorder, real):
    def observe(input, target, *args, **kw):
        out = real(input, target, *args, **kw)
        if out.dim() == 0 and torch.is_grad_enabled() and threading.get_ident() == rec.main:
            rec.losses.append([float(out.detach()), int(target.numel())])
        return out
    return observe


def _evaluate(rec: Recorder, model, loader, *args, **kw) -> None:
    rec.flush_fetched()
    rec.add("evaluate", model=type(model).__name__, split=rec.split_of(getattr(loader, "dataset", None)))


def _path(f) -> str | None:
    """The file's path: given as one, or the name of an open file (None for a buffer)."""
    name = f if isinstance(f, str | os.PathLike) else getattr(f, "name", None)
    return str(name) if isinstance(name, str | os.PathLike) else None


def _save(rec: Recorder, obj, f, *args, **kw) -> None:
    epoch = obj.get("epoch") if isinstance(obj, dict) and isinstance(obj.get("epoch"), int) else None
    rec.add("save", path=_path(f), keys=_keys(obj), rank=_rank(), epoch=epoch)


def _load(rec: Recorder, f, map_location=None, *args, **kw) -> None:
    """A torch.load: the file, and the two arguments that decide where its tensors go and what it may unpickle."""
    rec.add("load", path=_path(f), rank=_rank(), map_location=map_location is not None,
            weights_only=kw.get("weights_only"))


# What recording() observes: (owner, name, wrap(rec, original) -> an observer that calls through to the original).
OBSERVED = (
    (data, "load_splits", _load_splits),  # which dataset object is each split, and a fingerprint of each
    (data.TokenizedDataset, "__getitem__", _before(_getitem)),  # each index fetched, per pass over a loader
    (DataLoader, "__iter__", _before(_loader_iter)),  # a pass starts: the loader's sampler
    (DistributedSampler, "__init__", _sampler_init),  # the arguments as given, the values the sampler resolved
    (DistributedSampler, "set_epoch", _before(_set_epoch)),
    (dist, "init_process_group", _init),
    (dist, "destroy_process_group", _before(_destroy)),
    (DistributedDataParallel, "__init__", _ddp_init),  # and forward hooks: the forwards through it, and around it
    (F, "binary_cross_entropy_with_logits", _loss),  # each training batch's loss
    (metrics, "evaluate", _before(_evaluate)),
    (torch, "save", _before(_save)),
    (torch, "load", _before(_load)),
)


@contextlib.contextmanager
def recording(rec: Recorder) -> Iterator[Recorder]:
    """Attach every observer (:data:`OBSERVED`, the collectives, the step hook) while the block runs; then take them off."""
    with contextlib.ExitStack() as stack:
        for owner, name, wrap in OBSERVED:
            stack.enter_context(mock.patch.object(owner, name, new=wrap(rec, getattr(owner, name))))
        stack.enter_context(collectives.observing(Collectives(rec)))
        hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: rec.stepped(optimizer))
        stack.callback(hook.remove)
        stack.callback(rec.flush_fetched)
        yield rec
