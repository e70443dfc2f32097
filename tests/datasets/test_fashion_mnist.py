"""FashionMNIST: IDX files written under FashionMNIST/raw load through torchvision's FashionMNIST class."""

from __future__ import annotations

import pytest
import torch

from fedcomp.datasets.mnist import IDX_FILES, load_fashion_mnist, load_mnist, write_idx


def random_images(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8)
    return images, torch.randint(0, 10, (n,), generator=gen)


def test_fashion_files_round_trip_through_torchvision(tmp_path):
    train, test = random_images(50, 0), random_images(12, 1)
    paths = write_idx(tmp_path, *train, "train", name="FashionMNIST")
    write_idx(tmp_path, *test, "test", name="FashionMNIST")
    assert paths[0] == tmp_path / "FashionMNIST" / "raw" / "train-images-idx3-ubyte"
    assert sorted(p.name for p in (tmp_path / "FashionMNIST" / "raw").iterdir()) == sorted(IDX_FILES)
    for split, (images, labels) in (("train", train), ("test", test)):
        got_images, got_labels = load_fashion_mnist(split, tmp_path)
        assert got_images.dtype == torch.uint8 and got_labels.dtype == torch.int64
        assert torch.equal(got_images, images) and torch.equal(got_labels, labels)
    with pytest.raises(FileNotFoundError, match="MNIST not found"):  # the folders are separate
        load_mnist("train", tmp_path)


def test_fashion_root_defaults_to_fedcomp_data(tmp_path, monkeypatch):
    train = random_images(5, 2)
    write_idx(tmp_path, *train, "train", name="FashionMNIST")
    write_idx(tmp_path, *random_images(3, 3), "test", name="FashionMNIST")
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    assert torch.equal(load_fashion_mnist("train")[1], train[1])


def test_missing_fashion_files_are_one_line(tmp_path):
    write_idx(tmp_path, *random_images(4, 0), "train", name="FashionMNIST")
    with pytest.raises(FileNotFoundError) as info:
        load_fashion_mnist("train", tmp_path)
    message = str(info.value)
    assert "\n" not in message and str(tmp_path / "FashionMNIST" / "raw") in message
    assert "missing: t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte" in message and "mnist5k" not in message


def test_bad_split_and_bad_folder_name(tmp_path):
    with pytest.raises(ValueError, match=r"^split = 'val': allowed: 'train', 'test'$"):
        load_fashion_mnist("val", tmp_path)
    with pytest.raises(ValueError, match=r"^name = 'KMNIST': allowed: 'MNIST', 'FashionMNIST'$"):
        write_idx(tmp_path, *random_images(2, 0), "train", name="KMNIST")
    assert not (tmp_path / "KMNIST").exists()
