"""workshop_lib.figures.timeline: profiler records cut into DDP steps, their median, the facts in words, a real 2-rank
run."""

from __future__ import annotations

import os
from types import SimpleNamespace

import matplotlib
import pytest
import torch

from workshop_lib.figures import timeline
from workshop_lib.figures.timeline import ALL_REDUCE, BACKWARD, COPY, FORWARD, LAUNCH, OPTIMIZER, Bucket, Event

matplotlib.use("Agg")

MAIN, GLOO_A, GLOO_B = 1, 2, 3
EVAL = "autograd::engine::evaluate_function: "
PERIOD = 20_000.0  # µs from one step's forward to the next


def step_events(t0: float, launches: list[float], forward: float = 4000.0, work: float = 500.0) -> list[Event]:
    """One DDP step as torch.profiler records it (µs from t0): forward, three backward ops, the AccumulateGrad that
    launches each bucket, gloo's all-reduce of each on alternating threads, the copies, the optimizer step.
    ``forward`` longer than 4000 delays everything after it."""
    late = forward - 4000.0
    events = [
        Event("DistributedDataParallel.forward", t0, forward, MAIN),
        Event("aten::lstm", t0 + 100, 3000, MAIN),  # nested in forward: not a part of its own
        Event(EVAL + "AddmmBackward0", t0 + late + 4100, 100, MAIN),
        Event(EVAL + "MkldnnRnnLayerBackward0", t0 + late + 4300, 6000, MAIN),
        Event(EVAL + "EmbeddingBackward0", t0 + late + 10400, 600, MAIN),  # backward's last op ends at 11000
        Event("Optimizer.step#AdamW.step", t0 + late + 13000, 300, MAIN),
    ]
    for i, at in enumerate(launches):
        events += [Event(EVAL + "torch::autograd::AccumulateGrad", t0 + late + at - 10, 200, MAIN),
                   Event("c10d::allreduce_", t0 + late + at, 100, MAIN),
                   Event("gloo:all_reduce", t0 + late + at + 150, work, GLOO_A if i % 2 == 0 else GLOO_B),
                   Event("torch.distributed.ddp.reducer::copy_bucket_to_grad", t0 + late + 12500 + 10 * i, 5, MAIN)]
    return events


def rank_records(launches: list[float], steps: int = 3, offset: float = 0.0, slow_step: int | None = None):
    """A rank's records of ``steps`` back-to-back steps; ``slow_step``'s forward takes 4 ms longer."""
    events = []
    for k in range(steps):
        events += step_events(1e9 + offset + k * PERIOD, launches, forward=8000.0 if k == slow_step else 4000.0)
    return events


ONE = [Bucket(("head.weight", "lstm.weight", "embed.weight"), (8000, 60000, 16612))]
THREE = [Bucket(("head.weight",), (8000,)), Bucket(("lstm.weight",), (60000,)), Bucket(("embed.weight",), (16612,))]


def timelines(steps: int = 3):
    default = timeline.median_step(None, [(rank_records([11100.0], steps), ONE),
                                          (rank_records([11100.0], steps, offset=700), ONE)])
    small = timeline.median_step(0.005, [(rank_records([4250.0, 10350.0, 11100.0], steps), THREE),
                                         (rank_records([4250.0, 10350.0, 11100.0], steps, offset=700), THREE)])
    return [default, small]


def test_kind_of_names_the_records_of_a_ddp_step_and_leaves_out_the_rest():
    assert timeline.kind_of("DistributedDataParallel.forward") == FORWARD
    assert timeline.kind_of(EVAL + "MkldnnRnnLayerBackward0") == BACKWARD
    assert timeline.kind_of("c10d::allreduce_") == LAUNCH
    assert timeline.kind_of("gloo:all_reduce") == ALL_REDUCE
    assert timeline.kind_of("torch.distributed.ddp.reducer::copy_bucket_to_grad") == COPY
    assert timeline.kind_of("Optimizer.step#AdamW.step") == OPTIMIZER
    # adding into .grad is where DDP's hook launches a bucket: not one of backward's ops
    for other in (EVAL + "torch::autograd::AccumulateGrad", "aten::lstm", "gloo:barrier", "c10d::barrier"):
        assert timeline.kind_of(other) is None


def test_records_keeps_a_ddp_steps_parts_on_the_machines_clock():
    def event(name, start, end, thread=MAIN):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), thread=thread)

    prof = SimpleNamespace(
        profiler=SimpleNamespace(kineto_results=SimpleNamespace(trace_start_ns=lambda: 5_000_000)),
        events=lambda: [event("DistributedDataParallel.forward", 10, 40), event("aten::mm", 12, 20),
                        event("gloo:all_reduce", 50, 80, GLOO_A)])
    assert timeline.records(prof) == [Event("DistributedDataParallel.forward", 5010.0, 30, MAIN),
                                      Event("gloo:all_reduce", 5050.0, 30, GLOO_A)]


