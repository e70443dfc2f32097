"""Imbalance builders: exact counts at the papers' sizes, seeded choice, positives-first batches, clear errors."""

from __future__ import annotations

import math

import pytest
import torch

from fedcomp.datasets.imbalance import binarize, drop_positives, positive_classes, positives_first, ratio_keep

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def labels_of(counts: list[int], seed: int = 0) -> torch.Tensor:
    """A shuffled label vector with the given class counts (real training sets interleave their classes)."""
    labels = torch.arange(len(counts)).repeat_interleave(torch.tensor(counts))
    return labels[torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(seed))]


def test_positive_classes_follow_both_conventions():
    assert positive_classes(10, "first-half") == (0, 1, 2, 3, 4)
    assert positive_classes(10, "second-half") == (5, 6, 7, 8, 9)
    assert positive_classes(100, "first-half") == tuple(range(50))
    assert positive_classes(2, "second-half") == (1,)
    assert positive_classes(5, "first-half") == (0, 1) and positive_classes(5, "second-half") == (2, 3, 4)


def test_binarize_is_int64_zero_one():
    got = binarize(torch.tensor([0, 5, 9, 4, 7]), (5, 6, 7, 8, 9))
    assert got.dtype == torch.int64 and got.tolist() == [0, 1, 1, 0, 1]
    assert binarize([3, 3, 1], [1]).tolist() == [0, 0, 1]


@pytest.mark.parametrize(
    ("counts", "rule", "ratio", "n_neg", "n_pos"),
    [
        ([5000] * 10, "first-half", 0.1, 25_000, 2_777),  # CIFAR-10 (E10 derived)
        ([500] * 100, "first-half", 0.1, 25_000, 2_777),  # CIFAR-100
        ([500] * 10, "first-half", 0.1, 2_500, 277),  # STL10
        ([6000] * 10, "first-half", 0.1, 30_000, 3_333),  # FashionMNIST
        ([5000] * 10, "second-half", 0.01, 25_000, 252),
        ([5000] * 10, "first-half", 0.05, 25_000, 1_315),
        ([5000] * 10, "first-half", 0.2, 25_000, 6_250),
        ([5000] * 10, "first-half", 0.5, 25_000, 25_000),
    ],
)
def test_ratio_keep_counts_at_real_sizes(counts, rule, ratio, n_neg, n_pos):
    labels = labels_of(counts)
    binary = binarize(labels, positive_classes(len(counts), rule))
    kept = ratio_keep(binary, ratio, seed=0)
    assert int((binary[kept] == 0).sum()) == n_neg and int((binary[kept] == 1).sum()) == n_pos
    assert n_pos == math.floor(ratio / (1 - ratio) * n_neg + 1e-9)
    assert torch.equal(kept, torch.sort(kept).values) and kept.unique().numel() == kept.numel()
    assert torch.equal(kept[binary[kept] == 0], torch.nonzero(binary == 0).flatten())  # every negative stays


@pytest.mark.parametrize(("ratio", "n_pos"), [(0.01, 101), (0.05, 526), (0.1, 1_111), (0.2, 2_500)])
def test_ratio_keep_catvsdog_study_sizes(ratio, n_pos):
    # E11: 20,000 training images, 10,000 of them negatives
    binary = labels_of([10_000, 10_000], seed=3)
    kept = ratio_keep(binary, ratio, seed=1)
    assert kept.numel() == 10_000 + n_pos and int(binary[kept].sum()) == n_pos


def test_ratio_keep_is_deterministic_in_the_seed():
    binary = binarize(labels_of([500] * 10), range(5))
    a, b, c = ratio_keep(binary, 0.1, 7), ratio_keep(binary, 0.1, 7), ratio_keep(binary, 0.1, 8)
    assert torch.equal(a, b) and not torch.equal(a, c) and a.numel() == c.numel() == 2_777


def test_ratio_keep_accepts_bool_labels():
    binary = torch.tensor([True] * 5 + [False] * 36)
    kept = ratio_keep(binary, 0.1, 0)
    assert kept.numel() == 40 and int(binary[kept].sum()) == 4


def test_drop_positives_mnist_counts():
    labels = labels_of(MNIST_TRAIN_COUNTS)
    kept = drop_positives(labels, positive_classes(10, "second-half"), 0.2, seed=0)
    per_class = torch.bincount(labels[kept], minlength=10).tolist()
    assert per_class == MNIST_TRAIN_COUNTS[:5] + [1084, 1183, 1253, 1170, 1189]
    assert sum(per_class[5:]) == 5_879 and sum(per_class[:5]) == 30_596
    assert torch.equal(kept, torch.sort(kept).values)


