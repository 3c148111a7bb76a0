"""A DDP step on a timeline: torch.profiler's record of forward, backward and gloo's all-reduces, per rank.

:func:`profile_ddp_step` runs the step-3 model under DDP on 2 forked ranks (gloo,
CPU), once per bucket size, and profiles one training step after two warm-up
steps (without find_unused_parameters, DDP puts every gradient in one bucket for
the first iteration, and rebuilds its buckets in the order the gradients became
ready at the start of the second). :func:`draw` puts the ranks' steps on one clock.

The records used (torch 2.13, gloo on CPU), all on the rank's main thread but the last:
``DistributedDataParallel.forward`` (DDP's forward); ``autograd::engine::evaluate_function: XBackward0``
(one backward op each); ``c10d::allreduce_`` (DDP hands a full bucket to the process group);
``torch.distributed.ddp.reducer::copy_bucket_to_grad`` (the averaged bucket copied into ``.grad``, at
the end of ``backward()``); ``Optimizer.step#AdamW.step``; and ``gloo:all_reduce`` on gloo's worker
threads, from the start of the all-reduce to its end, waiting for the other rank included.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FORWARD, BACKWARD, LAUNCH, ALL_REDUCE, COPY, OPTIMIZER = "forward", "backward", "launch", "all-reduce", "copy", "optimizer"
_EXACT = {"DistributedDataParallel.forward": FORWARD, "c10d::allreduce_": LAUNCH, "gloo:all_reduce": ALL_REDUCE,
          "torch.distributed.ddp.reducer::copy_bucket_to_grad": COPY}
_BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
_COLORS = {FORWARD: "tab:blue", BACKWARD: "tab:orange", ALL_REDUCE: "tab:green", OPTIMIZER: "tab:purple"}
SMALL_CAP_MB = 0.005  # 5,242 bytes: the head's gradients (8,452 bytes) fill the first bucket


@dataclass(frozen=True)
class Event:
    """One record of torch.profiler, as a rank sends it back."""

    name: str
    start: float  # microseconds on this machine's clock (the same for every rank)
    duration: float  # microseconds
    thread: int


@dataclass(frozen=True)
class Span:
    kind: str  # FORWARD, BACKWARD, LAUNCH, ALL_REDUCE, COPY or OPTIMIZER
    start: float  # ms since the step began (the earliest forward of any rank)
    duration: float  # ms
    thread: int

    @property
    def end(self) -> float:
        return self.start + self.duration


def kind_of(name: str) -> str | None:
    """Which part of a DDP step a profiler record is, or None for one the timeline leaves out."""
    if name in _EXACT:
        return _EXACT[name]
    if name.startswith(_BACKWARD_PREFIX):  # AccumulateGrad: adding to .grad, where DDP's hook runs (and launches)
        return None if name.endswith("AccumulateGrad") else BACKWARD
    return OPTIMIZER if name.startswith("Optimizer.step#") else None


def classify(events: Iterable[Event], origin: float) -> tuple[Span, ...]:
    """The events the timeline shows, as Spans in ms since ``origin`` (µs), in order of start."""
    spans = [Span(kind, (e.start - origin) / 1000, e.duration / 1000, e.thread)
             for e in events if (kind := kind_of(e.name)) is not None]
    return tuple(sorted(spans, key=lambda s: s.start))


@dataclass(frozen=True)
class RankStep:
    """One rank's profiled step."""

    rank: int
    spans: tuple[Span, ...]

    def of(self, kind: str) -> list[Span]:
        return [s for s in self.spans if s.kind == kind]

    @property
    def backward_end(self) -> float:
        """When backward's last op ended (DDP's wait for the all-reduces and its copies come after)."""
        return max(s.end for s in self.of(BACKWARD))

    def check(self) -> None:
        """Assert the step holds what the figure shows: forward, backward, and one gloo all-reduce per launch."""
        for kind in (FORWARD, BACKWARD, LAUNCH):
            assert self.of(kind), f"rank {self.rank}'s profile has no {kind} record; is this torch's DDP on gloo?"
        assert len(self.of(ALL_REDUCE)) == len(self.of(LAUNCH)), (
            f"rank {self.rank}: DDP launched {len(self.of(LAUNCH))} all-reduce(s), gloo recorded {len(self.of(ALL_REDUCE))}")


@dataclass(frozen=True)
class ProfiledStep:
    """The ranks' profiled step under one bucket size (None: DDP's default)."""

    bucket_cap_mb: float | None
    ranks: tuple[RankStep, ...]
    grad_bytes: int  # the gradients DDP all-reduces in every step

    @property
    def buckets(self) -> int:
        return len(self.ranks[0].of(LAUNCH))  # one launch per bucket

    @property
    def label(self) -> str:
        cap = "bucket_cap_mb=25 (the default)" if self.bucket_cap_mb is None else f"bucket_cap_mb={self.bucket_cap_mb:g}"
        return f"{cap}: {self.buckets} bucket{'s' if self.buckets != 1 else ''}"


def facts(steps: Sequence[ProfiledStep]) -> list[str]:
    """What the figure shows, in words that do not change from run to run (counts and orderings, no times)."""
    lines = []
    for step in steps:
        lines.append(f"{step.label} for {step.grad_bytes:,} bytes of gradients")
        for r in step.ranks:
            n = len(r.of(ALL_REDUCE))
            early = sum(s.start < r.backward_end for s in r.of(LAUNCH))  # one thread's order: the same every run
            # (when gloo's own thread starts each one depends on the machine's load: the figure shows it, not this)
            lines.append(f"  rank {r.rank}: {n} all-reduce{'s' if n != 1 else ''}, {early} launched before backward's "
                         f"last op ended")
    return lines


