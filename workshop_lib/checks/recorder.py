"""One rank's record: its events in order (:class:`Recorder`; with a prefix, also PREFIX.jsonl, and the parameters
after each optimizer step in PREFIX.params), the observer of its collectives (:class:`Collectives`), and the readers
of the records: how each rank left, what it waited in, the replicas' spread, what each loader pass read."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
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


# ----------------------------------------------------------------------------- reading the records

# A rank whose collective failed because a peer went away, or waited out the group's timeout: not the culprit.
_LOST = ("Connection closed", "Connection reset", "Broken pipe", "lost contact", "connection refused",
         "Connection refused", "ECONNRESET", "EPIPE", "peer", "Socket closed")
_TIMED_OUT = ("Timed out", "timed out", "Timeout", "timeout")


def _of(events: list[dict], kind: str, **match) -> list[dict]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def _at(event: dict | None, key: str = "line") -> str:
    line = (event or {}).get(key)
    return f" (line {line})" if line else ""


def _and(items: Iterable) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def end(events: list[dict]) -> dict | None:
    ends = _of(events, "end")
    return ends[-1] if ends else None


def how(events: list[dict]) -> str:
    """'ok', 'exit', 'error', 'lost' (a peer went away), 'timed out' (the group's timeout), or 'stopped'."""
    e = end(events)
    if e is None:
        return "stopped"
    if e["how"] != "error":
        return e["how"]
    message = e.get("message") or ""
    if any(s in message for s in _TIMED_OUT):
        return "timed out"
    if any(s in message for s in _LOST):
        return "lost"
    return "error"


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
