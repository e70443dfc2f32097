"""CIFAR-10/100 from local files (through torchvision's own loader) and the step-imbalanced CIFAR-ST sets.

* :func:`load_cifar` reads the pickled batches under ``<root>/cifar-10-batches-py`` or
  ``<root>/cifar-100-python`` with ``torchvision.datasets.CIFAR10`` / ``CIFAR100`` and never downloads.
  Images come back as uint8 ``[N, 3, 32, 32]`` (channels first: the layout of the pickled rows and of a
  conv net's input, *not* torchvision's ``[N, 32, 32, 3]`` ``.data``), labels as int64 ``[N]`` (fine labels
  for CIFAR-100).
* torchvision checks the md5 of every file. Files written by :func:`write_cifar_batches` (tests, smoke
  runs) cannot match the published checksums, so ``load_cifar(..., verify_md5=False)`` reads them through
  a subclass whose md5 entries are ``None`` (``check_integrity(path, None)`` then only tests existence;
  EXPERIMENTS.md 9.2, approach 2). The default verifies; nothing else switches the check off.
* :func:`step_imbalance` keeps every example of the full classes and a fixed number of each reduced class;
  :func:`cifar_st` applies it with one of the three published CIFAR-ST constructions (see its docstring).

All index functions are pure functions of (labels, arguments, seed) and return int64 positions in dataset
order, so they compose with :mod:`fedcomp.datasets.partition` (``subset[part]``).
"""

from __future__ import annotations

import functools
import math
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypedDict, cast

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets.checks import check_seed, check_split, class_labels, md5_failure, reading, require_files
from fedcomp.datasets.mnist import data_root

__all__ = [
    "CIFAR_FILES",
    "CIFAR_FOLDERS",
    "CIFAR_ST_RATIOS",
    "cifar_st",
    "load_cifar",
    "require_cifar",
    "step_counts",
    "step_imbalance",
    "write_cifar_batches",
]

Name = Literal["cifar10", "cifar100"]
Split = Literal["train", "test"]
Variant = Literal["recover", "scdro", "ldam"]

CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
"""Folder under the data root that torchvision reads for each dataset."""

class CifarFiles(TypedDict):
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str


CIFAR_FILES: dict[str, CifarFiles] = {
    "cifar10": {
        "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test": ("test_batch",),
        "meta": "batches.meta",
    },
    "cifar100": {"train": ("train",), "test": ("test",), "meta": "meta"},
}
"""File names inside each folder; torchvision wants all of them even when one split is read."""

CIFAR_ST_RATIOS = {"recover": 0.02, "scdro": 0.01, "ldam": 0.01}
"""The ratio each published construction uses by default (EXPERIMENTS.md E8)."""

_CLASSES = {"cifar10": 10, "cifar100": 100}


def load_cifar(
    name: Name, split: Split, root: str | os.PathLike[str] | None = None, *, verify_md5: bool = True
) -> tuple[Tensor, Tensor]:
    """CIFAR ``split`` as (uint8 images [N, 3, 32, 32], int64 labels [N]), read by torchvision's dataset class.

    Args:
        name: ``"cifar10"`` or ``"cifar100"`` (fine labels).
        split: ``"train"`` or ``"test"``.
        root: data root holding ``cifar-10-batches-py`` / ``cifar-100-python``; default :func:`data_root`.
        verify_md5: keep torchvision's md5 check of every file (the default). ``False`` reads through a
            subclass with the md5 entries set to ``None``; use it only for files written by
            :func:`write_cifar_batches`.

    Raises:
        FileNotFoundError: a file of the folder is missing (one line naming the folder and the files).
        ValueError: bad ``name``/``split``, the files fail the md5 check, or a file is empty, cut short, damaged or
            not a batch of this dataset, or holds a label outside its classes (one line naming the file).
    """
    _check_name(name)
    check_split(split)
    if not isinstance(verify_md5, bool):
        raise ValueError(f"verify_md5 = {verify_md5!r}: must be True or False")
    root = require_cifar(name, root)
    folder = root / CIFAR_FOLDERS[name]
    cls = _dataset_class(name, verify_md5)
    try:
        with reading(folder, f"{name}'s python-version batches"):
            dataset = cls(str(root), train=split == "train", download=False)
    except ValueError as error:
        failed = md5_failure(name, folder, error, verify_md5)
        if failed is not None:
            raise failed from None
        _check_files(name, folder, split)  # names the file at fault
        raise
    data, targets = dataset.data, dataset.targets
    classes = _CLASSES[name]
    if (
        data.dtype != np.uint8
        or data.shape[0] != len(targets)
        or any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < classes for t in targets)
    ):
        _check_files(name, folder, split)  # names the file at fault
        raise ValueError(f"{folder}: the {split} batches hold {data.shape[0]} images of {data.dtype} and "
                         f"{len(targets)} labels; expected uint8 images, one label in 0..{classes - 1} each")
    images = torch.from_numpy(np.ascontiguousarray(data.transpose(0, 3, 1, 2)))
    return images, torch.as_tensor(targets, dtype=torch.int64)


