"""Melanoma: real JPEGs + CSV in Kaggle's layout load through the real decoder; tfrecord split; errors."""

from __future__ import annotations

import csv

import pytest
import torch
from torchvision.transforms.v2.functional import resize

from fedcomp.datasets.melanoma import load_melanoma, melanoma_split, write_melanoma

TFRECORDS = [0, 1, 2, 3, 4, -1, 5, 0, 5, 2, -1, 4]  # 6 distinct ids -> int(0.2 * 6) = 1 test id (5)
TARGETS = [0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 1]


def smooth_images(n: int) -> torch.Tensor:
    """Low-frequency images (a colour ramp per image), which JPEG keeps within a few grey levels."""
    ramp = torch.linspace(0, 1, 40)
    colour = torch.tensor([20.0, 90.0, 160.0])[:, None, None]
    base = torch.arange(n, dtype=torch.float32)[:, None, None, None] * 15 + colour
    return (base + 60 * ramp[None, None, :, None] + 30 * ramp[None, None, None, :]).clamp(0, 255).to(torch.uint8)


@pytest.fixture
def fake(tmp_path):
    images = smooth_images(12)
    write_melanoma(tmp_path, images, TARGETS, TFRECORDS)
    return tmp_path, images


def test_split_drops_duplicates_and_holds_out_the_last_ids():
    train, test = melanoma_split(TFRECORDS)
    assert test == [6, 8] and train == [0, 1, 2, 3, 4, 7, 9, 11]
    fifteen = list(range(15)) * 2
    _, held = melanoma_split(fifteen)
    assert sorted({fifteen[i] for i in held}) == [12, 13, 14]  # Kaggle's 15 tfrecords: 3 test ids


def test_jpegs_load_with_labels_shapes_and_close_pixels(fake):
    root, images = fake
    train_x, train_y = load_melanoma("train", root, size=None)
    test_x, test_y = load_melanoma("test", root, size=None)
    assert train_x.shape == (8, 3, 40, 40) and test_x.shape == (2, 3, 40, 40) and train_x.dtype == torch.uint8
    assert train_y.dtype == torch.int64
    assert train_y.tolist() == [TARGETS[i] for i in (0, 1, 2, 3, 4, 7, 9, 11)] and test_y.tolist() == [1, 0]
    error = (train_x.float() - images[[0, 1, 2, 3, 4, 7, 9, 11]].float()).abs()
    assert float(error.mean()) < 2.0 and float(error.max()) < 16
    assert float((test_x.float() - images[[6, 8]].float()).abs().mean()) < 2.0


def test_resize_is_antialiased_to_the_requested_side(fake, monkeypatch):
    root, images = fake
    monkeypatch.setenv("FEDCOMP_DATA", str(root))
    small, _ = load_melanoma("test")  # default size 64 upsamples here
    assert small.shape == (2, 3, 64, 64)
    tiny, _ = load_melanoma("train", root, size=10)
    expected = resize(images[[0, 1, 2, 3, 4, 7, 9, 11]], [10, 10], antialias=True)
    assert tiny.shape == (8, 3, 10, 10) and float((tiny.float() - expected.float()).abs().mean()) < 2.0


def test_kaggle_csv_with_more_columns_is_read(fake):
    root, _ = fake
    table = root / "melanoma" / "train.csv"
    with open(table, newline="") as fh:
        rows = list(csv.DictReader(fh))
    with open(table, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["image_name", "patient_id", "sex", "target", "tfrecord", "width", "height"])
        writer.writerows([r["image_name"], "IP_1", "male", r["target"], r["tfrecord"], 40, 40] for r in rows)
    assert load_melanoma("test", root, size=None)[1].tolist() == [1, 0]


def test_missing_and_malformed_inputs_are_one_line(fake, tmp_path_factory):
    with pytest.raises(FileNotFoundError) as info:
        load_melanoma("train", tmp_path_factory.mktemp("empty"))
    assert "\n" not in str(info.value) and "melanoma" in str(info.value) and "train.csv" in str(info.value)
    root, _ = fake
    (root / "melanoma" / "train" / "ISIC_0000008.jpg").unlink()
    assert load_melanoma("train", root, size=8)[0].shape == (8, 3, 8, 8)  # only the split's images are needed
    with pytest.raises(FileNotFoundError, match=r"^melanoma: 1 of the 2 test images .* e.g. ISIC_0000008.jpg$"):
        load_melanoma("test", root)
    (root / "melanoma" / "train" / "ISIC_0000000.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match=r"ISIC_0000000.jpg is not a decodable JPEG$"):
        load_melanoma("train", root)
    with pytest.raises(ValueError, match=r"^split = 'val': allowed: 'train', 'test'$"):
        load_melanoma("val", root)
    with pytest.raises(ValueError, match=r"^size = 0: must be a positive integer or None"):
        load_melanoma("train", root, size=0)
    (root / "melanoma" / "train.csv").write_text("image_name,target\nISIC_0000000,1\n")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) tfrecord; it has \['image_name', 'target'\]$"):
        load_melanoma("train", root)
    with pytest.raises(ValueError, match=r"^tfrecord: 4 distinct ids other than -1 give 0 test ids"):
        melanoma_split([0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"^targets = \[0, 2\]: must be 2 values, each 0 or 1$"):
        write_melanoma(root, torch.zeros(2, 3, 4, 4), [0, 2], [0, 1])
