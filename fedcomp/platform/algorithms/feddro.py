"""FedDRO and vanilla FedAvg for compositional problems -- "FedDRO: Federated Compositional Optimization for
Distributionally Robust Learning", Algorithms 1 and 2, as restated in ``reference/ALGORITHMS.md`` section 8.

Problem: min_x h(x) + f((1/K) sum_k g_k(x)) with a low-dimensional inner value g_k(x) in R^{d_g}.

**FedDRO** (Algorithm 2). Every local step t, every client k, on one batch b (the same samples for both
evaluations of g_k):

    y_k = (1 - beta) (y_bar - g_k(x_k_prev; b)) + g_k(x_k; b)       # hybrid estimator on function values
    y_bar = <y_k>                                                  # exchanged EVERY step (d_g floats)
    x_k_prev = x_k;  x_k = x_k - eta (grad h_k(x_k; b) + grad g_k(x_k; b)^T grad f(y_bar))
    every I steps: x_k = <x_k>                                     # model round

y_bar_0 = <g_k(x_0; b)> is the server's starting estimate (:meth:`FedDRO.start`, one exchange before round 0).
A round is that loop over I steps, run by every cohort client as a generator (``fed.exchange``): it yields
y_k at each step and gets y_bar back (I exchanges of d_g floats), and its x goes up at the end (one model
round). The clients keep x_prev (their own last iterate) between rounds.

**Modified FedAvg** (``fedavg-co-shared-y``, Theorem 4.2): y_bar = <g_k(x_k; b)> every step -- FedDRO with
beta = 1. **Vanilla FedAvg** (``fedavg-co-1`` / ``fedavg-co-2``, Algorithm 1): each client descends with its
own y_k = g_k(x_k) between model rounds, from a reset at x_bar: its own g_k(x_bar) in case I, the average
<g_k(x_bar)> in case II (a low-dimensional exchange inside the model round).

**A running shift for KL-DRO** (``kl: shifted``, the default; ALGORITHMS.md pitfall D7). With the KL objective
g = mean exp(l / lambda) overflows float32 once a loss passes ~88 lambda (lr >= 0.7 on ``feddro-offline``).
f = lambda log z is log-homogeneous (grad f(a z) = grad f(z) / a), and the recursion for y is linear in g, so
FedDRO may carry g, y and y_bar at any common scale e^-s: every step's direction grad g^T grad f(y_bar) is
unchanged. The server keeps s beside y_bar (``log_scale``); at the start (after y_bar_0) and after every model
round, when |log y_bar| > :data:`RESCALE_AT` it moves the shift, s <- s + log y_bar and y_bar <- 1, and the
clients evaluate g_k e^-s directly (:meth:`LogScalableProblem.inner_scaled`, e.g. mean exp((l - c - lambda s)
/ lambda)), so the exponents stay within float32's range. While |log y_bar| stays below the threshold s stays 0
and the run is bit for bit the plain one. s is broadcast with y_bar; a client that took part in the last
exchange can compute it from y_bar itself, so (like y_bar) it is not counted again. ``kl: plain`` never moves s.
The shift cannot keep the estimate positive: the hybrid recursion can make y_bar <= 0, where log is undefined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import Algorithm, ClientContext, Exchange, StepInfo, Tensors, batch_size
from fedcomp.platform.algorithms.builtins import (
    FEDAVG_CO_1,
    FEDAVG_CO_2,
    FEDAVG_CO_SHARED_Y,
    FEDDRO,
    CompositionalHParams,
    FedDROHParams,
    SharedEstimateHParams as SharedEstimateHParams,
)
from fedcomp.platform.kinds import COMPOSITIONAL_GLOBAL
from fedcomp.platform.oracles import outer_grad, plain_inner_vjp
from fedcomp.platform.params import Params
from fedcomp.platform.problems import GlobalCompositionalProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import Model, State, unsent

RESCALE_AT = 16.0
"""The running shift moves when |log y_bar| exceeds this (y_bar > e^16 ~ 9e6 leaves e^72 of float32's range)."""


@runtime_checkable
class LogScalableProblem(Protocol):
    """A global compositional problem whose inner value may be evaluated at a scale e^-s, for an outer f with
    f(a z) = f(z) + const (KL-DRO: g = mean exp(l / lambda), f = lambda log z)."""

    log_scalable: bool
    """Whether :meth:`inner_scaled` applies to this instance (e.g. only for the KL objective)."""

    def inner_scaled(self, x: Tensor, batch: Any, log_scale: float) -> Tensor:
        """g_k(x; b) e^-log_scale, computed without forming g_k(x; b)."""
        ...


class AtScale:
    """A log-scalable problem seen at the scale e^-s: ``inner`` is ``inner_scaled(., s)``, the rest delegates."""

    def __init__(self, problem: Any, log_scale: float) -> None:
        self.problem, self.log_scale = problem, log_scale

    def inner(self, x: Tensor, batch: Any) -> Tensor:
        value: Tensor = self.problem.inner_scaled(x, batch, self.log_scale)
        return value

    def plain(self, x: Tensor, batch: Any) -> Tensor:
        value: Tensor = self.problem.plain(x, batch)
        return value

    def outer(self, z: Tensor) -> Tensor:
        value: Tensor = self.problem.outer(z)
        return value


def scalable(problem: Any) -> bool:
    """Whether the problem's inner value may be carried at a running scale (see the module doc)."""
    return isinstance(problem, LogScalableProblem) and bool(problem.log_scalable)


def at_scale(problem: Any, log_scale: Tensor) -> Any:
    """The problem at scale e^-s; the problem itself while s = 0 (so an unshifted run is the plain one, bit for bit)."""
    s = float(log_scale)
    return problem if s == 0.0 or not scalable(problem) else AtScale(problem, s)


def renormalise(problem: Any, y: Tensor, log_scale: Tensor) -> tuple[Tensor, Tensor]:
    """The running shift's rule: (1, s + log y) when |log y| > :data:`RESCALE_AT` for a positive finite scalar
    y of a log-scalable problem, else (y, s) unchanged."""
    if y.numel() != 1 or not scalable(problem):
        return y, log_scale
    value = float(y)
    if not (value > 0 and math.isfinite(value)) or abs(math.log(value)) <= RESCALE_AT:
        return y, log_scale
    return torch.ones_like(y), log_scale + math.log(value)


@dataclass(frozen=True)
class ModelEstimate(Model):
    y: Tensor
    """y-bar, the cohort mean of the clients' estimates of g (d_g floats), carried at the scale e^-log_scale."""
    log_scale: Tensor
    """s, the running shift's log-scale (one float; 0 unless ``kl: shifted`` moved it)."""


@dataclass(frozen=True)
class DROClient(ModelEstimate):
    x_prev: Tensor
    """The client's previous local iterate (its own, never averaged)."""


class Compositional(Algorithm[Any, Any]):
    """The FedDRO paper's problem kind; the server starts from x_0."""

    kind = COMPOSITIONAL_GLOBAL
    HParams: ClassVar[type[Params]] = CompositionalHParams
    Client: ClassVar[type[State]] = Model
    Server: ClassVar[type[State]] = Model
    hp: CompositionalHParams

    def init(self, variables: Tensors) -> Model:
        return Model(x=variables["x"].clone())

    def sample(self, problem: GlobalCompositionalProblem, ctx: ClientContext, *ids: Any) -> Any:
        """The client's batch b keyed by ``ids`` (the same ids give the same batch)."""
        return problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(*ids))


