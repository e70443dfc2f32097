"""CATvsDOG: LibAUC's two .npy files, last rows as the test split, channels-first output, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcomp.datasets.catvsdog import CATVSDOG_FILES, load_catvsdog, write_catvsdog


@pytest.fixture
def fake(tmp_path):
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (30, 50, 50, 3), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, 2, (30,), generator=gen)
    write_catvsdog(tmp_path, images, labels)
    return tmp_path, images, labels


def test_last_rows_are_the_test_split(fake):
    root, images, labels = fake
    train_x, train_y = load_catvsdog("train", root, test_size=8)
    test_x, test_y = load_catvsdog("test", root, test_size=8)
    assert train_x.shape == (22, 3, 50, 50) and test_x.shape == (8, 3, 50, 50)
    assert train_x.dtype == torch.uint8 and train_y.dtype == torch.int64
    assert torch.equal(train_x, images[:22].permute(0, 3, 1, 2)) and torch.equal(train_y, labels[:22])
    assert torch.equal(test_x, images[22:].permute(0, 3, 1, 2)) and torch.equal(test_y, labels[22:])
    assert sorted(p.name for p in (root / "cat_vs_dog").iterdir()) == sorted(CATVSDOG_FILES)


def test_stored_arrays_follow_libaucs_layout(fake):
    root, images, labels = fake
    stored = np.load(root / "cat_vs_dog" / "cat_vs_dog_data.npy")
    assert stored.shape == (30, 50, 50, 3) and stored.dtype == np.uint8
    assert np.array_equal(stored, images.numpy())
    assert np.array_equal(np.load(root / "cat_vs_dog" / "cat_vs_dog_label.npy"), labels.numpy())


def test_default_test_size_is_5000(fake, monkeypatch):
    root, _, _ = fake
    with pytest.raises(ValueError, match=r"cat_vs_dog_data.npy holds 30 rows; test_size = 5000 must be below that "
                                         r"\(LibAUC's split: the last 5,000 rows are the test set\)$"):
        load_catvsdog("train", root)
    monkeypatch.setenv("FEDCOMP_DATA", str(root))
    assert load_catvsdog("test", test_size=1)[0].shape == (1, 3, 50, 50)


def test_float_column_labels_and_grayscale_images_are_read(tmp_path):
    folder = tmp_path / "cat_vs_dog"
    folder.mkdir()
    np.save(folder / "cat_vs_dog_data.npy", np.arange(4 * 5 * 5, dtype=np.uint8).reshape(4, 5, 5))
    np.save(folder / "cat_vs_dog_label.npy", np.array([[1.0], [0.0], [0.0], [1.0]], dtype=np.float32))
    x, y = load_catvsdog("train", tmp_path, test_size=1)
    assert x.shape == (3, 1, 5, 5) and y.tolist() == [1, 0, 0] and int(x[1, 0, 0, 0]) == 25


def test_missing_and_malformed_files_are_one_line(fake, tmp_path_factory):
    with pytest.raises(FileNotFoundError) as info:
        load_catvsdog("train", tmp_path_factory.mktemp("empty"))
    assert "\n" not in str(info.value) and "cat_vs_dog" in str(info.value) and "none is there" in str(info.value)
    root, _, _ = fake
    np.save(root / "cat_vs_dog" / "cat_vs_dog_label.npy", np.full(30, 2))
    with pytest.raises(ValueError, match=r"cat_vs_dog_label.npy holds the label 2; expected 0 or 1$"):  # named
        load_catvsdog("train", root, test_size=5)
    (root / "cat_vs_dog" / "cat_vs_dog_label.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"\(missing: cat_vs_dog_label.npy\);"):
        load_catvsdog("train", root)
    with pytest.raises(ValueError, match=r"^split = 'val': allowed: 'train', 'test'$"):
        load_catvsdog("val", root)
    with pytest.raises(ValueError, match=r"^images of shape \(2, 3, 8, 8\): must be \[n, H, W, 3\]"):
        write_catvsdog(root, np.zeros((2, 3, 8, 8)), [0, 1])
    with pytest.raises(ValueError, match=r"^labels of shape \(2,\) and dtype int64: must be 2 0/1 integers$"):
        write_catvsdog(root, np.zeros((2, 8, 8, 3)), np.array([0, 3]))
