"""The step scripts end to end, as a learner runs them: python for step 0, torchrun with 2 gloo ranks for steps 1-4."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SOLUTIONS, run_python, run_torchrun
from workshop_lib.config import TrainConfig
from workshop_lib.metrics import REQUIRED

QUICK = ["--limit", "400", "--epochs", "2", "--no-tensorboard"]
TRAIN = 288  # training molecules of --limit 400 (heldout 10%, then dev 20% of the rest)


def check_metrics(out, script, world_size):
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(REQUIRED) <= metrics.keys()
    assert metrics["script"] == script
    assert metrics["world_size"] == world_size
    assert metrics["epochs"] == 2 and len(metrics["history"]) == 2
    assert metrics["global_batch_size"] == metrics["batch_size_per_process"] * world_size
    assert 0.0 <= metrics["dev_roc_auc"] <= 1.0 and 0.0 <= metrics["heldout_roc_auc"] <= 1.0
    assert metrics["best_epoch"] in (0, 1)
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


@pytest.mark.timeout(150)
def test_step0_runs_with_python(tmp_path):
    proc = run_python([SOLUTIONS / "step0_baseline.py", *QUICK, "--out", tmp_path], timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"metrics: {tmp_path / 'metrics.json'}" in proc.stdout
    m = check_metrics(tmp_path, "step0_baseline", 1)
    assert molecules_per_epoch(m) == TRAIN


@pytest.mark.timeout(150)
def test_step0_is_reproducible(tmp_path):
    runs = []
    for name in ("a", "b"):
        proc = run_python([SOLUTIONS / "step0_baseline.py", *QUICK, "--epochs", "1", "--out", tmp_path / name])
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads((tmp_path / name / "metrics.json").read_text()))
    assert runs[0]["history"][0]["train_loss"] == runs[1]["history"][0]["train_loss"]
    assert runs[0]["heldout_roc_auc"] == runs[1]["heldout_roc_auc"]


@pytest.mark.timeout(200)
def test_step1_every_rank_trains_everything(tmp_path):
    proc = run_torchrun(SOLUTIONS / "step1_process_group.py", [*QUICK, "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    every_rank_speaks(proc.stdout)  # and check_all_reduce asserted 1 + 2 on each
    m = check_metrics(tmp_path, "step1_process_group", 2)
    assert molecules_per_epoch(m) == TRAIN  # rank 0's own: the whole split, as every rank


@pytest.mark.timeout(200)
def test_step2_shards_the_data_and_replicas_drift(tmp_path):
    proc = run_torchrun(SOLUTIONS / "step2_sampler.py", [*QUICK, "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    every_rank_speaks(proc.stdout)
    m = check_metrics(tmp_path, "step2_sampler", 2)
    assert molecules_per_epoch(m) == TRAIN  # summed over 2 ranks: 144 each, the split once, not twice
    assert m["replica_spread"] > 1e-3  # without DDP the two models disagree
    assert all(row["replica_spread"] > 0 for row in m["history"])


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


@pytest.mark.timeout(200)
def test_step4_writes_its_snapshot(tmp_path):
    proc = run_torchrun(SOLUTIONS / "step4_snapshots.py", [*QUICK, "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    every_rank_speaks(proc.stdout)
    m = check_metrics(tmp_path, "step4_snapshots", 2)
    assert m["replica_spread"] == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "model.pt", "snapshot.pt"]


@pytest.mark.timeout(150)
def test_step0_accepts_bbbp_layout_and_writes_tensorboard(tmp_path, small_csv):
    proc = run_python([SOLUTIONS / "step0_baseline.py", "--data", small_csv, "--epochs", "2", "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[smiles -> p_np]" in proc.stdout
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
