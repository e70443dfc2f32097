"""FedNest and its variants -- "FedNest: Federated Bilevel, Minimax, and Compositional Optimization"
(Tarzanagh et al., ICML 2022), Algorithms 1-4, as restated in ``reference/ALGORITHMS.md`` section 7.

One round here is one FedNest *epoch* (outer iteration k), made of communication sub-rounds, each counted
and each on a fresh cohort. The sub-rounds are the functions below, and each algorithm's round composes them:

* FedInn by SVRG (2 rounds, :func:`fedinn_svrg`): q = <grad_y g_i(x, y)>; every client runs ``inner_steps``
  steps y_i <- y_i - beta (grad_y g_i(x, y_i; z) - grad_y g_i(x, y; z) + q) on one batch z per step;
  y = <y_i>. By local SGD instead (1 round, :func:`fedinn_sgd`): y_i <- y_i - beta grad_y g_i(x, y_i; z).
* FedIHGP: ``paper`` (1 + N' rounds): p_0 = (N / l) <grad_y f_i(x, y)>, then N' ~ U{0..N-1} rounds of
  p_n = <(I - H_i / l) p_{n-1}> with H_i = grad^2_yy g_i -- an unbiased truncated Neumann estimate of
  [grad^2_yy g]^{-1} grad_y f. ``deterministic``: p = (1/l) sum_{n=0..N} (I - H/l)^n grad_y f in 1 + N
  rounds. ``code``: the authors' code -- fixed N rounds, no N/l factor, each client multiplying its own
  counter by (I - H_i / l), the server adding (1/n) <counter> -- **[derived from the code reading in
  ALGORITHMS.md 7.5; reconstruction]**, with the indirect term scaled by 1/l as in the
  hyper-representation code.
* FedOut by SVRG (2 rounds): h = <grad_x f_i(x, y) - grad^2_xy g_i(x, y) p>; every client runs
  ``local_steps`` (tau) steps x_i <- x_i - alpha (grad_x f_i(x_i, y; z) - grad_x f_i(x, y; z) + h); x = <x_i>.
  For minimax problems (g = -f) the indirect term vanishes and FedIHGP is skipped.

Rounds per epoch: FedNest 2T + N' + 3 (2T + N + 3 with a fixed N), FedNest_SGD T + N' + 3, LFedNest T + 1
(local hypergradients with each client's own Hessian, tau local outer steps, then x averaged),
LFedNest_SVRG 2T + 2 **[inferred]**. The paper's minimax baseline FedAvg-S is in :mod:`.fedavg_s`.
Anchors, grad_y f, Hessian products and hypergradients use each client's full local data unless
``oracle_batch`` is set (the code's choice; pitfall N4).

A FedNest client keeps nothing between sub-rounds (except the ``code`` variant's counter): each client
program reads the typed message its sub-round broadcasts -- the type of its ``view`` parameter -- and
returns the vector the server averages.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

import torch
from pydantic import Field
from torch import Tensor

from fedcomp.platform.algorithms.base import Algorithm, ClientContext, StepInfo, Tensors, batch_size
from fedcomp.platform.oracles import grad_xy, grad_y, hvp_yy, jvp_xy
from fedcomp.platform.params import Params
from fedcomp.platform.problems import BILEVEL, BilevelProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import State


class FedNestHParams(Params):
    """alpha (``lr``), beta (``inner_lr``), tau (``local_steps``), T (``inner_rounds``), N, 1/l and batches."""

    lr: float = Field(0.01, gt=0, description="outer step size alpha")
    inner_lr: float = Field(0.01, gt=0, description="inner step size beta")
    local_steps: int = Field(1, ge=1, description="local outer steps tau in FedOut")
    inner_rounds: int = Field(1, ge=1, description="FedInn calls per epoch (T)")
    inner_steps: int = Field(5, ge=1, description="local steps per FedInn call")
    neumann_terms: int = Field(5, ge=1, description="Neumann terms N")
    neumann_lr: float = Field(0.01, gt=0, description="Neumann step 1/l (l bounds the Hessian of g in y)")
    ihgp: Literal["paper", "deterministic", "code"] = Field("paper", description="FedIHGP variant")
    cohorts: Literal["fresh", "shared"] = Field(
        "fresh", description="FedNest: a cohort per sub-round (the paper), or one for FedIHGP, hypergradient and FedOut (the code)"
    )
    inner_batch: int | None = Field(64, ge=1, description="batch of local inner steps; null = all local data")
    outer_batch: int | None = Field(None, ge=1, description="batch of local outer steps; null = all local data")
    oracle_batch: int | None = Field(None, ge=1, description="batch of anchors, HVPs, hypergradients; null = all")


# -- states and messages ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point(State):
    """(x, y): the server's state, a client's, and what every sub-round broadcasts."""

    x: Tensor
    y: Tensor


@dataclass(frozen=True)
class WithQ(Point):
    q: Tensor
    """FedInn's SVRG anchor <grad_y g_i(x, y)>."""


