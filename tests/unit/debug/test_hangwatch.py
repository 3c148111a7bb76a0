"""hangwatch: the diagnosis from the ranks' answers, and real 2-rank jobs that wait."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.conftest import REPO, run_torchrun
from workshop_lib.debug import hangreport, hangwatch
from workshop_lib.debug.hangreport import explain, one_line
from workshop_lib.debug.hangwatch import Call

WORKER = REPO / "tests" / "workers" / "hang_worker.py"


def answer(rank, frames, current=None, last=None, history=(), left=False, inner=""):
    return {"rank": rank, "asked": 1, "pid": 100 + rank, "frames": frames, "inner": inner, "current": current,
            "last": last, "history": list(history), "left": left}


def call(op, seq, tensors="float32[3]", where="t.py:9 in train()"):
    return {"op": op, "seq": seq, "tensors": tensors, "since": 0.0, "where": where}


STUCK = Call("all_reduce", 2, "float32[3]", 0.0, "t.py:9 in train()")


def test_a_rank_elsewhere_is_named_with_its_function_and_line():
    answers = {0: answer(0, [["t.py", 20, "main", ""], ["t.py", 9, "train", "dist.all_reduce(x)"]],
                         current=call("all_reduce", 2), history=[call("all_reduce", 1), call("all_reduce", 2)]),
               1: answer(1, [["t.py", 20, "main", ""], ["t.py", 4, "evaluate", "time.sleep(9)"]],
                         last=call("all_reduce", 1), history=[call("all_reduce", 1)])}
    lines = explain(0, STUCK, "has waited 6 s", answers, 2)
    text = "\n".join(lines)
    assert lines[0] == "rank 0 has waited 6 s in all_reduce #2 (float32[3]), called at t.py:9 in train()"
    assert "never arrived: rank 1" in text
    assert "rank 1 never entered all_reduce #2: it is in evaluate() at t.py:4" in text
    assert "its last collective was all_reduce #1" in text
    assert "rank 1: t.py:20 main() > t.py:4 evaluate()" in text


def test_different_shapes_and_different_ops_are_told_apart():
    mine = call("all_reduce", 2)
    shapes = {0: answer(0, [], current=mine, history=[mine]),
              1: answer(1, [], current=call("all_reduce", 2, "float32[1]"), history=[call("all_reduce", 2, "float32[1]")])}
    text = "\n".join(explain(0, STUCK, "has waited 6 s", shapes, 2))
    assert "with float32[1] where rank 0 has float32[3]" in text and "same shape and dtype" in text
    assert "first differ (op, tensors or call site) at #2" in text
    ops = {0: answer(0, [], current=mine), 1: answer(1, [], current=call("all_gather", 2, where="t.py:7 in f()"))}
    assert "rank 1 is in all_gather #2 (float32[3]) at t.py:7 in f(), not in all_reduce #2" in "\n".join(
        explain(0, STUCK, "has waited 6 s", ops, 2))


def test_ranks_that_left_in_backward_or_silent_are_each_explained():
    answers = {0: answer(0, []), 1: answer(1, [], left=True, last=call("all_gather", 7)),
               2: answer(2, [["t.py", 3, "step", "loss.backward()"]], current=call("backward", 0, "DDP's gradient buckets"))}
    text = "\n".join(explain(0, STUCK, "has waited 6 s", answers, 4))
    assert "never arrived: rank 1, 2, 3" in text
    assert "rank 1 has left the job (it called destroy_process_group); its last collective was all_gather #7" in text
    assert "rank 2 never entered all_reduce #2: it is in loss.backward()" in text
    assert "rank 3 did not answer" in text


def test_one_line_says_who_waits_where_and_what_the_missing_rank_does_instead():
    mine = call("all_reduce", 2)
    elsewhere = {0: answer(0, [], current=mine), 1: answer(1, [], current=call("all_gather", 2, where="t.py:7 in f()"))}
    assert one_line(explain(0, STUCK, "has waited 6 s", elsewhere, 2)) == (
        "rank 0 waits in all_reduce #2 (called at t.py:9 in train()); rank 1 never joined it: it is in "
        "all_gather #2 (float32[3]) at t.py:7 in f()")
    backward = {0: answer(0, [], current=mine),
                1: answer(1, [["t.py", 3, "step", "loss.backward()"]], current=call("backward", 0, "DDP's buckets"))}
    assert one_line(explain(0, STUCK, "has waited 6 s", backward, 2)) == (
        "rank 0 waits in all_reduce #2 (called at t.py:9 in train()); rank 1 never joined it: it is in "
        "loss.backward(), where DDP all-reduces the gradients (step() at t.py:3)")
    left = {0: answer(0, [], current=mine), 1: answer(1, [], left=True)}
    assert one_line(explain(0, STUCK, "has waited 6 s", left, 2)).endswith(
        "rank 1 never joined it: it has left the job (it called destroy_process_group)")
    shapes = {0: answer(0, [], current=mine), 1: answer(1, [], current=call("all_reduce", 2, "float32[1]"))}
    assert one_line(explain(0, STUCK, "has waited 6 s", shapes, 2)).endswith(
        "rank 1 is in it too, but with float32[1] where rank 0 has float32[3]: every rank must pass the same "
        "shape and dtype")


def test_install_in_a_world_of_one_changes_nothing():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10))
    try:
        before = dist.all_reduce
        assert hangwatch.install() is None
        assert dist.all_reduce is before
    finally:
        dist.destroy_process_group()


def test_each_collective_is_recorded_with_the_backward_calls_before_it():
    """Under DDP each backward() all-reduces the gradients: the record counts them, for the ranks' sequences."""
    watch = hangwatch.Watch(dist.HashStore(), 0, 2, threshold=60, poll=60)
    x = torch.ones(2)
    for op in ("_broadcast_coalesced", "backward", "backward", "all_gather"):
        watch.leave(watch.enter(op, (x,), {}), None)
    watch.enter("backward", (), {})  # the third one, still running
    said = json.loads(watch.where(1))
    assert [(c["op"], c["seq"], c["backwards"]) for c in said["history"]] == [("_broadcast_coalesced", 1, 0),
                                                                             ("all_gather", 2, 2)]
    assert said["backwards"] == 3 and (said["current"]["op"], said["current"]["backwards"]) == ("backward", 3)


