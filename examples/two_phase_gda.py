"""A user's algorithm with a round program of its own, in one file: what ``fedcomp run examples/two_phase_gda.yaml``
runs (the FedNest paper's quadratic minimax, whose saddle point the task knows in closed form).

Algorithm ``two-phase-gda``, for min_x max_y (1/K) sum_k f_k(x, y): every round, two calls to the cohort --

    ascend  (sub-round 0):  every client, p steps  y <- y + beta grad_y f_k(x, y)   at the server's x;   y = <y_k>
    descend (sub-round 1):  every client, q steps  x <- x - alpha grad_x f_k(x, y)  at that y;           x = <x_k>

Where ``LocalSteps`` (``examples/extension.py``) fixes the round -- q steps, then the average -- an ``Algorithm``
writes it: ``round(fed, server)`` calls client programs by name (``fed.call``) and gets their outputs' cohort
means back (``Means``, read as attributes); each program takes the problem, the record it is annotated with (here
the broadcast (x, y): ``Point``) and its ``ClientContext`` (who, which round and sub-round, keyed random streams),
and returns that record, the outputs to average and a ``StepInfo`` (samples drawn, mean loss). The calls count
their messages and samples; the local steps a round takes are counted by the round (``fed.count``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from torch import Tensor

from fedcomp.extension import (  # everything a file of one's own algorithm imports of fedcomp
    Algorithm,
    ClientContext,
    CommonHParams,
    MinimaxModel,
    MinimaxProblem,
    Round,
    StepInfo,
    Tensors,
    grad_x,
    grad_y,
    kinds,
    register_algorithm,
)

Point = MinimaxModel
"""(x, y): the server's state, each client's and what both calls broadcast."""
Reply = tuple[Point, Tensors, StepInfo]


class TwoPhaseHParams(CommonHParams):
    """``lr`` (alpha) and ``local_steps`` (q) of the descent on x, ``outer_batch`` examples a step (``lr``,
    ``local_steps``, ``outer_batch``: :class:`CommonHParams`); the ascent on y:"""

    inner_lr: float = Field(0.5, gt=0, description="ascent step size on y (beta)")
    ascent_steps: int = Field(10, ge=1, description="local ascent steps on y each round (p)")


@register_algorithm("two-phase-gda")
class TwoPhaseGDA(Algorithm[Point, Point]):
    """Each round: local ascent on y at the server's x, y averaged; then local descent on x at that y, x averaged."""

    HParams = TwoPhaseHParams
    kind = kinds.MINIMAX
    description = "local ascent on y, then local descent on x, each averaged (examples/two_phase_gda.py)"
    Client = Server = Point
    hp: TwoPhaseHParams

    def init(self, variables: Tensors) -> Point:
        return Point(x=variables["x"].clone(), y=variables["y"].clone())

    def round(self, fed: Round, server: Point) -> Point:
        y = fed.call("ascend", fed.cohort(), server, sub=0).y
        x = fed.call("descend", fed.cohort(), server.replace(y=y), sub=1).x
        fed.count(local_steps=self.hp.ascent_steps + self.hp.local_steps)
        return Point(x=x, y=y)

    def ascend(self, problem: MinimaxProblem, view: Point, ctx: ClientContext) -> Reply:
        """p steps y <- y + beta grad_y f_k(x, y; batch) at the broadcast x; outputs y."""
        y, info = self._steps(problem, view, ctx, "y", self.hp.ascent_steps)
        return view, {"y": y}, info

    def descend(self, problem: MinimaxProblem, view: Point, ctx: ClientContext) -> Reply:
        """q steps x <- x - alpha grad_x f_k(x, y; batch) at the broadcast y; outputs x."""
        x, info = self._steps(problem, view, ctx, "x", self.hp.local_steps)
        return view, {"x": x}, info

    def _steps(self, problem: MinimaxProblem, view: Point, ctx: ClientContext, moving: str, steps: int) -> tuple[Tensor, StepInfo]:
        """``steps`` steps on ``moving`` (the other variable held at the broadcast's), one batch a step drawn from
        the client's stream keyed by (round, step): the same draws on every backend and packing."""
        x, y, losses = view.x, view.y, []
        for step in range(steps):
            batch = problem.sample(ctx.client, "outer", self.hp.outer_batch, ctx.rng(ctx.round, step))

            def f(a: Tensor, b: Tensor, batch: Any = batch) -> Tensor:
                return problem.loss(a, b, batch)

            losses.append(float(f(x, y)))
            if moving == "y":
                y = y + self.hp.inner_lr * grad_y(f, x, y)
            else:
                x = x - self.hp.lr * grad_x(f, x, y)
        return (y if moving == "y" else x), StepInfo(samples=steps * self.hp.outer_batch, loss=sum(losses) / steps)
