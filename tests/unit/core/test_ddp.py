"""DDP's promise, measured on the workshop's model: 2 ranks x batch B take the step of 1 process x batch 2B."""

from __future__ import annotations

import pytest
import torch

from tests.workers.ddp_step_worker import one_step
from workshop_lib.launching import forklaunch


def _ddp_step(env) -> dict[str, torch.Tensor]:
    return one_step(env.rank, env.world_size, ddp=True)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_two_ranks_batch_b_equals_one_process_batch_2b():
    """On 2 forked ranks in a gloo group (what DDP does, whoever started the ranks; torchrun's start is tested where
    it is the point: test_scripts.py, test_faults.py, test_launch.py)."""
    ddp = forklaunch.notebook_launch(_ddp_step, 2, timeout=100)
    single = one_step(rank=0, world_size=1)
    for rank in (0, 1):  # every replica took the same step
        assert ddp[rank].keys() == single.keys()
        for name in single:
            assert torch.allclose(ddp[rank][name], single[name], atol=1e-5, rtol=0), (rank, name)
    start = one_step(rank=0, world_size=1, steps=0)
    assert any(not torch.allclose(start[n], single[n]) for n in single)  # the step did move the weights
