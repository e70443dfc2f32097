"""Melanoma (SIIM-ISIC 2020) in Kaggle's 256 x 256 JPEG layout, from the local data root (E10).

Layout read (EXPERIMENTS.md §9.3): ``<root>/melanoma/train.csv`` with at least the columns
``image_name``, ``target`` (1 = malignant) and ``tfrecord`` (the fold file the image was assigned to;
-1 marks duplicates), and the images ``<root>/melanoma/train/<image_name>.jpg``. The full set has 33,126
images, 584 of them malignant (about 1.8 %).

Split [inferred from public LibAUC-era loaders; whether LocalSCGDAM used it is unknown]: rows with
``tfrecord == -1`` are dropped; the test split is every row whose tfrecord id is among the last
``int(0.2 * k)`` of the k sorted distinct ids (3 of Kaggle's 15), the training split the rest. (Those
loaders keep ids ``range(k)[:-int(0.2 k)]`` for training, the same thing when the ids are 0..k-1.)

Images are decoded with ``torchvision.io.decode_jpeg`` (RGB) and resized to ``size`` x ``size`` with
``torchvision.transforms.v2.functional.resize`` (antialiased) in memory; nothing is cached on disk, so a
full load decodes every JPEG of the split. Nothing is downloaded. :func:`write_melanoma` writes real JPEGs
and the CSV for tests.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets.checks import check_split, read_text
from fedcomp.datasets.mnist import data_root

__all__ = ["MELANOMA_COLUMNS", "MELANOMA_FOLDER", "load_melanoma", "melanoma_split", "require_melanoma", "write_melanoma"]

Split = Literal["train", "test"]

MELANOMA_FOLDER = "melanoma"
MELANOMA_COLUMNS = ("image_name", "target", "tfrecord")
"""Columns of ``train.csv`` that are read (Kaggle's file has more; they are ignored)."""


def melanoma_split(tfrecords: Sequence[int], test_fraction: float = 0.2) -> tuple[list[int], list[int]]:
    """(training, test) row positions: rows with tfrecord -1 dropped, the last ``int(test_fraction k)`` ids test.

    ``k`` is the number of distinct tfrecord ids other than -1; positions keep the input order.
    """
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction = {test_fraction!r}: must be a number strictly between 0 and 1")
    ids = sorted({int(t) for t in tfrecords} - {-1})
    n_test = int(test_fraction * len(ids))
    if n_test < 1 or n_test == len(ids):
        raise ValueError(
            f"tfrecord: {len(ids)} distinct ids other than -1 give {n_test} test ids at test_fraction = "
            f"{test_fraction}; need at least one test id and one training id"
        )
    test_ids = set(ids[len(ids) - n_test :])
    train = [i for i, t in enumerate(tfrecords) if int(t) != -1 and int(t) not in test_ids]
    test = [i for i, t in enumerate(tfrecords) if int(t) in test_ids]
    return train, test


def load_melanoma(
    split: Split,
    root: str | os.PathLike[str] | None = None,
    *,
    size: int | None = 64,
    test_fraction: float = 0.2,
) -> tuple[Tensor, Tensor]:
    """Melanoma ``split`` as (uint8 images [N, 3, size, size], int64 targets [N] in {0, 1}), in CSV row order.

    Args:
        split: ``"train"`` or ``"test"`` (see the module docstring for the tfrecord split).
        root: data root holding ``melanoma/``; default :func:`~fedcomp.datasets.mnist.data_root`.
        size: side of the resized square images; ``None`` keeps the stored size (all images must share it).
        test_fraction: share of the sorted distinct tfrecord ids held out (0.2 in the LibAUC-era loaders).

    Raises:
        FileNotFoundError: ``train.csv`` or an image of the split is missing (one line).
        ValueError: bad arguments, a malformed CSV, or an image that is not a decodable JPEG.
    """
    check_split(split)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"size = {size!r}: must be a positive integer or None (keep the stored size)")
    folder = require_melanoma(root) / MELANOMA_FOLDER
    table = folder / "train.csv"
    names, targets, tfrecords = _read_table(table)
    train, test = melanoma_split(tfrecords, test_fraction)
    rows = train if split == "train" else test
    paths = [folder / "train" / f"{names[i]}.jpg" for i in rows]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"melanoma: {len(missing)} of the {len(paths)} {split} images listed in {table} are missing "
            f"from {folder / 'train'}, e.g. {missing[0].name}"
        )
    images = _decode(paths, size)
    return images, torch.tensor([targets[i] for i in rows], dtype=torch.int64)


