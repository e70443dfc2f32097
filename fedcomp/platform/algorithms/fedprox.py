"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020) -- the LocalSCGDAM paper's extra
baseline A23, in its standard form (``reference/ALGORITHMS.md`` section 9.8).

Each cohort client starts from the broadcast model w_g and takes p SGD steps on its proximal objective

    h_i(w) = f_i(w) + (mu / 2) ||w - w_g||^2,    w = w - lr (grad f_i(w; batch) + mu (w - w_g)),

then the server averages w. The proximal term's gradient is added in closed form, so with mu = 0 every
step is FedAvg's, bit for bit. mu is **[unknown]** for the LocalSCGDAM paper's runs; 0.01 is one of the
values the FedProx paper tried, and only that. The reported training loss is f_i's (the task's loss, as
for the other baselines), not h_i's. The round's w_g is the client state's round-local ``anchor`` (set when
the client's program starts, not kept afterwards), so clients keep no private state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import LocalSteps, Tensors, grad_and_loss, grad_and_loss_factors
from fedcomp.platform.algorithms.builtins import FEDPROX, FedProxHParams
from fedcomp.platform.algorithms.steps import descend, descend_
from fedcomp.platform.problems import PlainProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import Model

__all__ = ["FedProx", "FedProxHParams"]


@dataclass(frozen=True)
class ProxClient(Model):
    anchor: Tensor
    """w_g, the global model the round started from (round-local: set when the client's program starts)."""


@register_algorithm(FEDPROX)
class FedProx(LocalSteps[ProxClient, Model]):
    """p SGD steps on f_i(w) + (mu/2)||w - w_g||^2 from the broadcast w_g; then w averaged."""

    Client, Server = ProxClient, Model
    round_local = frozenset({"anchor"})
    mutates = frozenset({"x"})

    def init(self, variables: Tensors) -> Model:
        return Model(x=variables["x"].clone())

    def begin(self, state: Tensors) -> Tensors:
        return {**state, "anchor": state["x"]}

    def draw(self, problem: PlainProblem, client: int, step: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        return (problem.sample_batch(client, self.hp.outer_batch, gen),), self.hp.outer_batch

    def update(self, problem: PlainProblem, state: ProxClient, batch: tuple[Any, ...], step: int) -> tuple[ProxClient, Tensor]:
        grad, loss = grad_and_loss(problem, state.x, *batch)
        return state.replace(x=descend(state.x, grad + self.hp.mu * (state.x - state.anchor), self.hp.lr)), loss

    def update_(self, problem: PlainProblem, state: ProxClient, batch: tuple[Any, ...], step: int) -> tuple[ProxClient, Tensor]:
        grad, loss = grad_and_loss_factors(problem, state.x, *batch)
        x = grad.whole(state.x)
        direction = list(torch._foreach_sub(x, grad.whole(state.anchor)))
        torch._foreach_mul_(direction, self.hp.mu)  # the pull mu (x - anchor), then the loss's gradient added
        torch._foreach_add_(grad.select(direction), grad)
        descend_(x, direction, self.hp.lr)
        grad.add_factors_(state.x, -self.hp.lr)  # under federation.fused_sgd
        return state, loss
