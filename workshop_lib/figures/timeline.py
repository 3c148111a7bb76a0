"""A DDP step on a timeline: torch.profiler's records of several steps, per rank, drawn as the median step (04b).

Each rank returns :func:`records` of its profile (each bucket size's steps in spans named ``bucket_cap_mb=...``),
:func:`buckets` (as a DDP communication hook saw them, :func:`note_buckets`) and :func:`ms_per_step`;
:func:`median_step` cuts the records into steps and takes their median; :func:`facts` says what does not change
from run to run, :func:`timings` what does, :func:`draw` shows it.
Records used (torch 2.13, gloo on CPU): DDP's forward, each backward op, ``c10d::allreduce_`` (a bucket launched),
``copy_bucket_to_grad``, the optimizer's step, and ``gloo:all_reduce`` on gloo's threads (the wait included).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

FORWARD, BACKWARD, LAUNCH, ALL_REDUCE, COPY, OPTIMIZER = "forward", "backward", "launch", "all-reduce", "copy", "optimizer"
PARTS = (FORWARD, BACKWARD, LAUNCH, ALL_REDUCE, COPY, OPTIMIZER)
STEP = "step"  # a span the notebook names with torch.profiler.record_function(f"bucket_cap_mb={cap}")
STEP_PREFIX = "bucket_cap_mb="
_EXACT = {"DistributedDataParallel.forward": FORWARD, "c10d::allreduce_": LAUNCH, "gloo:all_reduce": ALL_REDUCE,
          "torch.distributed.ddp.reducer::copy_bucket_to_grad": COPY}
_BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
_COLORS = {FORWARD: "tab:blue", BACKWARD: "tab:orange", ALL_REDUCE: "tab:green", OPTIMIZER: "tab:purple"}
SMALL_CAP_MB = 0.005  # 5,242 bytes: smaller than most of the model's parameters, so about one bucket each


@dataclass(frozen=True)
class Event:
    """One record of torch.profiler, as a rank sends it back."""

    name: str
    start: float  # microseconds on this machine's clock (the same for every rank)
    duration: float  # microseconds
    thread: int


def kind_of(name: str) -> str | None:
    """Which part of a DDP step a profiler record is (STEP: the step itself, as the notebook named it), or None."""
    if name in _EXACT:
        return _EXACT[name]
    if name.startswith(STEP_PREFIX):
        return STEP
    if name.startswith(_BACKWARD_PREFIX):  # AccumulateGrad: adding to .grad, where DDP's hook runs (and launches)
        return None if name.endswith("AccumulateGrad") else BACKWARD
    return OPTIMIZER if name.startswith("Optimizer.step#") else None


def records(prof) -> list[Event]:
    """The records of a finished ``torch.profiler.profile`` that make up DDP steps, on this machine's clock."""
    origin = prof.profiler.kineto_results.trace_start_ns() / 1000  # µs; the events' times are relative to it
    return [Event(e.name, origin + e.time_range.start, e.time_range.end - e.time_range.start, e.thread)
            for e in prof.events() if kind_of(e.name) is not None]


@contextlib.contextmanager
def quiet():
    """Mute this process's native stderr: the profiler's C++ side prints a timestamped line at start and at stop."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def ms_per_step(runs: dict, step: Callable, batch, steps: int) -> dict:
    """Median ms of ``step(model, optimizer, batch)`` per ``runs[key] = (model, optimizer)``, without a profiler."""
    times: dict = {key: [] for key in runs}
    for _ in range(steps):
        for key, (model, optimizer) in runs.items():  # in turns: a change in load falls on all (every rank: one order)
            start = time.perf_counter()
            step(model, optimizer, batch)
            times[key].append(1000 * (time.perf_counter() - start))
    return {key: statistics.median(t) for key, t in times.items()}


@dataclass(frozen=True)
class Bucket:
    """One of DDP's buckets: the parameters whose gradients it all-reduces together, in the order they arrive."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]  # bytes of each parameter's gradient

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


@dataclass
class _BucketLog:
    """What :func:`note_buckets`' hook saw of each bucket: this backward's so far, by index, and the last whole one."""

    names: dict[int, str]  # id(parameter) -> its name in the module
    current: dict[int, Bucket] = field(default_factory=dict)
    last: list[Bucket] | None = None


