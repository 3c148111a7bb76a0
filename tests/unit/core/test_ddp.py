"""DDP's promise, measured on the workshop's model: 2 ranks x batch B take the step of 1 process x batch 2B."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import REPO, run_torchrun


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_two_ranks_batch_b_equals_one_process_batch_2b(tmp_path):
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
