"""LocalSCGDAM and LocalSGDAM -- "Federated Compositional Deep AUC Maximization" (Zhang, Zhang, Yang, Souvenir,
Gao; NeurIPS 2023), Algorithm 1, and its LocalSGDAM baseline, as restated in ``reference/ALGORITHMS.md``
sections 9.2 and 9.3 (A17, A18).

Problem (class C4): min_x max_y (1/K) sum_k f_k( (1/K) sum_k' g_k'(x), y ). For compositional deep AUC,
x = (w, a, b), y = [alpha], g(x) = x - rho (grad_w CE(w), 0, 0) and f the square-loss AUC surrogate; here any
:class:`~fedcomp.platform.problems.CompositionalMinimaxProblem` runs.

**LocalSCGDAM** (``local-scgdam``). State per device: x, y, h (the inner estimate, the size of g's value,
which class C4 makes model-sized: ALGORITHMS.md A17), u (x-side momentum), v (y-side momentum). With eta = ``lr``:

    init:  h = g(x_0; xi_0),  u = J_g(x_0; xi_0)^T grad_z f(h, y_0; zeta_0),  v = grad_y f(h, y_0; zeta_0)
    iteration t = 0, 1, ...:
        x = x - gamma_x eta u                       # descent with the previous momentum
        y = y + gamma_y eta v                       # ascent
        h = (1 - alpha eta) h + alpha eta g(x; xi)  # moving average of the inner value, at the new x
        u = (1 - beta_x eta) u + beta_x eta J_g(x; xi)^T grad_z f(h, y; zeta)
        v = (1 - beta_y eta) v + beta_y eta grad_y f(h, y; zeta)
        if (t + 1) mod p == 0: the server averages x, y, h, u and v (all five; pitfall S1)

How the sequence maps onto local steps (global index s = round * p + i): step 0 runs the init on its own
draws (xi_0, zeta_0) and then iteration t = 0 on the next draws; every step s >= 1 runs iteration t = s. So the
p-th step of round r ends iteration t = (r + 1) p - 1 and the server averages exactly where the pseudo-code
does; every iterate and every average is the paper's. The init's draws are part of step 0 (drawn first), so its
sample count is twice that of later steps. Both algorithms are a draw and a pure update
(:class:`~fedcomp.platform.algorithms.base.LocalSteps`), so a host may run its clients in lockstep. xi (for g and its Jacobian, ``inner_batch`` examples) and zeta (for both
gradients of f, ``outer_batch`` examples) are independent draws from the step's generator (S5); the same xi
gives g's value and J_g^T; the same zeta gives grad_z f and grad_y f.

Options: ``jacobian: exact`` (the paper: J_g^T by a vector-Jacobian product, a Hessian-vector product when g
contains a gradient step) or ``identity`` (J_g ~ I, cheaper, LibAUC PDSCA-like; pitfall S3). ``batches: shared`` uses one draw zeta for g and f (pitfall S5; needs a task whose inner
oracle accepts its outer batches). ``dual: clamp`` keeps y in [0, 999] after each ascent step (LibAUC's
margin form, pitfall S7); the paper's y is unconstrained.

**LocalSGDAM** (``local-sgdam``; Sharma, Panda, Joshi, Varshney, ICML 2022). **[inferred]** from ALGORITHMS.md
9.3: the loop above with g = identity, so h disappears and both gradients are of f at (x, y) on one batch:
init u = grad_x f(x_0, y_0; zeta_0), v = grad_y f(x_0, y_0; zeta_0), then iteration t moves x and y with
(u, v) and refreshes u, v at the new point, with the same step-to-iteration mapping. ``average: all``
(default, following the LocalSCGDAM template **[inferred]**) averages x, y, u and v; ``average: model``
averages x and y only and leaves each client its own momenta (pitfall S10; :class:`PrivateMomenta`, whose
server state is (x, y)); a client that takes part for the first time after step 0 then starts its momenta from
its first step's batch, as every client does at step 0.
The batch is the task's ``sample(client, "inner", outer_batch, gen)``.

Degenerate case (ALGORITHMS.md 10, item 5): with g(x) = x (rho = 0) and alpha eta = 1, LocalSCGDAM's h is x
after every move, J_g = I, and it takes LocalSGDAM's steps on the same draws of zeta.

Hyperparameters are the paper's: eta and the multipliers gamma_x, gamma_y, beta_x, beta_y, alpha. The paper
needs alpha eta, beta_x eta, beta_y eta in (0, 1) for its theory; here 1 is allowed too (a fresh estimate, no
averaging over time -- the degenerate case above). The values in the paper's Appendix B are unavailable;
the defaults are ALGORITHMS.md 9.9's starting points **[inferred from LibAUC defaults]**: gamma_x eta =
gamma_y eta = 0.1, alpha eta = beta_x eta = beta_y eta = 0.9.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

import torch
from pydantic import Field, model_validator
from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext, CommonHParams, LocalSteps, StepInfo, Tensors, batch_size
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.oracles import grad_xy_and_value, inner_value_vjp
from fedcomp.platform.problems import (
    COMPOSITIONAL_MINIMAX,
    MINIMAX,
    CompositionalMinimaxProblem,
    MinimaxProblem,
)
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import State

__all__ = [
    "DUAL_CLAMP",
    "LocalSCGDAM",
    "LocalSCGDAMHParams",
    "LocalSGDAM",
    "LocalSGDAMHParams",
    "Model",
    "Momenta",
    "PrivateMomenta",
    "SCGDAMState",
]

DUAL_CLAMP = (0.0, 999.0)
"""LibAUC's range for the dual variable of its margin AUC loss (``torch.clamp(alpha, 0, 999)``)."""


