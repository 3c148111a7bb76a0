"""What each rank holds at steps 1, 2 and 3 (its data, gradients, weights), from a real 2-rank run (03, section 1).

:func:`record` trains one epoch per step on 2 ranks as the step scripts do, with the notebook's ``make_loader``;
:func:`figure` draws, for a projector, each step's weights on rank 1 against rank 0 and the spread step by step;
:func:`summary` says what the run shows in a line per step.
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
        out[kind] = {"n_train": len(splits.train), "shards": shard, "own_grads": own, "grads": grad,
                     "weights": weights, "start": start, "shown": slice(at, at + sizes[names.index(SHOWN)])}
    return out


def record(make_loader: Callable | None = None, kinds: Sequence[int] = (1, 2), limit: int = 1000) -> dict[int, Held]:
    """One epoch of each kind of step (1, 2, 3) on 2 ranks; what each rank held.

    ``make_loader(dataset, batch_size, seed)`` is the notebook's own, for steps 2 and 3 (3 wraps the model in DDP).
    """
    from workshop_lib.launching.forklaunch import notebook_launch

    if any(k not in TITLES for k in kinds):
        raise WorkshopError(f"kinds {list(kinds)}: the steps drawn are 1, 2 and 3")
    if make_loader is None and any(k > 1 for k in kinds):
        raise WorkshopError("steps 2 and 3 need your make_loader: replicas.record(make_loader, kinds=...)")
    ranks = notebook_launch(_on_rank, 2, list(kinds), make_loader, limit, timeout=90)
    per_rank = ("shards", "own_grads", "grads", "weights")  # the rest is the same on every rank: rank 0's
    return {kind: Held(kind, **{k: [r[kind][k] for r in ranks] if k in per_rank else v for k, v in ranks[0][kind].items()})
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


def _panel_title(h: Held) -> str:
    """What a kind's scatter says, in a few words: the weights apart, or equal."""
    apart = h.spread[-1]
    return f"{TITLES[h.kind]}:\n" + (f"apart by up to {apart:.2g}" if apart else "every weight equal")


def figure(held: dict[int, Held]):
    """For the projector, at most 4 panels in large type: per kind, each weight's change over the epoch on rank 1
    against rank 0 (on the diagonal: equal); then the replica spread after each optimizer step, every kind a line."""
    import matplotlib.pyplot as plt

    from workshop_lib.figures.plots import _new_figure

    kinds = list(held.values())
    with plt.rc_context({"font.size": 16, "axes.titlesize": 17}):
        fig, axes = _new_figure(4.6 * (len(kinds) + 1), 5.0, ncols=len(kinds) + 1, layout="constrained")
        changes = {h.kind: [(w[-1] - h.start).numpy() for w in h.weights[:2]] for h in kinds}  # ranks 0 and 1: (P,)
        edge = max(float(abs(c).max()) for pair in changes.values() for c in pair) * 1.05 or 1.0
        colours = {1: "tab:gray", 2: "tab:red", 3: "tab:blue"}
        for ax, h in zip(axes, kinds, strict=False):
            x, y = changes[h.kind]
            ax.plot([-edge, edge], [-edge, edge], color="black", linewidth=1, linestyle="--")
            ax.scatter(x, y, s=4, alpha=0.4, color=colours[h.kind], rasterized=True)
            ax.set(xlim=(-edge, edge), ylim=(-edge, edge), aspect="equal", title=_panel_title(h),
                   xlabel="rank 0: a weight's change", ylabel="rank 1: the same weight's")
            ax.set_xticks([-edge / 1.05, 0, edge / 1.05], [f"{-edge / 1.05:.2f}", "0", f"{edge / 1.05:.2f}"])
            ax.set_yticks([-edge / 1.05, 0, edge / 1.05], [f"{-edge / 1.05:.2f}", "0", f"{edge / 1.05:.2f}"])
        ax = axes[-1]
        for h in kinds:
            ax.plot(range(1, len(h.spread) + 1), h.spread, marker="o", linewidth=3, color=colours[h.kind],
                    label=TITLES[h.kind].split(": ", 1)[0] + (" (DDP)" if h.kind == 3 else ""))
        top = max(max(h.spread) for h in kinds) or 1.0
        ax.set(title="how far apart the ranks are", xlabel="optimizer step", ylabel="largest weight difference",
               ylim=(-0.05 * top, 1.15 * top))
        ax.legend(frameon=False)
        ax.grid(alpha=0.3)
    return fig
