"""CIFAR: generated pickles through torchvision's own loader, the md5 gate, CIFAR-ST counts."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from fedcomp.datasets import cifar
from fedcomp.datasets.cifar import (
    CIFAR_FILES,
    CIFAR_FOLDERS,
    cifar_st,
    load_cifar,
    step_counts,
    step_imbalance,
    write_cifar_batches,
)


def random_cifar(n: int, classes: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 32, 32), generator=gen, dtype=torch.uint8)
    return images, torch.randint(0, classes, (n,), generator=gen)


@pytest.fixture(params=["cifar10", "cifar100"])
def fake_root(request, tmp_path):
    name = request.param
    classes = 10 if name == "cifar10" else 100
    train, test = random_cifar(23, classes, 0), random_cifar(7, classes, 1)
    write_cifar_batches(tmp_path, *train, name, "train")
    write_cifar_batches(tmp_path, *test, name, "test")
    return name, tmp_path, train, test


def test_generated_batches_round_trip_through_torchvision(fake_root):
    name, root, train, test = fake_root
    for split, (images, labels) in (("train", train), ("test", test)):
        got_images, got_labels = load_cifar(name, split, root, verify_md5=False)
        assert got_images.shape == (images.shape[0], 3, 32, 32) and got_images.dtype == torch.uint8
        assert got_labels.dtype == torch.int64
        assert torch.equal(got_images, images) and torch.equal(got_labels, labels)
    files = CIFAR_FILES[name]
    assert sorted(p.name for p in (root / CIFAR_FOLDERS[name]).iterdir()) == sorted(
        [*files["train"], *files["test"], files["meta"]]
    )


def test_pickles_are_in_torchvisions_row_layout(fake_root):
    name, root, train, _ = fake_root
    first = CIFAR_FILES[name]["train"][0]
    with open(root / CIFAR_FOLDERS[name] / first, "rb") as fh:
        entry = pickle.load(fh, encoding="latin1")
    assert entry["data"].dtype == np.uint8 and entry["data"].shape[1] == 3072
    # row = red plane, green plane, blue plane, each row-major 32 x 32
    assert np.array_equal(entry["data"][0, :1024].reshape(32, 32), train[0][0, 0].numpy())
    assert np.array_equal(entry["data"][0, 2048:].reshape(32, 32), train[0][0, 2].numpy())
    key = "labels" if name == "cifar10" else "fine_labels"
    assert entry[key][0] == int(train[1][0])


def test_torchvision_pil_image_matches_returned_layout(fake_root):
    name, root, train, _ = fake_root
    dataset = cifar._dataset_class(name, False)(str(root), train=True)
    image, target = dataset[3]
    assert torch.equal(torch.from_numpy(np.array(image)).permute(2, 0, 1), train[0][3]) and target == int(train[1][3])


def test_md5_is_verified_by_default_and_generated_files_fail_it(fake_root):
    name, root, _, _ = fake_root
    with pytest.raises(ValueError, match="md5") as info:
        load_cifar(name, "train", root)
    assert "\n" not in str(info.value) and "set verify_md5 false (a config's task.verify_md5)" in str(info.value)


def test_unchecked_class_only_drops_md5_entries():
    from torchvision.datasets import CIFAR10, CIFAR100

    for name, base in (("cifar10", CIFAR10), ("cifar100", CIFAR100)):
        unchecked = cifar._dataset_class(name, False)
        assert issubclass(unchecked, base) and cifar._dataset_class(name, True) is base
        assert [f for f, _ in unchecked.train_list] == [f for f, _ in base.train_list]
        assert all(md5 is None for _, md5 in unchecked.train_list + unchecked.test_list)
        assert unchecked.meta["md5"] is None and base.meta["md5"] is not None


def test_missing_files_are_a_one_line_error_naming_the_folder(tmp_path, fake_root):
    with pytest.raises(FileNotFoundError) as info:
        load_cifar("cifar10", "test", tmp_path / "empty")
    message = str(info.value)
    assert "\n" not in message and "cifar-10-batches-py" in message and "none is there" in message
    name, root, _, _ = fake_root
    inner = root / CIFAR_FOLDERS[name]  # the root given as the extracted folder itself
    with pytest.raises(FileNotFoundError, match=rf"; they are in {inner}: the data root is the folder above "
                                                rf"{CIFAR_FOLDERS[name]}/, give {root}$"):
        load_cifar(name, "train", inner, verify_md5=False)
    (root / CIFAR_FOLDERS[name] / CIFAR_FILES[name]["test"][0]).unlink()
    with pytest.raises(FileNotFoundError, match=f"missing: {CIFAR_FILES[name]['test'][0]}"):
        load_cifar(name, "train", root, verify_md5=False)


def test_root_defaults_to_fedcomp_data(fake_root, monkeypatch):
    name, root, train, _ = fake_root
    monkeypatch.setenv("FEDCOMP_DATA", str(root))
    assert torch.equal(load_cifar(name, "train", verify_md5=False)[1], train[1])


def test_bad_arguments_name_the_value(tmp_path):
    with pytest.raises(ValueError, match="name = 'cifar20'"):
        load_cifar("cifar20", "train")
    with pytest.raises(ValueError, match="split = 'val'"):
        load_cifar("cifar10", "val")
    with pytest.raises(ValueError, match=r"\[N, 3, 32, 32\]"):
        write_cifar_batches(tmp_path, torch.zeros(2, 32, 32, 3, dtype=torch.uint8), [0, 1], "cifar10")
    with pytest.raises(ValueError, match=r"0\.\.9"):
        write_cifar_batches(tmp_path, torch.zeros(2, 3, 32, 32, dtype=torch.uint8), [0, 10], "cifar10")


@pytest.mark.parametrize(
    ("classes", "per_class", "variant", "reduced", "kept", "total"),
    [
        (10, 5000, "recover", range(0, 5), 100, 25_500),
        (100, 500, "recover", range(0, 50), 10, 25_500),
        (10, 5000, "scdro", range(5, 10), 50, 25_250),
        (100, 500, "scdro", range(50, 100), 5, 25_250),
        (10, 5000, "ldam", range(5, 10), 50, 25_250),
        (100, 500, "ldam", range(50, 100), 5, 25_250),
    ],
)
def test_cifar_st_counts_are_exact_at_real_sizes(classes, per_class, variant, reduced, kept, total):
    # real CIFAR training labels are interleaved; a shuffled balanced vector has the same counts
    shuffle = torch.randperm(classes * per_class, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(classes).repeat(per_class)[shuffle]
    index = cifar_st(labels, variant=variant)
    counts = torch.bincount(labels[index], minlength=classes)
    expected = torch.tensor([kept if c in reduced else per_class for c in range(classes)])
    assert torch.equal(counts, expected) and index.numel() == total
    assert torch.equal(index, torch.sort(index).values)


def test_recover_keeps_the_last_images_of_each_reduced_class_in_dataset_order():
    labels = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1, 0, 1] * 10)  # 50 per class, class 0 reduced
    index = cifar_st(labels, ratio=0.1, variant="recover")
    zeros = torch.nonzero(labels == 0).flatten()
    assert torch.equal(index[labels[index] == 0], zeros[-5:])
    assert torch.equal(index[labels[index] == 1], torch.nonzero(labels == 1).flatten())
    scdro = cifar_st(labels, ratio=0.1, variant="scdro")
    assert torch.equal(scdro[labels[scdro] == 1], torch.nonzero(labels == 1).flatten()[-5:])


def test_ldam_subset_is_random_but_deterministic_in_the_seed():
    labels = torch.arange(10).repeat(100)
    a, b, c = (cifar_st(labels, ratio=0.2, variant="ldam", seed=s) for s in (3, 3, 4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.bincount(labels[a]).tolist() == [100] * 5 + [20] * 5


def test_step_counts_rules_and_step_imbalance_options():
    assert step_counts([5000, 5000], [0], 0.02) == [100, 5000]
    assert step_counts([7, 13], [0, 1], 0.3) == [3, 4]  # 7 - floor(4.9), 13 - floor(9.1)
    assert step_counts([100, 90], [1], 0.05, rule="ldam") == [100, 5]  # int(n_max * r)
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert step_imbalance(labels, [0], 0.5, keep="first").tolist() == [0, 1, 4, 5, 6, 7]
    assert step_imbalance(labels, [0], 0.5, keep="last").tolist() == [2, 3, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="seed = None"):
        step_imbalance(labels, [0], 0.5, keep="random")
    with pytest.raises(ValueError, match="only used with keep='random'"):
        step_imbalance(labels, [0], 0.5, keep="last", seed=1)
    with pytest.raises(ValueError, match=r"ratio = 0: must be a number in \(0, 1\]"):
        step_imbalance(labels, [0], 0)
    with pytest.raises(ValueError, match=r"reduced_classes contains \[7\]"):
        step_imbalance(labels, [7], 0.5)
    with pytest.raises(ValueError, match="variant = 'lt'"):
        cifar_st(labels, variant="lt")


def test_cifar_st_composes_with_the_real_loader(tmp_path):
    images, labels = random_cifar(200, 10, 5)
    write_cifar_batches(tmp_path, images, labels, "cifar10", "train")
    write_cifar_batches(tmp_path, images[:10], labels[:10], "cifar10", "test")
    got_images, got_labels = load_cifar("cifar10", "train", tmp_path, verify_md5=False)
    index = cifar_st(got_labels, ratio=0.2)
    sizes = torch.bincount(got_labels, minlength=10)
    expected = [int(n) - int(np.floor(int(n) * 0.8)) if c < 5 else int(n) for c, n in enumerate(sizes)]
    assert torch.bincount(got_labels[index], minlength=10).tolist() == expected
    assert torch.equal(got_images[index], images[index])