@pytest.fixture
def group_of_one():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_note_buckets_names_each_buckets_parameters_as_ddp_hands_them_and_changes_no_gradient(group_of_one):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 1))  # 40, 4, 1 elements
    plain = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 1))
    plain.load_state_dict(module.state_dict())
    ddp = DDP(module, bucket_cap_mb=20 / 2**20)  # 20 bytes: the linear layer's 5 floats close the first bucket
    with pytest.raises(RuntimeError, match=r"call timeline.note_buckets\(model\) right after DDP\(...\)"):
        timeline.buckets(ddp)
    timeline.note_buckets(ddp)
    with pytest.raises(RuntimeError, match="no backward has run since"):
        timeline.buckets(ddp)
    tokens = torch.tensor([[1, 2, 3]])
    first = None
    for _ in range(3):  # DDP rebuilds its buckets in the second step's forward, in the order the gradients came
        ddp.zero_grad()
        ddp(tokens).sum().backward()
        first = first or timeline.buckets(ddp)
    assert first == [Bucket(("0.weight", "1.weight", "1.bias"), (160, 16, 4))]  # the first step: one bucket
    assert timeline.buckets(ddp) == [Bucket(("1.bias", "1.weight"), (4, 16)), Bucket(("0.weight",), (160,))]
    plain(tokens).sum().backward()  # a world of one: DDP's averaged gradient is the plain one, through the hook too
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(plain.parameters(), module.parameters(), strict=True))


def test_median_step_cuts_the_records_into_steps_on_one_clock():
    default, small = timelines()
    assert len(default.steps) == 2 and all(len(rank) == 3 for rank in default.steps)
    first = default.steps[0][0]
    assert first.of(FORWARD) == ((0.0, 4.0),)  # ms from the earliest forward of the step on any rank
    assert default.steps[1][0].of(FORWARD) == ((0.7, 4.7),)  # rank 1 started 0.7 ms later: same clock
    assert first.backward_end == pytest.approx(11.0)  # the last backward op, not the wait that follows it
    assert first.returned == pytest.approx(12.505)  # the last averaged bucket copied into .grad
    assert first.end == pytest.approx(13.3)  # the optimizer step's end
    assert [s.launched_early for s in small.steps[0]] == [2, 2, 2]  # the third bucket waits for backward's end
    assert default.label == "bucket_cap_mb=25 (the default): 1 bucket"
    assert small.label == "bucket_cap_mb=0.005: 3 buckets"


def test_the_median_step_is_not_moved_by_one_slow_step():
    steady = timeline.median_step(None, [(rank_records([11100.0]), ONE), (rank_records([11100.0]), ONE)])
    noisy = timeline.median_step(None, [(rank_records([11100.0], slow_step=1), ONE), (rank_records([11100.0]), ONE)])
    assert noisy.steps[0][1].end == pytest.approx(17.3)  # the slow step itself, 4 ms late
    assert noisy.median == steady.median


def test_median_step_refuses_records_that_do_not_match_the_buckets():
    no_gloo = [e for e in rank_records([11100.0]) if e.name != "gloo:all_reduce"]
    with pytest.raises(AssertionError, match="1 launches and 0 gloo all-reduces in a step, for 1 buckets"):
        timeline.median_step(None, [(no_gloo, ONE), (rank_records([11100.0]), ONE)])
    with pytest.raises(AssertionError, match="different buckets"):
        timeline.median_step(None, [(rank_records([11100.0]), ONE), (rank_records([11100.0]), THREE)])


def test_facts_list_the_buckets_and_the_launches_before_backwards_end():
    assert timeline.facts(timelines()) == [
        "bucket_cap_mb=25 (the default): 1 bucket",
        "  bucket 0: all 3 parameters: 84,612 bytes",
        "  rank 0: 1 all-reduce a step, 0 launched before backward's last op ended, in each of 3 steps",
        "  rank 1: 1 all-reduce a step, 0 launched before backward's last op ended, in each of 3 steps",
        "bucket_cap_mb=0.005: 3 buckets",
        "  bucket 0: head.weight: 8,000 bytes",
        "  bucket 1: lstm.weight: 60,000 bytes",
        "  bucket 2: embed.weight: 16,612 bytes",
        "  rank 0: 3 all-reduces a step, 2 launched before backward's last op ended, in each of 3 steps",
        "  rank 1: 3 all-reduces a step, 2 launched before backward's last op ended, in each of 3 steps",
    ]


def test_timings_give_the_slower_ranks_medians_against_the_first_bucket_size():
    lines = timeline.timings(timelines(), {None: [40.0, 41.0], 0.005: [43.0, 45.1]})
    assert lines[0] == ("backward() returned, median of the 3 profiled steps: 1 bucket 13.2 ms, "
                        "3 buckets 13.2 ms (+0%)")
    assert lines[1].startswith("the whole step, median of the 3 profiled steps: 1 bucket 14.0 ms")
    assert lines[2] == "the whole step without the profiler, in turns: 1 bucket 41.0 ms, 3 buckets 45.1 ms (+10%)"


