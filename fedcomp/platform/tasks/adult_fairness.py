"""Equal-opportunity-constrained classification on UCI Adult -- the FedDRO paper's fairness experiment
(EXPERIMENTS.md E9, section 1.7), with GCIVR's objective as h + f(g):

    h(x) = BCE of a logistic model over the training rows,   f = log,
    g(x) = (1/(G+1)) (1 + sum_k exp(alpha c_k(x) / gamma)),  c_k = BCE over group k's label-1 rows - BCE - eps

computed on the noisy *proxy* groups during training; the constraint violation max_k (TPR_all - TPR_k - eps)
is measured on the *true* groups (prediction positive iff the logit > 0). Data: ``adult/adult.data`` and
``adult/adult.test`` in UCI format under the data root, prepared as GCIVR does (see
``fedcomp.datasets.adult``), the training part split equally over the clients (8 in the paper). There is
no offline copy of Adult; the tests write small files in the real format.

The mini-batch value of g is a biased estimate (exp of estimated constraints, group means over random
counts, groups without a label-1 row dropped; ~11 % high with 16 rows per client on Adult): see
:func:`fedcomp.losses.dro.eo_inner`. Larger ``algorithm.outer_batch`` shrinks it as O(1/batch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedcomp.datasets import adult, partition
from fedcomp.losses import dro as dro_losses
from fedcomp.platform.errors import ConfigError, config_field
from fedcomp.platform.registry import register_task
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.tasks.builtins import ADULT_FAIRNESS, AdultFairnessParams


@register_task(ADULT_FAIRNESS)
class AdultFairness(Task):
    @classmethod
    def check_data(cls, params: AdultFairnessParams) -> None:
        with config_field("task.name = 'adult-fairness'"):
            adult.require_adult(params.root)

    def __init__(self, params: AdultFairnessParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        with config_field("task.name = 'adult-fairness'"):
            data = adult.load_adult(params.root, noise_level=params.noise_level, proxy_seed=params.data_seed)
        self.train, self.test = data.train, data.test
        rows = self.train.labels.numel()
        if clients > rows:
            raise ConfigError(f"federation.clients = {clients}: at most {rows} allowed (the training part of Adult "
                              f"holds {rows} rows, split equally over the clients)")
        self.shards = partition.iid(rows, clients, None, params.data_seed)
        self.train_on_device = self.resident(self.train.features, self.train.labels, self.train.proxy_groups)
        """(features, labels, proxy groups) of the training part on the task's device, where steps index them."""
        self.inner_dim = 1

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": torch.zeros(self.train.features.shape[1] + 1)}

    def _logits(self, x: Tensor, features: Tensor) -> Tensor:
        return features @ x[:-1] + x[-1]

    def sample(self, client: int, size: int | None, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        pool = self.shards[client]
        if size is not None:
            pool = pool[torch.randint(pool.numel(), (size,), generator=gen)]
        features, labels, groups = self.train_on_device
        return self.gather(features, pool), self.gather(labels, pool), self.gather(groups, pool)

    def plain(self, x: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        return dro_losses.eo_plain(self._logits(x, batch[0]), batch[1])

    def inner(self, x: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        if not self.params.constrained:
            return x.new_ones(1)  # f(1) = log 1 = 0: the unconstrained objective
        p = self.params
        return dro_losses.eo_inner(self._logits(x, batch[0]), batch[1], batch[2], epsilon=p.epsilon, alpha=p.alpha, gamma=p.gamma)

    def outer(self, z: Tensor) -> Tensor:
        return dro_losses.eo_outer(z)

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        eps = self.params.epsilon

        def violation(pred: Tensor, part: adult.AdultSplit) -> float:
            positive = part.labels == 1
            tpr_all = pred[positive].float().mean()
            gaps = [tpr_all - pred[positive & (part.groups == k)].float().mean() - eps
                    for k in part.groups.unique().tolist() if (positive & (part.groups == k)).any()]
            return float(max(gaps))

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            x = state["x"].detach().cpu()
            out = {}
            for name, part in (("train", self.train), ("test", self.test)):
                pred = (self._logits(x, part.features) > 0).long()
                out[f"{name}_accuracy"] = float((pred == part.labels).float().mean())
                out[f"{name}_violation"] = violation(pred, part)
            t = self.train
            whole = (t.features, t.labels, t.proxy_groups)
            out["objective"] = float(self.plain(x, whole) + self.outer(self.inner(x, whole)))
            return out

        return evaluate


