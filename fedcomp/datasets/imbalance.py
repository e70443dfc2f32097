"""Binary imbalanced constructions (E3, E10, E11) and the positives-first batch draw.

Every function here is a pure function of its arguments; the random ones draw from one
``torch.Generator().manual_seed(seed)`` of their own (or the generator they are given), never from global
state. Index results are int64 positions, ascending, so they compose with :mod:`fedcomp.datasets.partition`
(``subset[part]``) and with the loaders' arrays (``images[kept]``).

The two published ways of making a binary problem imbalanced (EXPERIMENTS.md §7.1):

* :func:`ratio_keep` — LocalSCGDAM (E10, E11) and LibAUC's ``ImbalancedDataGenerator``: keep every
  negative and exactly ``floor(r / (1 - r) * n_neg)`` randomly chosen positives, so positives / all ~ r.
  Derived sizes at r = 0.1: CIFAR-10/100 25,000 + 2,777; STL10 2,500 + 277; FashionMNIST 30,000 + 3,333.
  LibAUC shuffles with the global NumPy RNG; here the choice comes from ``seed``, so the counts match
  LibAUC but the chosen rows do not.
* :func:`drop_positives` — FCSG's AUPRC experiment (E3, following ``xidongwu/D-AUPRC``): every positive
  *class* keeps ``int(keep_fraction * n_c)`` randomly chosen rows (keep_fraction 0.2 = "80 % of the
  positives removed"); MNIST keeps 5,879 positives.

Which classes are positive differs between the sources (:func:`positive_classes`): the LocalSCGDAM paper
makes the first half of the classes positive, LibAUC and the FCSG AUPRC experiment the second half.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from fedcomp.datasets.checks import check_seed, class_labels, seeded

__all__ = ["POSITIVE_RULES", "binarize", "drop_positives", "positive_classes", "positives_first", "ratio_keep"]

PositiveRule = Literal["first-half", "second-half"]
POSITIVE_RULES: tuple[str, ...] = ("first-half", "second-half")
"""``"first-half"``: classes 0..C/2-1 positive (LocalSCGDAM paper, E10); ``"second-half"``: C/2..C-1
(LibAUC's ``ImbalancedDataGenerator`` and the FCSG AUPRC experiment, E3)."""


def positive_classes(classes: int, rule: PositiveRule) -> tuple[int, ...]:
    """The class ids that become label 1 under ``rule`` for ``classes`` classes.

    The split point is ``classes // 2`` (LibAUC's rule for an odd count too): ``"first-half"`` gives
    ``0..classes//2 - 1``, ``"second-half"`` gives ``classes//2..classes - 1``; e.g. 0-4 and 5-9 for 10.
    """
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
        raise ValueError(f"classes = {classes!r}: must be an integer >= 2")
    half = classes // 2
    if rule == "first-half":
        return tuple(range(half))
    if rule == "second-half":
        return tuple(range(half, classes))
    raise ValueError(f"rule = {rule!r}: allowed: {', '.join(map(repr, POSITIVE_RULES))}")


def binarize(labels: Tensor | Sequence[int], positives: Sequence[int]) -> Tensor:
    """int64 0/1 labels: 1 where the class id is in ``positives``, else 0."""
    labels = class_labels(labels)
    return torch.isin(labels, _positive_tensor(positives)).long()


def ratio_keep(binary: Tensor | Sequence[int], ratio: float, seed: int) -> Tensor:
    """Sorted indices kept when every negative stays and ``floor(ratio / (1 - ratio) * n_neg)`` positives do.

    The positives kept are a uniformly random subset (without replacement) drawn from
    ``torch.Generator().manual_seed(seed)``. ``ratio`` is in (0, 0.5], as LibAUC's generator asserts; the
    product is rounded to 9 decimals before the floor so that exact cases (r = 0.2: n_neg / 4) are not
    lost to floating-point error.

    Raises:
        ValueError: ``binary`` is not a 1-D 0/1 vector, ``ratio`` is outside (0, 0.5], the rule keeps no
            positive, or fewer positives exist than the rule needs.
    """
    binary = _binary_labels(binary)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 0.5:
        raise ValueError(f"ratio = {ratio!r}: must be a number in (0, 0.5] (the positive share of the training part)")
    check_seed(seed)
    negatives = torch.nonzero(binary == 0).flatten()
    positives = torch.nonzero(binary == 1).flatten()
    needed = math.floor(round(ratio / (1 - ratio) * negatives.numel(), 9))
    if needed < 1:
        raise ValueError(
            f"ratio = {ratio!r}: floor(ratio / (1 - ratio) * {negatives.numel()} negatives) keeps no positive; "
            "raise ratio or use more negatives"
        )
    if needed > positives.numel():
        raise ValueError(
            f"ratio = {ratio!r}: needs {needed} positives next to {negatives.numel()} negatives, "
            f"but only {positives.numel()} are available"
        )
    chosen = positives[torch.randperm(positives.numel(), generator=seeded(seed))[:needed]]
    return torch.sort(torch.cat([negatives, chosen])).values


def drop_positives(
    labels: Tensor | Sequence[int], positives: Sequence[int], keep_fraction: float, seed: int
) -> Tensor:
    """Sorted indices kept when each positive class keeps ``int(keep_fraction * n_c)`` random rows.

    Negatives (classes not in ``positives``) are all kept. The positive classes draw, in ascending class
    order, from one ``torch.Generator().manual_seed(seed)``. ``keep_fraction * n_c`` is rounded to 9
    decimals before truncation (``0.2 * 6265`` is 1253, not 1252.99...). With MNIST's training counts and
    positives 5-9 at 0.2 this keeps 1084 + 1183 + 1253 + 1170 + 1189 = 5,879 positives (EXPERIMENTS.md E3).
    """
    labels = class_labels(labels)
    wanted = _positive_tensor(positives)
    if isinstance(keep_fraction, bool) or not isinstance(keep_fraction, (int, float)) or not 0 < keep_fraction <= 1:
        raise ValueError(f"keep_fraction = {keep_fraction!r}: must be a number in (0, 1]")
    check_seed(seed)
    gen = seeded(seed)
    keep = ~torch.isin(labels, wanted)
    for c in torch.unique(wanted).tolist():
        members = torch.nonzero(labels == c).flatten()
        k = math.floor(round(keep_fraction * members.numel(), 9))
        keep[members[torch.randperm(members.numel(), generator=gen)[:k]]] = True
    return torch.nonzero(keep).flatten()


def positives_first(pos: Tensor, neg: Tensor, size: int, positives: int, gen: torch.Generator) -> Tensor:
    """One batch of ``size`` indices: ``positives`` drawn from ``pos`` first, then ``size - positives`` from ``neg``.

    The fixed positive count and the positives-first order are D-AUPRC's ``AUPRCSampler`` (a loss may take
    the first ``positives`` scores as the positives) and LibAUC's ``DualSampler`` share. Within one batch
    each part is drawn without replacement when its pool holds at least that many indices, and with
    replacement otherwise (a pool smaller than its share, e.g. a client with 3 positives and 4 per batch).
    The batches are independent draws, not an epoch over the pools (the samplers' cyclic oversampling is
    not reproduced) [inferred: both give every index the same chance per batch].

    Args:
        pos: 1-D integer indices of the positive rows (any index space; the values are returned).
        neg: 1-D integer indices of the negative rows.
        size: batch size, >= 1.
        positives: how many positives, 0..size.
        gen: the generator to draw from (the caller's per-step generator).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size = {size!r}: must be a positive integer")
    if isinstance(positives, bool) or not isinstance(positives, int) or not 0 <= positives <= size:
        raise ValueError(f"positives = {positives!r}: must be an integer in 0..size = 0..{size}")
    pos, neg = _index_pool("pos", pos), _index_pool("neg", neg)
    parts = []
    for name, pool, count in (("pos", pos, positives), ("neg", neg, size - positives)):
        if count == 0:
            continue
        if pool.numel() == 0:
            raise ValueError(f"{name}: empty, but the batch needs {count} of its rows")
        if pool.numel() >= count:
            picks = torch.randperm(pool.numel(), generator=gen)[:count]
        else:
            picks = torch.randint(pool.numel(), (count,), generator=gen)
        parts.append(pool[picks])
    return torch.cat(parts)








def _binary_labels(binary: Tensor | Sequence[int]) -> Tensor:
    binary = torch.as_tensor(binary)
    if binary.dtype == torch.bool:
        binary = binary.long()
    binary = class_labels(binary)
    if int(binary.max()) > 1:
        raise ValueError(f"binary: must hold only 0 and 1, got values up to {int(binary.max())}")
    return binary


def _positive_tensor(positives: Sequence[int]) -> Tensor:
    try:
        values = [int(c) for c in positives]
    except (TypeError, ValueError):
        raise ValueError(f"positives = {positives!r}: must be a sequence of class ids") from None
    if not values or min(values) < 0:
        raise ValueError(f"positives = {positives!r}: must be a non-empty sequence of non-negative class ids")
    return torch.tensor(values, dtype=torch.int64)


def _index_pool(name: str, pool: Tensor) -> Tensor:
    pool = torch.as_tensor(pool)
    if pool.ndim != 1 or pool.is_floating_point() or pool.is_complex() or pool.dtype == torch.bool:
        raise ValueError(f"{name} of shape {tuple(pool.shape)} and dtype {pool.dtype}: must be a 1-D integer tensor")
    return pool.long()