@contextlib.contextmanager
def _native_stderr_muted():
    """The profiler's C++ side prints a timestamped line at start and stop: keep it out of the rank's log."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _train_step(model, optimizer, batch) -> None:
    """Step 3's training step (the scripts' loop body)."""
    import torch.nn.functional as F

    tokens, lengths, labels = batch
    loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
    optimizer.zero_grad()
    loss.backward()  # DDP's all-reduces start in here
    optimizer.step()


def _rank_profiles(env, caps: Sequence[float | None], limit: int) -> dict:
    """On each forked rank: per bucket size, a DDP model's profiled third step on a real batch of step 3's data."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.data import DistributedSampler

    from workshop_lib.config import TrainConfig
    from workshop_lib.data import collate, load_splits
    from workshop_lib.model import SmilesLSTM

    cfg = TrainConfig(limit=limit)
    splits = load_splits(cfg)
    shard = torch.tensor(list(DistributedSampler(splits.train, env.world_size, env.rank, seed=cfg.seed)))  # (N/2,)
    typical = shard[torch.argsort(splits.train.lengths[shard])][len(shard) // 2:][:cfg.batch_size]  # middle lengths
    batch = collate([splits.train[i] for i in typical.tolist()])  # both ranks about the same work: no long wait
    out = {}
    for cap in caps:
        torch.manual_seed(cfg.seed)
        model = SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout)
        model = DDP(model, bucket_cap_mb=cap)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        for _ in range(2):  # the second step's forward rebuilds the buckets: profile the third
            _train_step(model, optimizer, batch)
        dist.barrier()  # both ranks start the profiled step together
        with _native_stderr_muted(), profile(activities=[ProfilerActivity.CPU]) as prof:
            _train_step(model, optimizer, batch)
            dist.barrier()  # gloo's threads have closed their records before the profiler stops
        origin = prof.profiler.kineto_results.trace_start_ns() / 1000  # µs; events are relative to it
        out["grad_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        out[cap] = [Event(e.name, origin + e.time_range.start, e.time_range.end - e.time_range.start, e.thread)
                    for e in prof.events() if kind_of(e.name) is not None]
    return out


def profile_ddp_step(bucket_caps_mb: Sequence[float | None] = (None, SMALL_CAP_MB), limit: int = 1000,
                     timeout: float = 90) -> list[ProfiledStep]:
    """One DDP training step of the step-3 model on 2 forked ranks per bucket size, profiled; prints :func:`facts`."""
    from workshop_lib.lab.forklaunch import notebook_launch

    per_rank = notebook_launch(_rank_profiles, 2, tuple(bucket_caps_mb), limit, timeout=timeout)
    steps = []
    for cap in bucket_caps_mb:
        events = [result[cap] for result in per_rank]
        origin = min(e.start for rank_events in events for e in rank_events if kind_of(e.name) == FORWARD)
        ranks = tuple(RankStep(r, classify(ev, origin)) for r, ev in enumerate(events))
        step = ProfiledStep(cap, ranks, per_rank[0]["grad_bytes"])
        for rank in step.ranks:
            rank.check()
        steps.append(step)
    print("\n".join(facts(steps)))
    return steps


def draw(steps: Sequence[ProfiledStep]):
    """One panel per bucket size; per rank a row for its main thread and one for gloo's worker threads."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(steps), 1, figsize=(10, 1.0 + 1.5 * len(steps)), sharex=True, squeeze=False)
    plt.close(fig)  # shown once, as the cell's value
    for ax, step in zip(axes[:, 0], steps, strict=True):
        ticks, names = [], []
        for i, rank in enumerate(step.ranks):
            main_y, gloo_y = 3 * i + 0.4, 3 * i + 1.4  # rank 0 on top: the axis is inverted below
            for kind in (FORWARD, BACKWARD, OPTIMIZER):
                bars = [(s.start, s.duration) for s in rank.of(kind)]
                ax.broken_barh(bars, (main_y - 0.4, 0.8), color=_COLORS[kind])
            done = max([s.end for s in rank.of(COPY)] + [s.end for s in rank.of(ALL_REDUCE)])
            ax.broken_barh([(rank.backward_end, done - rank.backward_end)], (main_y - 0.25, 0.5),
                           facecolor="none", edgecolor="gray", hatch="///", linewidth=0)
            ax.plot([s.start for s in rank.of(LAUNCH)], [main_y - 0.55] * len(rank.of(LAUNCH)), "kv", markersize=5)
            threads = sorted({s.thread for s in rank.of(ALL_REDUCE)})
            height = 0.8 / len(threads)
            for s in rank.of(ALL_REDUCE):  # one lane per gloo thread: two all-reduces may run at once
                lane = gloo_y - 0.4 + height * threads.index(s.thread)
                ax.broken_barh([(s.start, s.duration)], (lane, height * 0.9), color=_COLORS[ALL_REDUCE], edgecolor="k",
                               linewidth=0.5)
            ticks += [main_y, gloo_y]
            names += [f"rank {rank.rank}", f"rank {rank.rank}: gloo"]
        ax.set_yticks(ticks, names)
        ax.set_ylim(3 * len(step.ranks) - 0.4, -0.4)
        ax.set_title(step.label, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("ms since the step began (one clock for both ranks)")
    handles = [Patch(color=_COLORS[k], label=k) for k in (FORWARD, BACKWARD, ALL_REDUCE, OPTIMIZER)]
    handles.append(Patch(facecolor="none", edgecolor="gray", hatch="///", label="backward() waits for gloo"))
    handles.append(plt.Line2D([], [], color="k", marker="v", linestyle="none", label="DDP launches a bucket"))
    fig.legend(handles=handles, loc="upper center", ncol=6, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
