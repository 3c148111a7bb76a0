"""Reading what the ranks recorded (:mod:`workshop_lib.checks.record`): the measurements every rule uses.

A :class:`~workshop_lib.checks.runner.Run` holds each rank's events and its parameters after each optimizer step.
The functions here turn them into what the rules judge: how each rank left, what it was waiting in, the replicas'
spread after each step, the indices each loader pass read.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

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


def samplers(events: list[dict], split: str | None = None) -> list[dict]:
    made = _of(events, "sampler")
    return made if split is None else [s for s in made if s.get("split") == split]


def split_sizes(events: list[dict]) -> dict[str, int]:
    found = _of(events, "splits")
    return {k: v["n"] for k, v in found[0].items() if isinstance(v, dict)} if found else {}
