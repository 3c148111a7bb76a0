"""The step scripts end to end, as a learner runs them: python for step 0, torchrun with 2 gloo ranks for steps 3-4
(step 4's run is the uninterrupted one that the fault tests compare with: tests.reliability.reference_run).

Steps 1 and 2 run under torchrun in notebooks 01 and 02 (nbval replays them in this suite), and the checker's
test (tests/unit/engine/test_script.py) runs every solution on two ranks and asserts what each rank read, how far
the replicas drifted and what the logged loss covers: a torchrun of them here would measure nothing more. A table
in BBBP's layout (test_data.py::test_bbbp_layout_is_detected) and TensorBoard's event files (the core's Reporter:
test_plots.py::test_the_reporter_writes_each_epoch_to_tensorboard) are the core's, whatever script runs it.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import SOLUTIONS, run_python, run_torchrun
from tests.reliability import STEP4, reference_run
from workshop_lib.config import TrainConfig
from workshop_lib.metrics import REQUIRED

QUICK = ["--limit", "400", "--epochs", "2", "--no-tensorboard"]
TRAIN = 288  # training molecules of --limit 400 (heldout 10%, then dev 20% of the rest)


def check_metrics(out, script, world_size, epochs: int = 2):
    """metrics.json in the folder ``out`` (or the dict itself) holds what every run reports."""
    metrics = out if isinstance(out, dict) else json.loads((out / "metrics.json").read_text())
    assert set(REQUIRED) <= metrics.keys()
    assert metrics["script"] == script
    assert metrics["world_size"] == world_size
    assert metrics["epochs"] == epochs and len(metrics["history"]) == epochs
    assert metrics["global_batch_size"] == metrics["batch_size_per_process"] * world_size
    assert 0.0 <= metrics["dev_roc_auc"] <= 1.0 and 0.0 <= metrics["heldout_roc_auc"] <= 1.0
    assert metrics["best_epoch"] in range(epochs)
    assert metrics["train_seconds"] > 0 and metrics["train_samples_per_second"] > 0
    assert (metrics["backend"], metrics["device"]) == (None if world_size == 1 else "gloo", "cpu")
    return metrics


def molecules_per_epoch(metrics) -> int:
    """The molecules the logged loss covers, per epoch (what rank 0 reported, summed over ranks where all-reduced)."""
    return round(metrics["train_samples_per_second"] * metrics["train_seconds"] / metrics["epochs"])


def every_rank_speaks(stdout: str, world_size: int = 2) -> None:
    for rank in range(world_size):
        assert f"rank {rank} of {world_size} on cpu" in stdout, stdout
    assert stdout.count("metrics:") == 1  # everything else is global rank 0's alone


@pytest.fixture(scope="module")
def step0_twice(tmp_path_factory):
    """Two runs of step 0 with the same arguments: (stdout, out folder) of each."""
    runs = []
    for name in ("a", "b"):
        out = tmp_path_factory.mktemp(f"step0{name}")
        proc = run_python([SOLUTIONS / "step0_baseline.py", *QUICK, "--out", out], timeout=140)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((proc.stdout, out))
    return runs


@pytest.mark.timeout(300)
def test_step0_runs_with_python(step0_twice):
    stdout, out = step0_twice[0]
    assert f"metrics: {out / 'metrics.json'}" in stdout
    m = check_metrics(out, "step0_baseline", 1)
    assert molecules_per_epoch(m) == TRAIN


@pytest.mark.timeout(300)
def test_step0_is_reproducible(step0_twice):
    a, b = (json.loads((out / "metrics.json").read_text()) for _, out in step0_twice)
    assert [h["train_loss"] for h in a["history"]] == [h["train_loss"] for h in b["history"]]
    assert a["heldout_roc_auc"] == b["heldout_roc_auc"]


@pytest.mark.timeout(200)
def test_step3_ddp_keeps_replicas_identical(tmp_path):
    proc = run_torchrun(SOLUTIONS / "step3_ddp.py", [*QUICK, "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    every_rank_speaks(proc.stdout)
    assert f"global batch {TrainConfig().batch_size * 2}" in proc.stdout
    m = check_metrics(tmp_path, "step3_ddp", 2)
    assert molecules_per_epoch(m) == TRAIN
    assert m["replica_spread"] == 0.0 and [row["replica_spread"] for row in m["history"]] == [0.0, 0.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "model.pt"]


@pytest.mark.timeout(300)
def test_step4_writes_its_snapshot():
    """The uninterrupted step-4 run that the fault, multi-node and SLURM tests compare with (run once per session)."""
    run = reference_run(STEP4)
    every_rank_speaks(run["output"])
    m = check_metrics(run["metrics"], "step4_snapshots", 2, epochs=4)
    assert m["replica_spread"] == 0.0
    assert run["files"] == ["metrics.json", "model.pt", "snapshot.pt"]
