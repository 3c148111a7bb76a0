"""workshop_lib.figures.plots: the figures read the right data and label their axes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from workshop_lib.config import TrainConfig
from workshop_lib.errors import WorkshopError
from workshop_lib.figures import plots
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


def test_the_reporter_writes_each_epoch_to_tensorboard(tmp_path, capsys):
    """What a learner opens in TensorBoard: the Reporter's scalars, one per epoch."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = fake_run(tmp_path / "run", [0.7, 0.5, 0.4], [0.6, 0.75, 0.8])
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    read = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert read["loss/train"] == pytest.approx([0.7, 0.5, 0.4])
    assert read["roc_auc/dev"] == pytest.approx([0.6, 0.75, 0.8])
    assert read["throughput/samples_per_second"] == pytest.approx([200.0, 200.0, 200.0])


def test_length_histogram_has_one_bar_per_length_holding_its_molecules():
    lengths = [3, 5, 5, 9, 5, 3]
    ax = plots.length_histogram(lengths).axes[0]
    heights = [round(bar.get_height()) for bar in ax.patches]
    starts = [round(bar.get_x()) for bar in ax.patches]
    assert starts == list(range(3, 10))  # one bar per token count, from the shortest to the longest
    assert heights == [2, 0, 3, 0, 0, 0, 1]  # the molecules of each length
    assert sum(heights) == len(lengths) and ax.get_xlabel() == "tokens per molecule"
    with pytest.raises(WorkshopError, match="at least one molecule"):
        plots.length_histogram([])


def test_training_curves_draw_what_the_reporter_wrote(tmp_path, capsys):
    out = fake_run(tmp_path / "run", [0.7, 0.5, 0.4], [0.6, 0.75, 0.8])
    ax_loss, ax_auc = plots.training_curves(out).axes
    (loss,), (auc,) = ax_loss.get_lines(), ax_auc.get_lines()
    assert list(loss.get_xdata()) == list(auc.get_xdata()) == [1, 2, 3]  # epochs counted from 1, as on the console
    assert list(loss.get_ydata()) == pytest.approx([0.7, 0.5, 0.4])
    assert list(auc.get_ydata()) == pytest.approx([0.6, 0.75, 0.8])
    assert "loss" in ax_loss.get_ylabel() and "ROC AUC" in ax_auc.get_ylabel()
    assert list(plots.training_curves(out / "metrics.json").axes[0].get_lines()[0].get_ydata()) == \
        pytest.approx([0.7, 0.5, 0.4])  # the file itself works too


def test_training_curves_name_a_run_that_did_not_finish(tmp_path):
    with pytest.raises(WorkshopError, match="run the training cell"):
        plots.training_curves(tmp_path)


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


def test_shard_picture_rejects_an_index_outside_the_dataset():
    with pytest.raises(WorkshopError, match=r"outside 0\.\.3"):
        plots.shard_picture([[[0, 4]]], 4)


def _marks(fig, gid: str) -> list[tuple[float, float, float]]:
    """(x, y, height) of the patches that shard_picture drew with ``gid``: cells outlined or hatched."""
    return sorted((p.get_x(), p.get_y(), p.get_height()) for p in fig.axes[0].patches if p.get_gid() == gid)


def test_shard_picture_marks_the_padded_repeats_and_the_indices_no_rank_reads():
    """10 molecules on 4 ranks: padding reads 2 of them twice; drop_last=True reads 8 and drops 2."""
    padded = [list(DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=True, seed=0)) for r in range(4)]
    dropped = [list(DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=True, seed=0, drop_last=True))
               for r in range(4)]
    fig = plots.shard_picture([padded, dropped], 10, blocks=["drop_last=False", "drop_last=True"])
    order = list(range(10))  # the sampler's list, padded with its own first 2: rank r reads positions r, r + 4, ...
    flat = [padded[pos % 4][pos // 4] for pos in range(12)]
    assert sorted(flat[:10]) == order and flat[10:] == flat[:2]  # so the repeats are the last 2 reads
    assert _marks(fig, "repeat") == sorted((flat[pos] - 0.5, pos % 4 - 0.5, 1) for pos in (10, 11))
    lost = sorted(set(order) - {i for shard in dropped for i in shard})
    assert len(lost) == 2 and _marks(fig, "dropped") == [(i - 0.5, 4 - 0.5, 4) for i in lost]  # the second block
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["padded repeat (2)", "read by no rank (2)"]
    assert [t.get_text() for t in ax.get_yticklabels()][3:5] == ["drop_last=False, rank 3", "drop_last=True, rank 0"]
    with pytest.raises(WorkshopError, match="name each block once"):
        plots.shard_picture([padded], 10, blocks=["a", "b"])


def test_shard_picture_marks_nothing_where_the_ranks_divide_the_data():
    fig = plots.shard_picture(_sampler_orders(12, 2, 2, set_epoch=True), 12)
    assert not _marks(fig, "repeat") and not _marks(fig, "dropped") and fig.axes[0].get_legend() is None


def test_speedup_bars_draws_each_epoch_and_the_median_ratio():
    runs = {name: {"history": [{"samples_per_second": 1.0}, *({"samples_per_second": v} for v in values)]}
            for name, values in (("1x1", [100.0, 110.0, 90.0]), ("1x2", [150.0, 150.0, 160.0]),
                                 ("2x1", [200.0, 190.0, 230.0]))}
    ax = plots.speedup_bars(runs).axes[0]
    assert [round(p.get_height()) for p in ax.patches] == [100, 150, 200]  # the medians, the first epoch left out
    assert sorted(t.get_text() for t in ax.texts) == ["x1.00", "x1.50", "x2.00"]
    with pytest.raises(WorkshopError, match="2 epochs or more"):
        plots.speedup_bars({"1x1": {"history": [{"samples_per_second": 1.0}]}})