@dataclass(frozen=True)
class WithP(Point):
    p: Tensor
    """A FedIHGP vector (p_{n-1}; for the ``code`` variant p_0), or its final estimate."""


@dataclass(frozen=True)
class WithH(Point):
    h: Tensor
    """The hypergradient: FedOut's SVRG anchor."""


@dataclass(frozen=True)
class Counter(Point):
    """A client of the ``code`` variant: its own Neumann counter, private, restarted once per epoch."""

    counter: Tensor
    """(I - H_i / l)^m p_0 after the client's m-th FedIHGP call of epoch ``counter_epoch``."""
    counter_epoch: Tensor
    """The epoch whose p_0 the counter started from (-1: none): the client's first call of an epoch restarts it."""


@dataclass(frozen=True)
class CounterStep(Counter):
    p: Tensor
    """p_0, broadcast with every call."""


V = TypeVar("V", bound=State)
Reply = tuple[V, Mapping[str, Tensor], StepInfo]
"""What a client program returns: its view (updated where it keeps private fields), outputs to average, counts."""
Counted = tuple[Tensor, StepInfo]
"""A client-side vector with the oracle calls (and loss) it took."""
Cohorts = Iterator[list[int]]


# -- sub-rounds: what the server does ----------------------------------------------------------------------
def fresh_cohorts(fed: Round) -> Cohorts:
    """The round's cohorts 0, 1, 2, ... in turn: FedNest samples a fresh cohort for every sub-round."""
    return (fed.cohort(k) for k in itertools.count())


def fedinn_svrg(fed: Round, cohort: list[int], x: Tensor, y: Tensor) -> Tensor:
    """FedInn by SVRG (2 rounds): the anchor q, then ``inner_steps`` corrected local steps on y, averaged."""
    q = fed.call("inner_anchor", cohort, Point(x, y)).q
    return fed.call("inner_svrg", cohort, WithQ(x, y, q), resent=("x", "y")).y


def fedinn_sgd(fed: Round, cohort: list[int], x: Tensor, y: Tensor) -> Tensor:
    """FedInn by local SGD (1 round)."""
    return fed.call("inner_sgd", cohort, Point(x, y)).y


def neumann_series(v: Tensor, step: Callable[[Tensor], Tensor], terms: int, eta: float) -> Tensor:
    """eta sum_{n=0..terms} A^n v, where ``step`` applies A = I - eta H (an approximation of H^{-1} v)."""
    term, total = v, v.clone()
    for _ in range(terms):
        term = step(term)
        total = total + term
    return eta * total


def fedihgp_paper(fed: Round, cohorts: Cohorts, x: Tensor, y: Tensor, terms: int, eta: float) -> Tensor:
    """p_0 = N eta <grad_y f_i>, then N' ~ U{0..N-1} rounds p <- <(I - eta H_i) p> (1 + N' rounds)."""
    v = fed.call("ihgp_start", next(cohorts), Point(x, y)).v
    n_prime = int(torch.randint(terms, (1,), generator=fed.rng("neumann")))
    p = terms * eta * v
    for _ in range(n_prime):
        p = fed.call("ihgp_step", next(cohorts), WithP(x, y, p)).p
    return p


