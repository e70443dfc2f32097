"""STL10: generated binaries load through torchvision's STL10 class; layout, md5 gate and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcomp.datasets import stl10
from fedcomp.datasets.stl10 import STL10_CLASSES, STL10_FILES, load_stl10, write_stl10


def random_stl(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 96, 96), generator=gen, dtype=torch.uint8)
    return images, torch.randint(0, 10, (n,), generator=gen)


@pytest.fixture
def fake_root(tmp_path):
    train, test = random_stl(9, 0), random_stl(4, 1)
    write_stl10(tmp_path, train=train, test=test, unlabeled=2)
    return tmp_path, train, test


def test_generated_files_round_trip_through_torchvision(fake_root):
    root, train, test = fake_root
    for split, (images, labels) in (("train", train), ("test", test)):
        got_images, got_labels = load_stl10(split, root, verify_md5=False)
        assert got_images.shape == (images.shape[0], 3, 96, 96) and got_images.dtype == torch.uint8
        assert got_labels.dtype == torch.int64
        assert torch.equal(got_images, images) and torch.equal(got_labels, labels)
    names = sorted(p.name for p in (root / "stl10_binary").iterdir())
    assert names == sorted([*STL10_FILES, "class_names.txt"])


def test_files_have_the_published_byte_layout(fake_root):
    root, train, _ = fake_root
    folder = root / "stl10_binary"
    raw = np.fromfile(folder / "train_X.bin", dtype=np.uint8)
    assert raw.size == 9 * 3 * 96 * 96
    # first 96 bytes = first *column* of the red plane of image 0
    assert np.array_equal(raw[:96], train[0][0, 0, :, 0].numpy())
    assert np.array_equal(raw[96 * 96 : 96 * 96 + 96], train[0][0, 1, :, 0].numpy())
    assert np.fromfile(folder / "train_y.bin", dtype=np.uint8).tolist() == (train[1] + 1).tolist()
    assert (folder / "unlabeled_X.bin").stat().st_size == 2 * 3 * 96 * 96
    dataset = stl10._dataset_class(False)(str(root), split="unlabeled")
    assert dataset.data.shape == (2, 3, 96, 96) and dataset.classes == list(STL10_CLASSES)


def test_md5_is_verified_by_default(fake_root):
    root, _, _ = fake_root
    with pytest.raises(ValueError, match="md5") as info:
        load_stl10("train", root)
    assert "\n" not in str(info.value) and "set verify_md5 false (a config's task.verify_md5)" in str(info.value)
    from torchvision.datasets import STL10

    unchecked = stl10._dataset_class(False)
    assert issubclass(unchecked, STL10) and stl10._dataset_class(True) is STL10
    assert all(md5 is None for _, md5 in unchecked.train_list + unchecked.test_list)


def test_missing_files_are_one_line(fake_root, tmp_path_factory):
    with pytest.raises(FileNotFoundError) as info:
        load_stl10("test", tmp_path_factory.mktemp("empty"))
    assert "\n" not in str(info.value) and "stl10_binary" in str(info.value) and "none is there" in str(info.value)
    root, _, _ = fake_root
    (root / "stl10_binary" / "unlabeled_X.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"\(missing: unlabeled_X.bin\);"):
        load_stl10("train", root, verify_md5=False)


def test_truncated_files_and_bad_arguments(fake_root):
    root, _, _ = fake_root
    path = root / "stl10_binary" / "test_X.bin"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ValueError, match=r"test_X.bin is not a whole number of 3 x 96 x 96 uint8 images \(110587 bytes, 27648 per image\); is it cut short\?$"):
        load_stl10("test", root, verify_md5=False)
    (root / "stl10_binary" / "train_y.bin").write_bytes(bytes([1, 2, 3]))
    with pytest.raises(ValueError, match=r"\(9 images, 3 labels\)$"):
        load_stl10("train", root, verify_md5=False)
    (root / "stl10_binary" / "train_y.bin").write_bytes(bytes([1] * 9 + [2] * 3))  # X cut at an image's end
    with pytest.raises(ValueError, match=r"train_X.bin holds 9 images and train_y.bin 12 labels, one per image; is "
                                         r"train_X.bin cut short\?$"):  # it blamed the labels file
        load_stl10("train", root, verify_md5=False)
    (root / "stl10_binary" / "train_y.bin").write_bytes(bytes(range(9)))  # 0..8: written as class ids, not 1..10
    with pytest.raises(ValueError, match=r"train_y.bin holds the label 0; STL-10's labels are 1..10"):
        load_stl10("train", root, verify_md5=False)
    with pytest.raises(ValueError, match=r"^split = 'unlabeled': allowed: 'train', 'test'$"):
        load_stl10("unlabeled", root)
    with pytest.raises(ValueError, match=r"^train images of shape \(2, 3, 32, 32\): must be \[N, 3, 96, 96\]"):
        write_stl10(root, train=(np.zeros((2, 3, 32, 32)), [0, 1]), test=random_stl(1, 0))
    with pytest.raises(ValueError, match=r"^test labels: must be class ids in 0..9, got 0..10$"):
        write_stl10(root, train=random_stl(1, 0), test=(random_stl(2, 0)[0], torch.tensor([0, 10])))
