"""Measuring the scaling model's inputs for this workshop's LSTM on this machine: :func:`measure`.

With one thread per rank, as torchrun runs them, it times whole epochs of real batches (each batch the best of
``repeats`` passes), scaled per molecule to one full batch: one rank alone at each batch size; ``nprocs`` ranks at
once, in lockstep as under DDP (a step, then an all-reduce of the gradient's size), which gives the slow-down of
ranks sharing the machine and the wait for the slowest; and all-reduces of several sizes, fitted to the ring's
alpha and beta (:func:`~.cost.fit_alpha_beta`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from workshop_lib.errors import WorkshopError
from workshop_lib.scaling.cost import ComputeCurve, Link, Step, Workload, fit_alpha_beta, interpolate, step

SIZES = (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)  # bytes all-reduced in the sweep


@dataclass
class MachineFit:
    """What ``measure.measure`` found on this machine: the inputs of the model for the LSTM."""

    params: int  # the LSTM's parameters
    nprocs: int  # ranks of the all-reduce and concurrent-compute measurements
    alpha: float
    beta: float
    allreduce_points: list[tuple[int, float]]  # (bytes, median seconds), back to back
    alone: ComputeCurve  # one rank alone
    together: ComputeCurve  # each of nprocs ranks computing at once, per-rank batch
    straggler: dict[int, float]  # per-rank batch -> seconds waiting for the slowest rank
    allreduce_in_step: dict[int, float] = field(default_factory=dict)  # diagnostic: inside a training step

    def workload(self, batch: int = 64) -> Workload:
        return Workload("this workshop's LSTM", self.params, self.alone, batch=batch,
                        source="measured on this machine (scaling_measure)")

    def loopback(self, max_ranks: int = 8) -> Link:
        return Link("loopback, gloo (this machine)", self.alpha, self.beta, max_ranks, source="fitted here")

    def predict(self, global_batch: int, procs: int) -> Step:
        """The model's step for ``procs`` ranks x 1 thread at ``global_batch``, from the measured inputs only."""
        if procs == 1:
            return step(self.workload(global_batch), self.loopback(), 1)
        assert procs == self.nprocs, f"measured with {self.nprocs} ranks, asked for {procs}"
        return self.predict_step(global_batch)

    def predict_step(self, global_batch: float) -> Step:
        """The model's step of nprocs ranks at any global batch (the compute curves interpolate)."""
        b = global_batch / self.nprocs
        return step(self.workload(b), self.loopback(), self.nprocs, contention=self.together(b) / self.alone(b),
                    straggler=self.wait(b))

    def wait(self, batch: float) -> float:
        """Seconds waiting for the slowest rank at a per-rank ``batch`` (interpolated between measured ones)."""
        keys = sorted(self.straggler)
        return interpolate(keys, [self.straggler[k] for k in keys], batch) if keys else 0.0

    def measured_step(self, batch: int) -> float:
        """Seconds of the nprocs-rank lockstep step timed while fitting, per-rank ``batch``: not the model."""
        return self.together(batch) + self.straggler[batch] + self.allreduce_in_step[batch]

    def as_dict(self) -> dict:
        return {"params": self.params, "nprocs": self.nprocs, "alpha_s": self.alpha, "beta_bytes_per_s": self.beta,
                "allreduce_points": [list(p) for p in self.allreduce_points],
                "alone": dict(zip(self.alone.batches, self.alone.seconds, strict=True)),
                "together": dict(zip(self.together.batches, self.together.seconds, strict=True)),
                "straggler_s": self.straggler, "allreduce_in_step_s": self.allreduce_in_step}


@functools.lru_cache(maxsize=2)
def _splits(limit: int | None):
    from workshop_lib.config import TrainConfig
    from workshop_lib.data import load_splits

    return load_splits(TrainConfig(limit=limit))


