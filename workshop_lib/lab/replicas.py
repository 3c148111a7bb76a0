"""What each rank holds at steps 1, 2 and 3 (its data, gradients, weights), from a real 2-rank run (03).

:func:`record` trains one epoch per step on 2 ranks as the step scripts do, with the notebook's ``make_loader``;
:func:`figure` draws each step in a column, :func:`summary` says what it shows in a line per step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workshop_lib.errors import WorkshopError

TITLES = {1: "step 1: every rank all the data", 2: "step 2: a shard each, no DDP", 3: "step 3: a shard each, DDP"}
SHOWN = "head.3.weight"  # the output layer: 32 weights, few enough to show one by one


@dataclass
class Held:
    """One kind of step on every rank: lists indexed by rank."""

    kind: int
    n_train: int
    shards: list[list[int]]  # the molecules each rank trains on in the epoch
    own_grads: list  # (P,) per rank: the gradient of its first batch alone
    grads: list  # (P,) per rank: p.grad when that first backward() returned
    weights: list[list]  # [rank][step] -> (P,): the weights after each optimizer step
    start: object  # (P,): the weights before the first step (the same on every rank)
    shown: slice  # where SHOWN lies in the (P,) vectors

    @staticmethod
    def _spread(vectors) -> float:
        return max((v - vectors[0]).abs().max().item() for v in vectors)

    @property
    def shared(self) -> int:
        """Molecules that every rank trains on."""
        return len(set.intersection(*map(set, self.shards)))

    @property
    def own_grad_spread(self) -> float:
        return self._spread(self.own_grads)

    @property
    def grad_spread(self) -> float:
        """Largest difference of p.grad between any rank and rank 0, after the first backward()."""
        return self._spread(self.grads)

    @property
    def spread(self) -> list[float]:
        """The replica spread (largest weight difference from rank 0's) after each optimizer step."""
        return [self._spread([w[step] for w in self.weights]) for step in range(len(self.weights[0]))]


def _step1_loader(dataset, batch_size: int, seed: int):
    """Step 1's make_loader: every rank all the data, shuffled by a seeded generator (the same order everywhere)."""
    import torch
    from torch.utils.data import DataLoader

    from workshop_lib.data import collate

    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed),
                      collate_fn=collate)


def _on_rank(env, kinds: Sequence[int], make_loader: Callable | None, limit: int) -> dict:
    """One epoch of each kind of step on this rank, as the step scripts train it (the same seed, data and steps)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.utils import parameters_to_vector

    from workshop_lib.config import TrainConfig
    from workshop_lib.data import load_splits
    from workshop_lib.model import SmilesLSTM

    def grad_vector(model) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()

    cfg = TrainConfig(limit=limit)
    splits = load_splits(cfg)  # draws no random numbers: loading it first changes nothing below
    out = {}
    for kind in kinds:
        loader = (_step1_loader if kind == 1 else make_loader)(splits.train, cfg.batch_size, cfg.seed)
        if kind > 1:
            loader.sampler.set_epoch(0)
            shard = sorted(int(i) for i in loader.sampler)
        else:
            shard = list(range(len(splits.train)))
        torch.manual_seed(cfg.seed)  # as each script seeds before building its model
        model = SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout)
        net = DDP(model) if kind == 3 else model  # step 3: backward() now averages
        optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        names = [name for name, _ in model.named_parameters()]
        sizes = [p.numel() for p in model.parameters()]
        at = sum(sizes[: names.index(SHOWN)])
        start, weights, own = parameters_to_vector(model.parameters()).detach().clone(), [], None
        net.train()
        for tokens, lengths, labels in loader:  # the scripts' loop
            if own is None:  # this batch's gradient alone: a plain copy, the same dropout masks
                rng = torch.get_rng_state()
                twin = copy.deepcopy(model)
                F.binary_cross_entropy_with_logits(twin(tokens, lengths), labels).backward()
                own = grad_vector(twin)
                torch.set_rng_state(rng)
            loss = F.binary_cross_entropy_with_logits(net(tokens, lengths), labels)
            optimizer.zero_grad()
            loss.backward()  # under DDP, this also averages the gradients across ranks
            if not weights:
                grad = grad_vector(model)
            optimizer.step()
            weights.append(parameters_to_vector(model.parameters()).detach().clone())
        out[kind] = {"n_train": len(splits.train), "shard": shard, "own": own, "grad": grad, "weights": weights,
                     "start": start, "shown": (at, at + sizes[names.index(SHOWN)])}
    return out


def record(make_loader: Callable | None = None, kinds: Sequence[int] = (1, 2), limit: int = 1000) -> dict[int, Held]:
    """One epoch of each kind of step (1, 2, 3) on 2 ranks; what each rank held.

    ``make_loader(dataset, batch_size, seed)`` is the notebook's own, for steps 2 and 3 (3 wraps the model in DDP).
    """
    from workshop_lib.lab.forklaunch import notebook_launch

    if any(k not in TITLES for k in kinds):
        raise WorkshopError(f"kinds {list(kinds)}: the steps drawn are 1, 2 and 3")
    if make_loader is None and any(k > 1 for k in kinds):
        raise WorkshopError("steps 2 and 3 need your make_loader: replicas.record(make_loader, kinds=...)")
    ranks = notebook_launch(_on_rank, 2, list(kinds), make_loader, limit, timeout=90)
    return {kind: Held(kind, ranks[0][kind]["n_train"], [r[kind]["shard"] for r in ranks],
                       [r[kind]["own"] for r in ranks], [r[kind]["grad"] for r in ranks],
                       [r[kind]["weights"] for r in ranks], ranks[0][kind]["start"], slice(*ranks[0][kind]["shown"]))
            for kind in kinds}


def summary(held: dict[int, Held]) -> str:
    """One line per kind: what the ranks share, how far their gradients and weights differ."""
    lines = []
    for h in held.values():
        own = f" (their own batches' by {_number(h.own_grad_spread)})" if h.own_grad_spread != h.grad_spread else ""
        lines.append(f"step {h.kind}: the ranks share {h.shared} of {h.n_train} molecules; after the first backward() "
                     f"their gradients differ by up to {_number(h.grad_spread)}{own}; after {len(h.weights[0])} steps "
                     f"their weights by {_number(h.spread[-1])}")
    return "\n".join(lines)


def _number(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def _grad_subtitle(h: Held) -> str:
    """What ``p.grad`` holds when backward() returns, as the data say: each rank's own gradient, or the mean."""
    import torch

    if all(torch.equal(g, o) for g, o in zip(h.grads, h.own_grads, strict=True)):
        return "p.grad when backward() returns: its own batch's"
    mean = torch.stack(h.own_grads).mean(0)
    if all(torch.allclose(g, mean, atol=1e-6) for g in h.grads):
        return "p.grad when backward() returns: the ranks' mean"
    return "p.grad when backward() returns"


