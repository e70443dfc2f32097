"""FedAvg (McMahan et al., 2017): local SGD on the client's loss, average the model every q steps."""

from __future__ import annotations

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import CommonHParams, grad_and_loss
from fedcomp.platform.algorithms.legacy import DictDrawUpdate, State
from fedcomp.platform.problems import PLAIN, PlainProblem
from fedcomp.platform.registry import register_algorithm


class FedAvgHParams(CommonHParams):
    """lr, q (``local_steps``) and the batch size (``outer_batch``)."""


@register_algorithm("fedavg")
class FedAvg(DictDrawUpdate):
    """x <- x - lr * grad l(x; batch) for q steps on each client; then x <- mean over the cohort."""

    kind = PLAIN
    HParams = FedAvgHParams
    synced = ("x",)
    description = "FedAvg: local SGD, model averaged every q steps (plain problems)"

    def init_state(self, params: State) -> State:
        return {"x": params["x"].clone()}

    def draw(self, problem: PlainProblem, client: int, step: int, gen: torch.Generator) -> tuple[tuple, int]:
        return (problem.sample_batch(client, self.hp.outer_batch, gen),), self.hp.outer_batch

    def update(self, problem: PlainProblem, state: State, batch: tuple, step: int) -> tuple[State, Tensor]:
        grad, loss = grad_and_loss(problem, state["x"], *batch)
        return {"x": state["x"] - self.hp.lr * grad}, loss
