"""One wrapper around torch's functions and one record of the calls per process, shared by every reader."""


from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from workshop_lib.debug import collectives


class _Kept:
    """A recorder's side: each entry and event as the record gives it."""

    def __init__(self):
        self.events = []

    def __call__(self, event, line):
        self.events.append(event)


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10))
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_blocks_share_one_record_and_one_wrapper_and_torch_is_put_back():
    original = dist.all_reduce
    kept = _Kept()
    with collectives.calls() as outer:
        wrapped = dist.all_reduce
        with collectives.calls(kept) as inner:
            assert inner is outer and dist.all_reduce is wrapped  # a second block wraps nothing again
            with pytest.raises((ValueError, RuntimeError)):  # no process group: torch's own error passes through
                dist.all_reduce(torch.ones(1))
        assert dist.all_reduce is wrapped and outer.keeps == []  # the outer block's record, kept by nobody now
    assert dist.all_reduce is original and torch.autograd.backward.__module__.startswith("torch")
    assert [(e["kind"], e["name"], e["seq"]) for e in kept.events] == [("collective", "all_reduce", 1)]
    assert list(outer.recent) == kept.events and outer.current is None  # the same entry, left (it raised)


def test_backward_and_the_collectives_inside_it_are_numbered_once():
    x = torch.ones(2, requires_grad=True)
    with collectives.calls() as record:
        (2 * x).sum().backward()
        (2 * x).sum().backward()
    assert [(e["kind"], e["n"]) for e in record.recent] == [("backward", 1), ("backward", 2)]
    assert record.counts() == {"backward": 2} and record.last() is None  # no numbered call
    assert x.grad.tolist() == [4.0, 4.0]


class _Follower:
    def __init__(self, fails=False):
        self.ended_calls, self.failures, self.fails = [], [], fails

    def ended(self, call, error):
        if self.fails:
            raise KeyError("a bug in a follower")
        self.ended_calls.append((call["name"], error))

    def failed(self, err):
        self.failures.append(type(err).__name__)


def test_a_follower_that_raises_is_dropped_and_a_broken_record_lets_every_call_through(capsys, monkeypatch):
    broken, follower = _Follower(fails=True), _Follower()
    x = torch.ones(2, requires_grad=True)
    with collectives.calls() as record:
        record.followers += [broken, follower]
        (3 * x).sum().backward()
        (3 * x).sum().backward()  # the broken follower is gone: no second report
        assert broken.failures == ["KeyError"] and follower.ended_calls == [("backward", None)] * 2
        monkeypatch.setattr(collectives.Record, "enter", lambda *a: 1 / 0)
        (3 * x).sum().backward()  # the record itself raises: the call is torch's
        (3 * x).sum().backward()
    assert x.grad.tolist() == [12.0, 12.0] and record.broken
    assert capsys.readouterr().err.splitlines() == [  # one line, once
        "warning: the record of calls stopped observing torch.distributed (ZeroDivisionError: division by zero)"]


def test_ddp_forward_is_recorded_where_it_broadcasts_the_buffers_and_only_there(group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    with collectives.calls() as record:
        model = DDP(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)))
        model(torch.ones(2, 3)).sum().backward()
        with torch.no_grad():
            model(torch.ones(2, 3))  # broadcasts (the forward before it had gradients) ...
        model(torch.ones(2, 3))  # ... and then not: the one before it ran without
        DDP(torch.nn.Linear(2, 2))(torch.ones(1, 2))  # no buffers: no broadcast
    forwards = [(e["kind"], e["seq"], e["tensors"]) for e in record.recent if e["name"] == collectives.DDP_FORWARD]
    assert forwards == [("forward", 1, "broadcasts 3 buffers"), ("forward", 2, "broadcasts 3 buffers")]
    assert DDP.forward.__module__.startswith("torch")
    # each entry names its tensors' device, backward's and the forward's too: where NCCL's work is queued on a GPU,
    # the hang watch follows these entries there until the GPU finishes them
    assert {(e["kind"], e["device"]) for e in record.recent if e["kind"] in ("forward", "backward")} == {
        ("forward", "cpu"), ("backward", "cpu")}


def test_each_call_is_described_once_and_a_handles_wait_is_told_where_a_recorder_keeps_the_record(group):
    kept = _Kept()
    with collectives.calls() as record:
        assert type(dist.all_reduce(torch.ones(1), async_op=True)) is not collectives.Handle  # the watch alone
        with collectives.calls(kept):
            total = torch.ones(3)
            handle = dist.all_reduce(total, op=dist.ReduceOp.MAX, async_op=True)
            assert handle.is_completed() in (True, False)  # the handle's own names pass through
            handle.wait()
            dist.all_gather([torch.zeros(2)], torch.ones(2))  # one rank: a list of one
            blocking = dist.all_reduce(total)
    assert blocking is None  # a blocking call returns what torch returns
    reduced, gathered = [e for e in kept.events if e.get("phase") == "enter"][:2]
    assert {k: reduced[k] for k in ("op", "async_op", "dtype", "shape", "device", "count", "before")} == {
        "op": "MAX", "async_op": True, "dtype": "float32", "shape": [3], "device": "cpu", "count": None,
        "before": [1.0, 1.0, 1.0]}
    assert (reduced["seq"], reduced["tensors"], gathered["tensors"]) == (2, "float32[3]", "1 tensors, first float32[2]")
    assert {"kind": "wait", "name": "all_reduce", "seq": 2, "ok": True} in kept.events
    assert record.counts() == {"all_reduce": 3, "all_gather": 1} and record.last()["seq"] == 4
    assert "before" not in record.recent[0]  # values only where a recorder keeps them (a copy to the CPU)


def test_init_process_group_is_recorded_with_what_it_was_given_however_it_was_passed(monkeypatch):
    """``init_process_group("gloo", "tcp://...")`` names init_method positionally: the record says so, as it does for
    keywords (the made-up GPU node judges a join that is not env:// from it; the watch's threshold reads the timeout)."""
    def init_process_group(*args, **kwargs):
        raise RuntimeError("not joined: the record of the call is what is tested")

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    kept = _Kept()
    with collectives.calls(kept):
        for args, kwargs in ((("gloo", "tcp://127.0.0.1:1"), {"rank": 0}),
                             (("gloo",), {"init_method": "tcp://127.0.0.1:1", "rank": 0, "timeout": timedelta(seconds=8)})):
            with pytest.raises(RuntimeError, match="not joined"):
                dist.init_process_group(*args, **kwargs)
    said = [(e["kind"], e["given_init_method"], e["given_rank"], e["store"], e["timeout"]) for e in kept.events]
    assert said == [("init", "tcp://127.0.0.1:1", 0, False, None), ("init", "tcp://127.0.0.1:1", 0, False, 8.0)]
