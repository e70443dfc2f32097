"""The federated quadratic minimax problem of the FedNest paper (section 4.3, Figure 4; EXPERIMENTS.md E7).

    f_i(x, y) = -[ 1/2 ||y||^2 - b_i^T y + y^T A_i x ] + (lambda / 2) ||x||^2,   min_x max_y (1/K) sum_i f_i

with A_i = t_i I, t_i ~ U(0, t_max), b_i = b'_i - mean_j b'_j, b'_i ~ N(0, s^2 I_d). Averaging gives
y*(x) = b_bar - t_bar x, x* = t_bar b_bar / (t_bar^2 + lambda), y* = lambda b_bar / (t_bar^2 + lambda)
(so x* = y* = 0 with the paper's centring; ``centre: false`` keeps b_bar != 0 and the closed form still
holds). Oracles are exact gradients (no sampling). Metrics: ``x_dist_sq`` = ||x - x*||^2 and
``y_dist_sq`` = ||y - y*||^2 of the server's variables. The start point x = y = ``init`` * 1 follows the
authors' notebook **[code]**; the paper's lambda = 10 is the default (the notebook uses 0.1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedcomp.platform.kinds import BILEVEL
from fedcomp.platform.problems import MinimaxAsBilevel
from fedcomp.platform.registry import register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.tasks.builtins import MINIMAX_QUADRATIC, MinimaxQuadraticParams


@dataclass(frozen=True)
class ClientQuadratic:
    """Client k's function, its t_k and b_k: a "batch" of one example (not a tuple, which would count its rows) that
    holds tensors, not the client's index, so that a compiled oracle (``federation.torch_compile``) has one graph for
    every client rather than one each (dynamo takes a Python number as a constant)."""

    t: Tensor
    b: Tensor


@register_task(MINIMAX_QUADRATIC)
class MinimaxQuadratic(Task):
    params: MinimaxQuadraticParams

    def __init__(self, params: MinimaxQuadraticParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(params.data_seed, "minimax-quadratic", clients)
        self.t = params.t_max * torch.rand(clients, generator=gen)
        b = params.noise_scale * torch.randn(clients, params.dim, generator=gen)
        self.b = b - b.mean(0) if params.centre else b
        self.t_on_device, self.b_on_device = self.resident(self.t, self.b)
        t_bar, b_bar = float(self.t.mean()), self.b.mean(0)
        self.x_star = t_bar * b_bar / (t_bar**2 + params.lam)
        self.y_star = params.lam * b_bar / (t_bar**2 + params.lam)

    def problem(self, kind: str) -> Any:
        return MinimaxAsBilevel(self) if kind == BILEVEL else super().problem(kind)

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        start = torch.full((self.params.dim,), float(self.params.init))
        return {"x": start.clone(), "y": start.clone()}

    def sample(self, client: int, split: str, size: int | None, gen: torch.Generator) -> ClientQuadratic:
        """Exact oracles: the "batch" is the client's function."""
        return ClientQuadratic(self.t_on_device[client], self.b_on_device[client])

    def loss(self, x: Tensor, y: Tensor, batch: ClientQuadratic) -> Tensor:
        t, b = batch.t, batch.b
        return -(0.5 * y @ y - b @ y + t * (y @ x)) + 0.5 * self.params.lam * (x @ x)

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            return {
                "x_dist_sq": float(((state["x"].cpu() - self.x_star) ** 2).sum()),
                "y_dist_sq": float(((state["y"].cpu() - self.y_star) ** 2).sum()),
            }

        return evaluate