def _batches(batch: int, rank: int, world: int, limit: int | None):
    """Every training batch of epoch 0 on ``rank`` of ``world``, as step 3 draws them (the last one partial)."""
    from torch.utils.data import DataLoader, DistributedSampler

    from workshop_lib.config import TrainConfig
    from workshop_lib.data import collate

    cfg = TrainConfig()
    splits = _splits(limit)
    sampler = DistributedSampler(splits.train, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    data = list(DataLoader(splits.train, batch_size=batch, sampler=sampler, collate_fn=collate))
    if not data or max(len(b.labels) for b in data) < batch:
        raise WorkshopError(f"no full batch of {batch} on rank {rank} of {world} with --limit {limit}; "
                            "raise the limit or measure smaller batches")
    return data, len(splits.tokenizer)


def _trainer(vocab: int):
    import torch
    import torch.nn.functional as F

    from workshop_lib.config import TrainConfig
    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    cfg = TrainConfig()
    model = SmilesLSTM(vocab, cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def train_step(b) -> float:  # the step scripts' loop body, timed
        start = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(model(b.tokens, b.lengths), b.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    return model, train_step


def time_alone(batches: Sequence[int], repeats: int = 3, limit: int | None = None) -> dict[int, float]:
    """Seconds of one training step at each batch size, this process alone on one thread (see the module docstring)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for batch in batches:
            data, vocab = _batches(batch, 0, 1, limit)
            _, train_step = _trainer(vocab)
            train_step(data[0])  # warm-up: allocator, oneDNN primitives
            passes = [[train_step(b) for b in data] for _ in range(repeats)]  # shapes vary step to step, as in an epoch
            best = sum(min(times) for times in zip(*passes, strict=True))
            out[batch] = best / sum(len(b.labels) for b in data) * batch
        return out
    finally:
        torch.set_num_threads(threads)


def _on_rank(env, batches: Sequence[int], sizes: Sequence[int], repeats: int, limit: int | None) -> dict:
    """What each forked rank measures (see the module docstring); returns its raw timings."""
    import torch
    import torch.distributed as dist

    from workshop_lib.model import count_parameters

    together, counts = {}, {}
    for batch in batches:
        data, vocab = _batches(batch, env.rank, env.world_size, limit)
        counts[batch] = [len(b.labels) for b in data]  # the same on every rank: DistributedSampler pads
        model, train_step = _trainer(vocab)
        grads = torch.zeros(count_parameters(model))  # as many floats as DDP all-reduces per step
        dist.barrier()
        train_step(data[0])
        rows = [[] for _ in data]  # per batch: (compute, all-reduce) of each pass
        for _ in range(repeats):
            for runs, b in zip(rows, data, strict=True):
                dist.barrier()  # start together, as DDP's previous all-reduce makes them
                compute = train_step(b)
                start = time.perf_counter()
                dist.all_reduce(grads)
                runs.append((compute, time.perf_counter() - start))
        together[batch] = rows
    sweep = {size: [] for size in sizes}
    tensors = {size: torch.zeros(size // 4) for size in sizes}
    for x in tensors.values():
        for _ in range(3):
            dist.all_reduce(x)  # warm-up: gloo's buffers for this size
    for _ in range(repeats * 5):  # sizes interleaved: a burst of other work hits every size alike
        for size, x in tensors.items():
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(x)
            sweep[size].append(time.perf_counter() - start)
    return {"together": together, "counts": counts, "sweep": sweep, "params": int(grads.numel())}


def _combine(ranks: list[dict], nbytes_sizes: Sequence[int]) -> tuple[dict, dict, dict, list]:
    """Per batch size: compute per rank and straggler wait (per full batch), in-step all-reduce; the sweep's medians."""
    together, straggler, in_step = {}, {}, {}
    for batch in ranks[0]["together"]:
        per_rank = [r["together"][batch] for r in ranks]  # [rank][batch j][pass k] = (compute, all-reduce)
        means, waits, comms = [], [], []
        for j in range(len(per_rank[0])):
            # the pass whose slowest rank was fastest: the least disturbed by other work
            k = min(range(len(per_rank[0][j])), key=lambda k: max(r[j][k][0] for r in per_rank))
            computes = [r[j][k][0] for r in per_rank]
            last = max(range(len(per_rank)), key=lambda i: computes[i])  # arrives last, so waits for no one
            means.append(statistics.fmean(computes))
            waits.append(max(computes) - statistics.fmean(computes))
            comms.append(per_rank[last][j][k][1])
        per_molecule = batch / sum(ranks[0]["counts"][batch])  # as a full batch's share of the epoch
        together[batch], straggler[batch] = sum(means) * per_molecule, sum(waits) * per_molecule
        in_step[batch] = statistics.median(comms)
    points = [(size, statistics.median(max(r["sweep"][size][i] for r in ranks)
                                      for i in range(len(ranks[0]["sweep"][size])))) for size in nbytes_sizes]
    return together, straggler, in_step, points


def measure(batches: Sequence[int] = (64, 128, 256, 512), rank_batches: Sequence[int] = (64, 128, 256),
            nprocs: int = 2, sizes: Sequence[int] = SIZES, repeats: int = 3, limit: int | None = None,
            timeout: float = 300) -> MachineFit:
    """Fit the scaling model's inputs here: ``batches`` of one rank alone, ``rank_batches`` per rank of ``nprocs``."""
    from workshop_lib.launching import forklaunch

    alone = time_alone(batches, repeats, limit)
    ranks = forklaunch.notebook_launch(_on_rank, nprocs, rank_batches, sizes, repeats, limit, timeout=timeout)
    together, straggler, in_step, points = _combine(ranks, sizes)
    alpha, beta = fit_alpha_beta([p[0] for p in points], [p[1] for p in points], nprocs)
    return MachineFit(ranks[0]["params"], nprocs, alpha, beta, points,
                      ComputeCurve(tuple(alone), tuple(alone.values())),
                      ComputeCurve(tuple(together), tuple(together.values())), straggler, in_step)
