"""Local-SCGD and Local-SCGDM -- "On the Convergence of Local Stochastic Compositional Gradient Descent with
Momentum" (Gao, Li, Huang, ICML 2022), Algorithm 1 of the slides, as restated in ``ALGORITHMS.md`` section 5
(A4, A5). Only a slide deck (an OCR scan) is available, so the update below is a **reconstruction**:

    t = 0:   u = g(x; xi_0),   z = (dg(x; xi_0)/dx)^T grad f(u; zeta_0),   m = z
    t >= 1:  u = (1 - gamma) u + gamma g(x; xi_t)               # moving average of the inner value
             z = (dg(x; xi_t)/dx)^T grad f(u; zeta_t)            # stochastic compositional gradient
             m = (1 - beta) m + beta z                           # momentum (Local-SCGDM only)
    every step:  x = x - lr * m   (Local-SCGD: x = x - lr * z)
    every p steps: the server averages x and u (Local-SCGD) or x, u and m (Local-SCGDM).

The slides write the weights as products with a global step eta (gamma * eta, alpha * eta); the FCSG paper
runs both methods with eta = 1, which is what ``gamma`` and ``beta`` are here (the scan's coefficient in
the x-update is unreadable, so ``lr`` is the whole step). xi_t and zeta_t are independent draws; the same
xi_t gives g's value and its vector-Jacobian product.

``sync_inner: false`` keeps u on each client instead of averaging it (the server averages x, and m): with
inner maps that differ across clients the average of the clients' u is not any client's inner value, which
biases the fixed point of the slides' scheme (an audit measured ||grad Phi|| = 0.39 at p = 1 with exact
oracles, against 6e-15 with u kept local). A client without its own u yet (every client at step 0, a late
joiner at its first step) starts it at g(x; xi), as step 0 does.

``inner_state: per-task-mix`` is the FCSG authors' code instead (pitfall L4, ``ALGORITHMS.md`` 5.4): for
each task i of the step's batch, the query loss is differentiated at its own point
u_i = (1 - gamma) u + gamma fast_i (u_i = fast_i at t = 0), the meta-gradient is the task mean of
(dfast_i/dx)^T grad L_query_i(u_i), and u becomes the task mean of the u_i. It needs tasks whose inner and
outer samples come in pairs (:class:`~fedcomp.platform.problems.PairedCompositionalProblem`). The default
is the slides' single moving-average point (``moving-average``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import LocalSteps, Tensors
from fedcomp.platform.algorithms.builtins import LOCAL_SCGD, LOCAL_SCGDM, LocalSCGDHParams, LocalSCGDMHParams
from fedcomp.platform.algorithms.steps import descend
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.kinds import COMPOSITIONAL
from fedcomp.platform.oracles import inner_value_vjp, outer_grad
from fedcomp.platform.params import Params
from fedcomp.platform.problems import CompositionalProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import Model, State, unsent


@dataclass(frozen=True)
class SCGDState(State):
    x: Tensor
    u: Tensor
    """The moving average of the inner value g (g's dimension; for MAML the model's, d)."""


@dataclass(frozen=True)
class SCGDMState(SCGDState):
    m: Tensor
    """The momentum of the compositional gradient."""


@dataclass(frozen=True)
class ModelMomentum(Model):
    """Local-SCGDM's server state under ``sync_inner: false``: x and m."""

    m: Tensor


class _SCGDBase(LocalSteps[Any, Any]):
    """Draw (xi_t, zeta_t) -- or, per-task-mix, the step's (xi_i, zeta_i) pairs -- then a pure update, so hosts
    can run clients in lockstep (``moving-average`` only: the pairs are a list of episodes, one at a time)."""

    kind = COMPOSITIONAL
    hp: LocalSCGDHParams

    def __init__(self, hparams: Params) -> None:
        super().__init__(hparams)
        self.vectorisable = self.hp.inner_state == "moving-average"  # type: ignore[misc]

    def draw(self, problem: CompositionalProblem, client: int, step: int, gen: torch.Generator) -> tuple[Any, int]:
        b = self.hp.outer_batch
        if self.hp.inner_state == "moving-average":
            xi = problem.sample_inner(client, b, gen)
            zeta = problem.sample_outer(client, b, gen)  # None: a deterministic f, no draws to count
            return (xi, zeta), b if zeta is None else 2 * b
        sample_pairs = getattr(problem, "sample_pairs", None)
        if sample_pairs is None:
            raise ConfigError(
                "algorithm.inner_state = 'per-task-mix': the task does not draw paired inner/outer samples; "
                "allowed with it: moving-average"
            )
        return (sample_pairs(client, b, gen),), 2 * b

    def _gradient(self, problem: CompositionalProblem, x: Tensor, u: Tensor, batch: Any) -> tuple[Tensor, Tensor, Tensor]:
        """(z, new u, outer loss) of one step: the compositional gradient and the updated inner estimate. A u that
        is empty -- the server's before its first averaging, a client's own before its first step -- starts at g."""
        gamma = self.hp.gamma

        def inner_point(g: Tensor) -> Tensor:
            return g if u.numel() == 0 else (1 - gamma) * u + gamma * g

        if self.hp.inner_state == "moving-average":
            xi, zeta = batch
            g, vjp = inner_value_vjp(problem, x, xi)
            u = inner_point(g)
            v, loss = outer_grad(problem, u, zeta)
            return vjp(v), u, loss
        (pairs,) = batch
        z, points, loss = torch.zeros_like(x), None, torch.zeros(())
        for xi, zeta in pairs:
            g, vjp = inner_value_vjp(problem, x, xi)
            point = inner_point(g)
            v, value = outer_grad(problem, point, zeta)
            z += vjp(v) / len(pairs)
            if points is None:  # u's size is g's, which an empty u does not have
                points = torch.zeros_like(point)
            points += point / len(pairs)
            loss += value / len(pairs)
        assert points is not None  # a step draws at least one pair
        return z, points, loss