_logs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DDP model -> its _BucketLog


def _noted_allreduce(log: _BucketLog, bucket):
    """A DDP communication hook: note the bucket's parameters and gradient bytes, then all-reduce it as DDP does."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    log.current[bucket.index()] = Bucket(tuple(log.names[id(p)] for p in bucket.parameters()),
                                         tuple(g.numel() * g.element_size() for g in bucket.gradients()))
    if bucket.is_last():
        log.last, log.current = [log.current[i] for i in sorted(log.current)], {}
    return allreduce_hook(None, bucket)  # the default group's all-reduce of the averaged bucket


def note_buckets(ddp_model) -> None:
    """Before ``ddp_model``'s first step: a communication hook (``register_comm_hook``) that notes each bucket DDP
    hands it, then all-reduces it with torch's ``allreduce_hook``, what DDP does without a hook."""
    log = _BucketLog({id(p): name for name, p in ddp_model.module.named_parameters()})
    ddp_model.register_comm_hook(log, _noted_allreduce)
    _logs[ddp_model] = log


def buckets(ddp_model) -> list[Bucket]:
    """The buckets of ``ddp_model``'s last backward, as :func:`note_buckets`' hook saw them (DDP rebuilds them once,
    in the second step's forward: read them after the third step's backward)."""
    log = _logs.get(ddp_model)
    if log is None:
        raise RuntimeError("the timeline did not see this model's buckets: call timeline.note_buckets(model) "
                           "right after DDP(...), before its first step")
    if log.last is None:
        raise RuntimeError("no backward has run since timeline.note_buckets(model): run the steps first")
    return list(log.last)


@dataclass(frozen=True)
class Step:
    """One rank's step: per part, its (start, end) spans in ms since the step's origin, in order of start."""

    parts: dict[str, tuple[tuple[float, float], ...]]

    def of(self, kind: str) -> tuple[tuple[float, float], ...]:
        return self.parts.get(kind, ())

    @property
    def backward_end(self) -> float:
        """When backward's last op ended (DDP's wait for the all-reduces and its copies come after)."""
        return max(end for _, end in self.of(BACKWARD))

    @property
    def returned(self) -> float:
        """When ``backward()`` returned: the last averaged bucket copied into ``.grad``."""
        return max(end for _, end in self.of(COPY) + self.of(BACKWARD))

    @property
    def end(self) -> float:
        """When the optimizer step ended (a gloo thread may close its record a little later)."""
        return max(end for _, end in self.of(OPTIMIZER))

    @property
    def launched_early(self) -> int:
        """All-reduces launched before backward's last op ended (one thread's order: the same in every step)."""
        return sum(start < self.backward_end for start, _ in self.of(LAUNCH))


def _windows(events: Sequence[Event], bucket_cap_mb: float | None) -> list[tuple[float, float]]:
    """When each step of this bucket size ran (µs): its named span, or (none named) from a forward to the next."""
    named = [e for e in events if kind_of(e.name) == STEP]
    if named:
        mine = sorted((e.start, e.start + e.duration) for e in named if e.name == f"{STEP_PREFIX}{bucket_cap_mb}")
        assert mine, f"no step named {STEP_PREFIX}{bucket_cap_mb} among {sorted({e.name for e in named})}"
        return mine
    forwards = sorted(e.start for e in events if kind_of(e.name) == FORWARD)
    return list(zip(forwards, [*forwards[1:], float("inf")], strict=True))


def _steps(events: Sequence[Event], windows: Sequence[tuple[float, float]], origins: Sequence[float]) -> list[Step]:
    """One rank's records cut into steps: step k holds the parts that started in its k-th window (ms from origin k)."""
    found = sorted((e for e in events if kind_of(e.name) not in (None, STEP)), key=lambda e: e.start)
    steps = []
    for (begin, stop), origin in zip(windows, origins, strict=True):
        parts: dict[str, list[tuple[float, float]]] = {}
        for e in found:
            if begin <= e.start < stop:
                span = ((e.start - origin) / 1000, (e.start + e.duration - origin) / 1000)  # ms
                parts.setdefault(kind_of(e.name), []).append(span)
        steps.append(Step({k: tuple(v) for k, v in parts.items()}))
    return steps


