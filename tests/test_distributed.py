"""DistEnv from torchrun's environment, a world of one, and DDP's gradient equivalence."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workshop_lib import distributed
from workshop_lib.distributed import read_launch_env
from workshop_lib.errors import WorkshopError

from .conftest import REPO, run_torchrun


def test_plain_python_is_a_world_of_one():
    env = read_launch_env({})
    assert (env.rank, env.local_rank, env.world_size, env.under_torchrun) == (0, 0, 1, False)


def test_torchrun_variables_are_read():
    env = read_launch_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                           "MASTER_ADDR": "node0", "MASTER_PORT": "29400", "TORCHELASTIC_RESTART_COUNT": "1",
                           "TORCHELASTIC_RUN_ID": "x", "OMP_NUM_THREADS": "1"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.master_addr, env.master_port, env.restart_count, env.omp_threads) == ("node0", 29400, 1, 1)


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


@pytest.mark.timeout(120)
def test_ddp_two_ranks_batch_b_equals_one_process_batch_2b(tmp_path):
    """One step of DDP (2 x B) lands on the same parameters as one process with 2B."""
    from tests.ddp_step_worker import one_step

    out = tmp_path / "ddp.pt"
    proc = run_torchrun(REPO / "tests" / "ddp_step_worker.py", [str(out)], nproc=2, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = torch.load(out, weights_only=True)
    single = one_step(rank=0, world_size=1)
    assert ddp.keys() == single.keys()
    for name in single:
        assert torch.allclose(ddp[name], single[name], atol=1e-5, rtol=0), name
    start = one_step(rank=0, world_size=1, steps=0)
    assert any(not torch.allclose(start[n], single[n]) for n in single)  # the step did move the weights
