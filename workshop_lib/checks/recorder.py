"""One rank's record: its events in order (:class:`Recorder`), and the observer of its collectives (:class:`Collectives`).

With a prefix, the events go to ``PREFIX.jsonl`` as they happen, one JSON object a line, each with ``kind`` and the
learner's ``line`` that led to it, and the parameters after each optimizer step to ``PREFIX.params``, as float32.
What is observed, and how, is :mod:`workshop_lib.checks.record`'s.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import torch

from workshop_lib.debug import collectives, frames

# The collectives recorded: those a learner's code calls itself (DDP's own run in C++ inside backward).
RECORDED = ("all_reduce", "all_gather", "broadcast", "barrier", "gather_object", "all_gather_object",
            "broadcast_object_list", "reduce", "gather", "scatter", "all_gather_into_tensor", "reduce_scatter_tensor",
            "monitored_barrier")
SMALL = 16  # a collective's tensor of at most this many elements is recorded by value, before and after


def _line() -> int | None:
    """The line of the learner's code that led here: the innermost frame outside torch and workshop_lib."""
    frame = frames.caller(core_is_library=True)
    return frame.lineno if frame is not None else None


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
