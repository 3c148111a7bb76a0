"""Training helpers: the ROC AUC that replaces scikit-learn's, and the fused optimizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workshop_lib.config import TrainConfig
from workshop_lib.train import build_optimizer, roc_auc


@pytest.mark.parametrize("ties", [False, True])
def test_roc_auc_equals_scikit_learns(ties):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(int(ties))
    for n in (2, 9, 781):
        labels = rng.integers(0, 2, n)
        labels[:2] = [0, 1]
        scores = rng.random(n).astype(np.float32)
        if ties:
            scores = np.round(scores, 1)
        assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_roc_auc_extremes_and_one_class():
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.9, 0.8, 0.2, 0.1])) == 0.0
    assert roc_auc(np.array([0, 1, 0, 1]), np.full(4, 0.5)) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(np.ones(3), np.arange(3.0))


def test_fused_adamw_steps_like_the_plain_one():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    fused = build_optimizer(TrainConfig(), a)
    plain = torch.optim.AdamW(b.parameters(), lr=TrainConfig().lr, weight_decay=TrainConfig().weight_decay)
    assert fused.defaults["fused"] or torch.__version__ < (2, 4)
    x = torch.randn(8, 5)
    for model, opt in ((a, fused), (b, plain)):
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
