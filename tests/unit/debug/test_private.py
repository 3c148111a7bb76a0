"""private: the one reader of torch's private names; where one is missing, None and one line, once."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from workshop_lib.debug import private, rankwatch


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(private, "_said", set())


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=40))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_the_group_timeout_is_the_one_the_group_was_created_with(group, fresh, capsys):
    assert private.group_timeout() == private.group_timeout(group) == timedelta(seconds=40)
    assert rankwatch.default_threshold() == 10.0  # a quarter of it
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("stand_in", "missing"), [
    (SimpleNamespace(), "ProcessGroup._get_backend"),
    (SimpleNamespace(_get_backend=lambda device: SimpleNamespace(options=SimpleNamespace())),
     "SimpleNamespace.options._timeout"),
])
def test_a_torch_without_the_timeout_gives_none_and_says_so_once(fresh, capsys, stand_in, missing):
    assert private.group_timeout(stand_in, instead="30 min is assumed") is None
    assert private.group_timeout(stand_in, instead="30 min is assumed") is None
    assert capsys.readouterr().err.splitlines() == [
        f"{private.WARNING}torch {torch.__version__} has no {missing}; 30 min is assumed"]


def test_the_watch_takes_torchs_default_timeout_where_it_cannot_read_the_groups(monkeypatch):
    monkeypatch.setattr(private, "group_timeout", lambda group=None, instead="": None)
    assert rankwatch.default_threshold() == dist.default_pg_timeout.total_seconds() / 4 == 450.0


def test_ddp_buckets_reads_the_rebuilt_buckets_and_none_where_torch_does_not_say(fresh, capsys):
    data = {"has_rebuilt_buckets": 1, "rebuilt_bucket_sizes": "20, 160", "rebuilt_per_bucket_param_indices": "2 1, 0"}
    assert private.ddp_buckets(SimpleNamespace(_get_ddp_logging_data=lambda: data)) == [((2, 1), 20), ((0,), 160)]
    assert capsys.readouterr().err == ""
    assert private.ddp_buckets(SimpleNamespace(), instead="no buckets") is None
    assert private.ddp_buckets(SimpleNamespace(_get_ddp_logging_data=lambda: {"has_rebuilt_buckets": 1})) is None
    assert capsys.readouterr().err.splitlines() == [
        f"{private.WARNING}torch {torch.__version__} has no DistributedDataParallel._get_ddp_logging_data; no buckets",
        f"{private.WARNING}torch {torch.__version__} has no rebuilt_per_bucket_param_indices or rebuilt_bucket_sizes "
        "in DDP's logging data; DDP's buckets cannot be named"]


def test_ddp_buckets_reads_a_real_ddp_model_once_its_third_forward_logged_them(group):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)))
    model(torch.ones(2, 3)).sum().backward()
    with pytest.raises(AssertionError, match="run three first"):
        private.ddp_buckets(model)
    for _ in range(2):
        model(torch.ones(2, 3)).sum().backward()
    found = private.ddp_buckets(model)
    assert sorted(i for indices, _ in found for i in indices) == [0, 1, 2, 3]
    assert sum(n for _, n in found) == 4 * (12 + 4 + 4 + 1)
