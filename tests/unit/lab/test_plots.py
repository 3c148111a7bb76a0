"""workshop_lib.lab.plots: the figures read the right data and label their axes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from workshop_lib.config import TrainConfig
from workshop_lib.errors import WorkshopError
from workshop_lib.lab import plots
from workshop_lib.metrics import BestModel
from workshop_lib.report import Reporter

matplotlib.use("Agg")


def fake_run(out: Path, losses: list[float], aucs: list[float], world_size: int = 1) -> Path:
    """Event files and metrics.json written by the real Reporter, with known numbers."""
    cfg = TrainConfig(out=out, epochs=len(losses))
    splits = SimpleNamespace(train=[0] * 8, dev=[0] * 2, heldout=[0] * 2, source="tiny.csv")  # what the header reads
    report = Reporter(cfg, "test", splits, torch.nn.Linear(2, 1), world_size)
    best = BestModel()
    for epoch, (loss, auc) in enumerate(zip(losses, aucs, strict=True)):
        report.epoch(epoch, loss, 100 * world_size, 0.5, auc)  # 100 molecules per rank, summed over the ranks
        best.epoch, best.roc_auc = (epoch, auc) if auc > best.roc_auc else (best.epoch, best.roc_auc)
    report.finish(best, heldout_roc_auc=0.5)
    return out


def test_read_scalars_returns_every_epoch_of_the_reporter(tmp_path, capsys):
    out = fake_run(tmp_path / "run", [0.7, 0.5, 0.4], [0.6, 0.75, 0.8])
    scalars = plots.read_scalars(out)
    assert scalars[plots.LOSS_TAG] == pytest.approx({0: 0.7, 1: 0.5, 2: 0.4})
    assert scalars[plots.AUC_TAG] == pytest.approx({0: 0.6, 1: 0.75, 2: 0.8})
    assert scalars[plots.THROUGHPUT_TAG] == pytest.approx({0: 200.0, 1: 200.0, 2: 200.0})
    assert plots.read_scalars(out / "tensorboard").keys() == scalars.keys()  # the tensorboard folder works too


def test_training_curves_overlays_runs_with_labelled_axes(tmp_path, capsys):
    one = fake_run(tmp_path / "one", [0.7, 0.5], [0.6, 0.7], world_size=1)
    two = fake_run(tmp_path / "two", [0.69, 0.55], [0.62, 0.66], world_size=2)
    fig = plots.training_curves(one, two)
    ax_loss, ax_auc = fig.axes
    assert ax_loss.get_xlabel() == "epoch" and "loss" in ax_loss.get_ylabel()
    assert ax_auc.get_xlabel() == "epoch" and "ROC AUC" in ax_auc.get_ylabel()
    assert [line.get_label() for line in ax_loss.get_lines()] == ["1 process (one)", "2 processes (two)"]
    first, second = ax_loss.get_lines()
    assert list(first.get_xdata()) == [1, 2]  # epochs counted from 1, as on the console
    assert list(second.get_ydata()) == pytest.approx([0.69, 0.55])
    assert list(ax_auc.get_lines()[0].get_ydata()) == pytest.approx([0.6, 0.7])
    fig.savefig(tmp_path / "curves.png")  # renders without error

    labelled = plots.training_curves([one], labels=["baseline"])
    assert [line.get_label() for line in labelled.axes[0].get_lines()] == ["baseline"]

    capsys.readouterr()
    partial = plots.training_curves(tmp_path / "not-run-yet", two, labels=["step 1", "step 2"])
    assert [line.get_label() for line in partial.axes[0].get_lines()] == ["step 2"]
    assert "no curves from" in capsys.readouterr().out


def test_training_curves_explains_a_missing_run(tmp_path):
    with pytest.raises(WorkshopError, match="no TensorBoard event files"):
        plots.training_curves(tmp_path)
    with pytest.raises(WorkshopError, match=r"none of .* holds TensorBoard event files"):
        plots.training_curves(tmp_path / "a", tmp_path / "b")
    with pytest.raises(WorkshopError, match="one label per run"):
        plots.training_curves(tmp_path, tmp_path, labels=["a"])


def _sampler_orders(n: int, world_size: int, epochs: int, set_epoch: bool) -> list[list[list[int]]]:
    orders = []
    for epoch in range(epochs):
        row = []
        for rank in range(world_size):
            sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=0)
            if set_epoch:
                sampler.set_epoch(epoch)
            row.append(list(sampler))
        orders.append(row)
    return orders


def test_shard_picture_colours_each_index_by_its_position():
    n = 10
    orders = _sampler_orders(n, world_size=2, epochs=2, set_epoch=True)
    fig = plots.shard_picture(orders, n, title="with set_epoch")
    ax = fig.axes[0]
    grid = np.ma.filled(ax.images[0].get_array(), np.nan)  # (epochs*ranks, n)
    assert grid.shape == (4, n)
    for e in range(2):
        for r in range(2):
            shard = orders[e][r]
            row = grid[e * 2 + r]
            assert [row[i] for i in shard] == list(range(len(shard)))
            assert np.isnan(row[[i for i in range(n) if i not in shard]]).all()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["epoch 0, rank 0", "epoch 0, rank 1",
                                                            "epoch 1, rank 0", "epoch 1, rank 1"]
    assert ax.get_title() == "with set_epoch" and "dataset index" in ax.get_xlabel()
    assert any("order" in a.get_ylabel() for a in fig.axes[1:])  # the colour bar says what colour means


def test_shard_picture_shows_the_same_rows_without_set_epoch():
    n = 12
    without = np.ma.filled(plots.shard_picture(_sampler_orders(n, 2, 2, set_epoch=False), n).axes[0].images[0].get_array(),
                           np.nan)
    with_ = np.ma.filled(plots.shard_picture(_sampler_orders(n, 2, 2, set_epoch=True), n).axes[0].images[0].get_array(),
                         np.nan)
    np.testing.assert_array_equal(without[:2], without[2:])  # epoch 1 repeats epoch 0
    assert not np.array_equal(with_[:2], with_[2:], equal_nan=True)


def test_shard_picture_accepts_a_mapping_and_rejects_bad_indices():
    fig = plots.shard_picture({(0, 0): [2, 0], (0, 1): [1, 3]}, 4)
    grid = np.ma.filled(fig.axes[0].images[0].get_array(), np.nan)
    np.testing.assert_array_equal(grid, [[1, np.nan, 0, np.nan], [np.nan, 0, np.nan, 1]])
    with pytest.raises(WorkshopError, match=r"outside 0\.\.3"):
        plots.shard_picture([[[0, 4]]], 4)


def test_speedup_plot_draws_measured_and_ideal_lines():
    metrics = [{"world_size": 2, "train_samples_per_second": 300.0},
               {"world_size": 1, "train_samples_per_second": 200.0}]
    ax = plots.speedup_plot(metrics).axes[0]
    ideal, measured = ax.get_lines()
    assert list(measured.get_xdata()) == [1, 2] and list(measured.get_ydata()) == [200.0, 300.0]
    assert list(ideal.get_ydata()) == [200.0, 400.0]
    assert measured.get_label() == "measured" and ideal.get_label().startswith("ideal")
    assert "processes" in ax.get_xlabel() and "samples" in ax.get_ylabel()
    assert sorted(t.get_text() for t in ax.texts) == ["x1.00", "x1.50"]

    from_mapping = plots.speedup_plot({1: 100.0, 2: 180.0, 4: 300.0}).axes[0]
    assert list(from_mapping.get_lines()[0].get_ydata()) == [100.0, 200.0, 400.0]
    with pytest.raises(WorkshopError, match="world_size"):
        plots.speedup_plot([{"samples": 1}])


def test_speedup_plot_reads_real_metrics_files(tmp_path, capsys):
    runs = [fake_run(tmp_path / f"p{n}", [0.5], [0.7], world_size=n) for n in (1, 2)]
    metrics = [json.loads((r / "metrics.json").read_text()) for r in runs]
    ax = plots.speedup_plot(metrics).axes[0]
    assert list(ax.get_lines()[1].get_ydata()) == pytest.approx([200.0, 400.0])  # 100 samples x world size / 0.5 s


def test_speedup_bars_draws_each_epoch_and_the_median_ratio():
    runs = {name: {"history": [{"samples_per_second": 1.0}, *({"samples_per_second": v} for v in values)]}
            for name, values in (("1x1", [100.0, 110.0, 90.0]), ("1x2", [150.0, 150.0, 160.0]),
                                 ("2x1", [200.0, 190.0, 230.0]))}
    ax = plots.speedup_bars(runs).axes[0]
    assert [round(p.get_height()) for p in ax.patches] == [100, 150, 200]  # the medians, the first epoch left out
    assert sorted(t.get_text() for t in ax.texts) == ["x1.00", "x1.50", "x2.00"]
    with pytest.raises(WorkshopError, match="2 epochs or more"):
        plots.speedup_bars({"1x1": {"history": [{"samples_per_second": 1.0}]}})