def require_cifar(name: Name, root: str | os.PathLike[str] | None = None) -> Path:
    """The data root (``root``, default :func:`data_root`), checked to hold every file of ``name``'s folder
    without reading one: the one-line ``FileNotFoundError`` :func:`load_cifar` raises first."""
    _check_name(name)
    root = data_root() if root is None else Path(root).expanduser()
    files = CIFAR_FILES[name]
    require_files(name, root / CIFAR_FOLDERS[name], [*files["train"], *files["test"], files["meta"]],
                  "extract the python-version archive from https://www.cs.toronto.edu/~kriz/cifar.html into the data root",
                  root)
    return root


def _check_files(name: Name, folder: Path, split: Split) -> None:
    """Read the split's batches and the meta file one by one and raise a one-line ``ValueError`` naming the first
    that is not what torchvision reads: a pickled dict with uint8 rows of 3 x 32 x 32 pixels under ``data`` and one
    class id per row (CIFAR-10 ``labels``, CIFAR-100 ``fine_labels``), and the class names in the meta file. Only
    called once torchvision's reading failed or gave something else, so good files are not read twice."""
    classes = _CLASSES[name]
    label_key = "labels" if name == "cifar10" else "fine_labels"
    names_key = "label_names" if name == "cifar10" else "fine_label_names"
    title = "CIFAR-10" if name == "cifar10" else "CIFAR-100"
    batch = f"a {title} python-version batch (a pickled dict of 'data', uint8 rows of 3072 pixels, and '{label_key}')"
    meta = f"{title}'s python-version meta file (a pickled dict with '{names_key}')"
    files = CIFAR_FILES[name]
    for file, expected in [*((f, batch) for f in files[split]), (files["meta"], meta)]:
        path = folder / file
        with reading(path, expected), open(path, "rb") as fh:
            entry = pickle.load(fh, encoding="latin1")
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: holds a pickled {type(entry).__name__}; expected {expected}")
        absent = [k for k in ((names_key,) if expected is meta else ("data", label_key)) if k not in entry]
        if absent:
            raise ValueError(f"{path}: has no {', '.join(map(repr, absent))} (it has {', '.join(map(repr, entry))}); "
                             f"expected {expected}")
        if expected is meta:
            continue
        data, labels = entry["data"], entry[label_key]
        if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
            what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
            raise ValueError(f"{path}: 'data' holds {what}; expected uint8 rows of 3072 pixels (3 x 32 x 32)")
        values = np.asarray(labels)
        if values.shape != (data.shape[0],) or values.dtype.kind not in "iu":
            raise ValueError(f"{path}: '{label_key}' holds {values.dtype} {values.shape}; expected {data.shape[0]} "
                             "class ids, one per row of 'data'")
        if values.size and not 0 <= int(values.min()) <= int(values.max()) < classes:
            bad = int(values.max()) if int(values.max()) >= classes else int(values.min())
            raise ValueError(f"{path}: '{label_key}' holds the label {bad}; {title} labels are 0..{classes - 1}")