def require_melanoma(root: str | os.PathLike[str] | None = None) -> Path:
    """The data root (``root``, default :func:`~fedcomp.datasets.mnist.data_root`), checked to hold
    ``melanoma/train.csv`` without reading it: the one-line ``FileNotFoundError`` :func:`load_melanoma` raises first
    (its images are checked as a split lists them)."""
    root = data_root() if root is None else Path(root).expanduser()
    folder = root / MELANOMA_FOLDER
    if not (folder / "train.csv").is_file():
        raise FileNotFoundError(
            f"melanoma not found: {folder} must hold train.csv (columns {', '.join(MELANOMA_COLUMNS)}) and "
            "train/<image_name>.jpg; place Kaggle's 256 x 256 JPEG version of SIIM-ISIC 2020 there"
        )
    return root


def _read_table(path: Path) -> tuple[list[str], list[int], list[int]]:
    text = read_text(path, f"CSV text with the columns {', '.join(MELANOMA_COLUMNS)}")
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        absent = [c for c in MELANOMA_COLUMNS if c not in (reader.fieldnames or [])]
        if absent:
            raise ValueError(f"melanoma: {path} lacks the column(s) {', '.join(absent)}; it has {reader.fieldnames}")
        names, targets, tfrecords = [], [], []
        for line, row in enumerate(reader, start=2):
            try:
                target, tfrecord = int(row["target"]), int(row["tfrecord"])
            except (TypeError, ValueError):
                raise ValueError(
                    f"melanoma: {path} line {line}: target {row['target']!r} and tfrecord {row['tfrecord']!r} "
                    "must be integers"
                ) from None
            if target not in (0, 1):
                raise ValueError(f"melanoma: {path} line {line}: target = {target}; allowed: 0, 1")
            names.append(row["image_name"])
            targets.append(target)
            tfrecords.append(tfrecord)
    return names, targets, tfrecords


def _decode(paths: list[Path], size: int | None) -> Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    from torchvision.transforms.v2.functional import resize

    images = []
    for path in paths:
        try:
            image = decode_jpeg(read_file(str(path)), mode=ImageReadMode.RGB)
        except RuntimeError:
            raise ValueError(f"melanoma: {path} is not a decodable JPEG") from None
        if size is not None and tuple(image.shape[1:]) != (size, size):
            image = resize(image, [size, size], antialias=True)
        images.append(image)
    if not images:
        side = 0 if size is None else size
        return torch.zeros((0, 3, side, side), dtype=torch.uint8)
    shapes = {tuple(i.shape) for i in images}
    if len(shapes) > 1:
        raise ValueError(f"melanoma: images of {len(shapes)} different sizes; set a size (a config's task.image_size) to resize them to one")
    return torch.stack(images)


def write_melanoma(
    root: str | os.PathLike[str],
    images: Tensor | np.ndarray,
    targets: Sequence[int] | Tensor,
    tfrecords: Sequence[int] | Tensor,
    *,
    quality: int = 95,
) -> Path:
    """Write ``images`` (uint8-valued [n, 3, H, W]) as ``melanoma/train/ISIC_<i>.jpg`` and a ``train.csv``.

    The CSV has the columns ``image_name``, ``target`` and ``tfrecord`` in that order; image names are
    ``ISIC_0000000``, ``ISIC_0000001``, ... in row order. JPEG is lossy: a decoded image matches the input
    only approximately (``quality`` 1..100). Returns the ``melanoma`` folder.
    """
    array = images.detach().cpu().numpy() if isinstance(images, Tensor) else np.asarray(images)
    if array.ndim != 4 or array.shape[1] != 3 or array.shape[0] == 0:
        raise ValueError(f"images of shape {array.shape}: must be [n, 3, H, W] with n >= 1 (channels first)")
    if array.dtype != np.uint8:
        if array.dtype.kind not in "iuf" or not np.all((array >= 0) & (array <= 255) & (array == np.round(array))):
            raise ValueError(f"images of dtype {array.dtype}: values must be integers in 0..255")
        array = array.astype(np.uint8)
    n = array.shape[0]
    target = [int(t) for t in targets]
    record = [int(t) for t in tfrecords]
    if len(target) != n or any(t not in (0, 1) for t in target):
        raise ValueError(f"targets = {target!r}: must be {n} values, each 0 or 1")
    if len(record) != n or any(t < -1 for t in record):
        raise ValueError(f"tfrecords = {record!r}: must be {n} integers >= -1")
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ValueError(f"quality = {quality!r}: must be an integer in 1..100")
    from torchvision.io import encode_jpeg

    folder = Path(root).expanduser() / MELANOMA_FOLDER
    (folder / "train").mkdir(parents=True, exist_ok=True)
    names = [f"ISIC_{i:07d}" for i in range(n)]
    for name, image in zip(names, array):
        data = encode_jpeg(torch.from_numpy(np.ascontiguousarray(image)), quality=quality)
        (folder / "train" / f"{name}.jpg").write_bytes(data.numpy().tobytes())
    tmp = folder / "train.csv.tmp"
    with open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(MELANOMA_COLUMNS)
        writer.writerows(zip(names, target, record))
    os.replace(tmp, folder / "train.csv")
    return folder
