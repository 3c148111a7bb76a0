"""What each rank holds at steps 1, 2 and 3: its data, its gradients, its weights, from a real 2-rank run.

:func:`record` forks 2 ranks (:func:`workshop_lib.lab.forklaunch.notebook_launch`)
and has each train one epoch the way a step script does: the same seed, data,
loader, model, optimizer and loop, with the notebook's own ``make_loader``
(steps 2 and 3; step 3 wraps the model in ``DDP``). Each rank keeps

* its shard: the training molecules its sampler gives it this epoch;
* its first batch's own gradient (what ``backward()`` computes from that batch
  alone, on a plain copy of the model with the same dropout masks), and ``p.grad``
  as ``backward()`` leaves it (under DDP: averaged over the ranks);
* its weights after every optimizer step.

:func:`figure` draws the kinds side by side, one column each; :func:`summary`
says in one line per kind what the figure shows.
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


def record(make_loader: Callable | None = None, kinds: Sequence[int] = (1, 2), limit: int = 1000, nprocs: int = 2,
           timeout: float = 90) -> dict[int, Held]:
    """Train one epoch of each kind of step (1, 2, 3) on ``nprocs`` forked ranks; what each rank held.

    ``make_loader(dataset, batch_size, seed) -> DataLoader`` is the notebook's own (a
    ``DistributedSampler`` in a plain DataLoader), called inside the ranks' group: it
    serves steps 2 and 3 (step 3 wraps the model in ``DDP``). Step 1 is drawn with step
    1's loader: all the data on every rank, shuffled the same way.
    """
    import torch._dynamo  # noqa: F401 (DDP and the optimizer import it on first use: once here, not in each rank)

    from workshop_lib.lab.forklaunch import notebook_launch

    if any(k not in TITLES for k in kinds):
        raise WorkshopError(f"kinds {list(kinds)}: the steps drawn are 1, 2 and 3")
    if make_loader is None and any(k > 1 for k in kinds):
        raise WorkshopError("steps 2 and 3 need your make_loader: replicas.record(make_loader, kinds=...)")
    ranks = notebook_launch(_on_rank, nprocs, list(kinds), make_loader, limit, timeout=timeout)
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


def figure(held: dict[int, Held]):
    """Per kind (a column): shards, own and averaged gradients, weight changes (rank 0 over rank 1), the spread."""
    import matplotlib.pyplot as plt
    import numpy as np

    kinds = list(held.values())
    fig, axes = plt.subplots(5, len(kinds), figsize=(5.2 * len(kinds), 8.4), squeeze=False,
                             gridspec_kw={"height_ratios": [1, 1, 1, 1, 1.6]})
    plt.close(fig)  # shown once, as the cell's value
    rows = [("data: its shard of the epoch", None),
            ("gradient of its first batch alone", "own_grads"),
            ("p.grad when backward() returns", "grads"),
            ("weights after the epoch, minus the start", "weights")]

    def strip(h: Held, what: str):
        if what in ("own_grads", "grads"):
            return np.stack([g[h.shown].numpy() for g in getattr(h, what)])
        return np.stack([(w[-1] - h.start)[h.shown].numpy() for w in h.weights])

    scale = {what: max(np.abs(strip(h, what)).max() for h in kinds) or 1.0 for _, what in rows if what}
    for col, h in enumerate(kinds):
        ranks = [f"rank {r}" for r in range(len(h.shards))]
        taken = np.zeros((len(h.shards), h.n_train))
        for r, shard in enumerate(h.shards):
            taken[r, shard] = 1
        axes[0][col].imshow(taken, aspect="auto", cmap="Greens", vmin=0, vmax=1.3, interpolation="nearest")
        axes[0][col].set_xlabel(f"training molecule (0 .. {h.n_train - 1}); shared by all ranks: {h.shared}")
        for row, (_, what) in enumerate(rows[1:], start=1):
            values = strip(h, what)
            axes[row][col].imshow(values, aspect="auto", cmap="RdBu_r", vmin=-scale[what], vmax=scale[what],
                                  interpolation="nearest")
            gap = {"own_grads": h.own_grad_spread, "grads": h.grad_spread, "weights": h.spread[-1]}[what]
            axes[row][col].set_xlabel(f"the {values.shape[1]} weights of the output layer; ranks differ by up to "
                                      f"{_number(gap)}", fontsize="small")
        for row, (label, _) in enumerate(rows):
            ax = axes[row][col]
            ax.set_yticks(range(len(ranks)), ranks)
            ax.set_xticks([])
            ax.set_title(f"{TITLES[h.kind]}\n{label}" if row == 0 else label, fontsize="medium")
        ax = axes[4][col]
        ax.plot(range(1, len(h.spread) + 1), h.spread, marker="o")
        ax.set(title="replica spread after each optimizer step", xlabel="optimizer step (one epoch)",
               ylabel="largest weight difference")
        ax.grid(alpha=0.3)
    top = max(max(h.spread) for h in kinds) or 1.0
    for col in range(len(kinds)):
        axes[4][col].set_ylim(-0.05 * top, 1.1 * top)
    fig.tight_layout()
    return fig
