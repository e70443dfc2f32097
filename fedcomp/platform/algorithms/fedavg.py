"""FedAvg (McMahan et al., 2017): local SGD on the client's loss, average the model every q steps."""

from __future__ import annotations

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import Algorithm, CommonHParams, State, StepInfo, estimate
from fedcomp.platform.problems import PLAIN, PlainProblem
from fedcomp.platform.registry import register_algorithm


class FedAvgHParams(CommonHParams):
    """lr, q (``local_steps``) and the batch size (``outer_batch``)."""


@register_algorithm("fedavg")
class FedAvg(Algorithm):
    """x <- x - lr * grad l(x; batch) for q steps on each client; then x <- mean over the cohort."""

    kind = PLAIN
    HParams = FedAvgHParams
    synced = ("x",)
    description = "FedAvg: local SGD, model averaged every q steps (plain problems)"

    def init_state(self, params: State) -> State:
        return {"x": params["x"].clone()}

    def local_step(
        self, problem: PlainProblem, client: int, state: State, step: int, gen: torch.Generator
    ) -> tuple[State, StepInfo]:
        batch = problem.sample_batch(client, self.hp.outer_batch, gen)
        grad, loss = estimate(problem, state["x"], batch)
        return {"x": state["x"] - self.hp.lr * grad}, StepInfo(samples=self.hp.outer_batch, loss=float(loss))
