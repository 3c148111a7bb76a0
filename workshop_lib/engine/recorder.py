"""One rank's record: what it read, stepped, evaluated, saved, and which collectives it called; and its readers. The
script checker, the cell checks (01's all_reduce, 04a's all-reduce count, 04b's handles) and the runs they judge all
read it. Its calls are the rank's one record of calls (:func:`workshop_lib.debug.collectives.calls`), which the hang
watch reads too: each collective's entry (:func:`~workshop_lib.debug.collectives.entry`: what it was given, where,
the backward() it ran in), kept here with the learner's line, then its exit and the wait on its handle.

:func:`recording` attaches an observer to each public function of :data:`OBSERVED`, the one table of what is watched
(``unittest.mock.patch.object``), keeps the record of calls (:mod:`workshop_lib.debug.collectives`: the collectives,
``init_process_group`` and ``loss.backward()``), and observes every optimizer step (torch's step post-hook); each calls
through and changes nothing the function does, adding no collective (an async collective's work handle comes back
wrapped, so that its wait is seen).
A :class:`Recorder` keeps the events in order (with a prefix, also in PREFIX.jsonl, and the parameters after each
optimizer step in PREFIX.params); the readers at the end answer how a rank left, what it waited in, the replicas'
spread and what each loader pass read.

A workshop script names its splits through :func:`workshop_lib.data.load_splits`; in any other script the dataset of
the first DistributedSampler, else of the first loader read with gradients on, is the training split, and its class's
``__getitem__`` is observed from then on as the workshop's dataset is.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from workshop_lib import data, metrics, report
from workshop_lib.debug import collectives, frames
from workshop_lib.launching import ends
from workshop_lib.launching.joining import let_gloo_finish


def _where() -> tuple[int | None, list[int]]:
    """The line of the learner's code that led here (the innermost frame outside torch and workshop_lib), and the
    lines of that file that called it, outermost first."""
    mine = frames.users(frames.since_fork(traceback.extract_stack()), core_is_library=True)
    if not mine:
        return None, []
    return mine[-1].lineno, [f.lineno for f in mine[:-1] if f.filename == mine[-1].filename]


class Recorder:
    """One rank's events, in order; with a ``prefix``, also appended to PREFIX.jsonl (and PREFIX.params) as they happen."""

    def __init__(self, prefix: str | Path | None = None, reads: int = 0):
        self.reads = reads  # > 0: a probe of the data alone, ended after this many passes over the training split
        self.events: list[dict] = []
        self._file = open(f"{prefix}.jsonl", "a", buffering=1) if prefix else None  # noqa: SIM115 (closed in close)
        self._params = open(f"{prefix}.params", "ab") if prefix else None  # noqa: SIM115
        self.splits: dict[int, str] = {}  # id(dataset) -> "train" | "dev" | "heldout"
        self.fetched: dict[str, list[int]] = {}  # split -> indices fetched since the last flush
        self.passes: dict[str, int] = {}  # split -> passes started
        self.losses: list[list[float]] = []  # [loss, molecules] of each training batch since the last step
        self.ddp_forwards = self.ddp_syncs = self.bypasses = self.backwards = self.steps = 0
        self.in_ddp = 0  # > 0 while a DDP wrapper's forward runs
        self.main, self.pid = threading.get_ident(), os.getpid()
        self.stack: contextlib.ExitStack | None = None  # while recording: where an observer put later is taken off
        self.samplers: dict[int, dict] = {}  # id(DistributedSampler) -> its "sampler" event
        self.loaders: dict[int, dict] = {}  # id(DataLoader) -> the line that built it, and whether with a collate_fn

    def name_split(self, dataset) -> str | None:
        """The split of ``dataset``; in a script that is not the workshop's (no load_splits), the first dataset asked
        for becomes "train", and its class's ``__getitem__`` is observed as the workshop's dataset is."""
        split = self.splits.get(id(dataset))
        if split is not None or self.splits or self.stack is None or isinstance(dataset, IterableDataset) \
                or not hasattr(type(dataset), "__getitem__"):
            return split
        self.splits[id(dataset)] = "train"
        cls = type(dataset)
        if cls is not data.TokenizedDataset:
            self.stack.enter_context(mock.patch.object(cls, "__getitem__", new=_before(_getitem)(self, cls.__getitem__)))
        self.add("splits", line=False, train={"n": len(dataset), "fp": None})
        for event in self.samplers.values():  # the sampler built over it before it was named
            if event["dataset"] == id(dataset):
                self.add("sampler", event["line"], **{k: v for k, v in event.items()
                                                      if k not in ("kind", "line", "t", "via", "split")}, split="train")
        return "train"

    def add(self, kind: str, line: bool | int | None = True, **data) -> dict:
        """Append an event; ``line``: True, with the learner's line that led to it and the lines that called that
        one; a number, that line."""
        return self.keep({"kind": kind, **data}, line)

    def keep(self, event: dict, line: bool | int | None = True) -> dict:
        """Append ``event`` (made here, or an entry of the record of calls), with its ``line`` (as :meth:`add`)."""
        at, via = _where() if line is True else (line or None, [])
        event.update(line=at, t=event.get("t", round(time.time(), 3)), **({"via": via} if via else {}))
        if event.get("phase") == "enter" and event["kind"] == "collective":  # the indices read before it, first
            self.flush_fetched()
        elif event.get("phase") == "enter" and event["kind"] == "backward":
            self.backwards += 1
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

    def starting(self, optimizer) -> None:
        """Before the first optimizer step: a fingerprint of the weights it starts from."""
        if self.steps == 0 and not _of(self.events, "weights"):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            digest = hashlib.sha1()
            for p in params:
                digest.update(p.detach().float().cpu().numpy().tobytes())
            self.add("weights", line=False, fp=digest.hexdigest()[:12], numel=sum(p.numel() for p in params))

    def stepped(self, optimizer) -> None:
        """After an optimizer step: the parameters it updated, and what led to the step since the last one."""
        self.flush_fetched()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        vector = torch.cat([p.detach().flatten().float().cpu() for p in params]) if params else torch.zeros(0)
        if self._params is not None:
            self._params.write(vector.numpy().tobytes())
            self._params.flush()
        self.add("step", n=self.steps, epoch_pass=self.passes.get("train", 0) - 1, numel=int(vector.numel()),
                 ddp_forwards=self.ddp_forwards, ddp_syncs=self.ddp_syncs, bypasses=self.bypasses,
                 backwards=self.backwards, losses=self.losses)
        self.steps += 1
        self.ddp_forwards = self.ddp_syncs = self.bypasses = self.backwards = 0
        self.losses = []

    def close(self) -> None:
        self.flush_fetched()
        for f in (self._file, self._params):
            if f is not None:
                f.close()
        self._file = self._params = None