def _last_loss(last: tuple[Tensor, Tensor, Tensor] | None) -> float:
    """The training loss a program reports: h + g . v of its last local step, read once the steps are queued (a
    read per step would make the host wait for the GPU every step); 0.0 without steps."""
    if last is None:
        return 0.0
    h, g, v = last
    return float(h + g @ v)


@register_algorithm(FEDDRO)
class FedDRO(Compositional):
    """FedDRO: hybrid estimator of g shared every local step, model averaged every I steps."""

    Client, Server = DROClient, ModelEstimate
    hp: FedDROHParams

    @property
    def beta(self) -> float:
        return self.hp.beta

    def join(self, broadcast: Tensors) -> DROClient:
        """x_prev starts at the first model the client receives."""
        return DROClient(x=broadcast["x"].clone(), y=broadcast["y"].clone(), log_scale=broadcast["log_scale"].clone(),
                         x_prev=broadcast["x"].clone())

    # -- client programs ---------------------------------------------------------------------------------------
    def initial_estimate(self, problem: GlobalCompositionalProblem, client: DROClient, ctx: ClientContext) -> tuple[DROClient, Tensors, StepInfo]:
        """y_k = g_k(x_0; b), the client's share of y_bar_0."""
        batch = self.sample(problem, ctx, -1)
        return client, {"y": problem.inner(client.x, batch).detach()}, StepInfo(batch_size(batch))

    def local_round(self, problem: GlobalCompositionalProblem, client: DROClient, ctx: ClientContext) -> Exchange[DROClient]:
        """Algorithm 2 over the round's I local steps, from the averaged x and y_bar; x goes up at the end."""
        x, x_prev, y_bar = client.x, client.x_prev, client.y
        scaled = at_scale(problem, client.log_scale)  # g_k e^-s: every value below at the round's scale
        lr, samples, last = self.hp.lr_at(ctx.round), 0, None
        for t in range(ctx.round * self.hp.local_steps, (ctx.round + 1) * self.hp.local_steps):
            b = self.sample(problem, ctx, t)
            with torch.no_grad():
                y = (1 - self.beta) * (y_bar - scaled.inner(x_prev, b)) + scaled.inner(x, b)
            y_bar = (yield {"y": y}).y  # exchanged: y_bar = <y_k>
            v, _ = outer_grad(problem, y_bar)
            grad, h, g = plain_inner_vjp(scaled, x, b, v)  # grad h_k(x; b) + grad g_k(x; b)^T grad f(y_bar)
            x_prev, x = x, x - lr * grad
            samples, last = samples + 3 * batch_size(b), (h, g, v)
        return client.replace(x=x, x_prev=x_prev, y=y_bar), {"x": x}, StepInfo(samples, _last_loss(last))

    # -- server ------------------------------------------------------------------------------------------------
    def start(self, fed: Round, server: Model) -> ModelEstimate:
        """y_bar_0 = <g_k(x_0; b)>: one exchange of d_g floats (the clients hold x_0)."""
        zero = torch.zeros(1)
        y = fed.call("initial_estimate", fed.cohort(), ModelEstimate(x=server.x, y=unsent(), log_scale=zero), message=None).y
        fed.count(embedding_exchanges=1, embedding_floats_up=y.numel(), embedding_floats_down=y.numel())
        y, log_scale = self.shifted(fed, y, zero)
        return ModelEstimate(x=server.x, y=y, log_scale=log_scale)

    def round(self, fed: Round, server: ModelEstimate) -> ModelEstimate:
        """I local steps exchanging y, then the model round (y_bar and its scale ride along for clients that
        missed its exchange)."""
        means = fed.exchange("local_round", fed.cohort(), server, self.hp.local_steps, resent=("y", "log_scale"))
        fed.count(local_steps=self.hp.local_steps)
        y, log_scale = self.shifted(fed, means.y, server.log_scale)
        return ModelEstimate(x=means.x, y=y, log_scale=log_scale)

    def shifted(self, fed: Round, y: Tensor, log_scale: Tensor) -> tuple[Tensor, Tensor]:
        """(y_bar, s) after the running shift's rule (``kl: shifted``), or as they are (``kl: plain``)."""
        return (y, log_scale) if self.hp.kl == "plain" else renormalise(fed.problem, y, log_scale)


