"""Figures for the notebooks: lengths, training curves, who-sees-which-molecule, speed-up.

Each function returns a matplotlib Figure that is already closed in pyplot, so
a notebook cell that ends with the call shows it exactly once (and a script can
``fig.savefig(...)``). Nothing is imported until a function is called.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from workshop_lib.errors import WorkshopError

# The tags workshop_lib/report.py writes each epoch (step = 0-based epoch).
LOSS_TAG = "loss/train"
AUC_TAG = "roc_auc/dev"
THROUGHPUT_TAG = "throughput/samples_per_second"


def _new_figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    import matplotlib.pyplot as plt  # pyplot, not Figure(): Jupyter's inline display hooks in on this import

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    plt.close(fig)  # not shown again at the end of the cell; the returned Figure still displays
    return fig, list(axes[0])


def length_histogram(lengths: Sequence[int]):
    """How many tokens the molecules have: the long tail is why batches group similar lengths."""
    fig, (ax,) = _new_figure(width=6.0, height=2.8)
    ax.hist(lengths, bins=60)
    ax.set(xlabel="tokens per molecule", ylabel="molecules", title="SMILES lengths in B3DB")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- training curves


def read_scalars(out_dir: str | Path) -> dict[str, dict[int, float]]:
    """{tag: {epoch: value}} from the TensorBoard event files of one run (``OUT/tensorboard``).

    ``out_dir`` may be the run's --out or its tensorboard folder. A resumed run
    appends event files; for an epoch written twice the later value wins.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out_dir = Path(out_dir)
    logdir = out_dir / "tensorboard" if (out_dir / "tensorboard").is_dir() else out_dir
    files = sorted(logdir.glob("events.out.tfevents.*"))
    if not files:
        raise WorkshopError(f"no TensorBoard event files in {logdir}; run a step script with --out {out_dir} "
                            "(and without --no-tensorboard) first")
    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(files, key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})  # 0: keep every point
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            points = scalars.setdefault(tag, {})
            for event in acc.Scalars(tag):
                points[event.step] = event.value
    return scalars


def _run_label(out_dir: Path) -> str:
    """'2 processes (runs/x)' from metrics.json where the run finished, else the folder name."""
    try:
        n = json.loads((out_dir / "metrics.json").read_text())["world_size"]
    except (OSError, ValueError, KeyError):
        return out_dir.name
    return f"{n} process{'es' if n != 1 else ''} ({out_dir.name})"


def training_curves(*out_dirs: str | Path, labels: Sequence[str] | None = None):
    """Train loss and dev ROC AUC against epoch, one line per run (overlay several --out dirs)."""
    if len(out_dirs) == 1 and isinstance(out_dirs[0], list | tuple):
        out_dirs = tuple(out_dirs[0])
    if not out_dirs:
        raise WorkshopError("training_curves needs at least one run directory (the --out of a step script)")
    paths = [Path(d) for d in out_dirs]
    if labels is not None and len(labels) != len(paths):
        raise WorkshopError(f"training_curves got {len(paths)} run(s) but {len(labels)} label(s); give one label per run")
    names = list(labels) if labels is not None else [_run_label(p) for p in paths]

    runs = []
    for path, name in zip(paths, names, strict=True):
        try:
            runs.append((name, read_scalars(path)))
        except WorkshopError:
            if len(paths) == 1:
                raise
            # Overlaying: a run not made yet (its notebook not run) should not hide the others.
            print(f"(no curves from {path}: no TensorBoard event files there yet; run the notebook that writes it)")
    if not runs:
        raise WorkshopError(f"none of {', '.join(map(str, paths))} holds TensorBoard event files; run the steps first")
    fig, (ax_loss, ax_auc) = _new_figure(ncols=2)
    for name, scalars in runs:
        for ax, tag in ((ax_loss, LOSS_TAG), (ax_auc, AUC_TAG)):
            points = scalars.get(tag, {})
            epochs = sorted(points)
            # +1: the console counts epochs from 1 ("epoch 1/10"), TensorBoard's step from 0
            ax.plot([e + 1 for e in epochs], [points[e] for e in epochs], marker="o", label=name)
    ax_loss.set(title="Training loss", xlabel="epoch", ylabel="mean train loss (BCE)")
    ax_auc.set(title="Dev ROC AUC (rank 0 evaluates)", xlabel="epoch", ylabel="dev ROC AUC")
    for ax in (ax_loss, ax_auc):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- shards