@dataclass(frozen=True)
class Model(State):
    """The minimax variables: the primal x and the dual y."""

    x: Tensor
    y: Tensor


@dataclass(frozen=True)
class Momenta(Model):
    """LocalSGDAM's state: x, y and their momenta u (x side) and v (y side)."""

    u: Tensor
    v: Tensor


M = TypeVar("M", bound=Momenta)


@dataclass(frozen=True)
class OwnMomenta(Momenta):
    """A client's state under ``average: model``: its own momenta, and whether it has estimated them yet."""

    estimated: Tensor
    """[1.0] once the client estimated its momenta (its first step), [0.0] before."""


@dataclass(frozen=True)
class SCGDAMState(Model):
    """LocalSCGDAM's state: x, y, the inner estimate h (model-sized: g maps x to x's space, class C4) and u, v."""

    h: Tensor
    u: Tensor
    v: Tensor


class _MomentumGDAHParams(CommonHParams):
    """eta (``lr``), the multipliers gamma_x, gamma_y, beta_x, beta_y, p (``local_steps``) and the batch."""

    lr: float = Field(0.1, gt=0, description="eta, the global step: x moves by gamma_x * eta, y by gamma_y * eta")
    local_steps: int = Field(4, ge=1, description="p, local steps per communication round (the paper: 4, 8, 16)")
    outer_batch: int = Field(32, ge=1, description="examples in the batch zeta of f's gradients, per step")
    gamma_x: float = Field(1.0, gt=0, description="x step multiplier (x step = gamma_x * eta)")
    gamma_y: float = Field(1.0, gt=0, description="y step multiplier (y step = gamma_y * eta)")
    beta_x: float = Field(9.0, gt=0, description="x-momentum weight multiplier: beta_x * eta in (0, 1]")
    beta_y: float = Field(9.0, gt=0, description="y-momentum weight multiplier: beta_y * eta in (0, 1]")
    dual: Literal["unconstrained", "clamp"] = Field(
        "unconstrained", description="'clamp': y kept in [0, 999] after each ascent step (LibAUC margin form, S7)"
    )

    def _check_weights(self, names: tuple[str, ...]) -> None:
        for name in names:
            value = getattr(self, name)
            if not 0 < value * self.lr <= 1:
                raise ValueError(
                    f"{name} = {value!r}: {name} * lr = {value * self.lr:g} must be in (0, 1] (lr = {self.lr!r})"
                )


class LocalSCGDAMHParams(_MomentumGDAHParams):
    """LocalSCGDAM's hyperparameters (Algorithm 1): eta, gamma_x, gamma_y, beta_x, beta_y, alpha, p, batches."""

    alpha: float = Field(9.0, gt=0, description="inner-estimate weight multiplier: alpha * eta in (0, 1]")
    inner_batch: int = Field(32, ge=1, description="examples in the batch xi of g and its Jacobian, per step")
    jacobian: Literal["exact", "identity"] = Field(
        "exact", description="J_g^T by a vector-Jacobian (Hessian-vector) product, or the identity (S3)"
    )
    batches: Literal["independent", "shared"] = Field(
        "independent", description="independent draws xi and zeta per step, or one draw for both (S5)"
    )

    @model_validator(mode="after")
    def _check(self) -> LocalSCGDAMHParams:
        self._check_weights(("alpha", "beta_x", "beta_y"))
        return self


class LocalSGDAMHParams(_MomentumGDAHParams):
    """LocalSGDAM's hyperparameters: eta, gamma_x, gamma_y, beta_x, beta_y, p, the batch and what is averaged."""

    average: Literal["all", "model"] = Field(
        "all", description="'all': x, y, u, v averaged (inferred default); 'model': x and y only (S10)"
    )

    @model_validator(mode="after")
    def _check(self) -> LocalSGDAMHParams:
        self._check_weights(("beta_x", "beta_y"))
        return self


