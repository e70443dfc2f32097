"""STL10 from local files, through torchvision's own loader (E10, E12), and a writer of its binary format.

:func:`load_stl10` reads ``<root>/stl10_binary/`` with ``torchvision.datasets.STL10`` and never downloads.
torchvision wants all five files (``train_X.bin``, ``train_y.bin``, ``unlabeled_X.bin``, ``test_X.bin``,
``test_y.bin``) whichever split is read, and checks the md5 of each. Files written by :func:`write_stl10`
cannot match the published checksums, so ``verify_md5=False`` reads through a subclass whose md5 entries
are ``None`` (``check_integrity(path, None)`` only tests existence), as :mod:`fedcomp.datasets.cifar` does.

On-disk format (EXPERIMENTS.md §9.2): ``*_X.bin`` is raw uint8, 3 x 96 x 96 bytes per image, one channel
plane after another, each plane stored **column-major** (torchvision transposes height and width on
reading); ``*_y.bin`` is one uint8 per image holding the class **1..10** (torchvision subtracts 1). The
labelled splits hold 5,000 training and 8,000 test images of 10 classes (airplane, bird, car, cat, deer,
dog, horse, monkey, ship, truck); the 100,000 unlabeled images are not used here.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Literal, cast

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets.checks import check_split, md5_failure, reading, require_files
from fedcomp.datasets.mnist import data_root

__all__ = ["STL10_CLASSES", "STL10_FILES", "STL10_FOLDER", "load_stl10", "require_stl10", "write_stl10"]

Split = Literal["train", "test"]

STL10_FOLDER = "stl10_binary"
STL10_FILES = ("train_X.bin", "train_y.bin", "unlabeled_X.bin", "test_X.bin", "test_y.bin")
"""Every file torchvision checks before reading any split."""
STL10_CLASSES = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")
"""Class names in label order (0..9 after torchvision's shift), as the dataset's ``class_names.txt`` lists them."""

_SIDE = 96


def load_stl10(
    split: Split, root: str | os.PathLike[str] | None = None, *, verify_md5: bool = True
) -> tuple[Tensor, Tensor]:
    """STL10 ``split`` as (uint8 images [N, 3, 96, 96] in row-major layout, int64 labels [N] in 0..9).

    Args:
        split: ``"train"`` (5,000 labelled images) or ``"test"`` (8,000).
        root: data root holding ``stl10_binary/``; default :func:`~fedcomp.datasets.mnist.data_root`.
        verify_md5: keep torchvision's md5 check of every file (the default); ``False`` only for files
            written by :func:`write_stl10`.

    Raises:
        FileNotFoundError: one of the five files is missing (one line naming the folder and the files).
        ValueError: bad ``split``/``verify_md5``, files failing the md5 check, or files empty, cut short or of
            inconsistent sizes (one line naming the file).
    """
    check_split(split)
    if not isinstance(verify_md5, bool):
        raise ValueError(f"verify_md5 = {verify_md5!r}: must be True or False")
    root = require_stl10(root)
    folder = root / STL10_FOLDER
    images_file, labels_file = folder / f"{split}_X.bin", folder / f"{split}_y.bin"
    image_bytes = 3 * _SIDE * _SIDE
    expected = f"{image_bytes} bytes (3 x 96 x 96) per image"
    size, labels_size = images_file.stat().st_size, labels_file.stat().st_size
    if size == 0:
        raise ValueError(f"stl10: {images_file} is empty (0 bytes); expected {expected}")
    if size % image_bytes:
        raise ValueError(f"stl10: {images_file} is not a whole number of 3 x 96 x 96 uint8 images ({size} bytes, "
                         f"{image_bytes} per image); is it cut short?")
    if 0 < size // image_bytes < labels_size:  # cut at an image's end, as a copy cut in half often is
        raise ValueError(f"stl10: {images_file} holds {size // image_bytes} images and {labels_file.name} "
                         f"{labels_size} labels, one per image; is {images_file.name} cut short?")
    if labels_size != size // image_bytes:
        state = "is empty (0 bytes); expected" if labels_size == 0 else "must hold"
        raise ValueError(f"stl10: {labels_file} {state} one label in 1..10 per image of {images_file.name} "
                         f"({size // image_bytes} images, {labels_size} labels)")
    try:
        with reading(folder, "STL-10's binary files"):
            dataset = _dataset_class(verify_md5)(str(root), split=split, download=False)
    except ValueError as error:
        failed = md5_failure("stl10", folder, error, verify_md5)
        if failed is not None:
            raise failed from None
        raise
    images = torch.from_numpy(np.ascontiguousarray(dataset.data))
    labels = torch.from_numpy(dataset.labels.astype(np.int64))
    if labels.numel() != images.shape[0]:
        raise ValueError(f"stl10: {labels_file} must hold one label in 1..10 per image of {images_file.name} "
                         f"({images.shape[0]} images, {labels.numel()} labels)")
    if labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < 10:
        written = np.fromfile(labels_file, dtype=np.uint8)  # torchvision's labels are these less one, wrapped
        bad = int(written[(written < 1) | (written > 10)][0])
        raise ValueError(f"stl10: {labels_file} holds the label {bad}; STL-10's labels are 1..10 (0..9 written as is "
                         f"are one too low)")
    return images, labels


def require_stl10(root: str | os.PathLike[str] | None = None) -> Path:
    """The data root (``root``, default :func:`~fedcomp.datasets.mnist.data_root`), checked to hold the five files
    of ``stl10_binary/`` without reading one: the one-line ``FileNotFoundError`` :func:`load_stl10` raises first."""
    root = data_root() if root is None else Path(root).expanduser()
    require_files("stl10", root / STL10_FOLDER, STL10_FILES,
                  "extract the binary archive from https://cs.stanford.edu/~acoates/stl10/ into the data root", root)
    return root


@functools.cache
def _dataset_class(verify_md5: bool) -> type:
    from torchvision.datasets import STL10

    if verify_md5:
        return cast(type, STL10)
    return type(
        "UncheckedSTL10",
        (STL10,),
        {
            "__doc__": "STL10 with every md5 entry set to None (files are only tested to exist).",
            "train_list": [[f, None] for f, _ in STL10.train_list],
            "test_list": [[f, None] for f, _ in STL10.test_list],
        },
    )


def write_stl10(
    root: str | os.PathLike[str],
    train: tuple[Tensor | np.ndarray, Tensor | np.ndarray],
    test: tuple[Tensor | np.ndarray, Tensor | np.ndarray],
    unlabeled: int | Tensor | np.ndarray = 0,
) -> Path:
    """Write all five STL10 files (plus ``class_names.txt``) in the published binary layout; return the folder.

    ``train`` and ``test`` are (uint8-valued images [N, 3, 96, 96] in the row-major layout
    :func:`load_stl10` returns, labels in 0..9). Images are written with each channel plane transposed
    (column-major) and labels as uint8 1..10, exactly as the published files. ``unlabeled`` is a number of
    blank images or an image array of the same layout. Files are replaced atomically.
    """
    train_x, train_y = _images("train images", train[0]), train[1]
    test_x, test_y = _images("test images", test[0]), test[1]
    train_y = _labels("train labels", train_y, train_x.shape[0])
    test_y = _labels("test labels", test_y, test_x.shape[0])
    if isinstance(unlabeled, bool):
        raise ValueError(f"unlabeled = {unlabeled!r}: must be a number of images or an image array")
    if isinstance(unlabeled, int):
        if unlabeled < 0:
            raise ValueError(f"unlabeled = {unlabeled}: must be a non-negative number of images")
        unlabeled_x = np.zeros((unlabeled, 3, _SIDE, _SIDE), dtype=np.uint8)
    else:
        unlabeled_x = _images("unlabeled images", unlabeled, allow_empty=True)
    folder = Path(root).expanduser() / STL10_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    contents = {
        "train_X.bin": _column_major(train_x),
        "train_y.bin": (train_y + 1).astype(np.uint8).tobytes(),
        "unlabeled_X.bin": _column_major(unlabeled_x),
        "test_X.bin": _column_major(test_x),
        "test_y.bin": (test_y + 1).astype(np.uint8).tobytes(),
        "class_names.txt": ("\n".join(STL10_CLASSES) + "\n").encode(),
    }
    for name, data in contents.items():
        tmp = folder / f"{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, folder / name)
    return folder


def _column_major(images: np.ndarray) -> bytes:
    return np.ascontiguousarray(images.transpose(0, 1, 3, 2)).tobytes()


def _images(name: str, values: Tensor | np.ndarray, *, allow_empty: bool = False) -> np.ndarray:
    array = values.detach().cpu().numpy() if isinstance(values, Tensor) else np.asarray(values)
    if array.ndim != 4 or array.shape[1:] != (3, _SIDE, _SIDE) or (array.shape[0] == 0 and not allow_empty):
        raise ValueError(f"{name} of shape {array.shape}: must be [N, 3, 96, 96] with N >= 1 (channels first)")
    if array.dtype != np.uint8:
        if array.dtype.kind not in "iuf" or not np.all((array >= 0) & (array <= 255) & (array == np.round(array))):
            raise ValueError(f"{name} of dtype {array.dtype}: values must be integers in 0..255")
        array = array.astype(np.uint8)
    return np.ascontiguousarray(array)


def _labels(name: str, values: Tensor | np.ndarray, n: int) -> np.ndarray:
    array = values.detach().cpu().numpy() if isinstance(values, Tensor) else np.asarray(values)
    if array.shape != (n,) or array.dtype.kind not in "iu":
        raise ValueError(f"{name} of shape {array.shape} and dtype {array.dtype}: must be {n} integers, one per image")
    if array.min() < 0 or array.max() > 9:
        raise ValueError(f"{name}: must be class ids in 0..9, got {int(array.min())}..{int(array.max())}")
    return array.astype(np.int64)
