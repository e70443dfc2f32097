"""The FedDRO paper's non-federated baselines, run "in parallel" over the clients -- ``reference/ALGORITHMS.md``
sections 8.4 and 8.6.

Problem: min_x Phi(x) = h(x) + f(g(x)), h = (1/K) sum_k h_k, g = (1/K) sum_k g_k, g_k(x) in R^{d_g}. The paper
compares FedDRO (with I = 1) against centralised methods whose per-step work is K times one client's (K x 16
samples per step). Here each is a synchronous parallel method: every step the clients compute their share on
their own batches, one model-sized round averages it, and the server takes the step. Clients hold no model
between steps (GCIVR keeps the last model it received, for its two-point differences).

**GCIVR** (``gcivr``; Haddadpour, Kamani, Mahdavi, Karbasi, ICLR 2022; read from ``mlscientist/GCIVR``). The
server keeps G ~ g(x_t) and J ~ the Jacobian of g at x_t (d_g x d), updated by the SARAH/SPIDER recursion on one
batch b_k per client shared by both points:

    G_t = G_{t-1} + <g_k(x_t; b_k) - g_k(x_{t-1}; b_k)>
    J_t = J_{t-1} + <dg_k(x_t; b_k) - dg_k(x_{t-1}; b_k)>
    every ``refresh_every`` steps instead: G_t = <g_k(x_t; B_k)>, J_t = <dg_k(x_t; B_k)>  (B_k: ``refresh_batch``)
    d_t = <grad h_k(x_t; b_k)> + J_t^T grad f(G_t)
    x_{t+1} = x_t - eta d_t                      (or an Adagrad step: ``optimizer: adagrad``)

One model round per step **[inferred]** (ALGORITHMS.md 8.4: how GCIVR was distributed over FedDRO's clients is
unknown): each client uploads the d_g value difference, the d_g x d Jacobian difference and its plain gradient
in one message and downloads x_t. Why the Jacobian and not the direction: for d_g = 1, J is the code's grad G
and d_t = grad main + grad G / G is exactly its update (f = log); for any d_g it is what GCIVR/CIVR track, it
keeps the recursion a martingale in the map g alone, and it needs one exchange per step -- a recursion on the
direction grad g(x)^T grad f(G) itself would need G_t before the clients could form it (a second exchange per
step) and would no longer reduce to the code for d_g = 1. The cost is d_g model-sized vectors per client per step
(one for the DRO tasks). The plain part h is not variance-reduced: the code computes its gradient directly
(on the full batch), so each step uses <grad h_k(x_t; b_k)>; at a refresh step all three come from B_k.

Code vs paper (policy in ALGORITHMS.md 0.3): the released loop never refreshes (``refresh_every: null``, the
default -- the published Adult curves came from it, with full batches, where the recursion is exact); the
paper's periodic refresh is ``refresh_every: q``. The code starts from G ~ U(0, 1) and grad G = 0, which leaves
permanent offsets g(x_0) - G_0 and -grad g(x_0) in a loop that never refreshes; the default ``init: estimate``
starts from fresh estimates at x_0 instead, ``init: code`` reproduces the code (x_prev = x_0, so its first step
uses grad h alone). The code steps with Adagrad (lr 0.01); the default here is plain SGD with FedDRO's lr
schedule, so that learning-rate grids mean the same thing across the comparison.

**Parallel MBSGD** (``parallel-mbsgd``; Ghadimi & Lan 2013, customised for compositional problems as in
ALGORITHMS.md 8.6). Per step: y = <g_k(x_t; b_k)> (one low-dimensional exchange), then on an independent batch
b'_k, d_t = <grad h_k(x_t; b'_k) + grad g_k(x_t; b'_k)^T grad f(y)> and x_{t+1} = x_t - eta d_t (one model round).
Biased (f(y) with a batch estimate y), as the paper says.

**Parallel FastDRO** (``parallel-fastdro``; Levy, Carmon, Duchi, Sidford 2020). Needs per-example losses
(:class:`ExampleLossProblem`). Per step every client sends its batch's b per-example losses (a low-dimensional
exchange), the server computes best-response weights p over the pooled K x b losses with
:func:`fedcomp.losses.dro.robust_weights` (no gradient), each client gets its b weights back and
uploads grad sum_{i in b_k} p_i l_i(x_t), and x_{t+1} = x_t - eta sum_k (that) (one model round). The task's
own h, g, f are not used: FastDRO minimises its mini-batch robust loss. Geometry, size and regulariser used by
FedDRO are **[unknown]**; the default is chi^2 with rho = 1 and no penalty.

**Parallel PDSGD** (``parallel-pdsgd``; the paper's "primal-dual SGD approach to solve constrained problems
with many constraints", Xu 2020). **Reconstruction**: the paper gives no details and ALGORITHMS.md 8.6 marks
the formulation it was applied to **[unknown]**. Xu's method is an augmented-Lagrangian primal-dual SGD for
min f_0(x) s.t. f_j(x) <= 0 with many constraints; here it is the standard stochastic primal-dual (descent /
mirror-ascent) method on the DRO game itself, min_x max_{p in simplex} sum_i p_i l_i(x) - lam D(p, uniform)
over the m training examples (Nemirovski et al. 2009; Namkoong & Duchi 2016), which is what "primal-dual with
many constraints" amounts to for the KL / chi^2 objectives: one dual variable per training example. The dual
variable (m floats) lives on the server, in the algorithm state; see :class:`ParallelPDSGD`.

Counters (per participating client): ``floats_up``/``floats_down`` count the model-sized message of the step;
``embedding_*`` the low-dimensional exchanges (MBSGD's y, FastDRO's losses and weights, PDSGD's positions,
losses and weights). They count what the protocol sends; the simulation moves FastDRO's and PDSGD's per-example
vectors as zero-padded K x b vectors (the federation returns means only), which the counters do not charge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping, Protocol, runtime_checkable

import torch
from pydantic import Field, model_validator
from torch import Tensor

from fedcomp.losses.dro import DualPenalty, project_simplex, robust_loss, robust_weights
from fedcomp.platform.algorithms.base import ClientContext, Exchange, StepInfo, Tensors, batch_size
from fedcomp.platform.algorithms.feddro import Compositional, CompositionalHParams, Model, unsent
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.oracles import inner_and_jacobian, outer_grad, plain_grad, plain_inner_vjp
from fedcomp.platform.params import Params
from fedcomp.platform.problems import GlobalCompositionalProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round

__all__ = [
    "ExampleLossProblem",
    "FastDROHParams",
    "GCIVR",
    "GCIVRHParams",
    "IndexedExampleProblem",
    "PDSGDHParams",
    "ParallelFastDRO",
    "ParallelHParams",
    "ParallelMBSGD",
    "ParallelPDSGD",
]


@runtime_checkable
class ExampleLossProblem(Protocol):
    """A problem that exposes its per-example losses (what FastDRO's robust loss reweights)."""

    def sample(self, client: int, size: int | None, gen: torch.Generator) -> Any:
        """A batch of ``size`` of the client's examples (all of them when ``size`` is None)."""
        ...

    def example_losses(self, x: Tensor, batch: Any) -> Tensor:
        """The losses of the batch's examples at ``x``, shape [n], differentiable in ``x``."""
        ...


@runtime_checkable
class IndexedExampleProblem(ExampleLossProblem, Protocol):
    """A problem whose examples have stable positions, so a method can keep one dual weight per example."""

    clients: int

    def examples(self, client: int) -> int:
        """n_k, the client's number of examples."""
        ...

    def sample_positions(self, client: int, size: int | None, gen: torch.Generator) -> Tensor:
        """Positions (in 0..n_k-1) of a batch of ``size`` examples drawn uniformly with replacement."""
        ...

    def batch_at(self, client: int, positions: Tensor) -> Any:
        """The batch of the client's examples at ``positions``."""
        ...


# ------------------------------------------------------------------------------------------------ hyperparameters


class ParallelHParams(CompositionalHParams):
    """eta (``lr``, with FedDRO's schedule) and the batch per client; one step per round (I = 1)."""

    local_steps: int = Field(1, ge=1, le=1, description="parallel baselines synchronise every step: I = 1 only")


class GCIVRHParams(ParallelHParams):
    """GCIVR's options: step rule, periodic refresh and initial estimates (code vs paper, see module doc)."""

    outer_batch: int | None = Field(16, ge=1, description="batch b per client and step; null = all local data (the code)")
    optimizer: Literal["sgd", "adagrad"] = Field("sgd", description="'adagrad' as in the code (with lr 0.01)")
    adagrad_eps: float = Field(1e-10, gt=0, description="Adagrad's epsilon (torch.optim.Adagrad's default)")
    refresh_every: int | None = Field(
        None, ge=1, description="fresh estimates of G and J every this many steps (the paper); null = never (the code)"
    )
    refresh_batch: int | None = Field(
        None, ge=1, description="batch per client for fresh estimates (initial and refresh); null = all local data"
    )
    init: Literal["estimate", "code"] = Field(
        "estimate", description="'estimate': G, J fresh at x_0; 'code': G ~ U(0, 1), J = 0 (mlscientist/GCIVR)"
    )


class FastDROHParams(ParallelHParams):
    """The uncertainty set (``geometry``, ``size``) and penalty ``reg`` of FastDRO's batch robust loss."""

    outer_batch: int = Field(16, ge=1, description="batch b per client and step (pooled: K x b losses)")
    geometry: Literal["cvar", "chi2"] = Field("chi2", description="uncertainty set of the robust loss")
    size: float | None = Field(
        1.0, gt=0, description="cvar: alpha in (0, 1]; chi2: rho > 0, null = unconstrained (needs reg > 0)"
    )
    reg: float = Field(0.0, ge=0, description="penalty on the divergence from uniform (KL for cvar, chi2 for chi2)")

    @model_validator(mode="after")
    def _check(self) -> "FastDROHParams":
        if self.geometry == "cvar" and (self.size is None or self.size > 1):
            raise ValueError(f"size = {self.size!r}: for geometry 'cvar' it is alpha and must be in (0, 1]")
        if self.geometry == "chi2" and self.size is None and self.reg == 0:
            raise ValueError("size = None: an unconstrained chi2 set needs reg > 0")
        return self

    @property
    def robust(self) -> dict[str, Any]:
        """Keyword arguments of :func:`robust_weights` / :func:`robust_loss`."""
        return {"geometry": self.geometry, "size": float("inf") if self.size is None else self.size, "reg": self.reg}


class PDSGDHParams(ParallelHParams):
    """The DRO game (``divergence``, ``lam``; by default the task's) and the relative dual step tau."""

    outer_batch: int = Field(16, ge=1, description="batch b per client and step (pooled: K x b examples)")
    divergence: Literal["task", "kl", "chi2"] = Field(
        "task", description="D(p, uniform) of the game; 'task' = the task's objective (its dual_penalty)"
    )
    lam: float | None = Field(None, gt=0, description="lambda of the game; null = the task's (needs divergence 'task')")
    dual_step: float = Field(
        0.05, gt=0, le=1, description="tau in (0, 1]: the dual step as a fraction of the way to the best response"
    )

    @model_validator(mode="after")
    def _check(self) -> "PDSGDHParams":
        if self.divergence == "task" and self.lam is not None:
            raise ValueError(f"lam = {self.lam!r}: give it together with divergence 'kl' or 'chi2' ('task' uses the task's lambda)")
        if self.divergence != "task" and self.lam is None:
            raise ValueError(f"lam = None: divergence {self.divergence!r} needs lam > 0 (or divergence 'task')")
        return self


# ------------------------------------------------------------------------------------------------ states


@dataclass(frozen=True)
class Estimates(Model):
    """GCIVR's server: x_t and the SARAH estimates of g(x_t) and of its Jacobian, with Adagrad's accumulator."""

    G: Tensor
    """G ~ g(x_t) (d_g floats)."""
    J: Tensor
    """J ~ the Jacobian of g at x_t (d_g x d, flat)."""
    accum: Tensor
    """Adagrad's sum of squared directions (zero and unused with ``optimizer: sgd``)."""


@dataclass(frozen=True)
class SeenModel(Model):
    """GCIVR's client: the broadcast x_t and the model it received the step before (for the differences)."""

    x_seen: Tensor
    seen_at: Tensor
    """The step x_seen was received at ([1] float; -1: none yet, so x_{-1} = x_0)."""


@dataclass(frozen=True)
class CohortWeights(Model):
    """FastDRO's and PDSGD's client: x_t, the cohort's client ids (each client's slot in the pooled vectors:
    the federation returns means only) and the server's weights of the pooled examples, by slot."""

    cohort: Tensor
    w: Tensor


@dataclass(frozen=True)
class Game(Model):
    """PDSGD's server: x_t and the dual weights p over all m training examples, kept as the divergence's
    ascent step needs them (:class:`KLGame`: log p; :class:`Chi2Game`: p). A checkpoint's field names which."""

    @classmethod
    def of(cls, tensors: Mapping[str, Tensor]) -> "Game":
        if cls is Game:
            return (KLGame if "log_p" in tensors else Chi2Game).of(tensors)
        return super().of(tensors)  # type: ignore[return-value]


@dataclass(frozen=True)
class KLGame(Game):
    log_p: Tensor

    @classmethod
    def uniform(cls, x: Tensor, m: int) -> "KLGame":
        return cls(x=x, log_p=torch.full((m,), -math.log(m)))

    def weights(self) -> Tensor:
        return self.log_p.exp()

    def penalty(self) -> float:
        """D(p, uniform) = sum_i p_i log(m p_i)."""
        return float((self.weights() * (self.log_p + math.log(self.log_p.numel()))).sum())

    def ascend(self, ghat: Tensor, tau: float, lam: float) -> "KLGame":
        """Entropic mirror ascent: log p = (1 - tau) log p + (tau / lam) ghat - logsumexp(...)."""
        log_p = (1 - tau) * self.log_p + (tau / lam) * ghat
        return self.replace(log_p=log_p - torch.logsumexp(log_p, 0))


@dataclass(frozen=True)
class Chi2Game(Game):
    p: Tensor

    @classmethod
    def uniform(cls, x: Tensor, m: int) -> "Chi2Game":
        return cls(x=x, p=torch.full((m,), 1.0 / m))

    def weights(self) -> Tensor:
        return self.p

    def penalty(self) -> float:
        """D(p, uniform) = (m / 2) sum_i (p_i - 1/m)^2."""
        m = self.p.numel()
        return float(((self.p - 1.0 / m) ** 2).sum() * m / 2)

    def ascend(self, ghat: Tensor, tau: float, lam: float) -> "Chi2Game":
        """Projected ascent: p = Proj_simplex((1 - tau) p + (tau / m)(1 + ghat / lam))."""
        m = self.p.numel()
        return self.replace(p=project_simplex((1 - tau) * self.p + (tau / m) * (1 + ghat / lam)))


GAMES: dict[str, type[KLGame] | type[Chi2Game]] = {"kl": KLGame, "chi2": Chi2Game}


def _slot(cohort: Tensor, client: int) -> int:
    """The client's position in the cohort (the payload carries the cohort's ids as floats)."""
    hits = (cohort == client).nonzero()
    if hits.numel() != 1:
        raise ValueError(f"client {client} is not in the broadcast cohort {cohort.tolist()}")
    return int(hits[0, 0])


def _count_step(fed: Round, d: int, up: int, down: int) -> None:
    """One parallel step as the protocol sends it: a model round (d floats each way) and one low-dimensional
    exchange of ``up`` / ``down`` floats (the simulation's zero-padded cohort vectors are not charged)."""
    fed.count(comm_rounds=1, floats_up=d, floats_down=d, local_steps=1,
              embedding_exchanges=1, embedding_floats_up=up, embedding_floats_down=down)


# ------------------------------------------------------------------------------------------------ GCIVR


@register_algorithm("gcivr")
class GCIVR(Compositional):
    """GCIVR as a synchronous parallel method: SARAH recursion on g and its Jacobian, one model round per step."""

    HParams: ClassVar[type[Params]] = GCIVRHParams
    Client, Server = SeenModel, Estimates
    description = "GCIVR (Haddadpour et al. 2022) in parallel: SARAH estimates of g and its Jacobian, 1 round/step"
    hp: GCIVRHParams

    def join(self, broadcast: Tensors) -> SeenModel:
        x = broadcast["x"]
        return SeenModel(x=x.clone(), x_seen=x.clone(), seen_at=torch.tensor([-1.0]))

    # -- client programs -------------------------------------------------------------------------------------
    def fresh_estimates(self, problem: GlobalCompositionalProblem, client: SeenModel, ctx: ClientContext) -> tuple[SeenModel, Tensors, StepInfo]:
        """g_k, its Jacobian and grad h_k at the broadcast x on the refresh batch B_k."""
        batch = problem.sample(ctx.client, self.hp.refresh_batch, ctx.rng(ctx.round, "refresh"))
        g, jac = inner_and_jacobian(problem, client.x, batch)
        grad_h, h = plain_grad(problem, client.x, batch)
        outputs = {"g": g, "jac": jac.reshape(-1), "grad_h": grad_h}
        return self.seen(client, ctx), outputs, StepInfo(batch_size(batch), float(h))

    def differences(self, problem: GlobalCompositionalProblem, client: SeenModel, ctx: ClientContext) -> tuple[SeenModel, Tensors, StepInfo]:
        """g_k and its Jacobian at the broadcast x_t minus at x_{t-1} on one batch, and grad h_k(x_t)."""
        batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round))
        g, jac = inner_and_jacobian(problem, client.x, batch)
        grad_h, h = plain_grad(problem, client.x, batch)
        n, seen_at = batch_size(batch), int(client.seen_at)
        if seen_at != ctx.round - 1:
            raise ConfigError(self._stale(ctx))
        if seen_at < 0:  # x_{-1} = x_0 (init 'code'): the differences vanish
            dg, djac, samples = torch.zeros_like(g), torch.zeros_like(jac), n
        else:
            g_prev, jac_prev = inner_and_jacobian(problem, client.x_seen, batch)
            dg, djac, samples = g - g_prev, jac - jac_prev, 2 * n
        outputs = {"dg": dg, "djac": djac.reshape(-1), "grad_h": grad_h}
        return self.seen(client, ctx), outputs, StepInfo(samples, float(h))

    @staticmethod
    def seen(client: SeenModel, ctx: ClientContext) -> SeenModel:
        """Keep the model just received, for the next step's differences, and its step index."""
        return client.replace(x_seen=client.x, seen_at=torch.tensor([float(ctx.round)]))

    @staticmethod
    def _stale(ctx: ClientContext) -> str:
        return (
            f"gcivr: client {ctx.client} did not take part in step {ctx.round - 1}, so it cannot form the "
            f"difference at step {ctx.round}; gcivr needs every client every step (federation.clients_per_round: null)"
        )

    # -- server ------------------------------------------------------------------------------------------------
    def start(self, fed: Round, server: Model) -> Estimates:
        """G_0 ~ U(0, 1), J_0 = 0 as in the code (with init 'estimate' step 0 replaces them by fresh estimates)."""
        dg = int(fed.problem.inner_dim)
        G = torch.rand(dg, generator=fed.rng("gcivr-init"))
        return Estimates(x=server.x, G=G, J=torch.zeros(dg * server.x.numel()), accum=torch.zeros_like(server.x))

    def refreshes(self, t: int) -> bool:
        """Fresh estimates at step t: step 0 with init 'estimate', then every ``refresh_every`` steps."""
        if t == 0:
            return self.hp.init == "estimate"
        return self.hp.refresh_every is not None and t % self.hp.refresh_every == 0

    def round(self, fed: Round, server: Estimates) -> Estimates:
        t, x = fed.number, server.x
        if self.refreshes(t):
            est = fed.call("fresh_estimates", fed.cohort(), Model(x=x))
            G, J = est.g, est.jac
        else:
            est = fed.call("differences", fed.cohort(), Model(x=x))
            G, J = server.G + est.dg, server.J + est.djac
        fed.count(local_steps=1)
        direction = est.grad_h + J.view(G.numel(), x.numel()).T @ outer_grad(fed.problem, G)[0]
        lr, accum = self.hp.lr_at(t), server.accum
        if self.hp.optimizer == "adagrad":  # torch.optim.Adagrad with lr_decay = 0, initial accumulator 0
            accum = accum + direction**2
            x = x - lr * direction / (accum.sqrt() + self.hp.adagrad_eps)
        else:
            x = x - lr * direction
        with torch.no_grad():
            fed.train_loss = fed.train_loss + float(fed.problem.outer(G))
        return Estimates(x=x, G=G, J=J, accum=accum)


