"""One wrapper around torch's collectives, shared by every observer."""


from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workshop_lib.debug import collectives


class _Log:
    def __init__(self, only=None):
        self.seen, self.only = [], only

    def enter(self, op, args, kwargs):
        if self.only and op not in self.only:
            return None
        self.seen.append(("enter", op))
        return op

    def leave(self, token, error):
        if token is not None:
            self.seen.append(("leave", token, type(error).__name__ if error else None))


def test_observers_share_one_wrapper_and_torch_is_put_back():
    original = dist.all_reduce
    a, b = _Log(), _Log(only={"barrier"})
    with collectives.observing(a):
        wrapped = dist.all_reduce
        with collectives.observing(b):
            assert dist.all_reduce is wrapped  # a second observer wraps nothing again
            with pytest.raises((ValueError, RuntimeError)):  # no process group: torch's own error passes through
                dist.all_reduce(torch.ones(1))
        assert dist.all_reduce is wrapped  # a's still there
    assert dist.all_reduce is original and torch.autograd.backward.__module__.startswith("torch")
    assert a.seen[0] == ("enter", "all_reduce") and a.seen[1][0] == "leave" and a.seen[1][2] is not None
    assert b.seen == []  # it observes barriers only


def test_backward_is_observed_for_the_hang_watch():
    log = _Log(only={collectives.BACKWARD})
    x = torch.ones(2, requires_grad=True)
    with collectives.observing(log):
        (2 * x).sum().backward()
    assert log.seen == [("enter", "backward"), ("leave", "backward", None)]
    assert x.grad.tolist() == [2.0, 2.0]


class _Broken:
    def __init__(self):
        self.failures = []

    def enter(self, op, args, kwargs):
        raise KeyError("a bug in an observer")

    def leave(self, token, error):
        raise AssertionError("never reached: the observer was dropped on entering")

    def failed(self, err):
        self.failures.append(type(err).__name__)


def test_an_observer_that_raises_is_dropped_and_the_call_goes_through_unchanged(capsys):
    broken, plain, log = _Broken(), type("Plain", (_Broken,), {"failed": None})(), _Log()
    x = torch.ones(2, requires_grad=True)
    with collectives.observing(log), collectives.observing(broken), collectives.observing(plain):
        (3 * x).sum().backward()  # the learner's call: its result is torch's
        (3 * x).sum().backward()  # the broken observers are gone: no second report
    assert x.grad.tolist() == [6.0, 6.0]
    assert broken.failures == ["KeyError"]  # told once, through its failed()
    assert capsys.readouterr().err.splitlines() == [  # one line for the observer without failed()
        "warning: Plain stopped observing torch.distributed's collectives (KeyError: 'a bug in an observer')"]
    assert log.seen == [("enter", "backward"), ("leave", "backward", None)] * 2  # the others still see every call


def test_ddp_forward_is_observed_where_it_broadcasts_the_buffers_and_only_there():
    from datetime import timedelta

    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10))
    seen = []
    log = type("Said", (_Log,), {"enter": lambda self, op, a, k: seen.append(
        (op, collectives.ddp_broadcasts(a[0]))) if op == collectives.DDP_FORWARD else None})()
    try:
        with collectives.observing(log):
            model = DDP(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)))
            model(torch.ones(2, 3)).sum().backward()
            with torch.no_grad():
                model(torch.ones(2, 3))  # broadcasts (the forward before it had gradients) ...
            model(torch.ones(2, 3))  # ... and then not: the one before it ran without
            DDP(torch.nn.Linear(2, 2))(torch.ones(1, 2))  # no buffers: no broadcast
    finally:
        dist.destroy_process_group()
    assert seen == [(collectives.DDP_FORWARD, "broadcasts 3 buffers")] * 2
    assert DDP.forward.__module__.startswith("torch")


class _Waits(_Log):
    def enter(self, op, args, kwargs):
        self.seen.append(("enter", op, collectives.facts(op, args, kwargs)))
        return op

    def waited(self, token, error):
        self.seen.append(("waited", token, error))


def test_each_call_is_described_once_and_a_handles_wait_is_told_to_the_observers_that_ask():
    from datetime import timedelta

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10))
    waits, plain = _Waits(), _Log()
    try:
        with collectives.observing(waits), collectives.observing(plain):
            total = torch.ones(3)
            handle = dist.all_reduce(total, op=dist.ReduceOp.MAX, async_op=True)
            assert handle.is_completed() in (True, False)  # the handle's own names pass through
            handle.wait()
            dist.all_gather([torch.zeros(2)], torch.ones(2))  # one rank: a list of one
            blocking = dist.all_reduce(total)
    finally:
        dist.destroy_process_group()
    assert blocking is None  # a blocking call returns what torch returns
    reduced, gathered = [s[2] for s in waits.seen if s[0] == "enter"][:2]
    assert reduced == {"op": "MAX", "async_op": True, "dtype": "float32", "shape": [3], "device": "cpu", "count": None}
    assert gathered["count"] == 1 and collectives.said(gathered) == "1 tensors, first float32[2]"
    assert collectives.said(reduced) == "float32[3]"
    assert ("waited", "all_reduce", None) in waits.seen and all(s[0] != "waited" for s in plain.seen)