def lines_of(done, tag="hangwatch: "):
    return [line.split(tag, 1)[1] for line in (done.stdout + done.stderr).splitlines() if tag in line]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_late_rank_is_diagnosed_and_the_job_still_finishes(tmp_path):
    """Rank 1 comes late, once the watch (threshold 2 s) has printed where it is; both finish with the right sum."""
    record = tmp_path / "hang.json"
    done = run_torchrun(WORKER, ["busy", 60, 2], timeout=120, **{hangreport.RECORD_VARIABLE: str(record)})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "rank 1 sum [4.0, 4.0, 4.0]" in out  # the wrapped collectives still compute: ones, summed twice over 2 ranks
    said = "\n".join(lines_of(done))
    lines = WORKER.read_text().splitlines()
    evaluate = range(next(i for i, text in enumerate(lines, 1) if text.startswith("def evaluate(")),
                     next(i for i, text in enumerate(lines, 1) if text.startswith("def main(")))
    assert re.search(r"rank 0 has waited \d+ s in all_reduce #2 \(float32\[3\]\)", said), said
    assert "never arrived: rank 1" in said, said
    at = re.search(r"rank 1 never entered all_reduce #2: it is in evaluate\(\) at tests/workers/hang_worker\.py:(\d+)", said)
    assert at and int(at.group(1)) in evaluate, said
    assert said.count("has waited") == 1, said  # one block for the job, not one per rank
    assert [b["missing"] for b in hangreport.load(record)] == [[1]]  # and its record, for programs


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_rank_that_left_is_named_by_the_rank_left_waiting():
    done = run_torchrun(WORKER, ["exit", 30, 60], timeout=120)
    said = "\n".join(lines_of(done))
    assert done.returncode != 0
    assert re.search(r"rank 0 failed after \d+ s \(.*\) in all_reduce #2", said), said
    assert "rank 1 has left the job (it called destroy_process_group); its last collective was all_reduce #1" in said, said


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_collective_still_running_on_the_gpu_is_the_one_reported():
    """NCCL returns once a collective is queued: the watch's CUDA event says whether the GPU got through it."""
    watch = hangwatch.Watch(dist.HashStore(), 0, 2, threshold=0.1, poll=0.1)
    x = torch.ones(4, device="cuda")
    call = watch.enter("all_reduce", (x,), {})
    torch.cuda._sleep(2_000_000_000)  # GPU time queued before the event, as a kernel waiting for a peer would be
    watch.leave(call, None)
    assert call.gpu and watch.unfinished_on_gpu() is call
    torch.cuda.synchronize()
    assert watch.unfinished_on_gpu() is None
