"""CATvsDOG (Kaggle dogs-vs-cats) in LibAUC's two-array layout, from the local data root (E10, E11).

LibAUC's ``CAT_VS_DOG`` loader keeps all 25,000 labelled images as two NumPy files,
``<root>/cat_vs_dog/cat_vs_dog_data.npy`` (uint8 images [n, H, W, 3]; LibAUC's archive uses 50 x 50
[inferred]) and ``cat_vs_dog_label.npy`` (0/1 labels), and uses the **last 5,000 rows** as the test split
(20,000 training rows). LibAUC only checks that the files exist; so does :func:`load_catvsdog`. Which
animal is label 1 is whatever the archive says ([unknown]; the binary tasks take label 1 as the positive
class). Nothing is downloaded; :func:`write_catvsdog` writes files of this layout for tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets.checks import check_split, file_start, reading, require_files
from fedcomp.datasets.mnist import data_root

__all__ = ["CATVSDOG_FILES", "CATVSDOG_FOLDER", "CATVSDOG_TEST_SIZE", "load_catvsdog", "require_catvsdog", "write_catvsdog"]

Split = Literal["train", "test"]

CATVSDOG_FOLDER = "cat_vs_dog"
CATVSDOG_FILES = ("cat_vs_dog_data.npy", "cat_vs_dog_label.npy")
CATVSDOG_TEST_SIZE = 5000
"""Rows at the end of the arrays that form the test split (LibAUC's loader)."""


def load_catvsdog(
    split: Split, root: str | os.PathLike[str] | None = None, *, test_size: int = CATVSDOG_TEST_SIZE
) -> tuple[Tensor, Tensor]:
    """CATvsDOG ``split`` as (uint8 images [N, 3, H, W], int64 labels [N] in {0, 1}).

    The images file holds [n, H, W, 3] (channels last, as LibAUC stores it) and is returned channels
    first; a grayscale [n, H, W] array is accepted and returned as [N, 1, H, W]. Labels may be stored as
    [n] or [n, 1], integer or float, but must be 0 or 1. The test split is the last ``test_size`` rows
    (default 5,000, LibAUC's split; smaller for small generated files), the training split the rest.

    Raises:
        FileNotFoundError: a file is missing (one line naming the folder and the files).
        ValueError: bad ``split``/``test_size``, or arrays of the wrong shape, dtype or values.
    """
    check_split(split)
    if isinstance(test_size, bool) or not isinstance(test_size, int) or test_size < 1:
        raise ValueError(f"test_size = {test_size!r}: must be a positive integer")
    folder = require_catvsdog(root) / CATVSDOG_FOLDER
    images = _load_npy(folder / CATVSDOG_FILES[0], "uint8 images [n, H, W, 3]", mmap=True)
    labels = _load_npy(folder / CATVSDOG_FILES[1], "0/1 labels [n]", mmap=False)
    n = images.shape[0] if images.ndim else 0
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[3] != 3):
        raise ValueError(
            f"catvsdog: {folder / CATVSDOG_FILES[0]} holds {images.dtype} {images.shape}; expected uint8 [n, H, W, 3]"
        )
    labels = labels.reshape(-1) if labels.ndim == 2 and labels.shape[1] == 1 else labels
    if labels.shape != (n,) or labels.dtype.kind not in "iufb":
        raise ValueError(
            f"catvsdog: {folder / CATVSDOG_FILES[1]} holds {labels.dtype} {labels.shape}; "
            f"expected {n} labels, each 0 or 1"
        )
    other = labels[(labels != 0) & (labels != 1)]
    if other.size:
        raise ValueError(f"catvsdog: {folder / CATVSDOG_FILES[1]} holds the label {other[0].item()!r}; expected 0 or 1")
    if test_size >= n:
        say = "" if test_size != CATVSDOG_TEST_SIZE else " (LibAUC's split: the last 5,000 rows are the test set)"
        raise ValueError(f"catvsdog: {folder / CATVSDOG_FILES[0]} holds {n} rows; test_size = {test_size} must be "
                         f"below that{say}")
    rows = slice(n - test_size, n) if split == "test" else slice(0, n - test_size)
    part = np.array(images[rows])  # a writable copy of the memory-mapped rows
    part = part[:, None] if part.ndim == 3 else part.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(part)), torch.from_numpy(labels[rows].astype(np.int64))


def require_catvsdog(root: str | os.PathLike[str] | None = None) -> Path:
    """The data root (``root``, default :func:`~fedcomp.datasets.mnist.data_root`), checked to hold both arrays
    without reading them: the one-line ``FileNotFoundError`` :func:`load_catvsdog` raises first."""
    root = data_root() if root is None else Path(root).expanduser()
    require_files("catvsdog", root / CATVSDOG_FOLDER, CATVSDOG_FILES,
                  "extract LibAUC's cat_vs_dog archive into the data root", root)
    return root


def _load_npy(path: Path, what: str, *, mmap: bool) -> np.ndarray:
    """The array in the NumPy ``.npy`` file ``path`` (memory-mapped with ``mmap``); one line naming the file if it is
    empty, another format (an ``.npz`` archive, text), cut short or damaged."""
    expected = f"a NumPy .npy file of {what}"
    head = file_start(path, 6)
    if not head:
        raise ValueError(f"{path}: is empty (0 bytes); expected {expected}")
    if head[:4] == b"PK\x03\x04":
        raise ValueError(f"{path}: is a zip archive (an .npz of several arrays?), not one array; expected {expected}")
    if head != b"\x93NUMPY":
        raise ValueError(f"{path}: is not a .npy file (it starts with {head!r}, not the .npy magic "
                         f"b'\\x93NUMPY'); expected {expected}")
    with reading(path, expected):
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    if not isinstance(array, np.ndarray):  # np.load gives other things for other formats
        raise ValueError(f"{path}: holds a {type(array).__name__}; expected {expected}")
    return array


def write_catvsdog(
    root: str | os.PathLike[str], images: Tensor | np.ndarray, labels: Tensor | np.ndarray
) -> Path:
    """Write ``images`` (uint8-valued [n, H, W, 3], channels last as stored) and 0/1 ``labels`` as LibAUC's files.

    Rows are written in the order given: the last ``test_size`` rows are what :func:`load_catvsdog`
    returns as the test split. Files are replaced atomically; returns the folder.
    """
    array = images.detach().cpu().numpy() if isinstance(images, Tensor) else np.asarray(images)
    if array.ndim != 4 or array.shape[3] != 3 or array.shape[0] == 0:
        raise ValueError(f"images of shape {array.shape}: must be [n, H, W, 3] with n >= 1 (channels last)")
    if array.dtype != np.uint8:
        if array.dtype.kind not in "iuf" or not np.all((array >= 0) & (array <= 255) & (array == np.round(array))):
            raise ValueError(f"images of dtype {array.dtype}: values must be integers in 0..255")
        array = array.astype(np.uint8)
    target = labels.detach().cpu().numpy() if isinstance(labels, Tensor) else np.asarray(labels)
    if target.shape != (array.shape[0],) or target.dtype.kind not in "iu" or not np.all((target == 0) | (target == 1)):
        raise ValueError(
            f"labels of shape {target.shape} and dtype {target.dtype}: must be {array.shape[0]} 0/1 integers"
        )
    folder = Path(root).expanduser() / CATVSDOG_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in zip(CATVSDOG_FILES, (np.ascontiguousarray(array), target.astype(np.int64))):
        tmp = folder / f"{name}.tmp.npy"
        np.save(tmp, value, allow_pickle=False)
        os.replace(tmp, folder / name)
    return folder