def test_ms_per_step_times_the_runs_in_turns():
    seen = []
    medians = timeline.ms_per_step({"a": ("A", None), "b": ("B", None)}, lambda m, o, b: seen.append(m), None, 3)
    assert seen == ["A", "B", "A", "B", "A", "B"] and set(medians) == {"a", "b"}


def test_steps_of_several_bucket_sizes_in_turns_are_told_apart_by_their_named_spans():
    def in_turns(offset: float = 0.0) -> list[Event]:
        events = []
        for k in range(3):  # default, small, default, small, ...: one step each, a span named after its cap
            for j, (cap, launches) in enumerate(((None, [11100.0]), (0.005, [4250.0, 10350.0, 11100.0]))):
                t0 = 1e9 + offset + (2 * k + j) * PERIOD
                events += [Event(f"bucket_cap_mb={cap}", t0 - 50, 13400, MAIN), *step_events(t0, launches)]
        return events

    default = timeline.median_step(None, [(in_turns(), ONE), (in_turns(700), ONE)])
    small = timeline.median_step(0.005, [(in_turns(), THREE), (in_turns(700), THREE)])
    assert [len(rank) for rank in default.steps] == [3, 3] and [len(rank) for rank in small.steps] == [3, 3]
    assert all(s.launched_early == 0 for s in default.steps[0]) and all(s.launched_early == 2 for s in small.steps[1])
    assert default.steps[1][0].of(FORWARD) == ((0.7, 4.7),)  # each step from its own origin, on one clock
    with pytest.raises(AssertionError, match="no step named bucket_cap_mb=1"):
        timeline.median_step(1, [(in_turns(), ONE), (in_turns(), ONE)])


def test_quiet_mutes_native_writes_to_stderr_and_restores_them(capfd):
    with timeline.quiet():
        os.write(2, b"profiler_start\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


def test_draw_gives_a_panel_per_bucket_size_and_two_rows_per_rank(tmp_path):
    fig = timeline.draw(timelines())
    top, bottom = fig.axes
    assert top.get_title(loc="left") == "bucket_cap_mb=25 (the default): 1 bucket; median step 14.0 ms (slower rank)"
    assert bottom.get_title(loc="left").startswith("bucket_cap_mb=0.005: 3 buckets; median step")
    assert [t.get_text() for t in bottom.get_yticklabels()] == ["rank 0", "rank 0: gloo", "rank 1", "rank 1: gloo"]
    assert "median of 3 steps" in bottom.get_xlabel()
    fig.savefig(tmp_path / "timeline.png")  # renders without error


def _profiled_steps(env, caps, steps):
    """The notebook's rank function (04b, section 4), on random tokens."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function

    from workshop_lib.model import SmilesLSTM

    def train_step(model, optimizer, b):
        tokens, lengths, labels = b
        loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    torch.manual_seed(0)
    b = (torch.randint(1, 40, (16, 30)), torch.full((16,), 30), torch.randint(0, 2, (16,)).float())
    runs = {}
    for cap in caps:
        model = DDP(SmilesLSTM(40), bucket_cap_mb=cap)
        timeline.note_buckets(model)
        runs[cap] = model, torch.optim.AdamW(model.parameters())
        for _ in range(2):
            train_step(*runs[cap], b)
    with timeline.quiet(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            for cap in caps:
                with record_function(f"bucket_cap_mb={cap}"):
                    train_step(*runs[cap], b)
    buckets = {cap: timeline.buckets(model) for cap, (model, _) in runs.items()}
    return timeline.records(prof), buckets, timeline.ms_per_step(runs, train_step, b, 2)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_two_rank_profile_shows_the_buckets_and_when_they_are_launched():
    from workshop_lib.launching.forklaunch import notebook_launch

    caps = (None, timeline.SMALL_CAP_MB)
    ranks = notebook_launch(_profiled_steps, 2, caps, 3, timeout=90)
    default, small = [timeline.median_step(cap, [(found, buckets[cap]) for found, buckets, _ in ranks]) for cap in caps]
    assert [len(rank) for rank in default.steps] == [len(rank) for rank in small.steps] == [3, 3]
    assert [b.nbytes for b in default.buckets] == [sum(b.nbytes for b in small.buckets)]  # one bucket: all of them
    assert len(small.buckets) > 1
    cap = int(timeline.SMALL_CAP_MB * 2**20)
    assert all(sum(b.sizes[:-1]) < cap <= b.nbytes for b in small.buckets[:-1])  # each closed by its last parameter
    assert small.buckets[0].names[:2] == ("head.3.bias", "head.3.weight")  # in the order the gradients arrive
    for t in (default, small):
        assert all(s.launched_early == len(t.buckets) - 1 for rank in t.steps for s in rank)
    assert all(set(ms) == set(caps) for _, _, ms in ranks)
