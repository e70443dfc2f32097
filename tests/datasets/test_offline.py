"""Offline scikit-learn sets: documented sizes and ratios, stratified split, standardisation, determinism."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

pytest.importorskip("sklearn", reason="the offline sets ship with scikit-learn")

from fedcomp.datasets import offline
from fedcomp.datasets.offline import breast_cancer, digits

DIGIT_SIZES = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_breast_cancer_sizes_and_positive_label_is_malignant():
    split = breast_cancer(0)
    assert split.x_train.shape == (456, 30) and split.x_test.shape == (113, 30)
    assert split.x_train.dtype == torch.float32 and split.y_train.dtype == torch.int64
    assert int(split.y_train.sum()) == 170 and int(split.y_test.sum()) == 42  # 212 malignant in all
    assert int(split.y_train.numel() + split.y_test.numel()) == 569


def test_training_part_is_standardised_and_test_uses_training_statistics():
    split = breast_cancer(3)
    torch.testing.assert_close(split.x_train.mean(0), torch.zeros(30), atol=1e-5, rtol=0)
    torch.testing.assert_close(split.x_train.std(0, unbiased=False), torch.ones(30), atol=1e-5, rtol=0)
    raw = breast_cancer(3, standardize=False)
    mean, std = raw.x_train.double().mean(0), raw.x_train.double().std(0, unbiased=False)
    torch.testing.assert_close(split.x_test.double(), (raw.x_test.double() - mean) / std, atol=1e-4, rtol=0)


def test_breast_cancer_imbalance_options():
    assert int(breast_cancer(0, keep_fraction=0.2).y_train.sum()) == 34  # 170 - floor(170 * 0.8)
    split = breast_cancer(0, positive_ratio=0.1)
    assert int(split.y_train.sum()) == 31 and split.y_train.numel() == 286 + 31  # floor(0.1 / 0.9 * 286)
    assert int(split.y_test.sum()) == 42  # the test part keeps its balance
    with pytest.raises(ValueError, match="either positive_ratio or keep_fraction"):
        breast_cancer(0, keep_fraction=0.5, positive_ratio=0.1)
    with pytest.raises(ValueError, match=r"keep_fraction = 0: must be a number in \(0, 1\]"):
        breast_cancer(0, keep_fraction=0)


def test_digits_multiclass_split_is_stratified():
    split = digits(0)
    assert split.x_train.shape == (1438, 64) and split.x_test.shape == (359, 64)
    test_counts = [round(0.2 * n) for n in DIGIT_SIZES]
    assert torch.bincount(split.y_test).tolist() == test_counts
    assert torch.bincount(split.y_train).tolist() == [n - t for n, t in zip(DIGIT_SIZES, test_counts)]


def test_digits_step_imbalance_keeps_two_percent_of_digits_five_to_nine():
    split = digits(0, keep_fraction=0.02)
    train_sizes = [n - round(0.2 * n) for n in DIGIT_SIZES]
    expected = [n if d < 5 else 3 for d, n in enumerate(train_sizes)]  # ceil(0.02 * 139..146) = 3
    assert torch.bincount(split.y_train).tolist() == expected
    assert torch.bincount(split.y_test).tolist() == [round(0.2 * n) for n in DIGIT_SIZES]
    custom = digits(0, reduced_classes=[0], keep_fraction=0.5)
    assert torch.bincount(custom.y_train)[0] == 71  # 142 - floor(142 * 0.5)


def test_digits_binarised_with_reduced_positives():
    split = digits(1, positive_classes=[5, 6, 7, 8, 9], keep_fraction=0.2)
    train_sizes = [n - round(0.2 * n) for n in DIGIT_SIZES]
    positives = sum(n - int(n * 0.8) for n in train_sizes[5:])  # per digit n - floor(0.8 n)
    assert int(split.y_train.sum()) == positives and int((split.y_train == 0).sum()) == sum(train_sizes[:5])
    assert set(split.y_test.tolist()) == {0, 1}
    ratio = digits(1, positive_classes=[0, 1], positive_ratio=0.1)
    negatives = 1438 - 142 - 146
    assert int(ratio.y_train.sum()) == 127 == int(0.1 / 0.9 * negatives) and ratio.y_train.numel() == negatives + 127
    assert int(digits(1, positive_classes=[0], positive_ratio=0.2).y_train.sum()) == 142  # capped: all positives
    raw = digits(1, standardize=False)
    assert float(raw.x_train.min()) == 0.0 and float(raw.x_train.max()) == 1.0
    with pytest.raises(ValueError, match="needs binary labels"):
        digits(0, positive_ratio=0.1)
    with pytest.raises(ValueError, match="positive_classes = \\[10\\]"):
        digits(0, positive_classes=[10])


@pytest.mark.parametrize("make", [breast_cancer, digits])
def test_deterministic_in_the_seed(make):
    a, b, c = make(5, keep_fraction=0.5), make(5, keep_fraction=0.5), make(6, keep_fraction=0.5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a.x_train, c.x_train)
    with pytest.raises(ValueError, match="seed = -1"):
        make(-1)


def test_datasets_package_imports_no_ray_or_platform():
    for module in ("offline.py", "cifar.py", "adult.py"):
        tree = ast.parse((Path(offline.__file__).parent / module).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(m == "ray" or m.startswith(("ray.", "fedcomp.platform", "fedcomp.actors")) for m in imported)
