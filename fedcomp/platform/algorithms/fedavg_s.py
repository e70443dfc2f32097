"""FedAvg-S -- local stochastic gradient descent-ascent with periodic averaging ("Efficient Algorithms for
Federated Saddle Point Optimization", Hou et al. 2021), the minimax baseline of the FedNest paper (Fig. 4):

    every client:  x <- x - alpha grad_x f_i(x, y; z),   y <- y + beta grad_y f_i(x, y; z)   (simultaneous)
    every ``local_steps`` steps the server averages x and y.

``update: alternating`` is the FedNest authors' notebook (``minmax_synthetic.ipynb``, the "joint" run of
Fig. 4): the ascent step on y first, then the descent step on x at the new y.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import LocalSteps, Tensors, batch_size
from fedcomp.platform.algorithms.builtins import FEDAVG_S, FedAvgSHParams
from fedcomp.platform.oracles import grad_x, grad_xy, grad_y
from fedcomp.platform.problems import MinimaxProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import MinimaxModel as Point


@register_algorithm(FEDAVG_S)
class FedAvgS(LocalSteps[Point, Point]):
    """FedAvg-S (Hou et al. 2021): local simultaneous SGDA x <- x - alpha grad_x f, y <- y + beta grad_y f;
    x and y averaged every ``local_steps`` steps."""

    Client = Server = Point
    vectorisable = False  # grad_xy is plain autograd, which torch.func.vmap cannot batch
    hp: FedAvgSHParams

    def init(self, variables: Tensors) -> Point:
        return Point(x=variables["x"].clone(), y=variables["y"].clone())

    def draw(self, problem: MinimaxProblem, client: int, step: int, gen: torch.Generator) -> tuple[Any, int]:
        batch = problem.sample(client, "outer", self.hp.outer_batch, gen)
        return batch, batch_size(batch)

    def update(self, problem: MinimaxProblem, state: Point, batch: Any, step: int) -> tuple[Point, Tensor]:
        f = lambda a, b: problem.loss(a, b, batch)  # noqa: E731
        loss = problem.loss(state.x, state.y, batch).detach()
        if self.hp.update == "alternating":
            y = state.y + self.hp.inner_lr * grad_y(f, state.x, state.y)
            return Point(x=state.x - self.hp.lr * grad_x(f, state.x, y), y=y), loss
        gx, gy = grad_xy(f, state.x, state.y)
        return Point(x=state.x - self.hp.lr * gx, y=state.y + self.hp.inner_lr * gy), loss
