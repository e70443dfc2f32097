"""FedAvg (McMahan et al., 2017) and its server-optimiser variants FedAvgM (Hsu, Qi, Brown 2019) and FedAdam
(Reddi et al., ICLR 2021, Algorithm 2): local SGD on the client's loss, then the server moves the model.

    every cohort client, q steps:  x_i <- x_i - lr grad l_i(x_i; batch)
    FedAvg:                        x <- <x_i>
    FedAvgM / FedAdam:             Delta = x - <x_i>;  (x, moments) <- server_optimizer.step((x, moments), Delta)

The server optimisers are transforms of the averaged update (:mod:`fedcomp.platform.server_optimizers`);
the server's typed state is the optimiser's record (the model and its moments), checkpointed as it is.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import LocalSteps, Tensors
from fedcomp.platform.algorithms.builtins import FEDADAM, FEDAVG, FEDAVGM, FedAdamHParams, FedAvgHParams, FedAvgMHParams
from fedcomp.platform.algorithms.steps import sgd_step, sgd_step_
from fedcomp.platform.problems import PlainProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.server_optimizers import Adam, AdamServer, Momentum, MomentumServer, ServerOptimizer
from fedcomp.platform.state import Model, State

__all__ = ["FedAdam", "FedAdamHParams", "FedAvg", "FedAvgHParams", "FedAvgM", "FedAvgMHParams"]


@register_algorithm(FEDAVG)
class FedAvg(LocalSteps[Model, State]):
    """x <- x - lr * grad l(x; batch) for q steps on each client; then x <- mean over the cohort."""

    Client = Model
    Server: ClassVar[type[State]] = Model
    mutates = frozenset({"x"})

    def init(self, variables: Tensors) -> State:
        return Model(x=variables["x"].clone())

    def draw(self, problem: PlainProblem, client: int, step: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        return (problem.sample_batch(client, self.hp.outer_batch, gen),), self.hp.outer_batch

    def update(self, problem: PlainProblem, state: Model, batch: tuple[Any, ...], step: int) -> tuple[Model, Tensor]:
        x, loss = sgd_step(problem, state.x, batch, self.hp.lr)
        return Model(x=x), loss

    def update_(self, problem: PlainProblem, state: Model, batch: tuple[Any, ...], step: int) -> tuple[Model, Tensor]:
        return state, sgd_step_(problem, state.x, batch, self.hp.lr)


class _ServerOptimized(FedAvg):
    """FedAvg whose server applies ``optimizer`` to the pseudo-gradient x - <x_i> (FedOpt)."""

    optimizer: ServerOptimizer[Model]

    def init(self, variables: Tensors) -> Model:
        return self.optimizer.init(variables["x"].clone())

    def round(self, fed: Round, server: Model) -> Model:  # type: ignore[override]
        mean = fed.local_steps({"x": server.x}, self.hp.local_steps)
        return self.optimizer.step(server, server.x - mean.x)


@register_algorithm(FEDAVGM)
class FedAvgM(_ServerOptimized):
    """FedAvg whose server takes a momentum step: m <- beta m + (x - <x_i>), x <- x - eta m."""

    Server = MomentumServer

    @property
    def optimizer(self) -> Momentum:  # type: ignore[override]
        return Momentum(self.hp.server_lr, self.hp.server_momentum)


@register_algorithm(FEDADAM)
class FedAdam(_ServerOptimized):
    """FedAvg whose server takes an Adam step (no bias correction) on the pseudo-gradient x - <x_i>."""

    Server = AdamServer

    @property
    def optimizer(self) -> Adam:  # type: ignore[override]
        return Adam(self.hp.server_lr, self.hp.server_beta1, self.hp.server_beta2, self.hp.server_tau)