# ----------------------------------------------------------------------------- what is observed


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


def _loader_iter(rec: Recorder, real):
    """A pass starts: recorded; in a probe of the data (``rec.reads``), a training pass is read from the loader's
    sampler at once and left empty, and the rank ends after ``rec.reads`` of them."""
    def observe(loader):
        _pass(rec, loader)
        if not rec.reads or rec.split_of(loader.dataset) != "train" or loader.batch_sampler is None:
            return real(loader)
        rec.fetched.setdefault("train", []).extend(int(i) for batch in loader.batch_sampler for i in batch)
        if rec.passes["train"] >= rec.reads:
            rec.flush_fetched()
            raise SystemExit(0)  # what the data rules need is recorded
        return iter(())
    return observe


def _pass(rec: Recorder, loader) -> None:
    split = rec.split_of(loader.dataset) or (rec.name_split(loader.dataset) if torch.is_grad_enabled() else None)
    if split is not None:
        rec.flush_fetched()
        rec.passes[split] = rec.passes.get(split, 0) + 1
        s = loader.sampler
        rec.add("pass", split=split, epoch_pass=rec.passes[split] - 1, sampler=type(s).__name__,
                sampler_id=id(s) if isinstance(s, DistributedSampler) else None,
                sampler_epoch=getattr(s, "epoch", None) if isinstance(s, DistributedSampler) else None,
                workers=loader.num_workers, **rec.loaders.get(id(loader), {}))