def test_drop_positives_cifar_and_determinism():
    labels = labels_of([5000] * 10)
    kept = drop_positives(labels, range(5, 10), 0.2, seed=4)
    assert torch.bincount(labels[kept]).tolist() == [5000] * 5 + [1000] * 5
    assert torch.equal(kept, drop_positives(labels, range(5, 10), 0.2, seed=4))
    assert not torch.equal(kept, drop_positives(labels, range(5, 10), 0.2, seed=5))
    assert drop_positives(labels, [0], 1.0, seed=0).numel() == 50_000


def test_positives_first_ordering_and_pools():
    pos, neg = torch.arange(100, 110), torch.arange(0, 50)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        batch = positives_first(pos, neg, 8, 3, gen)
        assert batch.dtype == torch.int64 and batch.numel() == 8
        assert torch.isin(batch[:3], pos).all() and torch.isin(batch[3:], neg).all()
        assert batch.unique().numel() == 8  # both pools are large enough: no repeats within a batch
    assert torch.isin(positives_first(pos, neg, 4, 0, gen), neg).all()
    assert torch.isin(positives_first(pos, torch.tensor([], dtype=torch.long), 4, 4, gen), pos).all()


def test_positives_first_oversamples_a_small_pool_and_is_seeded():
    pos, neg = torch.tensor([7, 9]), torch.arange(20, 40)
    batch = positives_first(pos, neg, 10, 5, torch.Generator().manual_seed(1))
    assert set(batch[:5].tolist()) <= {7, 9} and torch.isin(batch[5:], neg).all()
    again = positives_first(pos, neg, 10, 5, torch.Generator().manual_seed(1))
    other = positives_first(pos, neg, 10, 5, torch.Generator().manual_seed(2))
    assert torch.equal(batch, again) and not torch.equal(batch, other)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: positive_classes(1, "first-half"), "classes = 1: must be an integer >= 2"),
        (lambda: positive_classes(10, "odd"), "rule = 'odd': allowed: 'first-half', 'second-half'"),
        (lambda: ratio_keep(torch.tensor([0, 1]), 0.6, 0), "ratio = 0.6: must be a number in (0, 0.5]"),
        (lambda: ratio_keep(torch.tensor([0, 1]), 0.0, 0), "ratio = 0.0: must be a number in (0, 0.5]"),
        (lambda: ratio_keep(torch.tensor([0, 2]), 0.1, 0), "binary: must hold only 0 and 1, got values up to 2"),
        (
            lambda: ratio_keep(torch.tensor([1] * 3 + [0] * 90), 0.1, 0),
            "ratio = 0.1: needs 10 positives next to 90 negatives, but only 3 are available",
        ),
        (lambda: ratio_keep(torch.tensor([1, 0, 0]), 0.1, 0), "ratio = 0.1: floor(ratio / (1 - ratio) * 2 negatives"),
        (lambda: ratio_keep(torch.tensor([1, 0]), 0.1, -1), "seed = -1: must be a non-negative integer"),
        (lambda: drop_positives(torch.tensor([0, 1]), [1], 0.0, 0), "keep_fraction = 0.0: must be a number in (0, 1]"),
        (lambda: drop_positives(torch.tensor([0, 1]), [], 0.2, 0), "positives = []: must be a non-empty sequence"),
        (lambda: binarize(torch.tensor([0.5]), [1]), "labels of shape (1,) and dtype torch.float32"),
        (lambda: positives_first(torch.arange(3), torch.arange(3), 4, 5, None), "positives = 5: must be an integer in"),
        (lambda: positives_first(torch.arange(3), torch.arange(3), 0, 0, None), "size = 0: must be a positive integer"),
        (
            lambda: positives_first(torch.tensor([], dtype=torch.long), torch.arange(3), 4, 1, None),
            "pos: empty, but the batch needs 1 of its rows",
        ),
        (
            lambda: positives_first(torch.arange(3), torch.tensor([], dtype=torch.long), 4, 1, None),
            "neg: empty, but the batch needs 3 of its rows",
        ),
    ],
)
def test_bad_inputs_raise_one_line_value_error(call, needle):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)
