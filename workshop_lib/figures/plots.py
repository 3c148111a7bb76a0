"""Figures for the notebooks: the molecules' lengths, a run's curves, who sees which molecule, the speed-up; each
returned closed, so a cell shows it once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from workshop_lib.errors import WorkshopError


def _new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **options):
    """A figure and its axes (a list, row by row), closed in pyplot: the cell that returns it shows it once."""
    import matplotlib.pyplot as plt  # pyplot, not Figure(): Jupyter's inline display hooks in on this import

    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **options)
    plt.close(fig)
    return fig, list(axes.flat)


def length_histogram(lengths: Sequence[int]):
    """How many molecules have each number of tokens: one bar per length, so a batch's padding can be read off."""
    lengths = [int(n) for n in lengths]
    if not lengths:
        raise WorkshopError("length_histogram needs the token count of at least one molecule")
    fig, (ax,) = _new_figure(width=6.0, height=2.8)
    ax.hist(lengths, bins=range(min(lengths), max(lengths) + 2), color="#4c78a8")  # one bin per token count
    ax.set(xlabel="tokens per molecule", ylabel="molecules", title=f"{len(lengths):,} SMILES: tokens per molecule")
    fig.tight_layout()
    return fig


def training_curves(out: str | Path):
    """One run's train loss and dev ROC AUC per epoch, as its ``metrics.json`` (the Reporter's) holds them."""
    from workshop_lib.metrics import read_metrics

    try:
        history = read_metrics(out)["history"]
    except (OSError, ValueError, KeyError):
        raise WorkshopError(f"no finished run in {out} (its metrics.json, with a history): run the training cell "
                            "above first, with --out pointing there") from None
    epochs = [row["epoch"] + 1 for row in history]  # counted from 1, as on the console
    fig, (ax_loss, ax_auc) = _new_figure(width=8.0, height=3.0, ncols=2)
    ax_loss.plot(epochs, [row["train_loss"] for row in history], marker="o")
    ax_loss.set(title="Training loss", xlabel="epoch", ylabel="mean train loss (BCE)")
    ax_auc.plot(epochs, [row["dev_roc_auc"] for row in history], marker="o", color="#f58518")
    ax_auc.set(title="Dev ROC AUC", xlabel="epoch", ylabel="dev ROC AUC")
    for ax in (ax_loss, ax_auc):
        ax.set_xticks(epochs)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def shard_picture(grid, n: int, title: str | None = None, blocks: Sequence[str] | None = None):
    """Which dataset indices each rank sees (``grid[block][rank]``, a block an epoch unless ``blocks`` names them),
    coloured by their order in the block; a padded repeat outlined in red, an index no rank reads hatched.

    Rows alike from epoch to epoch mean the shuffle did not change (a forgotten ``sampler.set_epoch(epoch)``). A
    padded repeat is a read of an index already read in the block, in the sampler's order (position, then rank):
    ``DistributedSampler`` appends its repeats at the end of its list, so these are the ones it added.
    """
    import numpy as np
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import MaxNLocator

    grid = [[list(map(int, shard)) for shard in block] for block in grid]
    if not grid or not grid[0]:
        raise WorkshopError("shard_picture needs index lists as [epoch][rank] -> list of dataset indices")
    if blocks is not None and len(blocks) != len(grid):
        raise WorkshopError(f"{len(blocks)} block names for {len(grid)} blocks of rows: name each block once")
    names = list(blocks) if blocks is not None else [f"epoch {e}" for e in range(len(grid))]
    n_ranks = len(grid[0])
    order = np.full((len(grid) * n_ranks, n), np.nan)  # (blocks*ranks, n): position in the block, NaN = unseen
    labels, repeats, dropped = [], [], []  # (row, index) read again; (block, index) read by no rank
    for e, shards in enumerate(grid):
        assert len(shards) == n_ranks, f"block {e} has {len(shards)} ranks, block 0 has {n_ranks}"
        for r, shard in enumerate(shards):
            row = e * n_ranks + r
            labels.append(f"{names[e]}, rank {r}")
            for pos, idx in reversed(list(enumerate(shard))):  # reversed: a padded repeat keeps its first position
                if not 0 <= idx < n:
                    raise WorkshopError(f"index {idx} ({names[e]}, rank {r}) is outside 0..{n - 1}; "
                                        "pass the dataset size as n")
                order[row, idx] = pos
        seen: set[int] = set()
        for pos, r in sorted((pos, r) for r, shard in enumerate(shards) for pos in range(len(shard))):
            if shards[r][pos] in seen:
                repeats.append((e * n_ranks + r, shards[r][pos]))
            seen.add(shards[r][pos])
        dropped += [(e, idx) for idx in range(n) if idx not in seen]

    fig, (ax,) = _new_figure(width=max(6.0, min(14.0, 0.25 * n + 2)), height=max(2.5, 0.35 * len(labels) + 1.2))
    image = ax.imshow(np.ma.masked_invalid(order), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel(f"dataset index (0 .. {n - 1})")
    ax.set_title(title or "Which molecules each rank sees, per epoch")
    for e in range(1, len(grid)):  # a line between blocks
        ax.axhline(e * n_ranks - 0.5, color="black", linewidth=1.5)
    for row, idx in repeats:
        ax.add_patch(Rectangle((idx - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=3, gid="repeat"))
    for e, idx in dropped:
        ax.add_patch(Rectangle((idx - 0.5, e * n_ranks - 0.5), 1, n_ranks, facecolor="none", edgecolor="grey",
                               hatch="//", linewidth=0, gid="dropped"))
    legend = ([Patch(fill=False, edgecolor="red", linewidth=3, label=f"padded repeat ({len(repeats)})")]
              if repeats else []) + ([Patch(facecolor="none", edgecolor="grey", hatch="//",
                                            label=f"read by no rank ({len(dropped)})")] if dropped else [])
    if legend:
        ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    fig.colorbar(image, ax=ax, ticks=MaxNLocator(integer=True),
                 label=f"order within the {'block' if blocks else 'epoch'} (0 = first)")
    fig.tight_layout()
    return fig


def speedup_bars(runs: dict[str, dict]):
    """Throughput of named runs ({"1x1": metrics, ...}): each epoch after the first a dot, the median a bar."""
    import statistics

    names = list(runs)
    epochs = {n: [row["samples_per_second"] for row in runs[n]["history"][1:]] for n in names}
    if any(not e for e in epochs.values()):
        raise WorkshopError("speedup_bars needs runs of 2 epochs or more (the first epoch is not timed fairly)")
    medians = [statistics.median(epochs[n]) for n in names]
    fig, (ax,) = _new_figure(width=5.5, height=3.2)
    ax.bar(range(len(names)), medians, color="#9ecae1", label="median of the epochs after the first")
    for i, n in enumerate(names):
        ax.plot([i] * len(epochs[n]), epochs[n], "o", color="#08519c", markersize=4,
                label="one epoch" if i == 0 else None)
        ax.annotate(f"x{medians[i] / medians[0]:.2f}", (i, medians[i]), textcoords="offset points", xytext=(0, 4),
                    ha="center", fontsize="small")
    ax.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize="small")
    ax.set(title="Training throughput (processes x threads)", ylabel="training samples / second")
    ax.set_ylim(0, max(max(e) for e in epochs.values()) * 1.15)
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    return fig
