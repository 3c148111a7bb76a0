"""Ring all-reduce, step by step: what each of N ranks holds after each of its 2(N-1) steps.

Each rank cuts its vector into N chunks, sends to rank r+1 and receives from r-1, a chunk a step: N-1 steps of
reduce-scatter (the receiver adds), then N-1 of all-gather (the receiver overwrites). A rank sends 2(N-1)/N x S
bytes in all: the ring's cost in :mod:`workshop_lib.scaling.cost`. :func:`steps` computes, :func:`figure` draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """What one rank holds of one chunk: the partial sum, and which ranks' values are in it."""

    value: float
    sources: frozenset[int]


@dataclass(frozen=True)
class State:
    """The ranks' holdings after one step (step 0: before the first); ``sends``: (from, to, chunk) of that step."""

    step: int
    phase: str
    held: tuple[tuple[Chunk, ...], ...]  # held[rank][chunk]
    sends: tuple[tuple[int, int, int], ...]


def steps(values: Sequence[Sequence[float]]) -> list[State]:
    """Every state of a ring all-reduce of ``values[rank][chunk]`` (N ranks, N chunks each), 2(N-1) steps."""
    n = len(values)
    if n < 2 or any(len(v) != n for v in values):
        raise ValueError(f"need N >= 2 ranks with N chunks each, got {n} ranks with {[len(v) for v in values]}")
    held = [[Chunk(float(v), frozenset({r})) for v in row] for r, row in enumerate(values)]
    states = [State(0, "start", tuple(map(tuple, held)), ())]
    for s in range(1, 2 * (n - 1) + 1):
        scatter = s <= n - 1
        # every rank sends at once: what it held before this step
        sends = tuple((r, (r + 1) % n, (r - s + 1) % n) for r in range(n))
        before = [row[:] for row in held]
        for src, dst, c in sends:
            sent = before[src][c]
            held[dst][c] = (Chunk(held[dst][c].value + sent.value, held[dst][c].sources | sent.sources)
                            if scatter else sent)
        states.append(State(s, "reduce-scatter" if scatter else "all-gather", tuple(map(tuple, held)), sends))
    return states


def everyone_holds_the_sum(state: State, values: Sequence[Sequence[float]]) -> bool:
    """After the last step: every rank holds, in every chunk, the sum over all ranks."""
    n = len(values)
    totals = [sum(values[r][c] for r in range(n)) for c in range(n)]
    return all(abs(state.held[r][c].value - totals[c]) < 1e-9 and len(state.held[r][c].sources) == n
               for r in range(n) for c in range(n))


def chunks_sent_per_rank(states: Sequence[State]) -> int:
    """How many chunks (of S/N bytes) each rank sent over the whole all-reduce: 2(N-1)."""
    return sum(1 for st in states for src, _, _ in st.sends if src == 0)


def figure(states: Sequence[State], cols: int = 4):
    """One small table a step: rows are ranks, columns chunks; the shade counts the ranks summed in, the
    framed cells are the chunks received in that step."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from workshop_lib.figures.plots import _new_figure

    n = len(states[0].held)
    rows = -(-len(states) // cols)
    fig, axes = _new_figure(2.45 * cols, 2.45 * rows, rows, cols)
    cmap = plt.get_cmap("Blues")
    for ax in axes[len(states):]:
        ax.axis("off")
    for ax, st in zip(axes, states, strict=False):
        received = {(dst, c) for _, dst, c in st.sends}
        for r in range(n):
            for c in range(n):
                ch = st.held[r][c]
                share = len(ch.sources) / n
                ax.add_patch(Rectangle((c, r), 1, 1, facecolor=cmap(0.15 + 0.75 * share),
                                       edgecolor="tab:red" if (r, c) in received else "white",
                                       linewidth=2.2 if (r, c) in received else 1))
                ax.text(c + 0.5, r + 0.5, f"{ch.value:g}", ha="center", va="center", fontsize=8,
                        color="white" if share > 0.6 else "black")
        ax.set(xlim=(0, n), ylim=(n, 0), xticks=[c + 0.5 for c in range(n)], yticks=[r + 0.5 for r in range(n)])
        ax.set_xticklabels([f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticklabels([f"rank {r}" for r in range(n)], fontsize=7)
        ax.tick_params(length=0)
        ax.set_title("start" if st.step == 0 else f"step {st.step}: {st.phase}", fontsize=8)
    fig.suptitle(f"Ring all-reduce of {n} ranks: 2(N-1) = {2 * (n - 1)} steps; darker = more ranks summed in, "
                 "red frame = received this step", fontsize=9)
    fig.tight_layout()
    return fig