def _strip(h: Held, what: str):
    """The output layer's weights, a row per rank: its gradient ("own_grads", "grads") or the epoch's change."""
    import numpy as np

    if what in ("own_grads", "grads"):
        return np.stack([g[h.shown].numpy() for g in getattr(h, what)])
    return np.stack([(w[-1] - h.start)[h.shown].numpy() for w in h.weights])


def figure(held: dict[int, Held]):
    """Per kind (a column): the data, the first gradient, the weight changes per rank, the spread per step.

    The row "p.grad when backward() returns" is drawn only where p.grad differs from the batch's own (DDP).
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    kinds = list(held.values())
    averaged = any(_grad_subtitle(h) != "p.grad when backward() returns: its own batch's" for h in kinds)
    strips = ["own_grads", "grads", "weights"] if averaged else ["own_grads", "weights"]
    n_rows = 2 + len(strips)
    fig, axes = plt.subplots(n_rows, len(kinds), figsize=(5.4 * len(kinds) + 1.0, 1.7 * n_rows + 1.0), squeeze=False,
                             gridspec_kw={"height_ratios": [1] * (n_rows - 1) + [1.6]}, layout="constrained")
    plt.close(fig)  # shown once, as the cell's value

    labels = {"own_grads": ("gradient of its first batch alone", "gradient"),
              "grads": (None, "gradient"),
              "weights": ("weights after the epoch, minus the start", "weight change")}
    gaps = {"own_grads": lambda h: h.own_grad_spread, "grads": lambda h: h.grad_spread, "weights": lambda h: h.spread[-1]}
    in_data = ListedColormap(["white", "tab:green"])
    for col, h in enumerate(kinds):
        taken = np.zeros((len(h.shards), h.n_train))
        for r, shard in enumerate(h.shards):
            taken[r, shard] = 1
        ax = axes[0][col]
        image = ax.imshow(taken, aspect="auto", cmap=in_data, vmin=0, vmax=1, interpolation="nearest")
        data = "data: all of it, on every rank" if h.shared == h.n_train else "data: its shard of the epoch"
        ax.set_title(f"{TITLES[h.kind]}\n{data}", fontsize="medium")
        ax.set_xlabel(f"training molecule (0 .. {h.n_train - 1}); shared by all ranks: {h.shared}", fontsize="small")
    bar = fig.colorbar(image, ax=axes[0].tolist(), ticks=[0.25, 0.75], fraction=0.04, pad=0.01)
    bar.ax.set_yticklabels(["not read", "read"], fontsize="small")
    for row, what in enumerate(strips, start=1):
        scale = max(np.abs(_strip(h, what)).max() for h in kinds) or 1.0  # one scale per row: columns compare
        for col, h in enumerate(kinds):
            values = _strip(h, what)
            ax = axes[row][col]
            image = ax.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-scale, vmax=scale, interpolation="nearest")
            ax.set_title(labels[what][0] or _grad_subtitle(h), fontsize="medium")
            ax.set_xlabel(f"the {values.shape[1]} weights of the output layer; ranks differ by up to "
                          f"{_number(gaps[what](h))}", fontsize="small")
        bar = fig.colorbar(image, ax=axes[row].tolist(), fraction=0.04, pad=0.01)
        bar.set_label(labels[what][1], fontsize="small")
        bar.ax.tick_params(labelsize="x-small")
    for row in range(n_rows - 1):
        for col, h in enumerate(kinds):
            axes[row][col].set_yticks(range(len(h.shards)), [f"rank {r}" for r in range(len(h.shards))])
            axes[row][col].set_xticks([])
    top = max(max(h.spread) for h in kinds) or 1.0
    for col, h in enumerate(kinds):
        ax = axes[-1][col]
        ax.plot(range(1, len(h.spread) + 1), h.spread, marker="o")
        ax.set(title="replica spread after each optimizer step", xlabel="optimizer step (one epoch)",
               ylabel="largest weight difference", ylim=(-0.05 * top, 1.1 * top))
        ax.grid(alpha=0.3)
    return fig