class _MomentumGDA(LocalSteps[Any, Any]):
    """What both algorithms share: the two descent-ascent moves with the previous momenta, and the momenta's
    update. A step's draw holds one batch, or two at the momenta's first estimate (the init's own draw first)."""

    def _move(self, state: Momenta | SCGDAMState) -> tuple[Tensor, Tensor]:
        hp = self.hp
        x = state.x - hp.gamma_x * hp.lr * state.u
        y = state.y + hp.gamma_y * hp.lr * state.v
        if hp.dual == "clamp":
            y = y.clamp(*DUAL_CLAMP)
        return x, y

    def _momenta(self, state: Momenta | SCGDAMState, gx: Tensor, gy: Tensor) -> tuple[Tensor, Tensor]:
        """u, v after an iteration whose fresh gradients are (gx, gy)."""
        bx, by = self.hp.beta_x * self.hp.lr, self.hp.beta_y * self.hp.lr
        return (1 - bx) * state.u + bx * gx, (1 - by) * state.v + by * gy

    def draw(self, problem: Any, client: int, step: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        """Step 0 draws the pseudo-code's init batches before the iteration's."""
        return self._draws(problem, client, 2 if step == 0 else 1, gen)

    def _draws(self, problem: Any, client: int, n: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        """``n`` independent draws of one iteration's samples, and the examples drawn."""
        draws = [self._draw(problem, client, gen) for _ in range(n)]
        return tuple(batch for batch, _ in draws), sum(examples for _, examples in draws)

    @abstractmethod
    def _draw(self, problem: Any, client: int, gen: torch.Generator) -> tuple[Any, int]:
        """One iteration's samples and the examples drawn."""


@register_algorithm("local-scgdam")
class LocalSCGDAM(_MomentumGDA):
    """Local stochastic compositional gradient descent-ascent with momentum; x, y, h, u, v averaged every p steps."""

    kind = COMPOSITIONAL_MINIMAX
    HParams = LocalSCGDAMHParams
    Client = Server = SCGDAMState
    description = "LocalSCGDAM: compositional minimax GDA with momentum; x, y, h, u, v averaged (Zhang et al. 2023)"

    def init(self, variables: Tensors) -> SCGDAMState:
        x, y = variables["x"], variables["y"]
        zeros = torch.zeros_like  # h, u, v are estimated from samples at global step 0 (the pseudo-code's init)
        return SCGDAMState(x=x.clone(), y=y.clone(), h=zeros(x), u=zeros(x), v=zeros(y))

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


@register_algorithm("local-sgdam")
class LocalSGDAM(_MomentumGDA):
    """Local stochastic gradient descent-ascent with momentum; x, y (and by default u, v) averaged every p steps."""

    kind = MINIMAX
    HParams = LocalSGDAMHParams
    Client: ClassVar[type[State]] = Momenta
    Server: ClassVar[type[State]] = Momenta
    description = "LocalSGDAM: local minimax GDA with momentum; x, y, u, v averaged [inferred] (Sharma et al. 2022)"

    def __new__(cls, hparams: Any = None) -> LocalSGDAM:
        """``average: model`` builds :class:`PrivateMomenta` (another server state and a client's first step)."""
        model_only = hparams is not None and hparams.average == "model"
        return super().__new__(PrivateMomenta if model_only else cls)

    def init(self, variables: Tensors) -> State:
        x, y = variables["x"], variables["y"]  # u, v are estimated from samples at global step 0
        return Momenta(x=x.clone(), y=y.clone(), u=torch.zeros_like(x), v=torch.zeros_like(y))

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

    Client = OwnMomenta
    Server = Model
    vectorisable = False

    def init(self, variables: Tensors) -> Model:
        return Model(x=variables["x"].clone(), y=variables["y"].clone())

    def join(self, broadcast: Tensors) -> OwnMomenta:
        x, y = broadcast["x"].clone(), broadcast["y"].clone()
        return OwnMomenta(x=x, y=y, u=torch.zeros_like(x), v=torch.zeros_like(y), estimated=torch.zeros(1))

    def local_steps(
        self, problem: MinimaxProblem, state: OwnMomenta, ctx: ClientContext
    ) -> tuple[OwnMomenta, Tensors, StepInfo]:
        """``q`` local steps (global step index ``round * q + s``); a client without momenta estimates them first."""
        q, fresh = self.hp.local_steps, not bool(state.estimated)
        total = StepInfo()
        for s in range(q):
            step = ctx.round * q + s
            batch, samples = self._draws(problem, ctx.client, 2 if s == 0 and fresh else 1, ctx.rng(step))
            state, loss = self.update(problem, state, batch, step)
            total.samples += samples
            total.loss += float(loss) / q
        return state.replace(estimated=torch.ones(1)), {"x": state.x, "y": state.y}, total
