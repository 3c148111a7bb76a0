"""The hang watch's block, from every rank's answer (:func:`explain`: who never arrived, where each rank is, and each
rank's count of calls where the counts differ; each call an entry of the rank's record of calls,
:func:`~workshop_lib.debug.collectives.entry`), saved as JSON for the checks and figures.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from workshop_lib.debug import collectives
from workshop_lib.debug.collectives import called

PREFIX = "hangwatch: "  # starts every line of the block that a rank prints
POINT_TO_POINT = ("send", "recv")  # not every rank calls them: left out of the ranks' counts
RECORD_VARIABLE = "WORKSHOP_HANG_RECORD"  # a JSON file where the watch also saves its block (set by the launchers)


def _at(answer: dict) -> str:
    frames = answer["frames"]
    return f"{frames[-1][2]}() at {frames[-1][0]}:{frames[-1][1]}" if frames else "outside any Python frame"


def _last(answer: dict) -> str:
    last = answer.get("last")
    return f"its last collective was {called(last)}" if last else "it has entered no numbered collective yet"


def explain(rank: int, call: dict, how: str, answers: dict[int, dict], world_size: int,
            note: str | None = None) -> dict:
    """Why ``call`` is stuck on ``rank``, from every rank's answer: {"rank", "block": the lines to print (``note``: a
    line after the first), "missing": the ranks that never arrived, "line": the block in one line, 'rank 0 waits in
    all_reduce #3 (called at f.py:56 in mean()); rank 1 never joined it: it is in all_gather #3 ...'}."""
    name = called(call)
    lines, missing, instead = [f"rank {rank} {how} in {name} ({call['tensors']}), called at {call['where']}"], [], []
    for r in (r for r in range(world_size) if r != rank):
        a = answers.get(r)
        cur = (a or {}).get("current")
        if a is None:
            doing = "did not answer: it exited, crashed, or is stuck where Python cannot run"
            line = f"rank {r} {doing}"
        elif a.get("left"):
            doing = "has left the job (it called destroy_process_group)"
            line = f"rank {r} {doing}; {_last(a)}"
        elif cur and called(cur) == name and cur["tensors"] == call["tensors"]:
            lines.append(f"rank {r} is in {name} too ({_at(a)})")
            continue
        elif cur and called(cur) == name:
            doing = (f"but with {cur['tensors']} where rank {rank} has {call['tensors']}: every rank must pass the same "
                     f"shape and dtype")
            line = f"rank {r} is in {name} too, {doing}"
        elif cur and cur["kind"] == "backward":
            doing = f"is in loss.backward(), where DDP all-reduces the gradients ({_at(a)})"
            line = f"rank {r} never entered {name}: it {doing}; {_last(a)}"
        elif cur:
            doing = f"is in {called(cur)} ({cur['tensors']}) at {cur['where']}"
            line = f"rank {r} {doing}, not in {name}: the ranks called different collectives"
        else:
            doing = f"is in {_at(a)}"
            line = f"rank {r} never entered {name}: it {doing}, not in a collective; {_last(a)}"
        missing.append(r)
        instead.append(f"rank {r} is in it too, {doing}" if doing.startswith("but ") else
                       f"rank {r} never joined it: it {doing}")
        lines.append(line)
    if missing:
        lines.insert(1, f"never arrived: rank {', '.join(map(str, missing))}")
    if note:
        lines.insert(1, note)
    lines += filter(None, (_counts(answers), _first_difference(answers)))
    lines.append("where each rank is, outermost frame first:")
    for r in sorted(answers):
        frames = answers[r]["frames"][-4:]
        chain = " > ".join(f"{f}:{n} {fn}()" for f, n, fn, _ in frames) or "?"
        inner = answers[r]["inner"]
        lines.append(f"  rank {r}: {chain}" + (f" > torch {inner}()" if inner else ""))
        if frames and frames[-1][3]:
            lines.append(f"      {frames[-1][0]}:{frames[-1][1]}: {frames[-1][3]}")
    one = f"rank {rank} waits in {name} (called at {call['where']}); {instead[0]}" if instead else lines[0]
    return {"rank": rank, "block": lines, "line": one, "missing": missing}