def _as_grid(indices) -> list[list[list[int]]]:
    """Accept [epoch][rank] -> indices, or {(epoch, rank): indices}."""
    if isinstance(indices, Mapping):
        epochs = sorted({e for e, _ in indices})
        ranks = sorted({r for _, r in indices})
        return [[list(indices[(e, r)]) for r in ranks] for e in epochs]
    return [[list(map(int, shard)) for shard in epoch] for epoch in indices]


def shard_picture(index_lists_by_epoch_and_rank, n: int, title: str | None = None):
    """Which dataset indices each rank sees in each epoch, and in what order.

    One row per (epoch, rank), one column per dataset index; the colour is the
    position of that index in the rank's order for that epoch, white where the
    rank never sees it. Rows that look alike from epoch to epoch mean the
    shuffle did not change (a forgotten ``sampler.set_epoch(epoch)``).
    """
    import numpy as np

    grid = _as_grid(index_lists_by_epoch_and_rank)
    if not grid or not grid[0]:
        raise WorkshopError("shard_picture needs index lists as [epoch][rank] -> list of dataset indices")
    n_ranks = len(grid[0])
    order = np.full((len(grid) * n_ranks, n), np.nan)  # (epochs*ranks, n): position in the epoch, NaN = unseen
    labels = []
    for e, shards in enumerate(grid):
        assert len(shards) == n_ranks, f"epoch {e} has {len(shards)} ranks, epoch 0 has {n_ranks}"
        for r, shard in enumerate(shards):
            row = e * n_ranks + r
            labels.append(f"epoch {e}, rank {r}")
            for pos, idx in reversed(list(enumerate(shard))):  # reversed: a padded repeat keeps its first position
                if not 0 <= idx < n:
                    raise WorkshopError(f"index {idx} (epoch {e}, rank {r}) is outside 0..{n - 1}; "
                                        "pass the dataset size as n")
                order[row, idx] = pos

    fig, (ax,) = _new_figure(width=max(6.0, min(14.0, 0.25 * n + 2)), height=max(2.5, 0.35 * len(labels) + 1.2))
    image = ax.imshow(np.ma.masked_invalid(order), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel(f"dataset index (0 .. {n - 1})")
    ax.set_title(title or "Which molecules each rank sees, per epoch")
    for e in range(1, len(grid)):  # a line between epochs
        ax.axhline(e * n_ranks - 0.5, color="black", linewidth=1.5)
    fig.colorbar(image, ax=ax, label="order within the epoch (0 = first)")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- speed-up


def _throughputs(results, metric: str) -> list[tuple[int, float]]:
    """[(processes, samples/s)] from a {processes: samples/s} mapping or a list of metrics.json dicts."""
    if isinstance(results, Mapping):
        pairs = [(int(k), float(v)) for k, v in results.items()]
    else:
        try:
            pairs = [(int(m["world_size"]), float(m[metric])) for m in results]
        except (KeyError, TypeError):
            raise WorkshopError(f"speedup_plot needs metrics.json dicts with 'world_size' and {metric!r}, "
                                "or a mapping {processes: samples per second}") from None
    if not pairs:
        raise WorkshopError("speedup_plot got no results; pass the metrics of at least one run")
    return sorted(pairs)


def speedup_plot(results, metric: str = "train_samples_per_second"):
    """Measured training throughput against the number of processes, with ideal linear scaling."""
    pairs = _throughputs(results, metric)
    procs = [p for p, _ in pairs]
    measured = [v for _, v in pairs]
    base_p, base_v = pairs[0]
    ideal = [base_v * p / base_p for p in procs]

    fig, (ax,) = _new_figure()
    plural = "es" if base_p != 1 else ""
    ax.plot(procs, ideal, linestyle="--", color="grey", label=f"ideal (linear from {base_p} process{plural})")
    ax.plot(procs, measured, marker="o", linewidth=2, label="measured")
    for p, v in pairs:
        ax.annotate(f"x{v / base_v:.2f}", (p, v), textcoords="offset points",
                    xytext=(6, -12), fontsize="small")
    ax.set(title="Training throughput vs processes", xlabel="processes (world size)",
           ylabel="training samples / second")
    ax.set_xticks(procs)
    ax.margins(x=0.15)  # room for the x-factor labels
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def speedup_bars(runs: dict[str, dict]):
    """Training throughput of named runs ({"1x1": metrics, "1x2": ..., "2x1": ...}): each epoch after the first
    as a dot, the median as a bar, labelled with its ratio to the first run's median."""
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
