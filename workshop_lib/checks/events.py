"""Reading what the ranks recorded (:mod:`workshop_lib.checks.record`): the small helpers every rule uses."""

from __future__ import annotations

Events = dict[int, list[dict]]  # rank -> its events, in order

_LOST_PEERS = ("lost contact", "this rank stopped with it", "Connection closed", "Connection reset", "gloo",
               "Timed out", "timed out")


def _at(event: dict | None) -> str:
    line = (event or {}).get("line")
    return f" (line {line})" if line else ""


def _of(events: list[dict], kind: str, **match) -> list[dict]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def _end(events: list[dict]) -> dict | None:
    ends = _of(events, "end")
    return ends[-1] if ends else None


def _lost_peers(end: dict) -> bool:
    return any(s in (end.get("message") or "") for s in _LOST_PEERS)


def _and(ranks: list[int]) -> str:
    return " and ".join(str(r) for r in ranks)


def _at_end(end: dict) -> str:
    return f" (line {end['at']})" if end.get("at") else ""
