"""A tiny test task with a known saddle point, offering the ``minimax`` and ``compositional-minimax`` kinds (and the
scores / labels / (a, b) that CoDA's dual restart and CODA+'s closed-form dual step read), for the tests of
LocalSCGDAM, LocalSGDAM, CoDA and CODA+.

Client k, with a noise draw zeta = (zeta_x, zeta_y) (the batch mean of ``noise`` * N(0, I) per example):

    f_k(z, y; zeta) = (mu/2) ||z - a_k||^2 + y (c . z) - (lam/2) (y - b_k)^2 + zeta_x . z + zeta_y y     (y scalar)
    g_k(x; xi)      = x - rho grad q_k(x; xi),  q_k(x; xi) = 1/2 x^T H_k x + xi . x + (kappa/4) sum x^4

so f is strongly convex in z and strongly concave in y. The gradient in g is taken by autograd with a graph
(as deep AUC's g = x - rho grad CE does), so J_g^T v is a Hessian-vector product; in closed form
J_g = I - rho (H_k + 3 kappa diag(x^2)). The global problem min_x max_y f(g(x), y) with f = mean f_k and
g = mean g_k has, for kappa = 0, the saddle point

    z* solves (mu I + c c^T / lam) z = mu a_bar - c b_bar,   y* = b_bar + c . z* / lam,   x* = (I - rho H_bar)^-1 z*.

The ``minimax`` view is f(x, y) itself (no composition), whose saddle is the one above at rho = 0: run minimax
algorithms with ``rho: 0`` for the metrics to measure their distance. Its ``sample`` first draws an inner batch it
does not use, so that one generator gives the minimax view and LocalSCGDAM the same zeta (the degenerate-case
test). Batches are (client, noise [n, d + 1], labels [n]); half of each batch is labelled positive. Scores:
a positive scores its noise entry, a negative b_k + c . x / lam plus its noise entry, so the class-wise mean
difference is about y*(x), the best response to x (what CoDA's dual restart estimates for AUC).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedcomp.platform.kinds import COMPOSITIONAL_MINIMAX, MINIMAX
from fedcomp.platform.params import Params
from fedcomp.platform.registry import TASKS, register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.base import Task
from tests.conftest import results_root

NAME = "saddle-tiny-test"
Batch = tuple[int, Tensor, Tensor]


class SaddleTinyParams(Params):
    dim: int = Field(3, ge=1)
    rho: float = Field(0.1, ge=0, description="inner step of g (0: g = identity)")
    kappa: float = Field(0.0, ge=0, description="quartic term of q (0: the closed-form saddle holds)")
    noise: float = Field(0.1, ge=0, description="per-example noise scale")
    mu: float = Field(1.0, gt=0)
    lam: float = Field(1.0, gt=0)
    shift: float = Field(0.0, description="added to every b_k (moves y*)")
    init: float = Field(1.0, description="x starts at init * 1")
    init_y: float | None = Field(None, description="y's start; null = init")
    margin: float = Field(0.0, ge=0, description="m read by CODA+'s closed-form dual step and CoDA's restart")
    shared_hessian: bool = Field(False, description="every client's q has the same H (then J_g is the same everywhere)")


class SaddleTiny(Task):
    Params = SaddleTinyParams
    kinds = frozenset({MINIMAX, COMPOSITIONAL_MINIMAX})
    metrics = ("x_dist_sq", "y_dist_sq")
    mode = "min"

    def __init__(self, params: SaddleTinyParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(7, NAME, clients, params.dim)
        d = params.dim
        self.a = torch.randn(clients, d, generator=gen)
        self.b = torch.randn(clients, generator=gen) + params.shift
        self.c = torch.randn(d, generator=gen)
        m = torch.randn(clients, d, d, generator=gen)
        self.H = torch.eye(d) + 0.5 * m @ m.transpose(1, 2) / d
        if params.shared_hessian:
            self.H = self.H[:1].expand(clients, d, d).clone()
        self.margin = params.margin

    # -- closed form ---------------------------------------------------------------------------------------------
    def saddle(self) -> tuple[Tensor, Tensor]:
        p, d = self.params, self.params.dim
        system = p.mu * torch.eye(d, dtype=torch.float64) + torch.outer(self.c, self.c).double() / p.lam
        z = torch.linalg.solve(system, p.mu * self.a.double().mean(0) - self.c.double() * float(self.b.double().mean()))
        y = self.b.double().mean() + self.c.double() @ z / p.lam
        x = torch.linalg.solve(torch.eye(d, dtype=torch.float64) - p.rho * self.H.double().mean(0), z)
        return x, y.reshape(1)

    def jacobian(self, client: int, x: Tensor) -> Tensor:
        """J_g of client ``client`` at x (the noise enters g additively, so it is the same for every draw)."""
        p = self.params
        return torch.eye(p.dim, dtype=x.dtype) - p.rho * (self.H[client].to(x.dtype) + 3 * p.kappa * torch.diag(x**2))

    # -- sampling ----------------------------------------------------------------------------------------------------
    def _draw(self, client: int, n: int, gen: torch.Generator) -> Batch:
        noise = self.params.noise * torch.randn(n, self.params.dim + 1, generator=gen)
        return client, noise, (torch.arange(n) % 2 == 0).float()

    def sample_inner(self, client: int, n: int, gen: torch.Generator) -> Batch:
        return self._draw(client, n, gen)

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Batch:
        return self._draw(client, n, gen)

    def sample(self, client: int, split: str, size: int | None, gen: torch.Generator) -> Batch:
        self._draw(client, size or 1, gen)  # the compositional view's inner draw, unused (module doc)
        return self._draw(client, size or 1, gen)

    # -- oracles -----------------------------------------------------------------------------------------------------
    def inner(self, x: Tensor, xi: Batch) -> Tensor:
        client, noise, _ = xi
        p = self.params
        shift = noise.mean(0)[: p.dim].to(x.dtype)
        H = self.H[client].to(x.dtype)

        def q(z: Tensor) -> Tensor:
            return 0.5 * z @ H @ z + shift @ z + 0.25 * p.kappa * (z**4).sum()

        (grad,) = torch.autograd.grad(q(x), x, create_graph=True)
        return x - p.rho * grad

    def outer(self, z: Tensor, y: Tensor, zeta: Batch) -> Tensor:
        client, noise, _ = zeta
        p = self.params
        mean = noise.mean(0).to(z.dtype)
        a, b, c = self.a[client].to(z.dtype), float(self.b[client]), self.c.to(z.dtype)
        return (0.5 * p.mu * ((z - a) ** 2).sum() + y[0] * (c @ z) - 0.5 * p.lam * (y[0] - b) ** 2
                + mean[: p.dim] @ z + mean[p.dim] * y[0])

    def loss(self, x: Tensor, y: Tensor, batch: Batch) -> Tensor:
        return self.outer(x, y, batch)

    def scores(self, x: Tensor, batch: Batch) -> Tensor:
        client, noise, labels = batch
        negative = float(self.b[client]) + float(self.c @ x) / self.params.lam
        return noise[:, -1] + (1 - labels) * negative

    def labels(self, batch: Batch) -> Tensor:
        return batch[2]

    def auc_ab(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x[0], x[1]

    # -- task --------------------------------------------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        p = self.params
        return {"x": torch.full((p.dim,), p.init), "y": torch.full((1,), p.init if p.init_y is None else p.init_y)}

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        x_star, y_star = self.saddle()

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            return {"x_dist_sq": float(((state["x"].double() - x_star) ** 2).sum()),
                    "y_dist_sq": float(((state["y"].double() - y_star) ** 2).sum())}

        return evaluate


if NAME not in TASKS:  # a second import must not register a second class
    register_task(NAME)(SaddleTiny)


def config(algorithm: str, clients: int = 2, task: dict[str, Any] | None = None,
           federation: dict[str, Any] | None = None, seed: int = 0, **algo: Any):
    """A validated config of ``algorithm`` on this task (local backend, no progress output)."""
    from fedcomp.platform.config import load_config

    return load_config({
        "task": {"name": NAME, **(task or {})},
        "algorithm": {"name": algorithm, **algo},
        "federation": {"clients": clients, "backend": "local", **(federation or {})},
        "run": {"seed": seed, "progress": "none", "out": results_root()},
    })
