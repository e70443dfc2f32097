"""LocalSGDAM (``local-sgdam``; Sharma, Panda, Joshi, Varshney, ICML 2022) -- the LocalSCGDAM paper's baseline
(``reference/ALGORITHMS.md`` section 9.3, A18).

Problem (class MINIMAX): min_x max_y (1/K) sum_k f_k(x, y). **[inferred]** from ALGORITHMS.md 9.3: LocalSCGDAM's
loop (:mod:`.local_scgdam`) with g = identity, so h disappears and both gradients are of f at (x, y) on one
batch zeta. With eta = ``lr`` (the moves are :class:`~.momentum_gda.MomentumGDA`'s)::

    init:  u = grad_x f(x_0, y_0; zeta_0),  v = grad_y f(x_0, y_0; zeta_0)
    iteration t = 0, 1, ...:
        x = x - gamma_x eta u
        y = y + gamma_y eta v
        u = (1 - beta_x eta) u + beta_x eta grad_x f(x, y; zeta)
        v = (1 - beta_y eta) v + beta_y eta grad_y f(x, y; zeta)
        if (t + 1) mod p == 0: the server averages x, y, u and v

with the same step-to-iteration mapping as LocalSCGDAM. ``average: all`` (default, following the LocalSCGDAM
template **[inferred]**) averages x, y, u and v; ``average: model`` averages x and y only and leaves each client
its own momenta (pitfall S10; :class:`PrivateMomenta`, whose server state is (x, y)); a client that takes part
for the first time after step 0 then starts its momenta from its first step's batch, as every client does at
step 0. The batch is the task's ``sample(client, "inner", outer_batch, gen)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext, StepInfo, Tensors, batch_size, mean_loss
from fedcomp.platform.algorithms.builtins import LOCAL_SGDAM, LocalSGDAMHParams
from fedcomp.platform.algorithms.momentum_gda import MomentumGDA
from fedcomp.platform.oracles import grad_xy_and_value
from fedcomp.platform.problems import MinimaxProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import MinimaxModel, State, unsent

__all__ = ["LocalSGDAM", "LocalSGDAMHParams", "Momenta", "PrivateMomenta"]


@dataclass(frozen=True)
class Momenta(MinimaxModel):
    """LocalSGDAM's state: x, y and their momenta u (x side) and v (y side)."""

    u: Tensor
    v: Tensor


M = TypeVar("M", bound=Momenta)


@register_algorithm(LOCAL_SGDAM)
class LocalSGDAM(MomentumGDA):
    """Local stochastic gradient descent-ascent with momentum; x, y (and by default u, v) averaged every p steps."""

    Client: ClassVar[type[State]] = Momenta
    Server: ClassVar[type[State]] = Momenta

    def __new__(cls, hparams: Any = None) -> LocalSGDAM:
        """``average: model`` builds :class:`PrivateMomenta` (another server state and a client's first step)."""
        model_only = hparams is not None and hparams.average == "model"
        return super().__new__(PrivateMomenta if model_only else cls)

    def init(self, variables: Tensors) -> State:
        """x_0, y_0; u and v are estimated from samples at global step 0: empty until then (nothing to send)."""
        x, y = variables["x"], variables["y"]
        return Momenta(x=x.clone(), y=y.clone(), u=unsent(), v=unsent())

    def _draw(self, problem: MinimaxProblem, client: int, gen: torch.Generator) -> tuple[Any, int]:
        batch = problem.sample(client, "inner", self.hp.outer_batch, gen)
        return batch, batch_size(batch)

    def update(self, problem: MinimaxProblem, state: M, batch: tuple[Any, ...], step: int) -> tuple[M, Tensor]:
        *init, current = batch
        if init:  # the momenta's first estimate at (x, y), on its own draw
            u, v, _ = grad_xy_and_value(lambda a, b: problem.loss(a, b, init[0]), state.x, state.y)
            state = state.replace(u=u, v=v)
        x, y = self._move(state)
        gx, gy, loss = grad_xy_and_value(lambda a, b: problem.loss(a, b, current), x, y)
        u, v = self._momenta(state, gx, gy)
        return state.replace(x=x, y=y, u=u, v=v), loss


class PrivateMomenta(LocalSGDAM):
    """LocalSGDAM with ``average: model``: x and y averaged, each client keeps its momenta (pitfall S10). A client
    that takes part for the first time after step 0 estimates them on its first step's draw, as every client
    does at step 0, so its first draw depends on its state: no lockstep."""

    Server = MinimaxModel
    vectorisable = False

    def init(self, variables: Tensors) -> MinimaxModel:
        return MinimaxModel(x=variables["x"].clone(), y=variables["y"].clone())

    def join(self, broadcast: Tensors) -> Momenta:
        """x and y from the broadcast; the momenta empty until the client's first step estimates them."""
        return Momenta(x=broadcast["x"].clone(), y=broadcast["y"].clone(), u=unsent(), v=unsent())

    def local_steps(
        self, problem: MinimaxProblem, state: Momenta, ctx: ClientContext
    ) -> tuple[Momenta, Tensors, StepInfo]:
        """``q`` local steps (global step index ``round * q + s``); a client without momenta estimates them first."""
        q, fresh = self.hp.local_steps, state.u.numel() == 0
        total, losses = StepInfo(), []
        for s in range(q):
            step = ctx.round * q + s
            batch, samples = self._draws(problem, ctx.client, 2 if s == 0 and fresh else 1, ctx.rng(step))
            state, loss = self.update(problem, state, batch, step)
            total.samples += samples
            losses.append(torch.as_tensor(loss).detach())  # no autograd graph kept until the read
        total.loss = mean_loss(losses)
        return state, {"x": state.x, "y": state.y}, total
