"""Invariant logistic regression -- the FCSG paper's section 5.1 / Figure 1 task (``EXPERIMENTS.md`` E1).

Outer sample xi = (a, b): a ~ N(0, sigma1^2 I_d), b = sign(x*.a) for a fixed teacher x*. Inner samples
eta ~ N(a, sigma2^2 I_d). Model: linear d -> 1 with bias, x = (w, c). Objective per client:

    paper (default):  E_xi log(1 + exp(-b (mean_j eta_j . w + c)))  + lambda sum_i gamma x_i^2 / (1 + gamma x_i^2)
    official-code:    E_xi mean_j log(1 + exp(-b (eta_j . w + c)))  + the same regulariser

i.e. the paper puts the mean of the m inner samples inside the logistic loss (a conditional problem, biased
for finite m); the authors' code averages per-inner-sample losses (pitfall F1). The regulariser covers the
bias too, as in the code. Clients draw independent streams; ``identical_client_streams`` reproduces the
code's same-seed-everywhere behaviour (pitfall F2). The plain view (used by FedAvg) is logistic regression
on single perturbed examples (a, b, eta). Test accuracy is measured on ``test_samples`` fresh clean outer
samples: mean of 1[sign(a.w + c) = b]. The teacher and the test set depend on ``teacher_seed`` only, so
different run seeds solve the same problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from fedcomp.datasets.synthetic import gaussian_inner, gaussian_outer
from fedcomp.platform.registry import register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.tasks.builtins import INVARIANT_LOGREG, InvariantLogRegParams


@register_task(INVARIANT_LOGREG)
class InvariantLogReg(Task):
    params: InvariantLogRegParams
    vmappable = True

    def __init__(self, params: InvariantLogRegParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        self.teacher = torch.randn(params.dim, generator=generator(params.teacher_seed, "teacher"))
        self.sigma2 = params.noise_ratio * params.sigma1

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        # As the official code: Xavier-normal weight of a Linear(d, 1), bias 1.
        std = math.sqrt(2.0 / (self.params.dim + 1))
        return {"x": torch.cat([std * torch.randn(self.params.dim, generator=gen), torch.ones(1)])}

    # -- oracles -------------------------------------------------------------------------------------------
    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        return gaussian_outer(self.teacher, n, self.params.sigma1, gen)

    def sample_inner(self, client: int, outer: tuple[Tensor, Tensor], m: int, gen: torch.Generator) -> Tensor:
        return gaussian_inner(outer[0], m, self.sigma2, gen).to(self.device)

    def sample_batch(self, client: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        a, b = gaussian_outer(self.teacher, size, self.params.sigma1, gen)
        return gaussian_inner(a, 1, self.sigma2, gen).squeeze(1).to(self.device), b.to(self.device)

    def regulariser(self, x: Tensor) -> Tensor:
        g = self.params.reg_gamma
        return self.params.reg_lambda * (g * x * x / (1 + g * x * x)).sum()

    def loss(self, x: Tensor, batch: tuple[Tensor, Tensor], inner: Tensor | None = None) -> Tensor:
        """Conditional loss ``loss(x, outer, inner)`` or plain loss ``loss(x, (features, labels))``."""
        w, c = x[:-1], x[-1]
        if inner is None:
            features, labels = batch
            margins = labels * (features @ w + c)
        else:
            labels = batch[1].to(self.device)
            if self.params.objective == "paper":
                margins = labels * (inner.mean(dim=1) @ w + c)
            else:
                margins = labels.unsqueeze(1) * (inner @ w + c)
        return F.softplus(-margins).mean() + self.regulariser(x)

    def stream_id(self, client: int) -> int:
        return 0 if self.params.identical_client_streams else client

    # -- evaluation ----------------------------------------------------------------------------------------
    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        a, b = gaussian_outer(
            self.teacher, self.params.test_samples, self.params.sigma1, generator(self.params.teacher_seed, "test")
        )

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            x = state["x"].detach().cpu()
            scores = a @ x[:-1] + x[-1]
            return {
                "test_accuracy": float((torch.where(scores >= 0, 1.0, -1.0) == b).float().mean()),
                "test_loss": float(F.softplus(-b * scores).mean()),
            }

        return evaluate