def _loader_init(rec: Recorder, real):
    def observe(self, dataset, *args, **kw):
        real(self, dataset, *args, **kw)
        collate = kw.get("collate_fn", args[5] if len(args) > 5 else None)  # after batch_size ... num_workers
        built = rec.add("loader", collate_fn=collate is not None)
        rec.loaders[id(self)] = {"loader": built["line"], "collate_fn": built["collate_fn"]}
    return observe


def _sampler_init(rec: Recorder, real):
    def observe(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, *args, **kw):
        real(self, dataset, num_replicas, rank, shuffle, seed, *args, **kw)
        event = rec.add("sampler", split=rec.split_of(dataset), id=id(self), given_replicas=num_replicas,
                        given_rank=rank, num_replicas=self.num_replicas, rank=self.rank, shuffle=self.shuffle,
                        seed=self.seed, n=len(dataset), local_rank=os.environ.get("LOCAL_RANK"), dataset=id(dataset))
        rec.samplers[id(self)] = event
        rec.name_split(dataset)
    return observe


def _set_epoch(rec: Recorder, sampler, epoch) -> None:
    rec.add("set_epoch", id=id(sampler), split=rec.split_of(sampler.dataset), epoch=int(epoch))


def _destroy(rec: Recorder, *args, **kw) -> None:
    rec.flush_fetched()
    rec.add("destroy")
    # Gloo on torch 2.13 can deadlock here right after a collective (workshop_lib.launching.joining.let_gloo_finish
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
                rec.ddp_syncs += module.require_backward_grad_sync  # False inside no_sync(): no all-reduce after it
            rec.in_ddp += 1

        def after(module, inputs, output):
            rec.in_ddp -= 1

        def inner(module, inputs):  # the plain model's forward: inside the wrapper's, or around it
            if rec.in_ddp == 0 and torch.is_grad_enabled() and module.training:
                rec.bypasses += 1
                if rec.bypasses == 1:  # the first training forward that went around the wrapper
                    rec.add("bypass")
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


def _seed(rec: Recorder, seed, *args, **kw) -> None:
    if os.getpid() == rec.pid and threading.get_ident() == rec.main:  # not a DataLoader worker's own seed
        rec.add("seed", seed=int(seed) if isinstance(seed, int) else str(seed))


def _logged(rec: Recorder, reporter, epoch, loss, samples, *args, **kw) -> None:
    rec.add("logged", epoch=epoch, loss=float(loss), samples=int(samples))


def _evaluate(rec: Recorder, model, loader, *args, **kw) -> None:
    rec.flush_fetched()
    rec.add("evaluate", model=type(model).__name__, split=rec.split_of(getattr(loader, "dataset", None)))


def _autocast(rec: Recorder, real):
    signature = inspect.signature(real)

    def observe(self, *args, **kw):
        try:
            given = signature.bind(self, *args, **kw).arguments
        except TypeError:  # torch's own error says it
            return real(self, *args, **kw)
        dtype = given.get("dtype")
        rec.add("autocast", device_type=given.get("device_type"), enabled=bool(given.get("enabled", True)),
                dtype=str(dtype).removeprefix("torch.") if dtype is not None else None)  # None: the device's default
        return real(self, *args, **kw)
    return observe


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
    (DataLoader, "__init__", _loader_init),  # where each loader was built, and whether it was given a collate_fn
    (DataLoader, "__iter__", _loader_iter),  # a pass starts: the loader's sampler
    (DistributedSampler, "__init__", _sampler_init),  # the arguments as given, the values the sampler resolved
    (DistributedSampler, "set_epoch", _before(_set_epoch)),
    (dist, "destroy_process_group", _before(_destroy)),
    (DistributedDataParallel, "__init__", _ddp_init),  # and forward hooks: the forwards through it, and around it
    (F, "binary_cross_entropy_with_logits", _loss),  # each training batch's loss
    (metrics, "evaluate", _before(_evaluate)),
    (torch, "manual_seed", _before(_seed)),  # the seed each rank gave, and where
    (torch.autocast, "__init__", _autocast),  # each autocast made: device type, dtype (None: the default), enabled
    (report.Reporter, "epoch", _before(_logged)),  # what rank 0 logged of an epoch, and where
    (torch, "save", _before(_save)),
    (torch, "load", _before(_load)),
)


