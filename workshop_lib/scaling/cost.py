"""A scaling model for data-parallel training: how fast N ranks go, and why. One optimizer step costs

    compute at the per-rank batch (x the slow-down of ranks that share a machine)
  + the part of the gradient all-reduce that backward does not hide
  + the wait for the slowest rank.

The all-reduce: the ring's 2(N-1) steps of alpha + (S/N)/beta, or the binomial tree's 2*ceil(log2 N) steps of
alpha + S/beta (Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005). The ring moves 2(N-1)/N * S bytes per rank,
the factor nccl-tests use for "bus bandwidth" (doc/PERFORMANCE.md), so ``beta`` compares with a bus bandwidth.
"double-tree" (NCCL's across nodes, NVIDIA blog on NCCL 2.4, 2019): the tree's latency, the ring's bandwidth.
``overlap``: the share of backward that can hide the all-reduce of early buckets, as Horovod (arXiv:1802.05799)
and DDP do; this workshop's LSTM fits in one DDP bucket, all-reduced when backward ends: overlap 0.
Inputs are measured (:mod:`~.measure`) or published (:mod:`~.published`). Plain arithmetic (numpy's least squares), no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from workshop_lib.errors import WorkshopError

MiB = 1024 * 1024
BACKWARD_SHARE = 2 / 3  # backward costs about twice forward: the part of compute an all-reduce can hide behind
DDP_BUCKET_BYTES = 25 * MiB  # DistributedDataParallel's default bucket_cap_mb


def allreduce_seconds(nbytes: float, n: int, alpha: float, beta: float, algorithm: str = "ring",
                      buckets: int = 1) -> float:
    """Seconds to all-reduce ``nbytes`` over ``n`` ranks in ``buckets`` messages (latency alpha, bandwidth beta).

    Each bucket pays the latency; the bytes are paid once.
    """
    if n <= 1 or nbytes <= 0:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) * (alpha * buckets + nbytes / n / beta)
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(n)) * (alpha * buckets + nbytes / beta)
    if algorithm == "double-tree":
        return 2 * math.ceil(math.log2(n)) * alpha * buckets + 2 * (n - 1) * nbytes / n / beta
    raise WorkshopError(f"unknown all-reduce algorithm {algorithm!r}; use 'ring', 'tree' or 'double-tree'")


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float], n: int = 2) -> tuple[float, float]:
    """(alpha, beta) of the ring from all-reduce timings of several sizes on ``n`` ranks: t = 2(n-1)alpha + 2(n-1)/n S/beta.

    A straight line weighted by 1/t, so that the small messages (which set alpha) count as much as the large.
    """
    if n < 2 or len(nbytes) != len(seconds) or len(set(nbytes)) < 2:
        raise WorkshopError("fit_alpha_beta needs timings of at least 2 message sizes on 2 or more ranks")
    b, a = np.polyfit(nbytes, seconds, 1, w=[1 / t for t in seconds])  # least squares of t = a + b*S, weighted
    a, b = max(float(a), 0.0), max(float(b), 1e-15)  # noise can tip a line through tiny timings below zero
    return a / (2 * (n - 1)), 2 * (n - 1) / n / b


@dataclass(frozen=True)
class ComputeCurve:
    """Seconds of one training step against the per-rank batch, one rank alone: linear between the measured batches,
    the last segment extended above them, in proportion to the batch below them."""

    batches: tuple[float, ...]
    seconds: tuple[float, ...]

    def __post_init__(self):
        if not self.batches or len(self.batches) != len(self.seconds) or min(self.seconds) <= 0:
            raise WorkshopError("ComputeCurve needs one positive step time per batch size")
        order = sorted(range(len(self.batches)), key=self.batches.__getitem__)
        object.__setattr__(self, "batches", tuple(float(self.batches[i]) for i in order))
        object.__setattr__(self, "seconds", tuple(float(self.seconds[i]) for i in order))

    def __call__(self, batch: float) -> float:
        return interpolate(self.batches, self.seconds, batch, proportional_below=True)

    def linear(self) -> tuple[float, float]:
        """Least-squares (seconds per step, seconds per sample): the fixed and the per-sample cost."""
        if len(self.batches) == 1:
            return 0.0, self.seconds[0] / self.batches[0]
        slope, fixed = np.polyfit(self.batches, self.seconds, 1)
        return float(fixed), float(slope)


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float, proportional_below: bool = False) -> float:
    """Piecewise-linear y(x) through sorted points; the last segment extended above them, and below them
    the first y (or, with ``proportional_below``, the first point scaled in proportion to x)."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0] * x / xs[0] if proportional_below else ys[0]
    i = len(xs) - 1 if x >= xs[-1] else next(k for k in range(1, len(xs)) if x <= xs[k])
    return max(ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1]), 0.0)


