"""Multilayer perceptrons (the tasks' small models)."""

from __future__ import annotations

from itertools import pairwise

from torch import nn


def mlp(sizes: list[int]) -> nn.Sequential:
    """A ReLU multilayer perceptron with the given layer widths."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
