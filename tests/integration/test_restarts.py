"""torchrun --max-restarts with gloo on torch 2.13: the workaround that step 4's launch command carries.

tests/workers/restart_repro.py is the bug in a few lines: env:// init, an all_reduce
loop, rank 1 SIGKILLs itself once. Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the
restarted round fails only sometimes (measured: docs/reference/restarts.md), so no test
can assert the failure; with it, every restart must be clean, and this test says so. Two more restarts
with it run in every suite: test_faults' SIGKILL in epoch 2 and test_slurm's killed rank, both on step 4.
"""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.reliability import RESTARTS, stop, torchrun

REPRO = REPO / "tests" / "workers" / "restart_repro.py"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_with_the_variable_a_restarted_group_joins_afresh():
    run = torchrun(["--max-restarts=1", REPRO, "30"], **RESTARTS)
    try:
        rc = run.wait(timeout=90)  # a restart that hangs would stop here, well before its own 30 s x 2
    finally:
        stop(run)
    assert rc == 0, run.output[-3000:]
    assert run.output.count("round 1 clean") == 2, run.output[-3000:]  # both ranks, in the restarted round
    assert "Connection refused" not in run.output
