"""A user's task and algorithm in one file: what ``fedcomp run examples/extension.yaml`` runs.

Task ``least-squares``: client k holds ``rows`` examples (a, b) with b = a . w_k + noise, its own w_k (the
clients' heterogeneity); the objective is the mean over clients of their mean squared error, halved. Its
minimiser x* is the pooled least-squares solution, so the task reports how far the model is from it.

Algorithm ``fedavg-hb``: FedAvg whose clients take heavy-ball steps, their momentum started at zero each round,
and whose server moves by ``server_lr`` times the averaged change (Hsu et al.'s FedAvgM with beta = 0):

    every cohort client, q steps:  v <- mu v + grad l(x; batch);  x <- x - lr v        (v = 0 as a round starts)
    server:                        x <- x - server_lr (x - <x_i>)

Importing this file registers both (``@register_task``, ``@register_algorithm``). A config names the file
(``task.module``, ``algorithm.module``), so that every process of a run imports it: Ray's actors, a sweep's
trials, a resumed or verified run. Defined in a script run as ``__main__`` instead, they run on the local backend
only (another process cannot import a script).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedcomp.extension import (  # everything a file of one's own algorithm or task imports of fedcomp
    CommonHParams,
    LocalSteps,
    Params,
    Round,
    State,
    Task,
    Tensors,
    generator,
    grad_and_loss,
    register_algorithm,
    register_task,
)


class LeastSquaresParams(Params):
    dim: int = Field(10, ge=1, description="features d")
    rows: int = Field(200, ge=1, description="examples per client")
    heterogeneity: float = Field(1.0, ge=0, description="spread of the clients' true weights w_k")
    noise: float = Field(0.1, ge=0, description="label noise's standard deviation")
    data_seed: int = Field(0, ge=0, description="seed of the clients' data (run.seed seeds the run)")


@register_task("least-squares")
class LeastSquares(Task):
    """min_x (1/K) sum_k (1/2n) ||A_k x - b_k||^2 over the clients' examples."""

    Params = LeastSquaresParams
    kinds = frozenset({"plain"})
    metrics = ("distance_to_optimum", "objective_gap")
    mode = "min"
    description = "heterogeneous least squares with a closed-form optimum (examples/extension.py)"

    def __init__(self, params: LeastSquaresParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(params.data_seed, "least-squares", clients)
        d, n = params.dim, params.rows
        truth = torch.randn(d, generator=gen) + params.heterogeneity * torch.randn(clients, d, generator=gen)
        self.a = torch.randn(clients, n, d, generator=gen)
        self.b = torch.einsum("knd,kd->kn", self.a, truth) + params.noise * torch.randn(clients, n, generator=gen)
        self.a, self.b = self.resident(self.a, self.b)

    def sample_batch(self, client: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        rows = torch.randint(self.params.rows, (size,), generator=gen)
        return self.gather(self.a[client], rows), self.gather(self.b[client], rows)

    def loss(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        features, targets = batch
        return 0.5 * (features @ x - targets).pow(2).mean()

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": torch.zeros(self.params.dim)}

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        a, b = self.a.cpu().double(), self.b.cpu().double()
        pooled_a, pooled_b = a.reshape(-1, a.shape[-1]), b.reshape(-1)  # equal rows: the pooled mean is the objective
        optimum = torch.linalg.lstsq(pooled_a, pooled_b.unsqueeze(1)).solution.squeeze(1)

        def objective(x: Tensor) -> float:
            return float(0.5 * (pooled_a @ x - pooled_b).pow(2).mean())

        least = objective(optimum)

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            x = state["x"].detach().cpu().double()
            return {"distance_to_optimum": float((x - optimum).norm()), "objective_gap": objective(x) - least}

        return evaluate


class FedAvgHbHParams(CommonHParams):
    """lr, local_steps and outer_batch (every local-steps algorithm's), and the two momenta's settings."""

    momentum: float = Field(0.9, ge=0, lt=1, description="the clients' heavy-ball momentum mu")
    server_lr: float = Field(1.0, gt=0, description="the server's step on the averaged change")


@dataclass(frozen=True)
class HeavyBallClient(State):
    x: Tensor
    velocity: Tensor
    """The client's momentum, for one round only (``round_local``: zero as each round's program starts)."""


@dataclass(frozen=True)
class ServerModel(State):
    x: Tensor


@register_algorithm("fedavg-hb")
class FedAvgHeavyBall(LocalSteps[HeavyBallClient, ServerModel]):
    """q heavy-ball steps on each client from the broadcast x; then x <- x - server_lr (x - <x_i>)."""

    HParams = FedAvgHbHParams
    kind = "plain"
    description = "FedAvg with heavy-ball client steps and a server step size (examples/extension.py)"
    Client, Server = HeavyBallClient, ServerModel
    round_local = frozenset({"velocity"})

    def init(self, variables: Tensors) -> ServerModel:
        return ServerModel(x=variables["x"].clone())

    def begin(self, state: Tensors) -> Tensors:
        return {**state, "velocity": torch.zeros_like(state["x"])}

    def draw(self, problem: Any, client: int, step: int, gen: torch.Generator) -> tuple[Any, int]:
        return (problem.sample_batch(client, self.hp.outer_batch, gen),), self.hp.outer_batch

    def update(self, problem: Any, state: HeavyBallClient, batch: Any, step: int) -> tuple[HeavyBallClient, Tensor]:
        grad, loss = grad_and_loss(problem, state.x, *batch)
        velocity = self.hp.momentum * state.velocity + grad
        return HeavyBallClient(x=state.x - self.hp.lr * velocity, velocity=velocity), loss

    def round(self, fed: Round, server: ServerModel) -> ServerModel:
        mean = fed.local_steps({"x": server.x}, self.hp.local_steps)
        return ServerModel(x=server.x - self.hp.server_lr * (server.x - mean.x))