def fedihgp_deterministic(fed: Round, cohorts: Cohorts, x: Tensor, y: Tensor, terms: int, eta: float) -> Tensor:
    """p = eta sum_{n=0..N} (I - eta H)^n <grad_y f_i>, one round per power (1 + N rounds)."""
    v = fed.call("ihgp_start", next(cohorts), Point(x, y)).v
    return neumann_series(v, lambda p: fed.call("ihgp_step", next(cohorts), WithP(x, y, p)).p, terms, eta)


def fedihgp_code(fed: Round, cohorts: Cohorts, x: Tensor, y: Tensor, terms: int, eta: float) -> Tensor:
    """The code's p = eta (p_0 + sum_{n=1..N} (1/n) <c_i>), c_i each client's own counter (1 + N rounds)."""
    v = fed.call("ihgp_start", next(cohorts), Point(x, y)).v
    total = v.clone()
    for n in range(1, terms + 1):
        total = total + fed.call("ihgp_code_step", next(cohorts), WithP(x, y, v)).c / n
    return eta * total


FEDIHGP = {"paper": fedihgp_paper, "deterministic": fedihgp_deterministic, "code": fedihgp_code}


def fedout_svrg(fed: Round, cohort: list[int], x: Tensor, y: Tensor, h: Tensor) -> Tensor:
    """FedOut after the hypergradient h (1 round, the hypergradient round's cohort, which holds x and y): tau
    SVRG-corrected local steps on x around h, averaged."""
    return fed.call("outer_svrg", cohort, WithH(x, y, h), resent=("x", "y")).x


def local_step_call(call: int, step: int) -> int:
    """The call id that keys the oracle batches of LFedNest's local outer step ``step`` in call ``call``.

    The first implementation ran each local step as a nested client program numbered ``call * 1000 + step``;
    keeping that id keeps its random streams, so runs reproduce bit for bit."""
    return call * 1000 + step