@register_algorithm(LOCAL_SCGD)
class LocalSCGD(_SCGDBase):
    """u = (1 - gamma) u + gamma g(x; xi); x = x - lr (dg/dx)^T grad f(u; zeta); x and u averaged every p steps."""

    Client: ClassVar[type[State]] = SCGDState
    Server: ClassVar[type[State]] = SCGDState

    def __new__(cls, hparams: Any = None) -> LocalSCGD:
        """``sync_inner: false`` builds :class:`LocalSCGDOwnInner` (another client and server state)."""
        own = hparams is not None and not hparams.sync_inner
        return super().__new__(LocalSCGDOwnInner if own and cls is LocalSCGD else cls)

    def init(self, variables: Tensors) -> State:
        """x_0; u is not sent before the first averaging (each client's first step starts it at g(x_0; xi)): empty,
        so that round 0 counts no u floats, and u takes g's size, which may differ from x's."""
        x = variables["x"]
        return SCGDState(x=x.clone(), u=unsent())

    def update(self, problem: CompositionalProblem, state: SCGDState, batch: Any, step: int) -> tuple[SCGDState, Tensor]:
        z, u, loss = self._gradient(problem, state.x, state.u, batch)
        return state.replace(x=descend(state.x, z, self.hp.lr), u=u), loss


class LocalSCGDOwnInner(LocalSCGD):
    """Local-SCGD with ``sync_inner: false``: x averaged, u kept on each client."""

    Server = Model

    def init(self, variables: Tensors) -> Model:
        return Model(x=variables["x"].clone())

    def join(self, broadcast: Tensors) -> SCGDState:
        """x from the broadcast; u empty until the client's first step starts it at g (g's size, not x's)."""
        return SCGDState(x=broadcast["x"].clone(), u=unsent())


@register_algorithm(LOCAL_SCGDM)
class LocalSCGDM(_SCGDBase):
    """Local-SCGD plus momentum m = (1 - beta) m + beta z, x = x - lr m; x, u and m averaged every p steps."""

    Client: ClassVar[type[State]] = SCGDMState
    Server: ClassVar[type[State]] = SCGDMState
    hp: LocalSCGDMHParams

    def __new__(cls, hparams: Any = None) -> LocalSCGDM:
        """``sync_inner: false`` builds :class:`LocalSCGDMOwnInner` (another client and server state)."""
        own = hparams is not None and not hparams.sync_inner
        return super().__new__(LocalSCGDMOwnInner if own and cls is LocalSCGDM else cls)

    def init(self, variables: Tensors) -> State:
        """x_0 and m_0 = 0; u not sent yet (:meth:`LocalSCGD.init`)."""
        x = variables["x"]
        return SCGDMState(x=x.clone(), u=unsent(), m=torch.zeros_like(x))

    def update(self, problem: CompositionalProblem, state: SCGDMState, batch: Any, step: int) -> tuple[SCGDMState, Tensor]:
        z, u, loss = self._gradient(problem, state.x, state.u, batch)
        m = z if step == 0 else (1 - self.hp.beta) * state.m + self.hp.beta * z
        return state.replace(x=descend(state.x, m, self.hp.lr), u=u, m=m), loss


class LocalSCGDMOwnInner(LocalSCGDM):
    """Local-SCGDM with ``sync_inner: false``: x and m averaged, u kept on each client."""

    Server = ModelMomentum

    def init(self, variables: Tensors) -> ModelMomentum:
        x = variables["x"]
        return ModelMomentum(x=x.clone(), m=torch.zeros_like(x))

    def join(self, broadcast: Tensors) -> SCGDMState:
        """x and m from the broadcast; u empty until the client's first step (:meth:`LocalSCGDOwnInner.join`)."""
        return SCGDMState(x=broadcast["x"].clone(), u=unsent(), m=broadcast["m"].clone())
