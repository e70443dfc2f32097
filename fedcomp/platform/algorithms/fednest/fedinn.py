"""FedInn (the paper's Algorithm 2): T calls per epoch, each updating the inner variable y.

* by SVRG (2 rounds, :func:`fedinn_svrg`): q = <grad_y g_i(x, y)>; every client runs ``inner_steps`` steps
  y_i <- y_i - beta (grad_y g_i(x, y_i; z) - grad_y g_i(x, y; z) + q) on one batch z per step; y = <y_i>;
* by local SGD (1 round, :func:`fedinn_sgd`): y_i <- y_i - beta grad_y g_i(x, y_i; z); y = <y_i>.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext, StepInfo, batch_size, mean_loss
from fedcomp.platform.algorithms.fednest.base import Counted, FedNestBase, Point, Reply, WithQ
from fedcomp.platform.oracles import grad_y
from fedcomp.platform.problems import BilevelProblem
from fedcomp.platform.rounds import Round

__all__ = ["FedInn", "fedinn_sgd", "fedinn_svrg"]


def fedinn_svrg(fed: Round, cohort: list[int], x: Tensor, y: Tensor) -> Tensor:
    """FedInn by SVRG (2 rounds): the anchor q, then ``inner_steps`` corrected local steps on y, averaged."""
    q = fed.call("inner_anchor", cohort, Point(x, y)).q
    return fed.call("inner_svrg", cohort, WithQ(x, y, q), resent=("x", "y")).y


def fedinn_sgd(fed: Round, cohort: list[int], x: Tensor, y: Tensor) -> Tensor:
    """FedInn by local SGD (1 round)."""
    return fed.call("inner_sgd", cohort, Point(x, y)).y



class FedInn(FedNestBase):
    """FedInn's client programs."""

    def _inner_steps(
        self, problem: BilevelProblem, view: Point, ctx: ClientContext, direction: Callable[..., Tensor], oracles: int
    ) -> Counted:
        """``inner_steps`` steps y <- y - beta direction(g_i(.; z), y), one batch z per step."""
        y, samples, losses = view.y.clone(), 0, []
        for s in range(self.hp.inner_steps):
            batch = self._inner_batch(problem, ctx, s)
            g = lambda a, b: problem.inner_loss(a, b, batch)  # noqa: E731, B023 (used in this iteration)
            d = direction(g, y)
            samples += batch_size(batch) * oracles
            losses.append(problem.inner_loss(view.x, y, batch).detach())
            y = y - self.hp.inner_lr * d
        return y, StepInfo(samples, mean_loss(losses))

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
