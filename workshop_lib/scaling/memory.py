"""Memory per rank for DDP and FSDP, without activations: bytes per parameter, and a figure.

float32 AdamW keeps 16 bytes a parameter (weight 4, gradient 4, two moments 8); DDP all of it on every rank,
plus its buckets (4, unless ``gradient_as_bucket_view=True``). FSDP keeps 1/N of it on each of N ranks, plus
the unit it computes gathered whole (weights, and gradients until reduce-scattered): the whole model if only
the model is sharded, about one block if each of B blocks is.
"""

from __future__ import annotations

from collections.abc import Mapping

WEIGHT, GRAD, ADAM = 4, 4, 8  # bytes per parameter: float32 weight and gradient, AdamW's two float32 moments
BUCKET = 4  # DDP's gradient buckets: one more float32 copy of the gradients (none with gradient_as_bucket_view)
GiB = 1024 ** 3


def per_rank(params: float, ranks: int, how: str, blocks: int = 1) -> dict[str, float]:
    """Peak bytes on one rank, by what they hold, for ``how``: 'ddp', 'ddp-bucket-view', 'fsdp-whole', 'fsdp-blocks'."""
    held = {"weights": WEIGHT, "gradients": GRAD, "optimizer state": ADAM}
    if how in ("ddp", "ddp-bucket-view"):
        return {k: v * params for k, v in (held | ({"DDP buckets": BUCKET} if how == "ddp" else {})).items()}
    if how not in ("fsdp-whole", "fsdp-blocks"):
        raise ValueError(f"unknown scheme {how!r}; use 'ddp', 'ddp-bucket-view', 'fsdp-whole' or 'fsdp-blocks'")
    units = 1 if how == "fsdp-whole" else blocks  # the whole model gathered at once, or one block at a time
    return {**{k: v * params / ranks for k, v in held.items()},
            "gathered unit (weights + gradients)": (WEIGHT + GRAD) * params / units}


LABELS = {"ddp": "DDP", "ddp-bucket-view": "DDP, bucket view", "fsdp-whole": "FSDP, whole model only",
          "fsdp-blocks": "FSDP, each block"}


def figure(params: float, ranks: int, blocks: int, name: str, gpu_gib: float | None = None):
    """Stacked bars: what one rank holds at the peak under each scheme, in GiB."""
    from workshop_lib.figures import plots

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
