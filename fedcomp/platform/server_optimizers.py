"""Server optimisers: transforms of the round's averaged update, as in Reddi et al., "Adaptive Federated
Optimization" (ICLR 2021), Algorithm 2 (FedOpt).

The round's pseudo-gradient is Delta = x - <x_i> (the model minus the cohort mean of the clients' models);
plain FedAvg takes x <- <x_i>, i.e. x - Delta. A server optimiser replaces that step:

* :class:`Momentum` (FedAvgM; Hsu, Qi, Brown 2019):  m <- beta m + Delta;  x <- x - eta m
* :class:`Adam` (FedAdam; Reddi et al. 2021):  m <- b1 m + (1 - b1) Delta;  v <- b2 v + (1 - b2) Delta^2;
  x <- x - eta m / (sqrt(v) + tau)   (the paper's form: no bias correction; tau sets the adaptivity)

An optimiser's record is the server's whole state: the model x and the optimiser's moments (FedAvgM's server is
:class:`MomentumServer`, FedAdam's :class:`AdamServer`), so a round is ``server = optimizer.step(server, Delta)``
and a checkpoint holds x beside the moments. Nothing here knows about clients or the federation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
from torch import Tensor

from fedcomp.platform.state import Model

S = TypeVar("S", bound=Model)


class ServerOptimizer(ABC, Generic[S]):
    """``init(x)`` -> the server's record at x; ``step(server, delta)`` -> the next record."""

    @abstractmethod
    def init(self, x: Tensor) -> S: ...

    @abstractmethod
    def step(self, server: S, delta: Tensor) -> S: ...


@dataclass(frozen=True)
class MomentumServer(Model):
    m: Tensor


@dataclass(frozen=True)
class AdamServer(MomentumServer):
    v: Tensor


@dataclass(frozen=True)
class Momentum(ServerOptimizer[MomentumServer]):
    """Heavy-ball momentum on the pseudo-gradient (FedAvgM)."""

    lr: float
    beta: float

    def init(self, x: Tensor) -> MomentumServer:
        return MomentumServer(x=x, m=torch.zeros_like(x))

    def step(self, server: MomentumServer, delta: Tensor) -> MomentumServer:
        m = self.beta * server.m + delta
        return MomentumServer(x=server.x - self.lr * m, m=m)


@dataclass(frozen=True)
class Adam(ServerOptimizer[AdamServer]):
    """Adam on the pseudo-gradient without bias correction (FedAdam)."""

    lr: float
    beta1: float
    beta2: float
    tau: float

    def init(self, x: Tensor) -> AdamServer:
        return AdamServer(x=x, m=torch.zeros_like(x), v=torch.zeros_like(x))

    def step(self, server: AdamServer, delta: Tensor) -> AdamServer:
        m = self.beta1 * server.m + (1 - self.beta1) * delta
        v = self.beta2 * server.v + (1 - self.beta2) * delta * delta
        return AdamServer(x=server.x - self.lr * m / (v.sqrt() + self.tau), m=m, v=v)