# ------------------------------------------------------------------------------------------------ MBSGD


@register_algorithm("parallel-mbsgd")
class ParallelMBSGD(Compositional):
    """Mini-batch SGD for compositional problems in parallel: y = <g_k(x; b)>, then a step on a fresh batch b'."""

    HParams: ClassVar[type[Params]] = ParallelHParams
    description = "MBSGD (Ghadimi & Lan) in parallel: <g_k(x; b)> exchanged, grad on fresh b', 1 round/step"

    def step(self, problem: GlobalCompositionalProblem, client: Model, ctx: ClientContext) -> Exchange[Model]:
        """g_k(x_t; b_k) exchanged for y = <g_k>, then grad h_k + grad g_k^T grad f(y) on an independent b'_k."""
        inner = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round, "inner"))
        with torch.no_grad():
            g = problem.inner(client.x, inner)
        y = (yield {"y": g}).y
        batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round))
        grad, h, _ = plain_inner_vjp(problem, client.x, batch, outer_grad(problem, y)[0])
        return client, {"grad": grad}, StepInfo(batch_size(inner) + batch_size(batch), float(h))

    def round(self, fed: Round, server: Model) -> Model:
        """x_t down, g_k up and y = <g_k> down (one exchange), the gradient up (the model round), the step."""
        means = fed.exchange("step", fed.cohort(), server, 1)
        fed.count(local_steps=1)
        with torch.no_grad():
            fed.train_loss = fed.train_loss + float(fed.problem.outer(means.y))
        return Model(x=server.x - self.hp.lr_at(fed.number) * means.grad)


