"""FedIHGP (the paper's Algorithm 3): p ~ [grad^2_yy g]^{-1} grad_y f, by federated Neumann rounds.

* ``paper`` (1 + N' rounds): p_0 = (N / l) <grad_y f_i(x, y)>, then N' ~ U{0..N-1} rounds of
  p_n = <(I - H_i / l) p_{n-1}> with H_i = grad^2_yy g_i -- an unbiased truncated Neumann estimate;
* ``deterministic``: p = (1/l) sum_{n=0..N} (I - H/l)^n grad_y f in 1 + N rounds;
* ``code``: the authors' code -- fixed N rounds, no N/l factor, each client multiplying its own counter by
  (I - H_i / l), the server adding (1/n) <counter> -- **[derived from the code reading in ALGORITHMS.md 7.5;
  reconstruction]**, with the indirect term scaled by 1/l as in the hyper-representation code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext, StepInfo, batch_size
from fedcomp.platform.algorithms.fednest.base import Cohorts, CounterStep, FedNestBase, Point, Reply, WithP
from fedcomp.platform.oracles import grad_y, hvp_yy
from fedcomp.platform.problems import BilevelProblem
from fedcomp.platform.rounds import Round

__all__ = ["FEDIHGP", "FedIHGP", "neumann_series"]


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



class FedIHGP(FedNestBase):
    """FedIHGP's client programs."""

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
