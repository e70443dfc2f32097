"""Server optimisers: transforms of the round's averaged update, as in Reddi et al., "Adaptive Federated
Optimization" (ICLR 2021), Algorithm 2 (FedOpt).

The round's pseudo-gradient is Delta = x - <x_i> (the model minus the cohort mean of the clients' models);
plain FedAvg takes x <- <x_i>, i.e. x - Delta. A server optimiser replaces that step:

* :class:`Momentum` (FedAvgM; Hsu, Qi, Brown 2019):  m <- beta m + Delta;  x <- x - eta m
* :class:`Adam` (FedAdam; Reddi et al. 2021):  m <- b1 m + (1 - b1) Delta;  v <- b2 v + (1 - b2) Delta^2;
  x <- x - eta m / (sqrt(v) + tau)   (the paper's form: no bias correction; tau sets the adaptivity)

Each optimiser's state is a typed record the algorithm keeps in its server state; nothing here knows about
clients or the federation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
from torch import Tensor

from fedcomp.platform.state import State

O = TypeVar("O", bound=State)


class ServerOptimizer(ABC, Generic[O]):
    """``init(x)`` -> the optimiser's state; ``step(x, delta, state)`` -> the new model and state."""

    @abstractmethod
    def init(self, x: Tensor) -> O: ...

    @abstractmethod
    def step(self, x: Tensor, delta: Tensor, state: O) -> tuple[Tensor, O]: ...


@dataclass(frozen=True)
class MomentumState(State):
    m: Tensor


@dataclass(frozen=True)
class AdamState(State):
    m: Tensor
    v: Tensor


@dataclass(frozen=True)
class Momentum(ServerOptimizer[MomentumState]):
    """Heavy-ball momentum on the pseudo-gradient (FedAvgM)."""

    lr: float
    beta: float

    def init(self, x: Tensor) -> MomentumState:
        return MomentumState(m=torch.zeros_like(x))

    def step(self, x: Tensor, delta: Tensor, state: MomentumState) -> tuple[Tensor, MomentumState]:
        m = self.beta * state.m + delta
        return x - self.lr * m, MomentumState(m=m)


@dataclass(frozen=True)
class Adam(ServerOptimizer[AdamState]):
    """Adam on the pseudo-gradient without bias correction (FedAdam)."""

    lr: float
    beta1: float
    beta2: float
    tau: float

    def init(self, x: Tensor) -> AdamState:
        return AdamState(m=torch.zeros_like(x), v=torch.zeros_like(x))

    def step(self, x: Tensor, delta: Tensor, state: AdamState) -> tuple[Tensor, AdamState]:
        m = self.beta1 * state.m + (1 - self.beta1) * delta
        v = self.beta2 * state.v + (1 - self.beta2) * delta * delta
        return x - self.lr * m / (v.sqrt() + self.tau), AdamState(m=m, v=v)