# ------------------------------------------------------------------------------------------------ FastDRO


@register_algorithm("parallel-fastdro")
class ParallelFastDRO(Compositional):
    """FastDRO's batch robust loss in parallel: best-response weights over the pooled K x b losses."""

    HParams: ClassVar[type[Params]] = FastDROHParams
    Client = CohortWeights
    description = "FastDRO (Levy et al. 2020) in parallel: robust weights over pooled K x b losses, 1 round/step"
    hp: FastDROHParams

    def example_losses(self, problem: ExampleLossProblem, client: CohortWeights, ctx: ClientContext) -> tuple[CohortWeights, Tensors, StepInfo]:
        """The batch's per-example losses at x_t, in the client's slot of a cohort-sized zero vector."""
        batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round))
        with torch.no_grad():
            losses = problem.example_losses(client.x, batch).reshape(-1)
        if losses.numel() != self.hp.outer_batch:
            raise ValueError(f"example_losses gave {losses.numel()} losses for a batch of {self.hp.outer_batch}")
        slots = losses.new_zeros(client.cohort.numel(), losses.numel())
        slots[_slot(client.cohort, ctx.client)] = losses
        return client, {"losses": slots.reshape(-1)}, StepInfo(losses.numel(), float(losses.mean()))

    def weighted_gradient(self, problem: ExampleLossProblem, client: CohortWeights, ctx: ClientContext) -> tuple[CohortWeights, Tensors, StepInfo]:
        """grad sum_i p_i l_i(x_t) over the client's batch, with its slot of the server's weights p (constants)."""
        b = self.hp.outer_batch
        weights = client.w.view(-1, b)[_slot(client.cohort, ctx.client)].detach()
        batch = problem.sample(ctx.client, b, ctx.rng(ctx.round))  # the same batch as the losses: keyed by the step
        x = client.x.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(weights @ problem.example_losses(x, batch).reshape(-1), x)
        return client, {"grad": grad}, StepInfo(b)

    def round(self, fed: Round, server: Model) -> Model:
        if not isinstance(fed.problem, ExampleLossProblem):
            raise ConfigError(
                f"algorithm.name = 'parallel-fastdro' needs per-example losses: the task's problem "
                f"{type(fed.problem).__name__} has no example_losses(x, batch)"
            )
        cohort, x, b = fed.cohort(), server.x, self.hp.outer_batch
        n, ids = len(cohort), torch.tensor(cohort, dtype=torch.float32)
        out = fed.call("example_losses", cohort, CohortWeights(x=x, cohort=ids, w=unsent()), message=None)
        pooled = out.losses * n  # each client filled only its own slot
        weights = robust_weights(pooled, **self.hp.robust)
        grads = fed.call("weighted_gradient", cohort, CohortWeights(x=x, cohort=ids, w=weights), message=None)
        fed.train_loss = float(robust_loss(pooled, **self.hp.robust))
        _count_step(fed, x.numel(), up=b, down=b)
        direction = grads.grad * n  # sum over clients of sum_i p_i grad l_i
        return Model(x=x - self.hp.lr_at(fed.number) * direction)