# -- client programs -----------------------------------------------------------------------------------
class _FedNestFamily(Algorithm[Point, Point]):
    """The client programs of the FedNest family; each algorithm below writes its round from the sub-rounds."""

    kind = BILEVEL
    HParams = FedNestHParams
    Client: ClassVar[type[State]] = Point
    Server = Point
    hp: FedNestHParams

    def init(self, variables: Tensors) -> Point:
        return Point(x=variables["x"].clone(), y=variables["y"].clone())

    def _sample(
        self, problem: BilevelProblem, ctx: ClientContext, split: Literal["inner", "outer"], size: int | None, call: int, tag: int
    ) -> Any:
        """The client's batch of ``split`` keyed by (round, call, tag)."""
        return problem.sample(ctx.client, split, size, ctx.rng(ctx.round, call, tag))

    def _hypergradient(
        self, problem: BilevelProblem, ctx: ClientContext, call: int, x: Tensor, y: Tensor, p: Tensor | None
    ) -> Counted:
        """h_i = grad_x f_i(x, y) - grad^2_xy g_i(x, y) p (just grad_x f_i if p is None), and f_i(x, y)."""
        outer = self._sample(problem, ctx, "outer", self.hp.oracle_batch, call, 0)
        h, _ = grad_xy(lambda a, b: problem.outer_loss(a, b, outer), x, y)
        info = StepInfo(batch_size(outer), float(problem.outer_loss(x, y, outer)))
        if p is not None:
            inner = self._sample(problem, ctx, "inner", self.hp.oracle_batch, call, 1)
            h = h - jvp_xy(lambda a, b: problem.inner_loss(a, b, inner), x, y, p)
            info.samples += batch_size(inner)
        return h, info

    def local_ihgp(self, problem: BilevelProblem, x: Tensor, y: Tensor, batch: Any, v: Tensor) -> Tensor:
        """(1/l) sum_{n=0..N} (I - H_i/l)^n v with the client's own Hessian (LFedNest's local FedIHGP)."""
        eta = self.hp.neumann_lr
        step = lambda t: t - eta * hvp_yy(lambda a, b: problem.inner_loss(a, b, batch), x, y, t)  # noqa: E731
        return neumann_series(v, step, self.hp.neumann_terms, eta)

    def _local_hypergradient(
        self, problem: BilevelProblem, ctx: ClientContext, call: int, x: Tensor, y: Tensor
    ) -> Counted:
        """h_i with p_i = the client's own Neumann series on grad_y f_i (no indirect term for minimax problems)."""
        p = None
        if not problem.minimax:
            outer = self._sample(problem, ctx, "outer", self.hp.oracle_batch, call, 2)
            inner = self._sample(problem, ctx, "inner", self.hp.oracle_batch, call, 3)
            p = self.local_ihgp(problem, x, y, inner, grad_y(lambda a, b: problem.outer_loss(a, b, outer), x, y))
        return self._hypergradient(problem, ctx, call, x, y, p)

    def _inner_steps(
        self, problem: BilevelProblem, view: Point, ctx: ClientContext, direction: Callable[..., Tensor], oracles: int
    ) -> Counted:
        """``inner_steps`` steps y <- y - beta direction(g_i(.; z), y), one batch z per step."""
        y, samples, loss = view.y.clone(), 0, 0.0
        for s in range(self.hp.inner_steps):
            batch = self._sample(problem, ctx, "inner", self.hp.inner_batch, ctx.sub, s)
            g = lambda a, b: problem.inner_loss(a, b, batch)  # noqa: E731, B023 (used in this iteration)
            d = direction(g, y)
            samples += batch_size(batch) * oracles
            loss += float(problem.inner_loss(view.x, y, batch)) / self.hp.inner_steps
            y = y - self.hp.inner_lr * d
        return y, StepInfo(samples, loss)

    def inner_anchor(self, problem: BilevelProblem, view: Point, ctx: ClientContext) -> Reply[Point]:
        """q_i = grad_y g_i(x, y)."""
        batch = self._sample(problem, ctx, "inner", self.hp.oracle_batch, ctx.sub, 0)
        q = grad_y(lambda a, b: problem.inner_loss(a, b, batch), view.x, view.y)
        return view, {"q": q}, StepInfo(batch_size(batch), float(problem.inner_loss(view.x, view.y, batch)))

    def inner_svrg(self, problem: BilevelProblem, view: WithQ, ctx: ClientContext) -> Reply[WithQ]:
        """y_i <- y_i - beta (grad_y g_i(x, y_i; z) - grad_y g_i(x, y; z) + q)."""
        x, y0, q = view.x, view.y, view.q
        y, info = self._inner_steps(problem, view, ctx, lambda g, y: grad_y(g, x, y) - grad_y(g, x, y0) + q, oracles=2)
        return view, {"y": y}, info

    def inner_sgd(self, problem: BilevelProblem, view: Point, ctx: ClientContext) -> Reply[Point]:
        """y_i <- y_i - beta grad_y g_i(x, y_i; z)."""
        y, info = self._inner_steps(problem, view, ctx, lambda g, y: grad_y(g, view.x, y), oracles=1)
        return view, {"y": y}, info

    def ihgp_start(self, problem: BilevelProblem, view: Point, ctx: ClientContext) -> Reply[Point]:
        """v_i = grad_y f_i(x, y) (the server scales the mean)."""
        batch = self._sample(problem, ctx, "outer", self.hp.oracle_batch, ctx.sub, 0)
        v = grad_y(lambda a, b: problem.outer_loss(a, b, batch), view.x, view.y)
        return view, {"v": v}, StepInfo(batch_size(batch), float(problem.outer_loss(view.x, view.y, batch)))

    def ihgp_step(self, problem: BilevelProblem, view: WithP, ctx: ClientContext) -> Reply[WithP]:
        """p_i = (I - H_i / l) p."""
        batch = self._sample(problem, ctx, "inner", self.hp.oracle_batch, ctx.sub, 0)
        p = view.p - self.hp.neumann_lr * hvp_yy(lambda a, b: problem.inner_loss(a, b, batch), view.x, view.y, view.p)
        return view, {"p": p}, StepInfo(batch_size(batch))

    def ihgp_code_step(self, problem: BilevelProblem, view: CounterStep, ctx: ClientContext) -> Reply[CounterStep]:
        """c_i <- (I - H_i / l) c_i on the client's own counter, started at p_0 by its first call of the epoch."""
        batch = self._sample(problem, ctx, "inner", self.hp.oracle_batch, ctx.sub, 0)
        c = view.p if int(view.counter_epoch) != ctx.round else view.counter
        c = c - self.hp.neumann_lr * hvp_yy(lambda a, b: problem.inner_loss(a, b, batch), view.x, view.y, c)
        view = view.replace(counter=c, counter_epoch=torch.tensor(float(ctx.round)))
        return view, {"c": c}, StepInfo(batch_size(batch))

    def hypergradient(self, problem: BilevelProblem, view: WithP, ctx: ClientContext) -> Reply[WithP]:
        """h_i = grad_x f_i(x, y) - grad^2_xy g_i(x, y) p."""
        h, info = self._hypergradient(problem, ctx, ctx.sub, view.x, view.y, view.p)
        return view, {"h": h}, info

    def direct_gradient(self, problem: BilevelProblem, view: Point, ctx: ClientContext) -> Reply[Point]:
        """h_i = grad_x f_i(x, y): the hypergradient of a minimax problem."""
        h, info = self._hypergradient(problem, ctx, ctx.sub, view.x, view.y, None)
        return view, {"h": h}, info

    def local_hypergradient(self, problem: BilevelProblem, view: Point, ctx: ClientContext) -> Reply[Point]:
        """h_i with the client's own Neumann series (LFedNest_SVRG averages them)."""
        h, info = self._local_hypergradient(problem, ctx, ctx.sub, view.x, view.y)
        return view, {"h": h}, info

    def outer_svrg(self, problem: BilevelProblem, view: WithH, ctx: ClientContext) -> Reply[WithH]:
        """tau steps x_i <- x_i - alpha (grad_x f_i(x_i, y; z) - grad_x f_i(x, y; z) + h)."""
        x0, y, h = view.x, view.y, view.h
        x, samples = x0.clone(), 0
        for s in range(self.hp.local_steps):
            batch = self._sample(problem, ctx, "outer", self.hp.outer_batch, ctx.sub, s)
            f = lambda a, b: problem.outer_loss(a, b, batch)  # noqa: E731, B023 (used in this iteration)
            x = x - self.hp.lr * (grad_xy(f, x, y)[0] - grad_xy(f, x0, y)[0] + h)
            samples += 2 * batch_size(batch)
        return view, {"x": x}, StepInfo(samples)

    def local_outer(self, problem: BilevelProblem, view: Point, ctx: ClientContext) -> Reply[Point]:
        """LFedNest: tau local steps x_i <- x_i - alpha h_i(x_i) with purely local hypergradients."""
        x, samples, loss = view.x.clone(), 0, 0.0
        for s in range(self.hp.local_steps):
            h, info = self._local_hypergradient(problem, ctx, local_step_call(ctx.sub, s), x, view.y)
            x = x - self.hp.lr * h
            samples, loss = samples + info.samples, info.loss
        return view, {"x": x}, StepInfo(samples, loss)


