"""The stratified split: the same indices as scikit-learn's train_test_split."""

from __future__ import annotations

import numpy as np
import pytest

from workshop_lib.split import stratified_holdout


@pytest.mark.parametrize(("n", "share", "frac"), [(2050, 0.76, 0.1), (1845, 0.76, 0.2), (7807, 0.635, 0.1), (37, 0.3, 0.25)])
def test_split_draws_the_same_indices_as_scikit_learn(n, share, frac):
    from sklearn.model_selection import train_test_split

    labels = (np.random.default_rng(n).random(n) < share).astype(np.int64)
    for seed in (1729, 0):
        kept, held = train_test_split(np.arange(n), test_size=frac, stratify=labels, random_state=seed)
        ours = stratified_holdout(labels, frac, seed)
        assert np.array_equal(ours[0], kept) and np.array_equal(ours[1], held)
