"""Argument checks and the seeded generator shared by the dataset builders (one clear ValueError each)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor


def seeded(seed: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed = {seed!r}: must be a non-negative integer")


def class_labels(labels: Tensor | Sequence[int]) -> Tensor:
    """``labels`` as an int64 tensor, checked to be a non-empty 1-D vector of non-negative class ids."""
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.numel() == 0 or labels.is_floating_point() or labels.is_complex():
        raise ValueError(
            f"labels of shape {tuple(labels.shape)} and dtype {labels.dtype}: must be a non-empty 1-D integer tensor"
        )
    if labels.dtype == torch.bool or int(labels.min()) < 0:
        raise ValueError("labels: must be non-negative integer class ids")
    return labels.long()


def check_split(split: object) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split = {split!r}: allowed: 'train', 'test'")


def require_files(name: str, folder: Path, files: Sequence[str], hint: str) -> None:
    """One-line ``FileNotFoundError`` naming the folder and the files it lacks (the loaders' first check, so that
    torchvision's download hint never shows)."""
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{name} not found: {folder} must hold {', '.join(files)} "
            f"({'none is there' if len(missing) == len(files) else 'missing: ' + ', '.join(missing)}); {hint}"
        )