@functools.cache
def _dataset_class(name: str, verify_md5: bool) -> type:
    from torchvision.datasets import CIFAR10, CIFAR100

    base = CIFAR10 if name == "cifar10" else CIFAR100
    if verify_md5:
        return cast(type, base)
    # check_integrity(path, None) tests only that the file exists (torchvision.datasets.utils).
    return type(
        f"Unchecked{base.__name__}",
        (base,),
        {
            "__doc__": f"{base.__name__} with every md5 entry set to None (files are only tested to exist).",
            "train_list": [[f, None] for f, _ in base.train_list],
            "test_list": [[f, None] for f, _ in base.test_list],
            "meta": {**base.meta, "md5": None},
        },
    )


def write_cifar_batches(
    root: str | os.PathLike[str],
    images: Tensor | np.ndarray,
    labels: Tensor | np.ndarray | Sequence[int],
    name: Name,
    split: Split = "train",
) -> Path:
    """Write one split as pickled batches in torchvision's format under ``<root>/<folder>/``; return the folder.

    ``images`` are uint8-valued ``[N, 3, 32, 32]`` (the layout :func:`load_cifar` returns), ``labels`` class
    ids. Each file is a protocol-2 pickle of a dict with ``data`` (uint8 [n, 3072]: the red plane, then
    green, then blue, each row-major 32 x 32), ``labels`` (CIFAR-10) or ``fine_labels`` and
    ``coarse_labels`` (CIFAR-100; coarse = fine // 5 here, a placeholder for the real superclass map),
    ``batch_label`` and ``filenames``. CIFAR-10's training split is cut into five ``data_batch_*`` files
    (``numpy.array_split``). The meta file (``batches.meta`` / ``meta``) is written with placeholder class
    names. Files are replaced atomically. torchvision reads all files of both splits, so write both.
    """
    _check_name(name)
    check_split(split)
    data = _images(images)
    targets = _label_array(labels, data.shape[0], _CLASSES[name])
    folder = Path(root).expanduser() / CIFAR_FOLDERS[name]
    folder.mkdir(parents=True, exist_ok=True)
    files = CIFAR_FILES[name][split]
    rows = data.reshape(data.shape[0], 3 * 32 * 32)
    for i, (file, chunk, chunk_labels) in enumerate(
        zip(files, np.array_split(rows, len(files)), np.array_split(targets, len(files)))
    ):
        entry: dict[str, object] = {
            "batch_label": f"fedcomp generated {split} batch {i + 1} of {len(files)}",
            "data": np.ascontiguousarray(chunk),
            "filenames": [f"generated_{i}_{j}.png" for j in range(chunk.shape[0])],
        }
        if name == "cifar10":
            entry["labels"] = chunk_labels.tolist()
        else:
            entry["fine_labels"] = chunk_labels.tolist()
            entry["coarse_labels"] = (chunk_labels // 5).tolist()
        _atomic_pickle(folder / file, entry)
    classes = _CLASSES[name]
    meta = (
        {"label_names": [f"class_{c}" for c in range(classes)], "num_cases_per_batch": 10000, "num_vis": 3072}
        if name == "cifar10"
        else {
            "fine_label_names": [f"class_{c}" for c in range(classes)],
            "coarse_label_names": [f"superclass_{c}" for c in range(20)],
        }
    )
    _atomic_pickle(folder / CIFAR_FILES[name]["meta"], meta)
    return folder


def step_counts(
    class_sizes: Sequence[int],
    reduced_classes: Sequence[int],
    ratio: float,
    *,
    rule: Literal["tail", "ldam"] = "tail",
) -> list[int]:
    """How many examples of each class a step imbalance keeps (full classes keep all of theirs).

    ``rule="tail"`` (RECOVER and SCDRO code): a reduced class of n_c examples keeps
    ``n_c - floor(n_c * (1 - ratio))``, evaluated in float64 as the code does (= ceil(ratio * n_c) for the
    published sizes and ratios: 100 of 5,000 and 10 of 500 at 0.02; 50 and 5 at 0.01).
    ``rule="ldam"`` (LDAM-style ``IMBALANCECIFAR``, ``imb_type="step"``): ``int(n_max * ratio)`` with n_max
    the largest class size, capped at n_c.
    """
    sizes = [int(s) for s in class_sizes]
    if not sizes or any(s < 0 for s in sizes):
        raise ValueError(f"class_sizes = {list(class_sizes)!r}: must be a non-empty list of non-negative counts")
    _check_ratio(ratio)
    if rule not in ("tail", "ldam"):
        raise ValueError(f"rule = {rule!r}: allowed: 'tail', 'ldam'")
    reduced = _reduced_set(reduced_classes, len(sizes))
    n_max = max(sizes)
    counts = []
    for c, n in enumerate(sizes):
        if c not in reduced:
            counts.append(n)
        elif rule == "tail":
            counts.append(n - math.floor(n * (1 - ratio)))
        else:
            counts.append(min(n, int(n_max * ratio)))
    return counts


def step_imbalance(
    labels: Tensor | Sequence[int],
    reduced_classes: Sequence[int],
    ratio: float,
    *,
    keep: Literal["last", "first", "random"] = "last",
    rule: Literal["tail", "ldam"] = "tail",
    seed: int | None = None,
    num_classes: int | None = None,
) -> Tensor:
    """Indices (ascending, dataset order) of a step-imbalanced subset.

    Every example of a class not in ``reduced_classes`` is kept; a reduced class keeps the number of
    examples given by :func:`step_counts` (``rule``): its ``"last"`` ones in dataset order (RECOVER, SCDRO),
    its ``"first"`` ones, or a uniformly ``"random"`` subset drawn from ``torch.Generator().manual_seed(seed)``
    (``seed`` required then, and only then). ``num_classes`` defaults to ``max(labels) + 1``.
    """
    labels = class_labels(labels)
    if keep not in ("last", "first", "random"):
        raise ValueError(f"keep = {keep!r}: allowed: 'last', 'first', 'random'")
    if keep == "random":
        check_seed(seed)
    elif seed is not None:
        raise ValueError(f"seed = {seed!r}: only used with keep='random'; leave it None for keep={keep!r}")
    classes = int(labels.max()) + 1 if num_classes is None else num_classes
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < int(labels.max()) + 1:
        raise ValueError(
            f"num_classes = {num_classes!r}: must be an integer >= max(labels) + 1 = {int(labels.max()) + 1}"
        )
    sizes = torch.bincount(labels, minlength=classes).tolist()
    counts = step_counts(sizes, reduced_classes, ratio, rule=rule)
    gen = torch.Generator().manual_seed(seed) if keep == "random" and seed is not None else None
    keep_mask = torch.zeros(labels.numel(), dtype=torch.bool)
    for c, (n, k) in enumerate(zip(sizes, counts)):
        members = torch.nonzero(labels == c).flatten()
        if k == n:
            chosen = members
        elif keep == "last":
            chosen = members[n - k :]
        elif keep == "first":
            chosen = members[:k]
        else:
            chosen = members[torch.randperm(n, generator=gen)[:k]]
        keep_mask[chosen] = True
    return torch.nonzero(keep_mask).flatten()


def cifar_st(
    labels: Tensor | Sequence[int],
    ratio: float | None = None,
    *,
    variant: Variant = "recover",
    seed: int = 0,
    num_classes: int | None = None,
) -> Tensor:
    """Training indices of CIFAR10-ST / CIFAR100-ST (FedDRO's E8 data): half of the classes reduced.

    The FedDRO paper cites Qi et al. for these sets but does not say which construction or ratio it used
    (its Appendix B is unavailable). Three published constructions (EXPERIMENTS.md E8, checked against the
    repositories' code):

    * ``"recover"`` (default; ``qiqi-helloworld/RECOVER`` ``dataset.py``, the same group's KL-DRO paper):
      classes ``c < C // 2`` are reduced; each keeps its **last** ``n_c - floor(n_c (1 - r))`` images in
      dataset order; default r = 0.02. Exact counts: CIFAR-10 keeps 100 images in each of classes 0-4 and
      all 5,000 in classes 5-9 (25,500 in total); CIFAR-100 keeps 10 in each of classes 0-49 and 500 in
      classes 50-99 (25,500).
    * ``"scdro"`` (``qiqi-helloworld/SCDRO`` ``mydataset.py``): the same rule on classes ``c >= C // 2``;
      default r = 0.01: CIFAR-10 keeps 5,000 in classes 0-4 and 50 in classes 5-9 (25,250); CIFAR-100 keeps
      500 in classes 0-49 and 5 in classes 50-99 (25,250).
    * ``"ldam"`` (LDAM-style ``IMBALANCECIFAR10/100(imb_type="step")``): classes ``c >= C // 2`` keep
      ``int(n_max r)`` images chosen at random (here from ``torch.Generator().manual_seed(seed)``, so the
      counts match the LDAM code but not its NumPy-drawn indices); default r = 0.01 (same counts as SCDRO).

    ``seed`` is used only by ``"ldam"``. The test set stays the original balanced one.
    """
    if variant not in CIFAR_ST_RATIOS:
        raise ValueError(f"variant = {variant!r}: allowed: {', '.join(map(repr, CIFAR_ST_RATIOS))}")
    labels = class_labels(labels)
    classes = int(labels.max()) + 1 if num_classes is None else num_classes
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
        raise ValueError(f"num_classes = {num_classes!r}: must be an integer >= 2")
    ratio = CIFAR_ST_RATIOS[variant] if ratio is None else ratio
    half = classes // 2
    reduced = range(half) if variant == "recover" else range(half, classes)
    if variant == "ldam":
        return step_imbalance(labels, reduced, ratio, keep="random", rule="ldam", seed=seed, num_classes=classes)
    return step_imbalance(labels, reduced, ratio, keep="last", rule="tail", num_classes=classes)


def _atomic_pickle(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)
    os.replace(tmp, path)


def _images(values: Tensor | np.ndarray) -> np.ndarray:
    array = values.detach().cpu().numpy() if isinstance(values, Tensor) else np.asarray(values)
    if array.ndim != 4 or array.shape[1:] != (3, 32, 32) or array.shape[0] == 0:
        raise ValueError(f"images of shape {array.shape}: must be [N, 3, 32, 32] with N >= 1 (channels first)")
    if array.dtype != np.uint8:
        if array.dtype.kind not in "iuf" or not np.all((array >= 0) & (array <= 255) & (array == np.round(array))):
            raise ValueError(f"images of dtype {array.dtype}: values must be integers in 0..255")
        array = array.astype(np.uint8)
    return np.ascontiguousarray(array)


def _label_array(values: Tensor | np.ndarray | Sequence[int], n: int, classes: int) -> np.ndarray:
    array = values.detach().cpu().numpy() if isinstance(values, Tensor) else np.asarray(values)
    if array.shape != (n,) or array.dtype.kind not in "iu":
        raise ValueError(f"labels of shape {array.shape} and dtype {array.dtype}: must be {n} integers, one per image")
    if array.min() < 0 or array.max() >= classes:
        raise ValueError(f"labels: must be class ids in 0..{classes - 1}, got {int(array.min())}..{int(array.max())}")
    return array.astype(np.int64)


def _reduced_set(reduced_classes: Sequence[int], classes: int) -> set[int]:
    try:
        reduced = {int(c) for c in reduced_classes}
    except (TypeError, ValueError):
        raise ValueError(f"reduced_classes = {reduced_classes!r}: must be a sequence of class ids") from None
    bad = sorted(c for c in reduced if not 0 <= c < classes)
    if bad:
        raise ValueError(f"reduced_classes contains {bad}: allowed class ids are 0..{classes - 1}")
    return reduced


def _check_ratio(ratio: object) -> None:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ValueError(f"ratio = {ratio!r}: must be a number in (0, 1]")


def _check_name(name: object) -> None:
    if name not in CIFAR_FOLDERS:
        raise ValueError(f"name = {name!r}: allowed: 'cifar10', 'cifar100'")

