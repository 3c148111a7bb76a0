"""Learning rate against global batch: the rules (none, sqrt(k), linear k), and ``benchmarks/lr_scaling.py``'s runs.

k = the global batch / the one the learning rate was tuned at; linear is Goyal et al. 2017 (SGD), sqrt the usual
start for Adam-type optimizers. The figure: mean best dev ROC AUC over the seeds, and their spread.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from workshop_lib.figures import plots
from workshop_lib.paths import clone_root

RESULTS = Path("benchmarks", "results", "lr_scaling.json")  # in the clone: the measured runs
RULES = {"none": lambda k: 1.0, "sqrt": math.sqrt, "linear": lambda k: k}


def scaled(lr: float, global_batch: int, tuned_at: int) -> dict[str, float]:
    """The learning rate each rule gives at ``global_batch``, for an ``lr`` tuned at ``tuned_at``."""
    return {rule: lr * f(global_batch / tuned_at) for rule, f in RULES.items()}


def read() -> dict:
    """The measured runs, in the clone's :data:`RESULTS`."""
    return json.loads((clone_root("lr_scaling.read()") / RESULTS).read_text())


def mean_dev(runs: dict) -> dict[tuple[int, str], float]:
    """{(ranks, rule): mean best dev ROC AUC over the seeds}."""
    return {(r["nprocs"], r["rule"]): sum(r["dev_roc_auc"]) / len(r["dev_roc_auc"]) for r in runs["runs"]}


def figure(runs: dict):
    """Best dev ROC AUC (mean, and the seeds' lowest to highest) by rank count and rule."""
    fig, (ax,) = plots._new_figure(width=6.0, height=3.2)
    counts, mean = sorted({r["nprocs"] for r in runs["runs"]}), mean_dev(runs)
    for i, rule in enumerate(RULES):
        rows = sorted((r for r in runs["runs"] if r["rule"] == rule), key=lambda r: r["nprocs"])
        xs = [counts.index(r["nprocs"]) + (i - 1) * 0.18 for r in rows]
        means = [mean[r["nprocs"], rule] for r in rows]
        spread = [[m - min(r["dev_roc_auc"]) for m, r in zip(means, rows, strict=True)],
                  [max(r["dev_roc_auc"]) - m for m, r in zip(means, rows, strict=True)]]
        ax.errorbar(xs, means, yerr=spread, fmt="o", capsize=3, label=f"lr rule: {rule}")
    batch = {r["nprocs"]: r["global_batch"] for r in runs["runs"]}
    ax.set_xticks(range(len(counts)), [f"{n} rank{'s' if n > 1 else ''}\nglobal batch {batch[n]}" for n in counts])
    ax.set(ylabel="best dev ROC AUC", title=f"{runs['epochs']} epochs, seeds {runs['seeds']}: mean and range")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig
