"""Offline real data: scikit-learn's bundled breast-cancer and digits sets, split, standardised, imbalanced.

Both sets ship inside the scikit-learn wheel (``sklearn/datasets/data/``), so these functions run with no
network and no data root. Everything is a pure function of the arguments and ``seed``: one
``torch.Generator().manual_seed(seed)`` draws the split and then the imbalance subset, in that order.

* **Split.** Stratified: each class c of n_c examples puts ``round(test_fraction * n_c)`` (Python's
  round, halves to even) randomly chosen examples in the test set and the rest in the training set.
  Rows of each part are in random order.
* **Imbalance** (training part only; the test part keeps the original class balance, as in E8 and E10):
  ``keep_fraction = r`` keeps ``n_c - floor(n_c (1 - r))`` (= ceil(r n_c)) randomly chosen training
  examples of each reduced class (:func:`fedcomp.datasets.cifar.step_counts`, rule ``"tail"``);
  ``positive_ratio = r`` (binary sets only) keeps ``floor(r / (1 - r) * n_neg)`` positives, so that
  positives / all ~ r (LibAUC's ``ImbalancedDataGenerator`` rule), capped at the positives available.
* **Standardisation.** z-scores with the mean and (population) standard deviation of the final training
  part; constant columns (digits' always-blank border pixels) get standard deviation 1.
  ``standardize=False`` returns the raw values (digits: pixel counts 0..16 scaled to [0, 1]).

:func:`breast_cancer`: 569 rows x 30 features; label 1 = malignant (212, the minority), 0 = benign (357).
:func:`digits`: 1,797 images of 8 x 8 (features flattened to 64; reshape to [N, 1, 8, 8] for a conv
net), 10 classes of 174-183 images; multiclass labels, or binary with chosen positive digits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets.cifar import step_counts

__all__ = ["BREAST_CANCER_SIZE", "DIGITS_SIZE", "OfflineSplit", "breast_cancer", "digits"]

BREAST_CANCER_SIZE = (569, 30)
DIGITS_SIZE = (1797, 64)


class OfflineSplit(NamedTuple):
    """Features float32 [N, d] and int64 labels [N] of a training and a test part."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor


def breast_cancer(
    seed: int,
    *,
    test_fraction: float = 0.2,
    keep_fraction: float = 1.0,
    positive_ratio: float | None = None,
    standardize: bool = True,
) -> OfflineSplit:
    """Wisconsin breast cancer, label 1 = malignant; optionally with fewer training positives.

    With the default ``test_fraction=0.2`` the test part holds 42 malignant + 71 benign = 113 rows and the
    training part 170 + 286 = 456. ``keep_fraction`` keeps that fraction of the training positives;
    ``positive_ratio`` (exclusive with ``keep_fraction``) keeps ``floor(r / (1 - r) * 286)`` of them, e.g. 31
    at r = 0.1.
    """
    x, target = _sklearn("breast_cancer")
    labels = (target == 0).astype(np.int64)  # sklearn: 0 = malignant, 1 = benign
    return _prepare(x, labels, seed, test_fraction, (1,), keep_fraction, positive_ratio, standardize, scale=1.0)


def digits(
    seed: int,
    *,
    test_fraction: float = 0.2,
    positive_classes: Sequence[int] | None = None,
    reduced_classes: Sequence[int] | None = None,
    keep_fraction: float = 1.0,
    positive_ratio: float | None = None,
    standardize: bool = True,
) -> OfflineSplit:
    """scikit-learn's 8 x 8 digits, multiclass or binarised, optionally step-imbalanced.

    Args:
        seed: seed of the split and of the imbalance subset.
        test_fraction: per-class fraction held out (rounded), in (0, 1).
        positive_classes: ``None`` for labels 0..9; digits given here become label 1, the rest label 0.
        reduced_classes: digits that keep only ``keep_fraction`` of their training images (step
            imbalance). Default: the positive classes when binary, else digits 5-9 (E8's offline plan:
            digits 5-9 reduced to 2 %).
        keep_fraction: fraction kept of each reduced digit, in (0, 1].
        positive_ratio: binary only, exclusive with ``keep_fraction``: keep positives so that
            positives / all ~ r in the training part.
        standardize: z-score the features with training statistics (else pixels / 16).
    """
    x, target = _sklearn("digits")
    target = target.astype(np.int64)
    if positive_classes is None:
        if positive_ratio is not None:
            raise ValueError("positive_ratio: needs binary labels; set positive_classes too")
        labels = target
        reduced = tuple(range(5, 10)) if reduced_classes is None else _digit_set("reduced_classes", reduced_classes)
        return _prepare(x, labels, seed, test_fraction, reduced, keep_fraction, None, standardize, 16.0, target)
    positives = _digit_set("positive_classes", positive_classes)
    labels = np.isin(target, positives).astype(np.int64)
    reduced = positives if reduced_classes is None else _digit_set("reduced_classes", reduced_classes)
    return _prepare(x, labels, seed, test_fraction, reduced, keep_fraction, positive_ratio, standardize, 16.0, target)