@contextlib.contextmanager
def recording(rec: Recorder) -> Iterator[Recorder]:
    """Attach every observer (:data:`OBSERVED`, the record of calls, the step hook) while the block runs; then take
    them off."""
    with contextlib.ExitStack() as stack:
        for owner, name, wrap in OBSERVED:
            stack.enter_context(mock.patch.object(owner, name, new=wrap(rec, getattr(owner, name))))
        stack.enter_context(collectives.calls(rec.keep))
        hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: rec.stepped(optimizer))
        stack.callback(hook.remove)
        first = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: rec.starting(optimizer))
        stack.callback(first.remove)
        rec.stack = stack
        stack.callback(setattr, rec, "stack", None)
        stack.callback(rec.flush_fetched)
        yield rec


# ----------------------------------------------------------------------------- reading the records

def _of(events: list[dict], kind: str, **match) -> list[dict]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def _at(event: dict | None, key: str = "line") -> str:
    line = (event or {}).get(key)
    return f" (line {line})" if line else ""


def _and(items: Iterable) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def end(events: list[dict]) -> dict | None:
    found = _of(events, "end")
    return found[-1] if found else None


def how(events: list[dict]) -> str:
    """How this rank ended: its end record's :func:`~workshop_lib.launching.ends.how`."""
    return ends.how(end(events))


def waiting_in(events: list[dict]) -> dict | None:
    """The call this rank was inside when it stopped: a collective, backward() or init_process_group not left."""
    open_calls: list[dict] = []
    for e in events:
        if e["kind"] in ("collective", "backward", "init"):
            if e.get("phase") == "enter":
                open_calls.append(e)
            elif open_calls:
                open_calls.pop()
    return open_calls[-1] if open_calls else None


def call_name(event: dict) -> str:
    if event["kind"] == "backward":
        return "loss.backward() (DDP's gradient all-reduce)"
    if event["kind"] == "init":
        return "init_process_group"
    return event.get("name", event["kind"])


def steps(events: list[dict]) -> list[dict]:
    return _of(events, "step")


def spreads(params: dict[int, list[np.ndarray]]) -> list[float]:
    """After each optimizer step that every rank took: the largest difference of any weight from rank 0's."""
    ranks = sorted(params)
    count = min((len(params[r]) for r in ranks), default=0)
    out = []
    for k in range(count):
        ref = params[ranks[0]][k]
        diffs = [0.0]
        for r in ranks[1:]:
            v = params[r][k]
            diffs.append(float("inf") if v.shape != ref.shape else float(np.abs(v - ref).max(initial=0.0)))
        out.append(max(diffs))
    return out


def passes(events: list[dict], split: str) -> list[list[int]]:
    """The indices each pass over a loader of ``split`` fetched, in order, one list per pass."""
    found: dict[int, list[int]] = {p["epoch_pass"]: [] for p in _of(events, "pass", split=split)}
    for e in _of(events, "fetched", split=split):
        found.setdefault(e["epoch_pass"], []).extend(e["indices"])
    return [found[k] for k in sorted(found)]


def split_sizes(events: list[dict]) -> dict[str, int]:
    found = _of(events, "splits")
    return {k: v["n"] for k, v in found[0].items() if isinstance(v, dict)} if found else {}
