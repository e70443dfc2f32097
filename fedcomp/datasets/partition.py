"""Client partitioners: pure functions of (labels or size, number of clients, seed).

Each draws from its own ``torch.Generator`` seeded with ``seed`` (never the global RNG), so the same
arguments give the same partition anywhere. Results are int64 tensors of positions into the array
described by ``n`` or ``labels``; map them through an index tensor when partitioning a subset (for
example ``subset[part]`` after ``label_shards(labels[subset], ...)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, overload

import torch
from torch import Tensor

from fedcomp.datasets.checks import check_seed, class_labels, seeded
from fedcomp.datasets.synthetic import dirichlet as _dirichlet_draw

__all__ = ["dirichlet", "iid", "label_shards", "stratified", "stride", "train_val_split"]


def iid(
    n: int, clients: int, per_client: int | None, seed: int, remainder: Literal["drop", "spread"] = "drop"
) -> list[Tensor]:
    """Disjoint uniformly random index sets of ``per_client`` each (``None``: ``n // clients``); the rest is unused,
    or, with ``remainder="spread"`` and ``per_client=None``, every example is used: the first ``n % clients``
    clients get one more (consecutive pieces of the same permutation)."""
    _check_int("n", n, 1)
    _check_int("clients", clients, 1)
    check_seed(seed)
    if remainder not in ("drop", "spread"):
        raise ValueError(f"remainder = {remainder!r}: allowed: 'drop', 'spread'")
    if remainder == "spread" and per_client is None:
        if clients > n:
            raise ValueError(f"clients = {clients}: must be at most n = {n} for an equal split")
        sizes = [n // clients + (1 if k < n % clients else 0) for k in range(clients)]
        return list(torch.randperm(n, generator=seeded(seed)).split(sizes))
    if per_client is None:
        per_client = n // clients
        if per_client == 0:
            raise ValueError(f"clients = {clients}: must be at most n = {n} for an equal split")
    _check_int("per_client", per_client, 1)
    if clients > n:
        raise ValueError(f"clients = {clients}: more than the n = {n} examples; at most {n} allowed")
    if clients * per_client > n:
        raise ValueError(
            f"per_client = {per_client}: clients * per_client = {clients * per_client} exceeds n = {n}; "
            f"allowed: at most {n // clients}"
        )
    perm = torch.randperm(n, generator=seeded(seed))
    return list(perm[: clients * per_client].view(clients, per_client).unbind(0))


def label_shards(
    labels: Tensor | Sequence[int], clients: int, shards_per_client: int, shard_size: int, seed: int
) -> list[Tensor]:
    """McMahan et al.'s non-iid split: stable-sort by label, cut into shards, deal random shards to clients.

    Only the ``n // shard_size`` complete shards are dealt; each client gets ``shards_per_client`` of them,
    chosen at random without replacement, so the data beyond ``clients * shards_per_client`` shards is
    unused (as in FedNest's long-tail code, where 14,818 images make 200 shards of 74).
    """
    labels = class_labels(labels)
    _check_int("clients", clients, 1)
    _check_int("shards_per_client", shards_per_client, 1)
    _check_int("shard_size", shard_size, 1)
    check_seed(seed)
    n, needed = labels.numel(), clients * shards_per_client
    if needed * shard_size > n:
        raise ValueError(
            f"shard_size = {shard_size}: clients * shards_per_client * shard_size = {needed * shard_size} "
            f"exceeds the {n} examples; allowed: at most {n // needed}"
        )
    order = torch.sort(labels, stable=True).indices
    shards = order[: (n // shard_size) * shard_size].view(-1, shard_size)
    picked = torch.randperm(shards.shape[0], generator=seeded(seed))[:needed]
    return list(shards[picked].view(clients, shards_per_client * shard_size).unbind(0))


def dirichlet(
    labels: Tensor | Sequence[int], clients: int, alpha: float, seed: int, *, min_size: int = 0
) -> list[Tensor]:
    """Label-skew partition: each class is shared among clients in proportions drawn from Dirichlet(alpha).

    Every index goes to exactly one client. With ``min_size > 0`` the draw is repeated (from the same
    generator) until every client holds at least ``min_size`` examples, as in NIID-Bench.
    """
    labels = class_labels(labels)
    _check_int("clients", clients, 1)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha = {alpha!r}: must be a positive finite number")
    _check_int("min_size", min_size, 0)
    check_seed(seed)
    if clients * min_size > labels.numel():
        raise ValueError(
            f"min_size = {min_size}: clients * min_size exceeds the {labels.numel()} examples; "
            f"allowed: at most {labels.numel() // clients}"
        )
    gen = seeded(seed)
    classes = [torch.nonzero(labels == c).flatten() for c in torch.unique(labels).tolist()]
    for _ in range(1000):
        parts: list[list[Tensor]] = [[] for _ in range(clients)]
        for members in classes:
            members = members[torch.randperm(members.numel(), generator=gen)]
            share = _dirichlet_draw(float(alpha), clients, gen).double()
            cuts = torch.floor(torch.cumsum(share, 0) * members.numel()).long().clamp(max=members.numel())
            cuts[-1] = members.numel()
            for client, chunk in enumerate(torch.tensor_split(members, cuts[:-1])):
                parts[client].append(chunk)
        result = [torch.cat(p) for p in parts]
        if min(p.numel() for p in result) >= min_size:
            return result
    raise ValueError(f"min_size = {min_size}: not reached in 1000 Dirichlet({alpha}) draws; lower it or raise alpha")


def stratified(labels: Tensor | Sequence[int], clients: int, seed: int) -> list[Tensor]:
    """An iid equal split with exact class balance: each class shuffled and dealt round-robin to the clients.

    Classes are dealt in ascending order, and each class's deal starts at the client after the one that
    received the previous class's last row, so every client holds floor or ceil of n_c / clients rows of
    every class c *and* the client sizes differ by at most one. Every index goes to exactly one client; each
    client's indices come back in ascending (dataset) order. This is EXPERIMENTS.md §7.2's "iid equal" split
    made exactly stratified (the default for E3 and E10). As index sets it equals :func:`stride` with the same
    seed (both deal the shuffled, class-ordered rows round-robin); only the order within a client differs.
    """
    return [torch.sort(part).values for part in stride(labels, clients, seed)]


def stride(labels: Tensor | Sequence[int], clients: int, seed: int) -> list[Tensor]:
    """D-AUPRC's split (E3 option, ``dist_data.py``): shuffle each class, concatenate in class order, deal by stride.

    Each class's rows are permuted by ``torch.Generator().manual_seed(seed)`` (classes in ascending order,
    one generator), the permuted classes are concatenated, and client r gets rows r, r + N, r + 2N, ... of
    that array (N = ``clients``), in that order. D-AUPRC shuffles with NumPy, so the sizes and class counts
    match its code but the chosen rows do not.
    """
    labels = class_labels(labels)
    _check_int("clients", clients, 1)
    check_seed(seed)
    if clients > labels.numel():
        raise ValueError(f"clients = {clients}: must be at most the {labels.numel()} examples")
    gen = seeded(seed)
    ordered = []
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).flatten()
        ordered.append(members[torch.randperm(members.numel(), generator=gen)])
    rows = torch.cat(ordered)
    return [rows[r::clients].clone() for r in range(clients)]


@overload
def train_val_split(indices: Tensor, fraction_train: float, seed: int) -> tuple[Tensor, Tensor]: ...
@overload
def train_val_split(
    indices: Sequence[Tensor], fraction_train: float, seed: int
) -> tuple[list[Tensor], list[Tensor]]: ...
def train_val_split(
    indices: Tensor | Sequence[Tensor], fraction_train: float, seed: int
) -> tuple[Tensor, Tensor] | tuple[list[Tensor], list[Tensor]]:
    """Random local train/validation split of each client's indices (FedNest uses 0.5 and 0.8).

    The validation part has ``ceil(n * (1 - fraction_train))`` examples, as in FedNest's code (148 -> 118/30).
    Given a list of per-client tensors, returns a list of train and a list of validation tensors, drawing
    all clients from one generator so that equal-sized clients do not share one permutation.
    """
    if isinstance(fraction_train, bool) or not isinstance(fraction_train, (int, float)) or not 0 < fraction_train < 1:
        raise ValueError(f"fraction_train = {fraction_train!r}: must be a number strictly between 0 and 1")
    check_seed(seed)
    gen = seeded(seed)
    if isinstance(indices, Tensor):
        return _split_one(_index_tensor(indices), fraction_train, gen)
    pairs = [_split_one(_index_tensor(part), fraction_train, gen) for part in indices]
    return [t for t, _ in pairs], [v for _, v in pairs]


def _split_one(indices: Tensor, fraction_train: float, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    n = indices.numel()
    n_val = min(n, math.ceil(round(n * (1 - fraction_train), 9)))
    shuffled = indices[torch.randperm(n, generator=gen)]
    return shuffled[: n - n_val], shuffled[n - n_val :]




def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ValueError(f"{name} = {value!r}: must be {kind}")






def _index_tensor(indices: Tensor) -> Tensor:
    indices = torch.as_tensor(indices)
    if indices.ndim != 1 or indices.is_floating_point() or indices.dtype == torch.bool:
        raise ValueError(
            f"indices of shape {tuple(indices.shape)} and dtype {indices.dtype}: must be a 1-D integer tensor"
        )
    return indices.long()
