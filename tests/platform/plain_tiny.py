"""Tiny plain tasks with known answers for the plain-loss baselines' tests (LocalSGDM(_RL), SCAFFOLD, FedProx).

``tiny-quadratics``: client k's loss is f_k(x) = 1/2 sum_j h_kj (x_j - m_kj)^2 + noise * mean(z) . x with
z ~ N(0, I) drawn per batch (noise 0: deterministic). Diagonal curvatures differ across clients, so the global
optimum x* = (sum_k h_k m_k) / (sum_k h_k) (per coordinate) is not FedAvg's fixed point for p > 1.

``tiny-binary``: a single-logit linear classifier x = (w, b) with the logistic loss, imbalanced labels per
client, a balanced auxiliary batch per class for the Ratio Loss monitor and the known positive fraction.
Both are registered on import (local backend only: Ray workers do not import the tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fedcomp.platform.config import load_config
from fedcomp.platform.kinds import PLAIN
from fedcomp.platform.params import Params
from fedcomp.platform.registry import TASKS, register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.base import Task
from tests.conftest import results_root

SEED = 0


class QuadraticsParams(Params):
    dim: int = Field(3, ge=1)
    noise: float = Field(0.0, ge=0)


class Quadratics(Task):
    Params = QuadraticsParams
    kinds = frozenset({PLAIN})
    metrics = ("distance",)
    mode = "min"
    vmappable = True

    def __init__(self, params: QuadraticsParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(0, "tiny-quadratics")
        self.h = 0.5 + 1.5 * torch.rand(clients, params.dim, generator=gen)
        self.m = 2 * torch.randn(clients, params.dim, generator=gen)

    def optimum(self) -> Tensor:
        return (self.h * self.m).sum(0) / self.h.sum(0)

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": torch.randn(self.params.dim, generator=gen)}

    def sample_batch(self, client: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        z = self.params.noise * torch.randn(size, self.params.dim, generator=gen)
        return self.h[client], self.m[client], z

    def loss(self, x: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        h, m, z = batch
        return 0.5 * (h * (x - m) ** 2).sum() + z.mean(0) @ x

    def grad(self, client: int, x: Tensor, z: Tensor | None = None) -> Tensor:
        """grad f_k(x) in closed form (plus the batch's noise term)."""
        g = self.h[client] * (x - self.m[client])
        return g if z is None else g + z.mean(0)

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        return lambda state: {"distance": float((state["x"] - self.optimum()).norm())}


class BinaryParams(Params):
    dim: int = Field(4, ge=1)
    examples: int = Field(40, ge=2)
    prior: float = Field(0.2, gt=0, lt=1)


class Binary(Task):
    Params = BinaryParams
    kinds = frozenset({PLAIN})
    metrics = ("test_loss",)
    mode = "min"
    vmappable = True

    def __init__(self, params: BinaryParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(0, "tiny-binary")
        n, d = params.examples, params.dim
        positives = max(1, round(params.prior * n))
        self.labels = torch.cat([torch.ones(positives), torch.zeros(n - positives)])
        shift = torch.linspace(-1, 1, d)
        self.features = [torch.randn(n, d, generator=gen) + self.labels[:, None] * shift for _ in range(clients)]
        self.aux = [(torch.randn(6, d, generator=gen) + c * shift, torch.full((6,), float(c))) for c in (0, 1)]
        self.prior = params.prior
        self.monitor_slice = slice(0, d)

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": 0.5 * torch.randn(self.params.dim + 1, generator=gen)}

    def sample_batch(self, client: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        idx = torch.randint(self.params.examples, (size,), generator=gen)
        return self.features[client][idx], self.labels[idx]

    def logits(self, x: Tensor, features: Tensor) -> Tensor:
        return features @ x[:-1] + x[-1]

    def loss(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        features, labels = batch
        return F.binary_cross_entropy_with_logits(self.logits(x, features), labels)

    def class_weighted_loss(self, x: Tensor, batch: tuple[Tensor, Tensor], weights: Tensor) -> Tensor:
        features, labels = batch
        per = weights[labels.long()]
        losses = F.binary_cross_entropy_with_logits(self.logits(x, features), labels, reduction="none")
        return (per * losses).sum() / per.sum()

    def monitor_batches(self) -> list[Any]:
        return list(self.aux)

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        return lambda state: {"test_loss": float(self.loss(state["x"], (self.features[0], self.labels)))}


for _name, _cls in (("tiny-quadratics", Quadratics), ("tiny-binary", Binary)):
    if _name not in TASKS:  # a second import must not register a second class
        register_task(_name)(_cls)


def config(algorithm: str, task: str = "tiny-quadratics", clients: int = 2, task_params: dict | None = None,
           federation: dict | None = None, rounds: int = 3, **algo: Any):
    """A local-backend config for a tiny task."""
    return load_config(
        {"task": {"name": task, **(task_params or {})}, "algorithm": {"name": algorithm, **algo},
         "federation": {"clients": clients, "backend": "local", **(federation or {})},
         "run": {"seed": SEED, "rounds": rounds, "progress": "none", "out": results_root()}}
    )


def synthetic_config(algorithm: str, **algo: Any):
    """A local-backend config on a small synthetic-classification MLP task, 3 clients and 2 per round, 3 local steps
    of 8 examples at lr 0.1: where a baseline with its extra term off must be FedAvg bit for bit."""
    return load_config(
        {"task": {"name": "synthetic-classification", "hidden": [8], "test_samples": 50},
         "algorithm": {"name": algorithm, "lr": 0.1, "local_steps": 3, "outer_batch": 8, **algo},
         "federation": {"clients": 3, "backend": "local", "clients_per_round": 2},
         "run": {"seed": SEED, "progress": "none", "out": results_root()}}
    )


def centralised_sgd(task: Task, lr: float, steps: int, batch: int) -> Tensor:
    """x after ``steps`` plain SGD steps from the run's x0 on client 0's noisy batches of ``batch`` draws (the
    streams a one-client, period-1 run draws from)."""
    x = x0(task)
    for t in range(steps):
        _, _, z = task.sample_batch(0, batch, step_gen(0, t))
        x = x - lr * task.grad(0, x, z)
    return x


def step_gen(client: int, step: int) -> torch.Generator:
    """The generator a client's local step ``step`` draws from (what ClientContext.rng gives)."""
    return generator(SEED, "client-step", client, step)


def x0(task: Task) -> torch.Tensor:
    """The run's initial x (the server draws it from the same keyed stream)."""
    return task.init_params(generator(SEED, "init"))["x"]