@register_algorithm(FEDAVG_CO_SHARED_Y)
class FedAvgSharedY(FedDRO):
    """Modified FedAvg (FedDRO paper, Theorem 4.2): y_bar = <g_k(x_k; b)> every step (FedDRO with beta = 1)."""


    @property
    def beta(self) -> float:
        return 1.0


class _VanillaCO(Compositional):
    """Vanilla FedAvg for compositional problems: local y_k = g_k(x_k) between model rounds, from a reset."""

    def reset(self, problem: GlobalCompositionalProblem, x: Tensor, ctx: ClientContext) -> tuple[Tensor, Any]:
        """g_k(x_bar; b) on the round's reset batch b (and the batch)."""
        batch = self.sample(problem, ctx, ctx.round * self.hp.local_steps, "reset")
        return problem.inner(x, batch).detach(), batch

    def descend(self, problem: GlobalCompositionalProblem, x: Tensor, y: Tensor, ctx: ClientContext) -> tuple[Tensor, StepInfo]:
        """I steps x <- x - eta grad g_k(x; b)^T grad f(y_k), then y_k <- g_k(x; b) at the new point (same b)."""
        first, samples, last = ctx.round * self.hp.local_steps, 0, None
        for s in range(self.hp.local_steps):
            batch = self.sample(problem, ctx, first + s)
            v, _ = outer_grad(problem, y)
            grad, h, g = plain_inner_vjp(problem, x, batch, v)
            x = x - self.hp.lr_at(ctx.round) * grad
            with torch.no_grad():
                y = problem.inner(x, batch)
            samples, last = samples + 2 * batch_size(batch), (h, g, v)
        return x, StepInfo(samples, _last_loss(last))


@register_algorithm(FEDAVG_CO_1)
class FedAvgCO1(_VanillaCO):
    """Vanilla FedAvg for compositional problems, case I: y_k = g_k(x_bar) reset locally at each model round."""


    def local_steps(self, problem: GlobalCompositionalProblem, client: Model, ctx: ClientContext) -> tuple[Model, Tensors, StepInfo]:
        """The client's own reset y_k = g_k(x_bar; b), then I local steps."""
        y, _ = self.reset(problem, client.x, ctx)
        x, info = self.descend(problem, client.x, y, ctx)
        return Model(x=x), {"x": x}, info

    def round(self, fed: Round, server: Model) -> Model:
        return Model(x=fed.local_steps(server, self.hp.local_steps).x)


@register_algorithm(FEDAVG_CO_2)
class FedAvgCO2(_VanillaCO):
    """Vanilla FedAvg for compositional problems, case II: y_k = <g_k(x_bar)> at each model round."""


    def local_round(self, problem: GlobalCompositionalProblem, client: Model, ctx: ClientContext) -> Exchange[Model]:
        """The averaged reset y = <g_k(x_bar; b)> (one exchange), then I local steps."""
        y, batch = self.reset(problem, client.x, ctx)
        y_bar = (yield {"y": y}).y
        x, info = self.descend(problem, client.x, y_bar, ctx)
        return Model(x=x), {"x": x}, StepInfo(batch_size(batch) + info.samples, info.loss)

    def round(self, fed: Round, server: Model) -> Model:
        x = fed.exchange("local_round", fed.cohort(), server, 1).x
        fed.count(local_steps=self.hp.local_steps)
        return Model(x=x)