@dataclass(frozen=True)
class Workload:
    """A model to scale: its gradient size and its compute per step."""

    name: str
    params: float  # trainable parameters (= gradient elements all-reduced per step)
    compute: ComputeCurve  # one rank alone; micro-batch -> seconds
    batch: int  # per-rank micro-batch the projections use by default
    accumulation: int = 1  # micro-batches per all-reduce (gradient accumulation with no_sync)
    grad_bytes: int = 4  # bytes per gradient element (float32; DDP all-reduces the grads' dtype)
    bucket_bytes: float = DDP_BUCKET_BYTES  # gradients are all-reduced in buckets of this size
    source: str = ""

    @property
    def nbytes(self) -> float:
        return self.params * self.grad_bytes

    @property
    def buckets(self) -> int:
        return max(1, math.ceil(self.nbytes / self.bucket_bytes))

    def scaled(self, params: float) -> Workload:
        """The same workload with ``params`` parameters and compute scaled in proportion (FLOPs ~ parameters)."""
        f = params / self.params
        return replace(self, params=params, compute=ComputeCurve(self.compute.batches,
                                                                 tuple(t * f for t in self.compute.seconds)))


@dataclass(frozen=True)
class Link:
    """An interconnect: all-reduce latency per step (s) and bandwidth per rank (bytes/s, one way)."""

    name: str
    alpha: float
    beta: float
    max_ranks: int
    source: str = ""
    node: Link | None = None  # within a node of ``node_size`` ranks the ring runs over this link instead
    node_size: int = 1
    algorithm: str = "ring"  # see allreduce_seconds

    def at(self, n: int) -> Link:
        return self.node if self.node is not None and n <= self.node_size else self


@dataclass(frozen=True)
class Step:
    """One optimizer step on ``n`` ranks, in seconds, split into the model's terms."""

    n: int
    samples: int  # per rank per optimizer step (micro-batch x accumulation)
    compute: float
    allreduce: float  # the whole all-reduce
    exposed: float  # the part backward did not hide
    straggler: float

    @property
    def seconds(self) -> float:
        return self.compute + self.exposed + self.straggler

    @property
    def samples_per_second(self) -> float:
        return self.n * self.samples / self.seconds


def step(work: Workload, link: Link, n: int, batch: float | None = None, overlap: float = 0.0,
         accumulation: int | None = None, contention: float = 1.0, straggler: float = 0.0) -> Step:
    """The model: one optimizer step of ``work`` on ``n`` ranks over ``link``.

    ``contention`` multiplies compute when n > 1 (ranks sharing one machine); ``straggler``: the wait for the slowest.
    """
    if not 0 <= overlap <= 1:
        raise WorkshopError(f"overlap {overlap} is not a share; use a value from 0 to 1")
    batch = work.batch if batch is None else batch
    accumulation = work.accumulation if accumulation is None else accumulation
    micro = work.compute(batch) * (contention if n > 1 else 1.0)
    at = link.at(n)
    ar = allreduce_seconds(work.nbytes, n, at.alpha, at.beta, at.algorithm, work.buckets)
    hidden = min(ar, overlap * BACKWARD_SHARE * micro)  # only the last micro-batch's backward all-reduces
    return Step(n, round(batch * accumulation), micro * accumulation, ar, ar - hidden, straggler if n > 1 else 0.0)


def ranks(max_ranks: int, start: int = 1) -> list[int]:
    """1, 2, 4, ... up to ``max_ranks``."""
    return [2**i for i in range(int(math.log2(max_ranks)) + 1) if 2**i >= start]


def project(work: Workload, link: Link, ns: Sequence[int] | None = None, global_batch: float | None = None,
            **kw) -> list[dict]:
    """Samples/s, speed-up over 1 rank and efficiency (speed-up / N) for each N.

    Each rank keeps its batch, unless ``global_batch`` is fixed: then each of N ranks gets 1/N of it.
    """
    if global_batch is not None:
        kw["batch"] = global_batch
    one = step(work, link, 1, **kw).samples_per_second
    rows = []
    for n in ns or ranks(link.max_ranks):
        if global_batch is not None:
            kw["batch"] = global_batch / n
        s = step(work, link, n, **kw)
        rows.append({"n": n, "samples_per_second": s.samples_per_second, "speedup": s.samples_per_second / one,
                     "efficiency": s.samples_per_second / one / n, "compute_s": s.compute,
                     "allreduce_s": s.allreduce, "exposed_s": s.exposed})
    return rows
