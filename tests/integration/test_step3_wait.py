"""Where the other ranks wait while rank 0 evaluates alone (notebook 03 names the place).

Rank 0's first evaluation is held back; rank 1, once past the epoch's last
collective, records where its main thread stops (tests/workers/step3_wait_worker.py).
Notebook 03 says it waits in the next epoch's first ``loss.backward()`` (DDP's
gradient all-reduce); if the step-3 script changes where the ranks meet, this test
fails, and the sentence in notebook 03 (cell nb03-13) must change with it.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_torchrun


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_while_rank0_evaluates_the_others_wait_in_the_next_backward(tmp_path):
    proc = run_torchrun(REPO / "tests" / "workers" / "step3_wait_worker.py",
                        [tmp_path, "--limit", "400", "--epochs", "2", "--no-tensorboard", "--out", tmp_path / "out"],
                        timeout=150, PYTHONPATH=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    stack = json.loads((tmp_path / "rank1.json").read_text())
    ours = [line for line in stack if line.startswith(("main:", "train_epoch:"))]
    assert ours[-2].startswith("main: totals = train_epoch("), stack[-8:]
    assert ours[-1] == "train_epoch: loss.backward()", stack[-8:]
