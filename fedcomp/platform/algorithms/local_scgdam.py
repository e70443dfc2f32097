"""LocalSCGDAM (``local-scgdam``) -- "Federated Compositional Deep AUC Maximization" (Zhang, Zhang, Yang, Souvenir,
Gao; NeurIPS 2023), Algorithm 1, as restated in ``reference/ALGORITHMS.md`` section 9.2 (A17).

Problem (class C4): min_x max_y (1/K) sum_k f_k( (1/K) sum_k' g_k'(x), y ). For compositional deep AUC,
x = (w, a, b), y = [alpha], g(x) = x - rho (grad_w CE(w), 0, 0) and f the square-loss AUC surrogate; here any
:class:`~fedcomp.platform.problems.CompositionalMinimaxProblem` runs.

State per device: x, y, h (the inner estimate, the size of g's value, which class C4 makes model-sized:
ALGORITHMS.md A17), u (x-side momentum), v (y-side momentum). With eta = ``lr`` (the moves and the momenta's
update are :class:`~.momentum_gda.MomentumGDA`'s, shared with LocalSGDAM, which also maps steps to iterations):

    init:  h = g(x_0; xi_0),  u = J_g(x_0; xi_0)^T grad_z f(h, y_0; zeta_0),  v = grad_y f(h, y_0; zeta_0)
    iteration t = 0, 1, ...:
        x = x - gamma_x eta u                       # descent with the previous momentum
        y = y + gamma_y eta v                       # ascent
        h = (1 - alpha eta) h + alpha eta g(x; xi)  # moving average of the inner value, at the new x
        u = (1 - beta_x eta) u + beta_x eta J_g(x; xi)^T grad_z f(h, y; zeta)
        v = (1 - beta_y eta) v + beta_y eta grad_y f(h, y; zeta)
        if (t + 1) mod p == 0: the server averages x, y, h, u and v (all five; pitfall S1)

xi (for g and its Jacobian, ``inner_batch`` examples) and zeta (for both gradients of f, ``outer_batch``
examples) are independent draws from the step's generator (S5); the same xi gives g's value and J_g^T; the same
zeta gives grad_z f and grad_y f.

Options: ``jacobian: exact`` (the paper: J_g^T by a vector-Jacobian product, a Hessian-vector product when g
contains a gradient step) or ``identity`` (J_g ~ I, cheaper, LibAUC PDSCA-like; pitfall S3). ``batches: shared``
uses one draw zeta for g and f (pitfall S5; needs a task whose inner oracle accepts its outer batches).
``dual: clamp`` keeps y in [0, 999] after each ascent step (LibAUC's margin form, pitfall S7).

Degenerate case (ALGORITHMS.md 10, item 5): with g(x) = x (rho = 0) and alpha eta = 1, h is x after every move,
J_g = I, and LocalSCGDAM takes LocalSGDAM's (:mod:`.local_sgdam`) steps on the same draws of zeta.

Hyperparameters are the paper's: eta and the multipliers gamma_x, gamma_y, beta_x, beta_y, alpha. The paper
needs alpha eta in (0, 1) for its theory; here 1 is allowed too (the degenerate case above). The default is
ALGORITHMS.md 9.9's starting point **[inferred from LibAUC defaults]**: alpha eta = 0.9.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import Tensors
from fedcomp.platform.algorithms.builtins import LOCAL_SCGDAM, LocalSCGDAMHParams
from fedcomp.platform.algorithms.momentum_gda import MomentumGDA
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.oracles import grad_xy_and_value, inner_value_vjp
from fedcomp.platform.problems import CompositionalMinimaxProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import MinimaxModel, unsent

__all__ = ["LocalSCGDAM", "LocalSCGDAMHParams", "SCGDAMState"]


@dataclass(frozen=True)
class SCGDAMState(MinimaxModel):
    """LocalSCGDAM's state: x, y, the inner estimate h (model-sized: g maps x to x's space, class C4) and u, v."""

    h: Tensor
    u: Tensor
    v: Tensor


@register_algorithm(LOCAL_SCGDAM)
class LocalSCGDAM(MomentumGDA):
    """Local stochastic compositional gradient descent-ascent with momentum; x, y, h, u, v averaged every p steps."""

    Client = Server = SCGDAMState

    def init(self, variables: Tensors) -> SCGDAMState:
        """x_0, y_0; h, u and v are estimated from samples at global step 0 (the pseudo-code's init), so there is
        nothing to send of them before the first averaging: empty (:func:`~fedcomp.platform.state.unsent`)."""
        x, y = variables["x"], variables["y"]
        return SCGDAMState(x=x.clone(), y=y.clone(), h=unsent(), u=unsent(), v=unsent())

    def _draw(self, problem: CompositionalMinimaxProblem, client: int, gen: torch.Generator) -> tuple[Any, int]:
        """(xi, zeta) of one iteration and the examples drawn."""
        if self.hp.batches == "shared":
            zeta = problem.sample_outer(client, self.hp.outer_batch, gen)
            return (zeta, zeta), self.hp.outer_batch
        xi = problem.sample_inner(client, self.hp.inner_batch, gen)
        zeta = problem.sample_outer(client, self.hp.outer_batch, gen)
        return (xi, zeta), self.hp.inner_batch + self.hp.outer_batch

    def update(
        self, problem: CompositionalMinimaxProblem, state: SCGDAMState, batch: tuple[Any, ...], step: int
    ) -> tuple[SCGDAMState, Tensor]:
        *init, (xi, zeta) = batch
        if init:  # the pseudo-code's init on its own draws (xi_0, zeta_0), before iteration t = 0
            h, u, v, _ = self._estimates(problem, state.x, state.y, None, *init[0])
            state = state.replace(h=h, u=u, v=v)
        x, y = self._move(state)
        h, gx, gy, loss = self._estimates(problem, x, y, state.h, xi, zeta)
        u, v = self._momenta(state, gx, gy)
        return SCGDAMState(x=x, y=y, h=h, u=u, v=v), loss

    def _estimates(
        self, problem: CompositionalMinimaxProblem, x: Tensor, y: Tensor, h: Tensor | None, xi: Any, zeta: Any
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(new h, J_g^T grad_z f, grad_y f, f) at (x, y) on (xi, zeta); ``h`` None: the init (h = g)."""
        g, vjp = self._inner(problem, x, xi)
        weight = self.hp.alpha * self.hp.lr
        h = g if h is None else (1 - weight) * h + weight * g
        gz, gy, value = grad_xy_and_value(lambda z, w: problem.outer(z, w, zeta), h, y)
        return h, vjp(gz), gy, value

    def _inner(
        self, problem: CompositionalMinimaxProblem, x: Tensor, xi: Any
    ) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        """g(x; xi) and v -> J_g(x; xi)^T v (exact, or the identity)."""
        g, vjp = inner_value_vjp(problem, x, xi)
        if g.shape != x.shape:
            raise ConfigError(
                f"algorithm.name = 'local-scgdam' keeps the inner estimate h the size of x (class C4), but the task's "
                f"g has shape {tuple(g.shape)} for x of shape {tuple(x.shape)}"
            )
        return (g, vjp) if self.hp.jacobian == "exact" else (g, lambda v: v)  # identity: g's graph dropped unused