def _median(steps: Sequence[Step]) -> Step:
    """Every span's median start and end over the steps (each step has the same parts, in the same order)."""
    parts = {}
    for kind in PARTS:
        counts = {len(s.of(kind)) for s in steps}
        assert len(counts) == 1, f"the steps hold {sorted(counts)} {kind} records: not the same step each time"
        parts[kind] = tuple((statistics.median(s.of(kind)[i][0] for s in steps),
                             statistics.median(s.of(kind)[i][1] for s in steps)) for i in range(counts.pop()))
    return Step(parts)


@dataclass(frozen=True)
class Timeline:
    """The profiled steps of every rank under one bucket size (None: DDP's default), and the median step."""

    bucket_cap_mb: float | None
    buckets: tuple[Bucket, ...]
    steps: tuple[tuple[Step, ...], ...]  # [rank][step]
    median: tuple[Step, ...]  # [rank]

    @property
    def label(self) -> str:
        cap = "bucket_cap_mb=25 (the default)" if self.bucket_cap_mb is None else f"bucket_cap_mb={self.bucket_cap_mb:g}"
        return f"{cap}: {len(self.buckets)} bucket{'s' if len(self.buckets) != 1 else ''}"

    def check(self) -> None:
        """Assert what the figure shows: every rank launched one all-reduce per bucket in every step, and gloo ran it."""
        for rank, steps in enumerate(self.steps):
            for step in steps:
                for kind in (FORWARD, BACKWARD, OPTIMIZER):
                    assert step.of(kind), f"rank {rank}'s step has no {kind} record; is this torch's DDP on gloo?"
                assert len(step.of(LAUNCH)) == len(step.of(ALL_REDUCE)) == len(self.buckets), (
                    f"rank {rank}: {len(step.of(LAUNCH))} launches and {len(step.of(ALL_REDUCE))} gloo all-reduces "
                    f"in a step, for {len(self.buckets)} buckets")


def median_step(bucket_cap_mb: float | None, per_rank: Sequence[tuple[Sequence[Event], Sequence[Bucket]]]) -> Timeline:
    """Each rank's (records of several steps, DDP's buckets) as steps on one clock, and their median.

    A rank's steps of this bucket size are the spans named ``f"bucket_cap_mb={bucket_cap_mb}"`` when the records hold
    any (steps of several bucket sizes profiled in turns), else the time from one forward to the next. Step k of
    every rank is measured from the same origin: the earliest start of its forward on any rank.
    """
    events = [list(records) for records, _ in per_rank]
    kept = [list(b) for _, b in per_rank]
    assert all(b == kept[0] for b in kept), "the ranks' DDP models hold different buckets"
    windows = [_windows(rank, bucket_cap_mb) for rank in events]
    assert len({len(w) for w in windows}) == 1, f"steps per rank: {[len(w) for w in windows]}"
    forwards = [[min((e.start for e in rank if kind_of(e.name) == FORWARD and a <= e.start < b), default=None)
                 for a, b in w] for rank, w in zip(events, windows, strict=True)]
    assert all(f is not None for rank in forwards for f in rank), "a step without DDP's forward"
    origins = [min(starts) for starts in zip(*forwards, strict=True)]  # µs: the earliest forward of step k
    steps = tuple(tuple(_steps(rank, w, origins)) for rank, w in zip(events, windows, strict=True))
    timeline = Timeline(bucket_cap_mb, tuple(kept[0]), steps, tuple(_median(s) for s in steps))
    timeline.check()
    return timeline


def facts(timelines: Sequence[Timeline]) -> list[str]:
    """What does not change from run to run: the buckets, and the all-reduces launched before backward's end."""
    lines = []
    for t in timelines:
        lines.append(t.label)
        for i, b in enumerate(t.buckets):
            names = f"all {len(b.names)} parameters" if len(t.buckets) == 1 else ", ".join(b.names)
            lines.append(f"  bucket {i}: {names}: {b.nbytes:,} bytes")
        for rank, steps in enumerate(t.steps):
            early = sorted({s.launched_early for s in steps})
            n, said = len(t.buckets), f"{early[0]}" if len(early) == 1 else f"{early[0]} to {early[-1]}"
            lines.append(f"  rank {rank}: {n} all-reduce{'s' if n != 1 else ''} a step, {said} launched before "
                         f"backward's last op ended, in each of {len(steps)} steps")
    return lines


