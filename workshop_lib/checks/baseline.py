"""The exercise check of notebook 00 (the baseline): the training loop keeps the best epoch."""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from workshop_lib.checks.common import CheckFailed, _call, _passed
from workshop_lib.config import TrainConfig


def train_loop(train: Callable, epochs: int = 2) -> None:
    """Run ``train(cfg, device)`` on 300 molecules for ``epochs`` epochs and check what it recorded."""
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(limit=300, epochs=epochs, out=Path(out), progress=False, tensorboard=False)
        quiet = io.StringIO()
        try:
            with contextlib.redirect_stdout(quiet):
                metrics = _call(train, "train", cfg, torch.device("cpu"))
        except AssertionError as err:
            if "no epoch was evaluated" in str(err):
                raise CheckFailed("no epoch was kept as best: call best.update(epoch, dev_auc, model) "
                                  "after evaluating each epoch") from None
            raise
    if not isinstance(metrics, dict):
        raise CheckFailed(f"train returned {metrics!r}, not the metrics: keep `return report.finish(best, heldout_auc)`")
    history = metrics["history"]
    if len(history) != epochs:
        raise CheckFailed(f"{len(history)} epochs were reported for cfg.epochs={epochs}: train, evaluate and "
                          f"call report.epoch once per epoch, inside the loop")
    aucs = [row["dev_roc_auc"] for row in history]
    if len(set(aucs)) == 1 and epochs > 1 and history[0]["train_loss"] == history[-1]["train_loss"]:
        raise CheckFailed("every epoch has the same loss and dev ROC AUC: call train_epoch(...) each epoch")
    best = max(range(epochs), key=lambda e: (aucs[e], -e))
    if metrics["best_epoch"] != best:
        raise CheckFailed(f"the best dev ROC AUC was in epoch {best + 1}, but epoch {metrics['best_epoch'] + 1} was "
                          f"kept: call best.update(epoch, dev_auc, model) every epoch")
    _passed(f"train ran {epochs} epochs, reported each, and kept the best (epoch {best + 1})")


