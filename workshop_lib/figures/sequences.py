"""The ranks' sequences of calls side by side, drawn from the hang watch's record, the first difference marked.

Each rank's answer holds its ``history``, its latest calls in order (entries of its record of calls,
:func:`~workshop_lib.debug.collectives.entry`: collectives, DDP's buffer broadcasts, and backward() calls, in each of
which DDP all-reduces the gradients), and the ``current`` one: :func:`sequence` reads them, :func:`first_difference`
finds where the lists part, :func:`draw` shows them in columns, agreed calls folded.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

from workshop_lib.debug import collectives

FOLD = 4  # agreed rows beyond this many are folded into one


def key(call: dict) -> tuple:
    """What must match across ranks: the call, and for a collective its tensors and call site."""
    return ("backward",) if call["kind"] == "backward" else (call["name"], call["tensors"], call["where"])


def label(call: dict) -> str:
    return f"backward() #{call['n']}" if call["kind"] == "backward" else collectives.called(call)


def answers(record: Sequence[dict] | dict) -> dict[int, dict]:
    """{rank: its answer} from a hang record (hangreport.load's list: its first block) or from one block."""
    block = record if isinstance(record, dict) else next((b for b in record if b.get("answers")), {})
    found = {int(r): a for r, a in block.get("answers", {}).items()}
    if not found:
        raise ValueError("the record holds no rank's answer: was the job's watch saving its record?")
    return found


def sequence(answer: dict) -> list[dict]:
    """One rank's calls, in order, as far as it remembers them; ``waiting``: the call it is in."""
    return [{**call, "waiting": call == answer.get("current")} for call in answer.get("history", [])]


def first_difference(sequences: dict[int, list[dict]]) -> int | None:
    """The first position (0-based) where the ranks' calls differ, or where one rank has none; None if all agree."""
    return collectives.first_difference({r: [key(call) for call in s] for r, s in sequences.items()})


def describe(record: Sequence[dict] | dict) -> str:
    """The first difference in one sentence: 'call 8: rank 0 all_gather #2 (at ...), rank 1 all_reduce #2 (...)'."""
    seqs = {r: sequence(a) for r, a in sorted(answers(record).items())}
    i = first_difference(seqs)
    if i is None:
        return "the ranks' sequences of collectives agree, as far as the record goes"

    def said(s: list[dict]) -> str:
        return f"{label(s[i])} at {s[i]['where']}" if i < len(s) else "nothing (it called no more)"

    each = ", ".join(f"rank {r} {said(s)}" for r, s in seqs.items())
    return f"the ranks' calls first differ at call {i + 1}: {each}"


def _rows(seqs: dict[int, list[dict]]) -> list[tuple[str, object]]:
    """("same", [steps]) rows the ranks agree on (runs of one op grouped), then ("differ", {rank: step}) rows."""
    first = first_difference(seqs)
    agreed = next(iter(seqs.values()))[: first if first is not None else None]
    rows: list[tuple[str, object]] = [("same", list(run)) for _, run in itertools.groupby(agreed, key=key)]
    if len(rows) > FOLD:  # fold the beginning, keep the last rows before the difference
        folded = [step for _, steps in rows[: -FOLD + 1] for step in steps]
        rows = [("folded", folded), *rows[-FOLD + 1:]]
    if first is not None:
        for i in range(first, max(len(s) for s in seqs.values())):
            rows.append(("differ", {r: s[i] for r, s in seqs.items() if i < len(s)}))
    return rows


def _text(call: dict, count: int = 1) -> str:
    head = f"backward() ×{count}" if count > 1 else label(call)
    detail = "DDP's gradient all-reduce" if call["kind"] == "backward" else call["tensors"]
    where = call["where"].replace(", from ", "\nfrom ")
    return "\n".join((head + ("   (waiting)" if call["waiting"] else ""), detail, where))


def draw(record: Sequence[dict] | dict, ax=None) -> None:
    """Draw the ranks' calls in columns, the first difference in red, and print it in one sentence (:func:`describe`)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    seqs = {r: sequence(a) for r, a in sorted(answers(record).items())}
    rows = _rows(seqs)
    ranks = sorted(seqs)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2 * len(ranks), 0.85 * len(rows) + 0.9))
    box = {"boxstyle": "round,pad=0.02,rounding_size=0.05", "linewidth": 1.2}
    for y, (kind, content) in zip(itertools.count(len(rows) - 1, -1), rows, strict=False):
        if kind in ("same", "folded"):
            steps = content
            if kind == "folded":
                counts = Counter("backward()" if s["kind"] == "backward" else s["name"] for s in steps)
                text = f"{len(steps)} calls, the same on every rank:\n" + ", ".join(
                    f"{op} ×{k}" if k > 1 else op for op, k in counts.items())
            else:
                text = _text(steps[0], len(steps))
            ax.add_patch(FancyBboxPatch((0.05, y + 0.1), len(ranks) - 0.1, 0.8, facecolor="#eeeeee",
                                        edgecolor="#999999", **box))
            ax.text(len(ranks) / 2, y + 0.5, text, ha="center", va="center", fontsize=8)
            continue
        for col, r in enumerate(ranks):
            step = content.get(r)
            if step is None:
                ax.text(col + 0.5, y + 0.5, "(no call)", ha="center", va="center", fontsize=8, color="#666666")
                continue
            ax.add_patch(FancyBboxPatch((col + 0.05, y + 0.1), 0.9, 0.8, facecolor="#fde0dc", edgecolor="#c62828",
                                        **box))
            ax.text(col + 0.5, y + 0.5, _text(step), ha="center", va="center", fontsize=8)
    first = next((y for y, (kind, _) in zip(itertools.count(len(rows) - 1, -1), rows, strict=False)
                  if kind == "differ"), None)
    if first is not None:
        ax.annotate("first difference", xy=(0, first + 0.5), xytext=(-0.08, first + 0.5), ha="right", va="center",
                    fontsize=9, color="#c62828", annotation_clip=False)
    for col, r in enumerate(ranks):
        ax.text(col + 0.5, len(rows) + 0.15, f"rank {r}", ha="center", va="bottom", fontsize=10, weight="bold")
    ax.set_xlim(0, len(ranks))
    ax.set_ylim(0, len(rows) + 0.6)
    ax.set_axis_off()
    ax.set_title("the collectives each rank entered, in order (from the hang watch's record)", fontsize=10, pad=14)
    plt.show()
    print(describe(record))