# -- the algorithms: one epoch each --------------------------------------------------------------------------
@register_algorithm("fednest")
class FedNest(_FedNestFamily):
    """FedNest: T x FedInn (SVRG), FedIHGP, FedOut (SVRG); 2T + N' + 3 rounds per epoch."""

    description = "FedNest: federated bilevel/minimax with SVRG FedInn, FedIHGP, FedOut (Tarzanagh et al. 2022)"
    fedinn = staticmethod(fedinn_svrg)

    def __init__(self, hparams: Params) -> None:
        super().__init__(hparams)
        if self.hp.ihgp == "code":
            self.Client = Counter  # type: ignore[misc]

    def join(self, broadcast: Tensors) -> Point:
        x, y = broadcast["x"].clone(), broadcast["y"].clone()
        if self.hp.ihgp == "code":
            return Counter(x, y, counter=torch.zeros_like(y), counter_epoch=torch.tensor(-1.0))
        return Point(x, y)

    def fedihgp(self, fed: Round, cohorts: Cohorts, x: Tensor, y: Tensor) -> Tensor:
        """FedIHGP by the configured variant (``ihgp``): p ~ [grad^2_yy g]^{-1} grad_y f."""
        return FEDIHGP[self.hp.ihgp](fed, cohorts, x, y, self.hp.neumann_terms, self.hp.neumann_lr)

    def round(self, fed: Round, server: Point) -> Point:
        hp, (x, y), cohorts = self.hp, (server.x, server.y), fresh_cohorts(fed)
        for _ in range(hp.inner_rounds):
            y = self.fedinn(fed, next(cohorts), x, y)
        if hp.cohorts == "shared":  # the authors' code: FedIHGP, the hypergradient and FedOut on one cohort
            cohorts = itertools.repeat(next(cohorts))
        if fed.problem.minimax:  # g = -f: no indirect term, no FedIHGP
            cohort = next(cohorts)
            h = fed.call("direct_gradient", cohort, Point(x, y)).h
        else:
            p = self.fedihgp(fed, cohorts, x, y)
            cohort = next(cohorts)
            h = fed.call("hypergradient", cohort, WithP(x, y, p)).h
        fed.train_loss = fed.record.train_loss  # the round reports f(x, y) as the hypergradient call measured it
        x = fedout_svrg(fed, cohort, x, y, h)
        fed.count(local_steps=hp.inner_rounds * hp.inner_steps + hp.local_steps)
        return Point(x, y)


