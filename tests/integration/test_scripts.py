"""The step scripts end to end: python for step 0, torchrun with 2 gloo ranks for steps 1-3."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SOLUTIONS, run_python, run_torchrun
from workshop_lib.config import TrainConfig
from workshop_lib.metrics import REQUIRED

QUICK = ["--limit", "400", "--epochs", "2", "--no-progress", "--no-tensorboard"]


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
    return metrics


@pytest.mark.timeout(150)
def test_step0_runs_with_python(tmp_path):
    proc = run_python([SOLUTIONS / "step0_baseline.py", *QUICK, "--out", tmp_path], timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"metrics: {tmp_path / 'metrics.json'}" in proc.stdout
    m = check_metrics(tmp_path, "step0_baseline", 1)
    assert m["backend"] is None and m["device"] == "cpu"


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
def test_step1_every_rank_reports_and_all_reduce_checks(tmp_path):
    proc = run_torchrun(SOLUTIONS / "step1_process_group.py", [*QUICK, "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"hello from rank {rank}/2" in proc.stdout
    assert "backend=gloo device=cpu threads=1" in proc.stdout
    assert "all_reduce: sum of (rank + 1) over 2 ranks = 3 (expected 3)" in proc.stdout
    check_metrics(tmp_path, "step1_process_group", 2)


@pytest.mark.timeout(200)
def test_step2_shards_the_data_and_replicas_drift(tmp_path):
    proc = run_torchrun(SOLUTIONS / "step2_sampler.py", [*QUICK, "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0: 144 of 288 training molecules per epoch" in proc.stdout
    assert "rank 1: 144 of 288 training molecules per epoch" in proc.stdout
    m = check_metrics(tmp_path, "step2_sampler", 2)
    assert m["replica_spread"] > 1e-3  # without DDP the two models disagree


@pytest.mark.timeout(200)
def test_step3_ddp_keeps_replicas_identical(tmp_path):
    proc = run_torchrun(SOLUTIONS / "step3_ddp.py", [*QUICK, "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"global batch {TrainConfig().batch_size * 2}" in proc.stdout
    m = check_metrics(tmp_path, "step3_ddp", 2)
    assert m["replica_spread"] == 0.0
    assert m["backend"] == "gloo"
    assert proc.stdout.count("metrics:") == 1  # only global rank 0 reports


@pytest.mark.timeout(150)
def test_step3_runs_as_a_world_of_one_under_python(tmp_path):
    proc = run_python([SOLUTIONS / "step3_ddp.py", *QUICK, "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = check_metrics(tmp_path, "step3_ddp", 1)
    assert m["replica_spread"] == 0.0


@pytest.mark.timeout(150)
def test_step0_accepts_bbbp_layout_and_writes_tensorboard(tmp_path, small_csv):
    proc = run_python([SOLUTIONS / "step0_baseline.py", "--data", small_csv, "--epochs", "2", "--no-progress",
                       "--out", tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[smiles -> p_np]" in proc.stdout
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
