"""FedOut (the paper's Algorithm 4) and the hypergradients it starts from.

h = <grad_x f_i(x, y) - grad^2_xy g_i(x, y) p> (just grad_x f_i for minimax problems, g = -f); FedOut by SVRG
(1 round on the hypergradient's cohort): every client runs ``local_steps`` (tau) steps
x_i <- x_i - alpha (grad_x f_i(x_i, y; z) - grad_x f_i(x, y; z) + h); x = <x_i>. LFedNest's local variants use
each client's own Neumann series (:meth:`FedOut.local_ihgp`) instead of FedIHGP.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext, StepInfo, batch_size
from fedcomp.platform.algorithms.fednest.base import Counted, FedNestBase, Point, Reply, WithH, WithP
from fedcomp.platform.algorithms.fednest.fedihgp import neumann_series
from fedcomp.platform.oracles import grad_xy, grad_y, hvp_yy, jvp_xy
from fedcomp.platform.problems import BilevelProblem
from fedcomp.platform.rounds import Round

__all__ = ["FedOut", "fedout_svrg", "local_step_call"]


def fedout_svrg(fed: Round, cohort: list[int], x: Tensor, y: Tensor, h: Tensor) -> Tensor:
    """FedOut after the hypergradient h (1 round, the hypergradient round's cohort, which holds x and y): tau
    SVRG-corrected local steps on x around h, averaged."""
    return fed.call("outer_svrg", cohort, WithH(x, y, h), resent=("x", "y")).x


def local_step_call(call: int, step: int) -> int:
    """The call id that keys the oracle batches of LFedNest's local outer step ``step`` in call ``call``.

    The first implementation ran each local step as a nested client program numbered ``call * 1000 + step``;
    keeping that id keeps its random streams, so runs reproduce bit for bit."""
    return call * 1000 + step



class FedOut(FedNestBase):
    """The hypergradient and FedOut client programs (and LFedNest's local ones)."""

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
