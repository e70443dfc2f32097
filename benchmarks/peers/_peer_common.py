"""What every runner of ``benchmarks/peers.py`` shares: the workload files and the result file.

The harness (``benchmarks/peers.py``) writes one workload as two files and starts a runner with
``--workload SPEC.json --out RESULT.json``:

* ``SPEC.json``: ``data`` (path of the ``.npz``), ``sizes`` (MLP layer widths), ``lr``, ``local_steps``,
  ``batch``, ``clients`` (registered), ``cohort``, ``rounds``, ``workers``, ``seed``;
* ``DATA.npz``: ``init`` (flat float32 initial weights), ``cohorts`` (rounds x cohort client ids),
  ``features`` (rounds x cohort x local_steps*batch x features, float32) and ``labels`` (int64): the
  batches client ``cohorts[r, j]`` trains on in round ``r``, in order, ``batch`` rows per local step.

A runner writes ``RESULT.json`` (``rounds_started_at``: wall-clock time when round 1 began,
``round_ends``: wall-clock time after each round, ``runner_versions``) and ``RESULT.npy`` (the final flat
float32 weights, in ``torch.nn.Sequential.named_parameters`` order).

This module imports only NumPy and PyTorch: Flower's runner imports it from its own virtualenv, where
fedcomp is not installed. PyTorch is imported where it is used: fedcomp's Ray runner measured for its memory
imports none in its driver.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import nn


def one_thread() -> None:
    """One torch thread per process, as the benchmark prescribes for every runner (torch is imported here only if
    the process has imported it already; one that imports it later reads ``OMP_NUM_THREADS``)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def load_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path) as f:
        return dict(json.load(f))


_DATA: dict[str, Any] = {}


def load_data(path: str) -> Any:
    """The workload's arrays, loaded once per process (Flower calls this inside its Ray actors)."""
    if path not in _DATA:
        with np.load(path) as z:
            _DATA[path] = {k: z[k] for k in z.files}
    return _DATA[path]


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """A ReLU MLP with these layer widths (the same layers, in the same order, as fedcomp's task)."""
    from torch import nn

    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def set_flat(module: nn.Module, flat: np.ndarray) -> None:
    """Copy a flat float32 vector into the module's parameters (named_parameters order)."""
    import torch

    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(np.ascontiguousarray(flat[offset:offset + n])).view_as(p))
            offset += n
    if offset != flat.size:
        raise ValueError(f"flat vector has {flat.size} values, the model {offset}")


def get_flat(module: nn.Module) -> np.ndarray:
    import torch

    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).float().numpy().copy()


def batches(data: Any, round_index: int, slot: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The local-step batches of cohort slot ``slot`` in round ``round_index`` (0-based), in order."""
    import torch

    x = torch.from_numpy(data["features"][round_index, slot])
    y = torch.from_numpy(data["labels"][round_index, slot])
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, x.shape[0], batch)]


class Clock:
    """Wall-clock marks the harness turns into start-up and per-round times."""

    def __init__(self) -> None:
        self.rounds_started_at: float | None = None
        self.round_ends: list[float] = []

    def start(self) -> None:
        if self.rounds_started_at is None:
            self.rounds_started_at = time.time()

    def end_round(self) -> None:
        self.round_ends.append(time.time())


def write_result(out: str | os.PathLike[str], clock: Clock, final: np.ndarray, versions: dict[str, str]) -> None:
    out = Path(out)
    np.save(out.with_suffix(".npy"), np.asarray(final, dtype=np.float32))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({
        "rounds_started_at": clock.rounds_started_at,
        "round_ends": clock.round_ends,
        "runner_versions": versions,
    }))
    tmp.replace(out)
