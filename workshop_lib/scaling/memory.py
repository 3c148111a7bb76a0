"""Memory per rank for DDP and FSDP, without activations: bytes per parameter, and a figure.

Training in float32 with AdamW keeps, per parameter, 4 bytes of weight, 4 of
gradient and 8 of optimizer state (two moments): 16 bytes. DDP keeps all of it
on every rank, plus its gradient buckets (another 4 bytes, unless
``gradient_as_bucket_view=True`` makes the gradients views into them).

FSDP (``fully_shard``) keeps 1/N of the weights, the gradients and the optimizer
state on each of N ranks. While it computes a unit (what ``fully_shard`` was
called on) it all-gathers the unit's full weights, and in backward that unit's
full gradients exist until they are reduce-scattered. Sharding only the whole
model makes it one unit: the full weights and gradients are all there at the
peak, and only the optimizer state and the shards stay divided, so the peak
still drops, by less. Sharding each of B blocks (then the model) leaves about one
block whole at a time.
"""

from __future__ import annotations

from collections.abc import Mapping

WEIGHT, GRAD, ADAM = 4, 4, 8  # bytes per parameter: float32 weight and gradient, AdamW's two float32 moments
BUCKET = 4  # DDP's gradient buckets: one more float32 copy of the gradients (none with gradient_as_bucket_view)
GiB = 1024 ** 3


def per_rank(params: float, ranks: int, how: str, blocks: int = 1) -> dict[str, float]:
    """Peak bytes on one rank, by what they hold, for ``how``: 'ddp', 'ddp-bucket-view', 'fsdp-whole', 'fsdp-blocks'."""
    if how in ("ddp", "ddp-bucket-view"):
        held = {"weights": WEIGHT, "gradients": GRAD, "optimizer state": ADAM}
        if how == "ddp":
            held["DDP buckets"] = BUCKET
        return {k: v * params for k, v in held.items()}
    shards = {"weights": WEIGHT * params / ranks, "gradients": GRAD * params / ranks,
              "optimizer state": ADAM * params / ranks}
    if how == "fsdp-whole":  # one unit: every weight gathered, every gradient whole before its reduce-scatter
        return {**shards, "gathered unit (weights + gradients)": (WEIGHT + GRAD) * params}
    if how == "fsdp-blocks":  # one block gathered at a time
        return {**shards, "gathered unit (weights + gradients)": (WEIGHT + GRAD) * params / blocks}
    raise ValueError(f"unknown scheme {how!r}; use 'ddp', 'ddp-bucket-view', 'fsdp-whole' or 'fsdp-blocks'")


LABELS = {"ddp": "DDP", "ddp-bucket-view": "DDP, bucket view", "fsdp-whole": "FSDP, whole model only",
          "fsdp-blocks": "FSDP, each block"}


def figure(params: float, ranks: int, blocks: int, name: str, gpu_gib: float | None = None):
    """Stacked bars: what one rank holds at the peak under each scheme, in GiB."""
    from workshop_lib.lab import plots

    fig, (ax,) = plots._new_figure(width=8.6, height=3.0)
    schemes = list(LABELS)
    parts: Mapping[str, dict[str, float]] = {s: per_rank(params, ranks, s, blocks) for s in schemes}
    kinds = list(dict.fromkeys(k for s in schemes for k in parts[s]))
    left = [0.0] * len(schemes)
    for kind in kinds:
        widths = [parts[s].get(kind, 0.0) / GiB for s in schemes]
        ax.barh([LABELS[s] for s in schemes], widths, left=left, label=kind)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.0f} GiB", va="center", fontsize=8)
    if gpu_gib:
        ax.axvline(gpu_gib, color="k", ls=":", lw=1, label=f"one {gpu_gib:g} GiB GPU")
    ax.invert_yaxis()
    ax.set(xlabel="GiB per rank at the peak, without activations",
           title=f"{name}, {ranks} ranks, AdamW in float32", xlim=(0, max(left) * 1.2))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig
