"""DistEnv from torchrun's environment, a world of one, and DDP's gradient equivalence."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from tests.conftest import REPO, run_torchrun
from workshop_lib import distributed
from workshop_lib.distributed import read_launch_env
from workshop_lib.errors import WorkshopError


def test_plain_python_is_a_world_of_one():
    env = read_launch_env({})
    assert (env.rank, env.local_rank, env.world_size, env.under_torchrun) == (0, 0, 1, False)


def test_torchrun_variables_are_read():
    env = read_launch_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                           "MASTER_ADDR": "node0", "MASTER_PORT": "29400", "TORCHELASTIC_RESTART_COUNT": "1",
                           "TORCHELASTIC_RUN_ID": "x", "OMP_NUM_THREADS": "1"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.master_addr, env.master_port, env.restart_count, env.omp_threads) == ("node0", 29400, 1, 1)


def test_without_local_rank_one_node_uses_rank_and_several_nodes_are_refused():
    assert read_launch_env({"RANK": "1", "WORLD_SIZE": "2"}).local_rank == 1  # one node: the same number
    with pytest.raises(WorkshopError, match=r"LOCAL_RANK is not set, and RANK cannot stand in for it on several nodes "
                                            r"\(WORLD_SIZE 4 > LOCAL_WORLD_SIZE 2\): it would pick the wrong GPU"):
        read_launch_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})


def test_the_usable_cores_are_the_affinity_not_the_machine():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    assert distributed.usable_cores() == len(os.sched_getaffinity(0))


def _relayed(monkeypatch, store, err):
    """What teardown() raises when ``err`` propagates out of a 2-rank job's work on rank 0."""
    monkeypatch.setattr(distributed, "_LINGER", 0)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: None)
    distributed._job.update(store=store, rank=0, world_size=2, timeout=5.0)
    with pytest.raises(WorkshopError) as raised:
        try:
            raise err
        finally:
            distributed.teardown()
    return raised.value


def test_a_peer_failure_is_one_line_and_an_unexplained_one_keeps_its_traceback(monkeypatch, capsys):
    lost = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:538] Connection closed by peer")
    unexplained = _relayed(monkeypatch, dist.HashStore(), lost)
    assert str(unexplained).startswith("lost contact with the other ranks (")
    assert unexplained.__cause__ is lost  # no other rank left a reason: it may be this rank's own bug
    assert "Traceback" in capsys.readouterr().err and "Connection closed by peer" in str(lost)
    store = dist.HashStore()
    store.set("failed/1", "ValueError: bad batch")
    explained = _relayed(monkeypatch, store, lost)
    assert str(explained) == "rank 1 failed (ValueError: bad batch); this rank stopped with it"
    assert explained.__cause__ is None and capsys.readouterr().err == ""  # rank 1 printed its own traceback


def test_a_broken_environment_is_a_clear_error():
    with pytest.raises(WorkshopError, match="incomplete torchrun environment"):
        read_launch_env({"WORLD_SIZE": "2"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_nccl_without_gpus_is_refused(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(WorkshopError, match="nccl needs CUDA GPUs"):
        distributed.setup("nccl")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_setup_makes_a_gloo_group_of_one(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    env = distributed.setup(timeout=10)
    try:
        assert (env.rank, env.world_size, env.backend, env.device.type, env.is_main) == (0, 1, "gloo", "cpu", True)
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        distributed.teardown()
    assert not dist.is_initialized()
    distributed.teardown()  # a second call is harmless


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_two_ranks_batch_b_equals_one_process_batch_2b(tmp_path):
    """One step of DDP (2 x B) lands on the same parameters as one process with 2B."""
    from tests.workers.ddp_step_worker import one_step

    out = tmp_path / "ddp.pt"
    proc = run_torchrun(REPO / "tests" / "workers" / "ddp_step_worker.py", [str(out)], nproc=2, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = torch.load(out, weights_only=True)
    single = one_step(rank=0, world_size=1)
    assert ddp.keys() == single.keys()
    for name in single:
        assert torch.allclose(ddp[name], single[name], atol=1e-5, rtol=0), name
    start = one_step(rank=0, world_size=1, steps=0)
    assert any(not torch.allclose(start[n], single[n]) for n in single)  # the step did move the weights


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_with_a_gpu_setup_picks_nccl_and_cuda_local_rank(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    env = distributed.setup(timeout=60)
    try:
        assert (env.backend, env.device) == ("nccl", torch.device("cuda", 0))
        assert torch.cuda.current_device() == 0
        t = torch.ones(3, device=env.device)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        distributed.teardown()