@register_algorithm("fednest-sgd")
class FedNestSGD(FedNest):
    """FedNest with FedInn by local SGD (1 round per call); T + N' + 3 rounds per epoch."""

    description = "FedNest_SGD: FedNest with local SGD in FedInn (ablation)"
    fedinn = staticmethod(fedinn_sgd)


@register_algorithm("lfednest")
class LFedNest(_FedNestFamily):
    """Light FedNest: local SGD on y, then local hypergradient steps on x; T + 1 rounds per epoch."""

    description = "LFedNest: local FedInn and local hypergradients, T+1 rounds (reconstructed from the code)"

    def round(self, fed: Round, server: Point) -> Point:
        hp, (x, y), cohorts = self.hp, (server.x, server.y), fresh_cohorts(fed)
        for _ in range(hp.inner_rounds):
            y = fedinn_sgd(fed, next(cohorts), x, y)
        x = fed.call("local_outer", next(cohorts), Point(x, y)).x  # tau local hypergradient steps, x averaged
        fed.count(local_steps=hp.inner_rounds * hp.inner_steps + hp.local_steps)
        return Point(x, y)


@register_algorithm("lfednest-svrg")
class LFedNestSVRG(_FedNestFamily):
    """LFedNest with SVRG FedInn, averaged local hypergradients and SVRG outer steps; 2T + 2 rounds."""

    description = "LFedNest_SVRG: SVRG FedInn, averaged local hypergradients (code only; inferred)"

    def round(self, fed: Round, server: Point) -> Point:
        hp, (x, y), cohorts = self.hp, (server.x, server.y), fresh_cohorts(fed)
        for _ in range(hp.inner_rounds):
            y = fedinn_svrg(fed, next(cohorts), x, y)
        cohort = next(cohorts)
        h = fed.call("local_hypergradient", cohort, Point(x, y)).h
        fed.train_loss = fed.record.train_loss  # f(x, y) as the hypergradient call measured it (FedOut does not)
        x = fedout_svrg(fed, cohort, x, y, h)
        fed.count(local_steps=hp.inner_rounds * hp.inner_steps + hp.local_steps)
        return Point(x, y)


__all__ = ["FedNest", "FedNestSGD", "LFedNest", "LFedNestSVRG"]