# ------------------------------------------------------------------------------------------------ PDSGD


@register_algorithm("parallel-pdsgd")
class ParallelPDSGD(Compositional):
    """Stochastic primal-dual SGD on the DRO game, in parallel, with the per-example weights p on the server.

    The game (**reconstruction**, see the module doc) is ``s * min_x max_{p in simplex} sum_i p_i l_i(x) -
    lam D(p)`` over all m = sum_k n_k training examples, D the KL or chi^2 divergence from uniform of the
    task's objective (its ``dual_penalty``: the same lam, and s = 1/lam for KL with ``kl_scale: paper``), so
    its value in x is exactly the task's ``robust_loss`` (for chi^2: the simplex-constrained value, which the
    task's closed form equals while all its weights are >= 0). Step t, with each client k of the cohort C
    (n of the K clients) drawing b positions uniformly with replacement from its n_k examples, and
    c_k = (K / n)(n_k / b) the weight that makes pooled sums unbiased for sums over all m examples:

        w_i   = c_k p_i                  for the b examples i of client k      (the batch's primal weights)
        ghat  = sum over the pooled batch of c_k l_i(x_t) e_i                    (unbiased for (l_1..l_m)(x_t))
        x_{t+1} = x_t - eta s sum_k sum_{i in b_k} w_i grad l_i(x_t)            (unbiased for s sum_i p_i grad l_i)
        KL:    log p_{t+1} = (1 - tau) log p_t + (tau / lam) ghat  - logsumexp(...)   (entropic mirror ascent)
        chi^2: p_{t+1} = Proj_simplex((1 - tau) p_t + (tau / m)(1 + ghat / lam))       (projected ascent)

    Both dual steps are ascent steps on sum_i p_i ghat_i - lam D(p) with step tau / lam (KL) or tau / (lam m)
    (chi^2), written with the scale-free tau = ``dual_step`` in (0, 1]: tau = 1 jumps to the best response to
    ghat alone, a small tau averages ghat over about 1/tau steps (each example is drawn about once every
    m / (K b) steps, so tau well below K b / m is needed for p to track exp(l / lam) rather than one batch).
    Primal and dual steps are simultaneous (both at (x_t, p_t)); p_0 is uniform; eta follows ``lr``'s schedule.

    Protocol per step (one model round, one low-dimensional exchange): clients receive x_t and upload their
    b positions and losses (2b floats, in their cohort slot); the server returns each client's b weights w_i
    (b floats), updates p, and the clients upload sum_i w_i grad l_i (d floats). The server keeps p: m floats
    (log p for KL) in the algorithm state and checkpoint, O(m) time per step for KL (every entry contracts)
    and O(m log m) for chi^2 (the projection sorts). Clients' messages do not grow with m; positions travel
    as float32, exact below 2^24 examples per client.
    """


    HParams: ClassVar[type[Params]] = PDSGDHParams
    Client, Server = CohortWeights, Game
    description = "Primal-dual SGD (reconstruction of the paper's PDSGD) in parallel: x SGD, p on the server, 1 round/step"
    hp: PDSGDHParams

    # -- client programs -------------------------------------------------------------------------------------
    def example_losses(self, problem: IndexedExampleProblem, client: CohortWeights, ctx: ClientContext) -> tuple[CohortWeights, Tensors, StepInfo]:
        """The batch's positions and per-example losses at x_t, in the client's slot of cohort-sized vectors."""
        b = self.hp.outer_batch
        positions = problem.sample_positions(ctx.client, b, ctx.rng(ctx.round))
        with torch.no_grad():
            losses = problem.example_losses(client.x, problem.batch_at(ctx.client, positions)).reshape(-1)
        if losses.numel() != b:
            raise ValueError(f"example_losses gave {losses.numel()} losses for a batch of {b}")
        slot, n = _slot(client.cohort, ctx.client), client.cohort.numel()
        pos_slots, loss_slots = losses.new_zeros(n, b), losses.new_zeros(n, b)
        pos_slots[slot], loss_slots[slot] = positions.to(losses.dtype), losses
        outputs = {"positions": pos_slots.reshape(-1), "losses": loss_slots.reshape(-1)}
        return client, outputs, StepInfo(b, float(losses.mean()))

    def weighted_gradient(self, problem: IndexedExampleProblem, client: CohortWeights, ctx: ClientContext) -> tuple[CohortWeights, Tensors, StepInfo]:
        """sum_i w_i grad l_i(x_t) over the client's batch, with its slot of the server's weights w (constants)."""
        b = self.hp.outer_batch
        weights = client.w.view(-1, b)[_slot(client.cohort, ctx.client)].detach()
        positions = problem.sample_positions(ctx.client, b, ctx.rng(ctx.round))  # the same batch: keyed by the step
        x = client.x.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(weights @ problem.example_losses(x, problem.batch_at(ctx.client, positions)).reshape(-1), x)
        return client, {"grad": grad}, StepInfo(b)

    # -- server ------------------------------------------------------------------------------------------------
    def game(self, problem: Any) -> DualPenalty:
        """The game this run plays: the hyperparameters' divergence and lam, or the task's ``dual_penalty``."""
        if self.hp.divergence != "task":
            return DualPenalty(self.hp.divergence, float(self.hp.lam))
        penalty = getattr(problem, "dual_penalty", None)
        if penalty is None:
            raise ConfigError(
                f"algorithm.divergence = 'task' but the task ({type(problem).__name__}) names no DRO game "
                f"(dual_penalty is None or missing); allowed: a KL / chi2 objective, or algorithm.divergence "
                f"'kl' | 'chi2' with algorithm.lam"
            )
        return penalty

    @staticmethod
    def examples(problem: Any) -> Tensor:
        """n_k of every client (the task must give its examples stable positions)."""
        if not isinstance(problem, IndexedExampleProblem):
            raise ConfigError(
                f"algorithm.name = 'parallel-pdsgd' needs per-example positions and losses: the task's problem "
                f"{type(problem).__name__} lacks examples / sample_positions / batch_at / example_losses"
            )
        return torch.tensor([problem.examples(k) for k in range(problem.clients)])

    def start(self, fed: Round, server: Model) -> Game:
        """p_0 uniform over the task's m training examples, kept as the game's divergence needs it."""
        m = int(self.examples(fed.problem).sum())
        return GAMES[self.game(fed.problem).divergence].uniform(server.x, m)

    def round(self, fed: Round, server: KLGame | Chi2Game) -> Game:
        problem, game = fed.problem, self.game(fed.problem)
        sizes = self.examples(problem)
        offsets, m = torch.cumsum(sizes, 0) - sizes, int(sizes.sum())
        p = server.weights()
        if p.numel() != m:
            raise ConfigError(f"the stored dual weights have {p.numel()} entries but the task has {m} examples")
        cohort, x, b = fed.cohort(), server.x, self.hp.outer_batch
        n, ids = len(cohort), torch.tensor(cohort, dtype=torch.float32)

        out = fed.call("example_losses", cohort, CohortWeights(x=x, cohort=ids, w=unsent()), message=None)
        positions = (out.positions * n).round().long().view(n, b)  # each client filled only its slot
        losses = (out.losses * n).view(n, b)
        members = torch.tensor(cohort)
        index = offsets[members].unsqueeze(1) + positions                     # global example ids [n, b]
        c = (problem.clients / n) * sizes[members].to(losses.dtype).unsqueeze(1) / b   # c_k per row [n, 1]
        weights = c * p[index]
        grads = fed.call("weighted_gradient", cohort, CohortWeights(x=x, cohort=ids, w=weights.reshape(-1)), message=None)
        direction = grads.grad * n  # sum over clients of sum_i w_i grad l_i

        ghat = torch.zeros(m, dtype=losses.dtype).index_add_(0, index.reshape(-1), (c * losses).reshape(-1))
        fed.train_loss = game.scale * (float((weights * losses).sum()) - game.lam * server.penalty())
        _count_step(fed, x.numel(), up=2 * b, down=b)
        return server.ascend(ghat, self.hp.dual_step, game.lam).replace(x=x - self.hp.lr_at(fed.number) * game.scale * direction)