@functools.cache
def _sklearn(name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn import datasets
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"the offline {name!r} set ships with scikit-learn: pip install scikit-learn"
        ) from None
    bunch = datasets.load_breast_cancer() if name == "breast_cancer" else datasets.load_digits()
    x, y = np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _prepare(
    x: np.ndarray,
    labels: np.ndarray,
    seed: int,
    test_fraction: float,
    reduced: Sequence[int],
    keep_fraction: float,
    positive_ratio: float | None,
    standardize: bool,
    scale: float,
    strata: np.ndarray | None = None,
) -> OfflineSplit:
    """Split stratified by ``strata`` (default: labels), imbalance the training part, standardise."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed = {seed!r}: must be a non-negative integer")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction = {test_fraction!r}: must be a number strictly between 0 and 1")
    if isinstance(keep_fraction, bool) or not isinstance(keep_fraction, (int, float)) or not 0 < keep_fraction <= 1:
        raise ValueError(f"keep_fraction = {keep_fraction!r}: must be a number in (0, 1]")
    if positive_ratio is not None:
        if keep_fraction != 1.0:
            raise ValueError(
                f"positive_ratio = {positive_ratio!r}: give either positive_ratio or keep_fraction, not both"
            )
        if isinstance(positive_ratio, bool) or not isinstance(positive_ratio, (int, float)):
            raise ValueError(f"positive_ratio = {positive_ratio!r}: must be a number strictly between 0 and 1")
        if not 0 < positive_ratio < 1:
            raise ValueError(f"positive_ratio = {positive_ratio!r}: must be a number strictly between 0 and 1")
    if not isinstance(standardize, bool):
        raise ValueError(f"standardize = {standardize!r}: must be True or False")
    strata = labels if strata is None else strata
    gen = torch.Generator().manual_seed(seed)
    train_parts, test_parts = [], []
    for c in np.unique(strata):
        members = np.flatnonzero(strata == c)
        members = members[torch.randperm(members.size, generator=gen).numpy()]
        n_test = round(test_fraction * members.size)
        test_parts.append(members[:n_test])
        train_parts.append(members[n_test:])
    train, test = np.concatenate(train_parts), np.concatenate(test_parts)

    # Imbalance: per stratum (digit / class) counts, random subset of each reduced stratum.
    if positive_ratio is not None:
        n_neg = int((labels[train] == 0).sum())
        n_pos = int((labels[train] == 1).sum())
        keep_pos = min(n_pos, math.floor(round(positive_ratio / (1 - positive_ratio) * n_neg, 9)))
        if keep_pos < 1:
            raise ValueError(
                f"positive_ratio = {positive_ratio!r}: keeps no positive next to {n_neg} negatives; raise it"
            )
        positives = train[labels[train] == 1]
        kept = positives[torch.randperm(positives.size, generator=gen)[:keep_pos].numpy()]
        train = np.concatenate([train[labels[train] == 0], kept])
    elif keep_fraction < 1.0:
        classes = int(strata.max()) + 1
        sizes = np.bincount(strata[train], minlength=classes).tolist()
        counts = step_counts(sizes, reduced, keep_fraction, rule="tail")
        kept_parts = []
        for c, k in enumerate(counts):
            members = train[strata[train] == c]
            if k < members.size:
                members = members[torch.randperm(members.size, generator=gen)[:k].numpy()]
            kept_parts.append(members)
        train = np.concatenate(kept_parts)
    train = train[torch.randperm(train.size, generator=gen).numpy()]
    test = test[torch.randperm(test.size, generator=gen).numpy()]

    x_train, x_test = x[train], x[test]
    if standardize:
        mean, std = x_train.mean(0), x_train.std(0)
        std[std == 0] = 1.0
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    else:
        x_train, x_test = x_train / scale, x_test / scale
    return OfflineSplit(
        torch.from_numpy(x_train.astype(np.float32)),
        torch.from_numpy(labels[train].copy()),
        torch.from_numpy(x_test.astype(np.float32)),
        torch.from_numpy(labels[test].copy()),
    )


def _digit_set(name: str, values: Sequence[int]) -> tuple[int, ...]:
    try:
        digits_ = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise ValueError(f"{name} = {values!r}: must be a sequence of digits 0..9") from None
    if not digits_ or any(not 0 <= d <= 9 for d in digits_):
        raise ValueError(f"{name} = {values!r}: must be a non-empty set of digits 0..9")
    return digits_
