"""FCSG, FCSG-M and Acc-FCSG-M -- "Federated Conditional Stochastic Optimization" (Wu et al., NeurIPS 2023),
Algorithms 1 and 2, as restated in ``reference/ALGORITHMS.md`` section 4.

The paper writes a step as "move x by -alpha*u, communicate every q steps, then draw a batch at the new
point and update u". We cut the same sequence of operations one half-step later: a local step here is
"draw a batch at x and update u, then move x <- x - alpha*u", and the server averages after every q-th
move. The two are the same sequence of operations, so every iterate and every average is the paper's:

* the first estimate (global step 0) averages ``first_batch`` (B) outer samples; later steps use b;
* FCSG: u = G (so u need not be kept or averaged -- the paper averages it but overwrites it at once);
* FCSG-M: u = (1 - beta) u + beta G; x and u are averaged;
* Acc-FCSG-M: u = G(x) + (1 - beta)(u - G(x_prev)) with both G on the same outer *and* inner samples,
  x_prev = the point of the client's previous estimate, kept locally and never averaged; x and u averaged.

G is the gradient of the empirical nested objective f_xi(mean_j g_{eta_j}(x, xi)) (biased, O(1/m)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedcomp.platform.algorithms import builtins
from fedcomp.platform.algorithms.base import LocalSteps, Tensors, grad_and_loss, grad_and_loss_pieces
from fedcomp.platform.algorithms.builtins import FCSGHParams, FCSGMHParams
from fedcomp.platform.algorithms.steps import descend, descend_, sgd_step, sgd_step_
from fedcomp.platform.kinds import CONDITIONAL
from fedcomp.platform.problems import ConditionalProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import Model, State


@dataclass(frozen=True)
class ModelMomentum(State):
    x: Tensor
    u: Tensor


@dataclass(frozen=True)
class AccClient(ModelMomentum):
    x_prev: Tensor
    """The point of the client's previous estimate (kept locally, never averaged)."""


class _FCSGBase(LocalSteps[Any, Any]):
    kind = CONDITIONAL
    hp: FCSGHParams

    def draw(self, problem: ConditionalProblem, client: int, step: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        n = self.hp.first_batch if step == 0 else self.hp.outer_batch
        outer = problem.sample_outer(client, n, gen)
        return (outer, problem.sample_inner(client, outer, self.hp.inner_batch, gen)), n * self.hp.inner_batch


@register_algorithm(builtins.FCSG)
class FCSG(_FCSGBase):
    """u_t = G(x_t); x_{t+1} = x_t - alpha u_t; x averaged every q steps."""

    Client = Server = Model
    mutates = frozenset({"x"})

    def init(self, variables: Tensors) -> Model:
        return Model(x=variables["x"].clone())

    def update(self, problem: ConditionalProblem, state: Model, batch: tuple[Any, ...], step: int) -> tuple[Model, Tensor]:
        x, loss = sgd_step(problem, state.x, batch, self.hp.lr)
        return Model(x=x), loss

    def update_(self, problem: ConditionalProblem, state: Model, batch: tuple[Any, ...], step: int) -> tuple[Model, Tensor]:
        return state, sgd_step_(problem, state.x, batch, self.hp.lr)


@register_algorithm(builtins.FCSG_M)
class FCSGM(_FCSGBase):
    """u_t = (1 - beta) u_{t-1} + beta G(x_t); x_{t+1} = x_t - alpha u_t; x and u averaged every q steps."""

    Client = Server = ModelMomentum
    hp: FCSGMHParams
    mutates = frozenset({"x", "u"})

    def init(self, variables: Tensors) -> ModelMomentum:
        x0 = variables["x"]
        return ModelMomentum(x=x0.clone(), u=torch.zeros_like(x0))

    def update(self, problem: ConditionalProblem, state: ModelMomentum, batch: tuple[Any, ...], step: int) -> tuple[ModelMomentum, Tensor]:
        grad, loss = grad_and_loss(problem, state.x, *batch)
        u = grad if step == 0 else (1 - self.hp.beta) * state.u + self.hp.beta * grad
        return ModelMomentum(x=descend(state.x, u, self.hp.lr), u=u), loss

    def update_(self, problem: ConditionalProblem, state: ModelMomentum, batch: tuple[Any, ...], step: int) -> tuple[ModelMomentum, Tensor]:
        grad, loss = grad_and_loss_pieces(problem, state.x, *batch)
        u = grad.of(state.u)
        if step == 0:
            torch._foreach_copy_(u, grad)
        else:
            torch._foreach_mul_(u, 1 - self.hp.beta)
            torch._foreach_mul_(grad, self.hp.beta)
            torch._foreach_add_(u, grad)
        descend_(grad.of(state.x), u, self.hp.lr)
        return state, loss


@register_algorithm(builtins.ACC_FCSG_M)
class AccFCSGM(_FCSGBase):
    """u_t = G(x_t) + (1 - beta)(u_{t-1} - G(x_{t-1})) on one batch; x, u averaged; x_prev stays local."""

    Client, Server = AccClient, ModelMomentum
    hp: FCSGMHParams
    mutates = frozenset({"x", "u", "x_prev"})

    def init(self, variables: Tensors) -> ModelMomentum:
        x0 = variables["x"]
        return ModelMomentum(x=x0.clone(), u=torch.zeros_like(x0))

    def join(self, broadcast: Tensors) -> AccClient:
        return AccClient(x=broadcast["x"].clone(), u=broadcast["u"].clone(), x_prev=broadcast["x"].clone())

    def draw(self, problem: ConditionalProblem, client: int, step: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        batch, samples = super().draw(problem, client, step, gen)
        return batch, samples if step == 0 else 2 * samples  # evaluated at x and at x_prev

    def update(self, problem: ConditionalProblem, state: AccClient, batch: tuple[Any, ...], step: int) -> tuple[AccClient, Tensor]:
        grad, loss = grad_and_loss(problem, state.x, *batch)
        if step == 0:
            u = grad
        else:
            grad_prev, _ = grad_and_loss(problem, state.x_prev, *batch)
            u = grad + (1 - self.hp.beta) * (state.u - grad_prev)
        return AccClient(x=descend(state.x, u, self.hp.lr), u=u, x_prev=state.x), loss

    def update_(self, problem: ConditionalProblem, state: AccClient, batch: tuple[Any, ...], step: int) -> tuple[AccClient, Tensor]:
        grad, loss = grad_and_loss_pieces(problem, state.x, *batch)
        u = grad.of(state.u)
        if step == 0:
            torch._foreach_copy_(u, grad)
        else:
            grad_prev, _ = grad_and_loss_pieces(problem, state.x_prev, *batch)
            if len(grad_prev) != len(grad):  # cut differently: the model declined the second time (for good)
                grad, grad_prev = grad.flat(), grad_prev.flat()
                u = grad.of(state.u)
            torch._foreach_sub_(u, grad_prev)
            torch._foreach_mul_(u, 1 - self.hp.beta)
            torch._foreach_add_(u, grad)
        state.x_prev.copy_(state.x)
        descend_(grad.of(state.x), grad.of(state.u), self.hp.lr)
        return state, loss
