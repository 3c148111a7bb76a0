"""The Reporter that global rank 0 alone builds: its header, one line per epoch, metrics.json, its state for resume."""

from __future__ import annotations

import json

import pytest
import torch

from workshop_lib.config import TrainConfig
from workshop_lib.data import load_splits
from workshop_lib.errors import InputError
from workshop_lib.metrics import REQUIRED, BestModel
from workshop_lib.model import SmilesLSTM
from workshop_lib.report import Reporter


@pytest.fixture(scope="module")
def splits():
    return load_splits(TrainConfig(limit=200))


def reporter(tmp_path, splits, world_size=2, **cfg) -> tuple[Reporter, SmilesLSTM]:
    config = TrainConfig(limit=200, epochs=2, out=tmp_path / "out", tensorboard=False, **cfg)
    model = SmilesLSTM(len(splits.tokenizer), 8, 8)
    return Reporter(config, "step3_ddp", splits, model, world_size), model


def test_the_header_comes_at_once_and_out_is_created(tmp_path, splits, capsys):
    reporter(tmp_path, splits)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("data: ") and out[0].endswith(f"{len(splits.train)} train / {len(splits.dev)} dev / "
                                                           f"{len(splits.heldout)} heldout molecules")
    assert out[1].endswith("batch 64 per process x 2 processes, each training its own copy of the model")  # step 2
    assert (tmp_path / "out").is_dir() and list((tmp_path / "out").iterdir()) == []  # the write test left nothing


@pytest.mark.timeout(30)
def test_the_header_names_a_global_batch_only_once_ddp_wraps_the_model(tmp_path, splits, capsys):
    """Steps 1 and 2 print each process's batch; the global batch appears with DDP (step 3), and one process's alone."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    config = TrainConfig(limit=200, epochs=2, out=tmp_path / "out", tensorboard=False)
    model = SmilesLSTM(len(splits.tokenizer), 8, 8)
    Reporter(config, "step0_baseline", splits, model)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10))
    try:
        Reporter(config, "step3_ddp", splits, DDP(model), world_size=2)  # the line reads the wrapper, not the group
    finally:
        dist.destroy_process_group()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("model: ")]
    assert [line.split("; ", 1)[1] for line in lines] == [
        "batch 64", "batch 64 per process x 2 processes (global batch 128: DDP averages their gradients)"]


def test_epochs_and_finish_write_metrics_json(tmp_path, splits, capsys):
    report, model = reporter(tmp_path, splits)
    best = BestModel()
    for epoch, auc in ((0, 0.6), (1, 0.7)):
        best.update(epoch, auc, model)
        report.epoch(epoch, loss=0.5, samples=200, seconds=0.5, dev_roc_auc=auc, replica_spread=0.0)
    assert "epoch 2/2  train loss 0.5000  dev ROC AUC 0.7000  0.5s  400 samples/s  replica_spread 0" in \
        capsys.readouterr().out
    metrics = report.finish(best, 0.8, replica_spread=0.0)
    assert metrics == json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert set(REQUIRED) <= metrics.keys()
    assert (metrics["world_size"], metrics["global_batch_size"], metrics["best_epoch"]) == (2, 128, 1)
    assert metrics["backend"] is None  # no process group here; under torchrun the group's backend
    assert metrics["train_samples_per_second"] == pytest.approx(400.0)
    assert [h["epoch"] for h in metrics["history"]] == [0, 1] and metrics["replica_spread"] == 0.0


def test_its_state_carries_the_history_into_a_resumed_run(tmp_path, splits):
    report, _ = reporter(tmp_path, splits)
    report.epoch(0, loss=0.5, samples=100, seconds=1.0, dev_roc_auc=0.6)
    resumed, _ = reporter(tmp_path, splits)
    resumed.load_state_dict(report.state_dict())
    assert resumed.history == report.history and resumed.train_samples == 100


def test_an_unwritable_out_is_one_line(tmp_path, splits):
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match=r"cannot write to --out .*file/sub \(.*\); choose a writable directory"):
        Reporter(TrainConfig(out=tmp_path / "file" / "sub"), "step0_baseline", splits, torch.nn.Linear(1, 1))