def block(lines: Iterable[str]) -> list[str]:
    """The watch's block from a rank's output lines, without the prefix (nor a launcher's rank label before it)."""
    return [line.split(PREFIX, 1)[1] for line in lines if PREFIX in line]


def save(path: str | Path, report: dict, left: Iterable[int] = (), answers: dict[int, dict] | None = None) -> None:
    """Add the ``report`` a rank printed (:func:`explain`) to the JSON list in ``path`` (replaced whole), with the
    ranks it waits for (``waiting_for``: those that had not ``left``) and what each rank answered (``"answers":
    {"0": {...}}``: frames, current call, history, counts)."""
    path = Path(path)
    blocks = [*load(path), {**report, "waiting_for": [r for r in report["missing"] if r not in set(left)],
                            "answers": {str(r): a for r, a in sorted((answers or {}).items())}}]
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(blocks, f)
    os.replace(tmp, path)


def load(path: str | Path) -> list[dict]:
    """The blocks the watches of a job saved (:func:`save`), in order: [{"rank", "block", "line", "missing", ...}]."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []


def missing_rank(path: str | Path) -> str | None:
    """The one line of the first saved block where a rank waits for one still in the job (a hang that will last);
    a rank that has left is not waited for long: its sockets close, and the collective fails."""
    return next((b["line"] for b in load(path) if b["waiting_for"]), None)


def _counts(answers: dict[int, dict]) -> str | None:
    """'calls entered so far: rank 0: 9 all_reduce, 8 backward; rank 1: 8 all_reduce, 8 backward (every rank must
    ...)', where the ranks' counts (each answer's ``counts``) of collectives and backward passes differ."""
    counts = {r: {op: n for op, n in a["counts"].items() if op not in POINT_TO_POINT}
              for r, a in sorted(answers.items()) if a.get("counts") is not None}
    ops = sorted(set().union(*counts.values()), key=lambda op: (op == collectives.BACKWARD, op))
    table = {r: [c.get(op, 0) for op in ops] for r, c in counts.items()}
    if len(table) < 2 or len({tuple(n) for n in table.values()}) == 1:
        return None
    each = "; ".join(f"rank {r}: " + ", ".join(f"{n} {op}" for n, op in zip(ns, ops, strict=True))
                     for r, ns in table.items())
    steps = len({c.get(collectives.BACKWARD, 0) for c in counts.values()}) > 1
    return (f"calls entered so far: {each} (every rank must make the same calls as often as the others" +
            ("; under DDP each backward all-reduces the gradients, so the ranks must also run as many batches, or "
             "train inside DDP's join())" if steps else ")"))


def _first_difference(answers: dict[int, dict]) -> str | None:
    """'the ranks' collectives first differ at #n: rank 0 all_gather at f.py:9, rank 1 all_reduce at f.py:7'."""
    by_seq = {r: {c["seq"]: c for c in a.get("history", []) if c.get("seq")} for r, a in answers.items()}
    common = sorted(set.intersection(*(set(calls) for calls in by_seq.values()))) if by_seq else []
    # the numbered calls every rank remembers and has entered, compared by name, tensors and call site
    i = collectives.first_difference({r: [(calls[s]["name"], calls[s]["tensors"], calls[s]["where"]) for s in common]
                                      for r, calls in by_seq.items()})
    if i is None:
        return None
    each = ", ".join(f"rank {r} {c['name']} ({c['tensors']}) at {c['where']}"
                     for r, c in sorted((r, calls[common[i]]) for r, calls in by_seq.items()))
    return f"the ranks' collectives first differ (op, tensors or call site) at #{common[i]}: {each}"


