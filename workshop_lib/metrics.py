"""How good the model is: ROC AUC, evaluation on a loader, the best epoch's weights, metrics.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from workshop_lib.paths import write_atomic

REQUIRED = ("script", "world_size", "backend", "device", "epochs", "global_batch_size", "best_epoch",
            "dev_roc_auc", "heldout_roc_auc", "train_seconds", "train_samples_per_second")


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a random positive outscores a random negative.

    Computed from ranks (Mann-Whitney U; ties count one half), which equals
    scikit-learn's ``roc_auc_score`` for 0/1 labels without importing it: scikit-learn
    costs every rank up to a second of startup (workshop_lib/split.py), so it is not a
    dependency; tests/unit/core/test_metrics.py compares the two (the dev extra).
    """
    labels, scores = np.asarray(labels), np.asarray(scores, dtype=np.float64)
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC AUC needs both classes among the labels")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based, tied scores share their mean rank
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@torch.no_grad()
def predict(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and labels for every molecule in ``loader``."""
    model.eval()
    probs, labels = [], []
    for tokens, lengths, batch_labels in loader:
        probs.append(torch.sigmoid(model(tokens.to(device), lengths)))
        labels.append(batch_labels)
    return torch.cat(probs).cpu().numpy(), torch.cat(labels).numpy()


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """ROC AUC of ``model`` on every molecule of ``loader``. Under DDP pass ``model.module``, not the wrapper."""
    probs, labels = predict(model, loader, device)
    return roc_auc(labels, probs)


class BestModel:
    """Keeps a copy of the weights with the best dev ROC AUC seen so far."""

    def __init__(self) -> None:
        self.epoch, self.roc_auc, self.state = -1, float("-inf"), None

    def update(self, epoch: int, roc_auc: float, model: nn.Module) -> bool:
        if roc_auc <= self.roc_auc:
            return False
        self.epoch, self.roc_auc = epoch, roc_auc
        self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return True

    def restore(self, model: nn.Module) -> None:
        assert self.state is not None, "no epoch was evaluated"
        model.load_state_dict(copy.deepcopy(self.state))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "roc_auc": self.roc_auc, "state": self.state}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.roc_auc, self.state = state["epoch"], state["roc_auc"], state["state"]


def write_metrics(path: Path, metrics: dict) -> Path:
    """metrics.json, written atomically (global rank 0 only): a run's last act."""
    missing = [k for k in REQUIRED if k not in metrics]
    assert not missing, f"metrics lack {missing}"
    write_atomic(path, (json.dumps(metrics, indent=2, sort_keys=True) + "\n").encode())
    return Path(path)


def read_metrics(path: Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.json"
    return json.loads(path.read_text())


def logged_samples(row: dict) -> int:
    """The molecules an epoch's row of metrics.json logged (its rate times its seconds): every rank's, if summed."""
    return round(row["samples_per_second"] * row["seconds"])
