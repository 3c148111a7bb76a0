"""Collectives as boxes: what each rank holds before, and after all_reduce, broadcast, all_gather, reduce_scatter.

:func:`before_after` draws the dicts a notebook's function returned on each rank, prints what each holds after
each collective, and asserts what the collective promises.
"""

from __future__ import annotations

from collections.abc import Sequence

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
PROMISE = {"all_reduce": "every rank: the element-wise sum",
           "broadcast": "every rank: rank 0's tensor",
           "all_gather": "every rank: every rank's tensor, in rank order",
           "reduce_scatter": "rank r: the sum of everyone's part r"}
RANK_COLOURS = ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc")  # a value held by one rank only: that rank's colour
SUM_COLOUR = "#d9d9d9"  # a value made of several ranks' values


def _values(tensor) -> list[float]:
    return [float(v) for v in tensor.flatten()]


def _expected(results: Sequence[dict], op: str, rank: int) -> list[float]:
    befores = [_values(r["before"]) for r in results]
    total = [sum(col) for col in zip(*befores, strict=True)]
    if op == "all_reduce":
        return total
    if op == "broadcast":
        return befores[0]
    if op == "all_gather":
        return [v for vs in befores for v in vs]
    part = len(total) // len(results)
    return total[rank * part:(rank + 1) * part]


def _text(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _colour(value: float, befores: list[list[float]]) -> str:
    owners = [r for r, vs in enumerate(befores) if value in vs]
    return RANK_COLOURS[owners[0] % len(RANK_COLOURS)] if len(owners) == 1 else SUM_COLOUR


def before_after(results: Sequence[dict]):
    """One column per collective, one row per rank: each value a box, coloured by the rank it came from."""
    from matplotlib.patches import Rectangle

    from workshop_lib.figures.plots import _new_figure

    befores = [_values(r["before"]) for r in results]
    for op in OPS:
        for rank, r in enumerate(results):
            got = _values(r[op])
            assert got == _expected(results, op, rank), f"{op} left {got} on rank {rank}: not what it promises"
        print(f"{op + ':':16}" + "   ".join(f"rank {rank} {_text(_values(r[op]))}" for rank, r in enumerate(results))
              + f"   ({PROMISE[op]})")
    columns = ["before", *OPS]
    widths = [max(len(_values(r[key])) for r in results) for key in columns]
    fig, (ax,) = _new_figure(width=1.0 + 0.55 * (sum(widths) + len(columns)), height=0.9 + 0.65 * len(results))
    ax.set(xlim=(-1.2, sum(widths) + len(columns)), ylim=(-0.2 - len(results), 0.9))
    ax.axis("off")
    x = 0.0
    for key, width in zip(columns, widths, strict=True):
        ax.text(x + width / 2, 0.4, key, ha="center", fontsize=9, weight="bold")
        for rank, r in enumerate(results):
            for i, value in enumerate(_values(r[key])):
                ax.add_patch(Rectangle((x + i, -rank - 0.9), 0.95, 0.8, fc=_colour(value, befores), ec="#555"))
                ax.text(x + i + 0.47, -rank - 0.5, f"{value:g}", ha="center", va="center", fontsize=8)
        x += width + 1
    for rank in range(len(results)):
        ax.text(-0.3, -rank - 0.5, f"rank {rank}", ha="right", va="center", fontsize=9)
    ax.set_title("what each rank holds, before and after each collective (grey: a sum of several ranks' values)",
                 fontsize=9)
    return fig
