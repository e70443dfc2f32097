"""Flat-parameter views of ``torch.nn`` models.

Algorithms see a model's parameters as one flat float32 vector (what is averaged and what crosses the
wire); tasks call the model functionally on that vector through :class:`FlatModel`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.func import functional_call


class FlatModel:
    """Calls ``module`` with parameters taken from a flat vector (views, no copies)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.dim = sum(self.sizes)

    def unflatten(self, x: Tensor) -> dict[str, Tensor]:
        return {n: v.view(s) for n, v, s in zip(self.names, x.split(self.sizes), self.shapes)}

    def flatten(self) -> Tensor:
        """The module's current parameters as a new flat float32 vector."""
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).float()

    def __call__(self, x: Tensor, *inputs: Tensor) -> Tensor:
        return functional_call(self.module, self.unflatten(x), inputs)
