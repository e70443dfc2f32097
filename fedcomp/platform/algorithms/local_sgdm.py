"""Local SGD with momentum (Yu, Jin, Yang, ICML 2019) -- the LocalSCGDAM paper's baseline A20
(``reference/ALGORITHMS.md`` section 9.5); its Ratio-Loss variant A21 is :mod:`.local_sgdm_rl`.

**LocalSGDM** (``local-sgdm``), every client at each local step, then every p steps an average::

    buf = mu * buf + grad l(x; batch)        # heavy-ball buffer, torch.optim.SGD's form (no dampening)
    x   = x - lr * buf
    every p steps: x and buf <- their means over the cohort   (Yu et al.'s scheme; ``average: all``)

``average: model`` averages x alone and leaves each client's buffer on the client (pitfall S10). The
momentum mu the LocalSCGDAM paper used is **[unknown]** (its Appendix B is not available); 0.9 is the
usual default and only that. With mu = 0 the update is FedAvg's, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import LocalSteps, Tensors, grad_and_loss, grad_and_loss_factors
from fedcomp.platform.algorithms.builtins import LOCAL_SGDM, LocalSGDMHParams
from fedcomp.platform.algorithms.steps import descend, descend_
from fedcomp.platform.params import Params
from fedcomp.platform.problems import PlainProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import Model, State

__all__ = ["LocalSGDM", "LocalSGDMHParams", "ModelMomentum"]


@dataclass(frozen=True)
class ModelMomentum(Model):
    buf: Tensor
    """The heavy-ball buffer."""


@register_algorithm(LOCAL_SGDM)
class LocalSGDM(LocalSteps[ModelMomentum, State]):
    """buf = mu buf + grad l(x); x = x - lr buf for p steps; then x (and buf, ``average: all``) averaged."""

    Client: ClassVar[type[State]] = ModelMomentum
    Server: ClassVar[type[State]] = ModelMomentum
    hp: LocalSGDMHParams
    mutates = frozenset({"x", "buf"})

    def __init__(self, hparams: Params) -> None:
        super().__init__(hparams)
        # what is averaged is a hyperparameter here (S10): with 'model' the server keeps x alone and each
        # client's buffer stays on the client
        self.Server = ModelMomentum if self.hp.average == "all" else Model  # type: ignore[misc]

    def init(self, variables: Tensors) -> State:
        x = variables["x"]
        return self.Server.of({"x": x.clone(), "buf": torch.zeros_like(x)})

    def join(self, broadcast: Tensors) -> ModelMomentum:
        x = broadcast["x"]
        buf = broadcast["buf"].clone() if self.hp.average == "all" else torch.zeros_like(x)
        return self.Client.of({**broadcast, "x": x.clone(), "buf": buf})  # type: ignore[return-value]

    def draw(self, problem: PlainProblem, client: int, step: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        return (problem.sample_batch(client, self.hp.outer_batch, gen),), self.hp.outer_batch

    def update(self, problem: PlainProblem, state: ModelMomentum, batch: tuple[Any, ...], step: int) -> tuple[ModelMomentum, Tensor]:
        grad, loss = grad_and_loss(self._loss(problem, state), state.x, *batch)
        buf = self.hp.momentum * state.buf + grad
        return state.replace(x=descend(state.x, buf, self.hp.lr), buf=buf), loss

    def update_(self, problem: PlainProblem, state: ModelMomentum, batch: tuple[Any, ...], step: int) -> tuple[ModelMomentum, Tensor]:
        grad, loss = grad_and_loss_factors(self._loss(problem, state), state.x, *batch)
        buf = grad.of(state.buf)
        torch._foreach_mul_(buf, self.hp.momentum)
        torch._foreach_add_(buf, grad)
        grad.add_factors_(state.buf, 1.0, self.hp.momentum)  # under federation.fused_sgd
        descend_(grad.whole(state.x), grad.whole(state.buf), self.hp.lr)
        return state, loss

    def _loss(self, problem: Any, state: ModelMomentum) -> Any:
        """The object whose ``loss`` the step differentiates (the task's own loss here)."""
        return problem
