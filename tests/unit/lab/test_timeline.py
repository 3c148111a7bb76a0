"""workshop_lib.lab.timeline: profiler records sorted into a DDP step's parts, the facts in words, a real 2-rank trace."""

from __future__ import annotations

import matplotlib
import pytest

from workshop_lib.lab import timeline
from workshop_lib.lab.timeline import ALL_REDUCE, BACKWARD, FORWARD, LAUNCH, Event, ProfiledStep, RankStep

matplotlib.use("Agg")

MAIN, GLOO_A, GLOO_B = 1, 2, 3
EVAL = "autograd::engine::evaluate_function: "


def rank_events(t0: float, launches: list[float], work: float = 500.0) -> list[Event]:
    """A profiled DDP step as torch.profiler records it (µs from t0): forward, three backward ops, the
    AccumulateGrad that launches each bucket, gloo's all-reduce of each on alternating threads, the copies."""
    events = [
        Event("DistributedDataParallel.forward", t0, 4000, MAIN),
        Event("aten::lstm", t0 + 100, 3000, MAIN),  # nested in forward: not a part of its own
        Event(EVAL + "AddmmBackward0", t0 + 4100, 100, MAIN),
        Event(EVAL + "MkldnnRnnLayerBackward0", t0 + 4300, 6000, MAIN),
        Event(EVAL + "EmbeddingBackward0", t0 + 10400, 600, MAIN),  # backward's last op ends at t0 + 11000
        Event("Optimizer.step#AdamW.step", t0 + 13000, 300, MAIN),
    ]
    for i, at in enumerate(launches):
        events += [Event(EVAL + "torch::autograd::AccumulateGrad", t0 + at - 10, 200, MAIN),
                   Event("c10d::allreduce_", t0 + at, 100, MAIN),
                   Event("gloo:all_reduce", t0 + at + 150, work, GLOO_A if i % 2 == 0 else GLOO_B),
                   Event("torch.distributed.ddp.reducer::copy_bucket_to_grad", t0 + 12500 + 10 * i, 5, MAIN)]
    return events


def profiled(cap: float | None, launches: list[float]) -> ProfiledStep:
    ranks = [rank_events(1e9, launches), rank_events(1e9 + 700, launches)]
    return ProfiledStep(cap, tuple(RankStep(r, timeline.classify(ev, origin=1e9)) for r, ev in enumerate(ranks)), 84_612)


def test_kind_of_names_the_records_of_a_ddp_step_and_leaves_out_the_rest():
    assert timeline.kind_of("DistributedDataParallel.forward") == FORWARD
    assert timeline.kind_of(EVAL + "MkldnnRnnLayerBackward0") == BACKWARD
    assert timeline.kind_of("c10d::allreduce_") == LAUNCH
    assert timeline.kind_of("gloo:all_reduce") == ALL_REDUCE
    assert timeline.kind_of("torch.distributed.ddp.reducer::copy_bucket_to_grad") == timeline.COPY
    assert timeline.kind_of("Optimizer.step#AdamW.step") == timeline.OPTIMIZER
    # adding into .grad is where DDP's hook launches a bucket: not one of backward's ops
    for other in (EVAL + "torch::autograd::AccumulateGrad", "aten::lstm", "gloo:barrier", "c10d::barrier"):
        assert timeline.kind_of(other) is None


def test_classify_keeps_the_parts_in_ms_from_the_origin_in_order_of_start():
    spans = timeline.classify(rank_events(5e6, [4250.0]), origin=5e6)
    assert [s.kind for s in spans] == [FORWARD, BACKWARD, LAUNCH, BACKWARD, ALL_REDUCE, BACKWARD, timeline.COPY,
                                       timeline.OPTIMIZER]
    assert (spans[0].start, spans[0].duration) == (0.0, 4.0)
    gloo = spans[4]
    assert (gloo.start, gloo.end, gloo.thread) == (4.4, 4.9, GLOO_A)


def test_rank_step_knows_when_backward_ends_and_checks_its_parts():
    rank = profiled(None, [11100.0]).ranks[0]
    assert rank.backward_end == pytest.approx(11.0)  # the last backward op, not the wait that follows it
    rank.check()
    no_gloo = RankStep(0, tuple(s for s in rank.spans if s.kind != ALL_REDUCE))
    with pytest.raises(AssertionError, match="DDP launched 1 all-reduce"):
        no_gloo.check()
    with pytest.raises(AssertionError, match="no forward"):
        RankStep(1, tuple(s for s in rank.spans if s.kind != FORWARD)).check()


def test_facts_count_the_buckets_and_say_which_all_reduce_overlaps_backward():
    one_bucket = profiled(None, [11100.0])
    three = profiled(0.005, [4250.0, 10350.0, 11100.0])
    assert one_bucket.buckets == 1 and three.buckets == 3
    assert timeline.facts([one_bucket, three]) == [
        "bucket_cap_mb=25 (the default): 1 bucket for 84,612 bytes of gradients",
        "  rank 0: 1 all-reduce, 0 launched before backward's last op ended",
        "  rank 1: 1 all-reduce, 0 launched before backward's last op ended",
        "bucket_cap_mb=0.005: 3 buckets for 84,612 bytes of gradients",
        "  rank 0: 3 all-reduces, 2 launched before backward's last op ended",
        "  rank 1: 3 all-reduces, 2 launched before backward's last op ended",
    ]


def test_draw_gives_a_panel_per_bucket_size_and_two_rows_per_rank(tmp_path):
    fig = timeline.draw([profiled(None, [11100.0]), profiled(0.005, [4250.0, 10350.0, 11100.0])])
    top, bottom = fig.axes
    assert top.get_title(loc="left") == "bucket_cap_mb=25 (the default): 1 bucket"
    assert bottom.get_title(loc="left") == "bucket_cap_mb=0.005: 3 buckets"
    assert [t.get_text() for t in bottom.get_yticklabels()] == ["rank 0", "rank 0: gloo", "rank 1", "rank 1: gloo"]
    assert "ms since the step began" in bottom.get_xlabel()
    fig.savefig(tmp_path / "timeline.png")  # renders without error


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_two_rank_trace_shows_the_all_reduces_against_backward(capsys):
    default, small = timeline.profile_ddp_step((None, timeline.SMALL_CAP_MB), timeout=90)
    for step in (default, small):
        assert len(step.ranks) == 2
        for rank in step.ranks:
            assert rank.of(FORWARD) and rank.of(BACKWARD) and rank.of(ALL_REDUCE), rank
            assert len(rank.of(ALL_REDUCE)) == step.buckets  # gloo's own record, one per bucket
    assert default.grad_bytes == 84_612 and default.buckets == 1  # under the 1 MiB cap of the first bucket
    assert small.buckets > default.buckets
    for one, several in zip(default.ranks, small.ranks, strict=True):
        assert min(s.start for s in one.of(ALL_REDUCE)) > one.backward_end  # one bucket: it waits for all of backward
        assert min(s.start for s in several.of(ALL_REDUCE)) < several.backward_end  # overlap
    assert capsys.readouterr().out.splitlines() == timeline.facts([default, small])
