"""The hang watch's block, from every rank's answer (:func:`explain`: who never arrived, where each rank is, and each
rank's count of calls where the counts differ; each call an entry of the rank's record of calls,
:func:`~workshop_lib.debug.collectives.entry`), saved as JSON for the checks and figures.
"""

from __future__ import annotations

import json
import os
import re
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


def explain(rank: int, call: dict, how: str, answers: dict[int, dict], world_size: int,
            note: str | None = None) -> list[str]:
    """The lines that explain ``call`` stuck on ``rank``, from every rank's answer (``note``: a line after the first)."""
    name = called(call)
    lines = [f"rank {rank} {how} in {name} ({call['tensors']}), called at {call['where']}"]
    missing = []
    for r in range(world_size):
        if r == rank:
            continue
        a = answers.get(r)
        if a is None:
            missing.append(r)
            lines.append(f"rank {r} did not answer: it exited, crashed, or is stuck where Python cannot run")
            continue
        cur, last = a["current"], a["last"]
        last_text = f"its last collective was {called(last)}" if last else \
            "it has entered no numbered collective yet"
        if a.get("left"):
            missing.append(r)
            lines.append(f"rank {r} has left the job (it called destroy_process_group); {last_text}")
        elif cur and called(cur) == name:
            if cur["tensors"] != call["tensors"]:
                missing.append(r)
                lines.append(f"rank {r} is in {name} too, but with {cur['tensors']} where rank {rank} has "
                             f"{call['tensors']}: every rank must pass the same shape and dtype")
            else:
                lines.append(f"rank {r} is in {name} too ({_at(a)})")
        elif cur and cur["kind"] == "backward":
            missing.append(r)
            lines.append(f"rank {r} never entered {name}: it is in loss.backward(), where DDP all-reduces the "
                         f"gradients ({_at(a)}); {last_text}")
        elif cur:
            missing.append(r)
            lines.append(f"rank {r} is in {called(cur)} ({cur['tensors']}) at {cur['where']}, not in {name}: the "
                         f"ranks called different collectives")
        else:
            missing.append(r)
            lines.append(f"rank {r} never entered {name}: it is in {_at(a)}, not in a collective; {last_text}")
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
    return lines


def block(lines: Iterable[str]) -> list[str]:
    """The watch's block from a rank's output lines, without the prefix (nor a launcher's rank label before it)."""
    return [line.split(PREFIX, 1)[1] for line in lines if PREFIX in line]


def save(path: str | Path, rank: int, block: list[str], left: Iterable[int] = (),
         answers: dict[int, dict] | None = None) -> None:
    """Add the block ``rank`` printed to the JSON list in ``path`` (replaced whole), with the ranks that had ``left``
    and what each rank answered (``"answers": {"0": {...}}``: frames, current call, history, backwards)."""
    path = Path(path)
    missing = never_arrived(block)
    blocks = [*load(path), {"rank": rank, "block": block, "line": one_line(block), "missing": missing,
                            "waiting_for": [r for r in missing if r not in set(left)],
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


def never_arrived(block: list[str]) -> list[int]:
    """The ranks that the block says never arrived."""
    line = next((x for x in block if x.startswith("never arrived: rank ")), "")
    return [int(r) for r in line.removeprefix("never arrived: rank ").split(", ") if r.strip().isdigit()]


_HEAD = re.compile(r"^rank (\d+) .+? in (\S+ #\d+|loss\.backward\(\)) \(.*?\)(?:, called at (.*))?$")


def one_line(block: list[str]) -> str:
    """The block in one line: 'rank 0 waits in all_reduce #3 (called at f.py:56 in mean()); rank 1 never joined it:
    it is in all_gather #3 ...'."""
    head = block[0] if block else "a rank waits in a collective"
    missing = next((line for line in block if line.startswith("never arrived: rank ")), "")
    first = missing.removeprefix("never arrived: rank ").split(",")[0].strip()
    instead = next((line for line in block[1:] if first and line.startswith(f"rank {first} ")), "")
    m = _HEAD.match(head)
    if not (m and instead):
        return f"{head}; {instead}" if instead else head
    waiter, call, where = m.groups()
    doing = instead[len(f"rank {first} "):]
    doing = re.sub(r"^never entered [^:]+: ", "", doing).split("; ")[0].split(", not in ")[0]
    joined = "is in it too, but" if " too, but with " in doing else "never joined it:"
    doing = doing.split(" too, but ")[-1] if " too, but with " in doing else \
        doing if doing.startswith("it ") else f"it {doing}"
    return f"rank {waiter} waits in {call}" + (f" (called at {where})" if where else "") + \
        f"; rank {first} {joined} {doing}"


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


