"""One epoch of training, evaluation by ROC AUC, and best-model keeping.

The step scripts own the epoch loop (it is what each step teaches); these are
the pieces it calls. Nothing here syncs host and device per step: the loss is
summed on the device and read once per epoch.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn
from torch.utils.data import DataLoader

from workshop_lib.config import TrainConfig
from workshop_lib.model import SmilesLSTM


@dataclass(frozen=True)
class EpochStats:
    loss: float  # mean training loss over this process's batches
    samples: int  # molecules this process trained on
    steps: int  # optimizer steps
    seconds: float  # wall time of the epoch on this process


def build_model(cfg: TrainConfig, vocab_size: int) -> SmilesLSTM:
    return SmilesLSTM(vocab_size, cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout)


def build_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def train_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer,
                device: torch.device, progress=None) -> EpochStats:
    """One pass over ``loader``. Works the same for a plain module and a DDP-wrapped one."""
    model.train()
    start = time.perf_counter()
    total = torch.zeros((), device=device)
    samples = steps = 0
    for batch in loader:
        batch = batch.to(device)
        logits = model(batch.tokens, batch.lengths)  # (B,)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # under DDP, this also averages the gradients across ranks
        optimizer.step()
        total += loss.detach() * len(batch.labels)
        samples += len(batch.labels)
        steps += 1
        if progress is not None:
            progress.update(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    mean = (total / max(samples, 1)).item()  # the epoch's one host sync
    return EpochStats(mean, samples, steps, time.perf_counter() - start)


@torch.no_grad()
def predict(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and labels for every molecule in ``loader``."""
    model.eval()
    probs, labels = [], []
    for batch in loader:
        batch = batch.to(device)
        probs.append(torch.sigmoid(model(batch.tokens, batch.lengths)))
        labels.append(batch.labels)
    return torch.cat(probs).cpu().numpy(), torch.cat(labels).cpu().numpy()


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """ROC AUC of ``model`` on ``loader``. Pass the unwrapped module, not the DDP wrapper."""
    probs, labels = predict(model, loader, device)
    return float(roc_auc_score(labels, probs))


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
