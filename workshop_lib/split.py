"""The train / dev / heldout split: stratified, seeded, the original workshop's.

The same algorithm and random stream as scikit-learn's
``train_test_split(..., stratify=labels, random_state=seed)``, so the same
indices, without importing scikit-learn: importing its ``train_test_split`` and
``roc_auc_score`` (through scipy.stats) costs every rank 0.8 to 1 s of startup
(measured on 2 cores, 2026-12-04), against about 20 s for a whole step 3 run,
so scikit-learn is not a dependency. The dev extra brings it for
tests/unit/core/test_split.py, which checks the indices against it.
"""

from __future__ import annotations

import math

import numpy as np

from workshop_lib.errors import InputError


def _approximate_mode(class_counts: np.ndarray, n_draws: int, rng: np.random.RandomState) -> np.ndarray:
    """Per-class draws proportional to ``class_counts``; leftover draws go to the largest remainders."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need_to_add = int(n_draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add_now = min(len(inds), need_to_add)
            floored[rng.choice(inds, size=add_now, replace=False)] += 1  # ties broken at random
            need_to_add -= add_now
            if need_to_add == 0:
                break
    return floored.astype(int)


def stratified_holdout(labels: np.ndarray, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions (kept, held out) of one stratified shuffle split holding out ``frac``.

    As scikit-learn's ``train_test_split(np.arange(n), test_size=frac,
    stratify=labels, random_state=seed)``.
    """
    n = len(labels)
    n_test = math.ceil(frac * n)
    n_train = n - n_test
    classes, y_idx, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if n_train <= 0 or counts.min() < 2 or min(n_train, n_test) < len(classes):
        raise ValueError(f"class counts {counts.tolist()} leave fewer than one of each class on a side")
    class_indices = np.split(np.argsort(y_idx, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    t_i = _approximate_mode(counts - n_i, n_test, rng)
    kept, held = [], []
    for i in range(len(classes)):
        perm = class_indices[i].take(rng.permutation(counts[i]), mode="clip")
        kept.extend(perm[: n_i[i]])
        held.extend(perm[n_i[i] : n_i[i] + t_i[i]])
    return rng.permutation(np.array(kept, dtype=np.int64)), rng.permutation(np.array(held, dtype=np.int64))


def stratified_split(labels: np.ndarray, heldout_frac: float, dev_frac: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of train / dev / heldout, each with the class balance of the whole.

    As the original workshop: hold out ``heldout_frac``, then take ``dev_frac``
    of the rest for model selection.
    """
    labels = np.asarray(labels)
    try:
        rest, heldout = stratified_holdout(labels, heldout_frac, seed)
        train, dev = stratified_holdout(labels[rest], dev_frac, seed)
    except ValueError as err:
        raise InputError(f"cannot split {len(labels)} molecules into train/dev/heldout with both classes in "
                            f"each ({err}); use more molecules (--limit 100 or more)") from None
    return np.sort(rest[train]), np.sort(rest[dev]), np.sort(heldout)
