"""Synthetic classification with an MLP -- a plain (single-level) task for FedAvg-type runs and benchmarks.

Each client draws a stream of examples from class-conditional Gaussians with its own label prior
p_k ~ Dirichlet(alpha) (label skew); nothing is stored, so 10,000 registered clients cost nothing until
they are sampled. The model is an MLP ``features -> hidden... -> classes`` trained with cross-entropy;
the test set is balanced.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from fedcomp.datasets.synthetic import GaussianMixtureStream
from fedcomp.models.functional import FlatModel
from fedcomp.models.mlp import mlp
from fedcomp.platform.registry import register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.tasks.builtins import SYNTHETIC_CLASSIFICATION, SyntheticClassificationParams


@register_task(SYNTHETIC_CLASSIFICATION)
class SyntheticClassification(Task):
    model: FlatModel
    vmappable = True  # an MLP without BatchNorm and cross-entropy: pure tensor functions

    def __init__(self, params: SyntheticClassificationParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        self.stream = GaussianMixtureStream(
            params.features, params.classes, params.dirichlet_alpha, params.separation, params.data_seed
        )
        self.model = FlatModel(mlp([params.features, *params.hidden, params.classes]).to(self.device))
        self._priors: dict[int, Tensor] = {}

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        parts = []
        for size, shape in zip(self.model.sizes, self.model.shapes):
            fan_in = shape[-1] if len(shape) > 1 else size
            parts.append((torch.rand(size, generator=gen) * 2 - 1) / fan_in**0.5)
        return {"x": torch.cat(parts)}

    def sample_batch(self, client: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        prior = self._priors.get(client)
        if prior is None:
            prior = self._priors[client] = self.stream.prior(client)
        features, labels = self.stream.sample(prior, size, gen)
        return features.to(self.device), labels.to(self.device)

    def loss(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        features, labels = batch
        return F.cross_entropy(self.model(x, features), labels)

    def classifier_inputs(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """:meth:`loss` is the mean cross-entropy of ``self.model`` on these features and labels: the oracles may
        differentiate it without autograd's tape (:func:`fedcomp.platform.oracles.untaped`)."""
        return batch

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        uniform = torch.full((self.params.classes,), 1.0 / self.params.classes)
        features, labels = self.stream.sample(uniform, self.params.test_samples, generator(self.params.data_seed, "test"))
        features = features.to(self.device)

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            with torch.no_grad():
                logits = self.model(state["x"].detach().to(self.device), features).cpu()
            return {
                "test_accuracy": float((logits.argmax(1) == labels).float().mean()),
                "test_loss": float(F.cross_entropy(logits, labels)),
            }

        return evaluate
