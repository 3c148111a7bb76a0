"""metrics.py: the ROC AUC that replaces scikit-learn's, evaluation on a loader, the best epoch's weights, metrics.json."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from workshop_lib.config import TrainConfig
from workshop_lib.data import collate, load_splits
from workshop_lib.metrics import REQUIRED, BestModel, evaluate, predict, read_metrics, roc_auc, write_metrics
from workshop_lib.model import SmilesLSTM


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


@pytest.fixture(scope="module")
def dev():
    splits = load_splits(TrainConfig(limit=300))
    return splits, DataLoader(splits.dev, batch_size=16, collate_fn=collate)


def test_evaluate_scores_every_molecule_of_the_loader_in_eval_mode(dev):
    splits, loader = dev
    torch.manual_seed(0)
    model = SmilesLSTM(len(splits.tokenizer), 8, 8, 1, dropout=0.5)  # dropout: eval mode must turn it off
    probs, labels = predict(model, loader, torch.device("cpu"))
    assert not model.training and probs.shape == labels.shape == (len(splits.dev),)
    assert np.array_equal(labels, splits.dev.labels.numpy())
    assert evaluate(model, loader, torch.device("cpu")) == roc_auc(labels, probs)
    assert np.array_equal(predict(model, DataLoader(splits.dev, batch_size=5, collate_fn=collate),
                                  torch.device("cpu"))[1], labels)


def test_best_model_keeps_a_copy_of_the_best_epochs_weights():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    best = BestModel()
    assert best.update(0, 0.7, model)
    kept = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on ...
    assert not best.update(1, 0.6, model) and best.epoch == 0  # ... a worse epoch changes nothing
    best.restore(model)
    assert torch.equal(model.weight, kept)
    again = BestModel()
    again.load_state_dict(best.state_dict())  # what a snapshot carries
    assert (again.epoch, again.roc_auc) == (0, 0.7) and torch.equal(again.state["weight"], kept)


def test_metrics_json_needs_every_field_and_reads_back(tmp_path):
    metrics = {k: 1 for k in REQUIRED}
    write_metrics(tmp_path / "metrics.json", metrics)
    assert read_metrics(tmp_path) == metrics == read_metrics(tmp_path / "metrics.json")
    with pytest.raises(AssertionError, match="metrics lack"):
        write_metrics(tmp_path / "other.json", {"script": "x"})