def timings(timelines: Sequence[Timeline], unprofiled: dict | None = None) -> list[str]:
    """The medians, in ms of the slower rank: the figure's (profiled) steps, and ``unprofiled[cap]`` (one per rank)."""
    def row(what: str, ms: dict) -> str:
        first = next(iter(ms.values()))
        return f"{what}: " + ", ".join(f"{t.label.split(': ')[1]} {ms[t.bucket_cap_mb]:.1f} ms"
                                       + (f" ({ms[t.bucket_cap_mb] / first - 1:+.0%})" if i else "")
                                       for i, t in enumerate(timelines))

    steps = len(timelines[0].steps[0])
    lines = [row(f"backward() returned, median of the {steps} profiled steps",
                 {t.bucket_cap_mb: max(m.returned for m in t.median) for t in timelines}),
             row(f"the whole step, median of the {steps} profiled steps",
                 {t.bucket_cap_mb: max(m.end for m in t.median) for t in timelines})]
    if unprofiled:
        lines.append(row("the whole step without the profiler, in turns", {k: max(v) for k, v in unprofiled.items()}))
    return lines


def draw(timelines: Sequence[Timeline]):
    """One panel per bucket size; per rank a row for its main thread and one for gloo's all-reduces, a lane per bucket."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from workshop_lib.figures.plots import _new_figure

    fig, axes = _new_figure(10, 1.2 + 1.6 * len(timelines), nrows=len(timelines), sharex=True)
    for ax, t in zip(axes, timelines, strict=True):
        ticks, names = [], []
        for rank, m in enumerate(t.median):
            main_y, gloo_y = 3 * rank + 0.4, 3 * rank + 1.4  # rank 0 on top: the axis is inverted below
            for kind in (FORWARD, BACKWARD, OPTIMIZER):
                ax.broken_barh([(a, b - a) for a, b in m.of(kind)], (main_y - 0.4, 0.8), color=_COLORS[kind])
            ax.broken_barh([(m.backward_end, m.returned - m.backward_end)], (main_y - 0.25, 0.5),
                           facecolor="none", edgecolor="gray", hatch="///", linewidth=0)
            ax.plot([a for a, _ in m.of(LAUNCH)], [main_y - 0.55] * len(m.of(LAUNCH)), "kv", markersize=5)
            height = 0.8 / len(t.buckets)
            for i, (a, b) in enumerate(m.of(ALL_REDUCE)):  # bucket i in lane i: they may overlap in time
                ax.broken_barh([(a, b - a)], (gloo_y - 0.4 + height * i, height * 0.9), color=_COLORS[ALL_REDUCE],
                               edgecolor="k", linewidth=0.5)
            ax.plot([m.end, m.end], [main_y - 0.5, gloo_y + 0.5], color="k", linewidth=1)
            ticks, names = [*ticks, main_y, gloo_y], [*names, f"rank {rank}", f"rank {rank}: gloo"]
        ax.set_yticks(ticks, names)
        ax.set_ylim(3 * len(t.median) - 0.4, -0.4)
        slower = max(t.median, key=lambda m: m.end)
        ax.set_title(f"{t.label}; median step {slower.end:.1f} ms (slower rank)", fontsize=10, loc="left")
    steps = len(timelines[0].steps[0])
    axes[-1].set_xlabel(f"ms since the step began: the median of {steps} steps (one clock for both ranks)")
    handles = [*(Patch(color=_COLORS[k], label=k) for k in (FORWARD, BACKWARD, ALL_REDUCE, OPTIMIZER)),
               Patch(facecolor="none", edgecolor="gray", hatch="///", label="backward() waits for gloo"),
               plt.Line2D([], [], color="k", marker="v", linestyle="none", label="DDP launches a bucket"),
               plt.Line2D([], [], color="k", linewidth=1, label="step ends")]
    fig.legend(handles=handles, loc="upper center", ncol=7, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
