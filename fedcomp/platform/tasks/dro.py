"""Distributionally robust classification as a compositional problem with a global inner value -- the
FedDRO paper's CIFAR10-ST / CIFAR100-ST experiment (EXPERIMENTS.md E8, section 1.6) and offline versions.

The KL-regularised DRO objective lambda log mean_i exp(l_i / lambda) over all clients' training data is
h + f(g) with h = 0, g_k = mean over client k's data of exp((l - c) / lambda) (a scalar, d_g = 1) and
f(z) = lambda log z + c; the chi^2-regularised one in its derived form is h_k = mean(l + l^2 / 2 lambda),
g_k = mean l, f(z) = -z^2 / 2 lambda (``chi2_variant: as_printed`` is the paper's sign-flipped version,
kept only to document it; see ``fedcomp.losses.dro``). ``objective: erm`` is the plain mean loss
(h = mean l, no inner value) for reference runs. The training set is split equally over the clients, as
in the paper (8 clients). Data: ``digits-st`` (scikit-learn's digits, digits 5-9 kept at
``keep_fraction``; offline default) or ``breast-cancer`` (offline, binary), or CIFAR10-ST / CIFAR100-ST
from the data root (RECOVER's construction by default, ``st_variant``) with ResNet20. The model is linear
for the offline sets unless ``model: mlp``. Metrics: test accuracy, the worst class's test recall, the
DRO objective on the whole training set and training accuracy.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from fedcomp.datasets import cifar, offline, partition
from fedcomp.losses import dro as dro_losses
from fedcomp.models.functional import FlatModel
from fedcomp.models.mlp import mlp
from fedcomp.platform.errors import ConfigError, config_field
from fedcomp.platform.registry import register_task
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.tasks.builtins import DRO_CLASSIFICATION, DROClassificationParams

CIFAR_MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
CIFAR_STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


@register_task(DRO_CLASSIFICATION)
class DROClassification(Task):
    model: FlatModel

    def __init__(self, params: DROClassificationParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        self.x_train, self.y_train, self.x_test, self.y_test = self._load(params)
        self.classes = int(torch.cat([self.y_train, self.y_test]).max()) + 1
        rows = self.y_train.numel()
        if clients > rows:
            raise ConfigError(f"federation.clients = {clients}: at most {rows} allowed (the training part of "
                              f"task.dataset = {params.dataset!r} holds {rows} examples, split equally over the clients)")
        self.shards = partition.iid(rows, clients, None, params.data_seed, params.remainder)
        self.batchnorm = params.batchnorm
        self.model = FlatModel(self._module(params).to(self.device))
        self.train_on_device = self.resident(self.x_train, self.y_train)
        """(features, labels) of the training part on the task's device, where steps index them."""
        self.composition = self._composition(params)
        self.inner_dim = 1
        self._warned_chi2 = False

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def check_data(cls, params: DROClassificationParams) -> None:
        if params.dataset.endswith("-st") and params.dataset != "digits-st":  # the others ship with scikit-learn
            with config_field(f"task.dataset = {params.dataset!r}"):
                cifar.require_cifar(cast(cifar.Name, params.dataset.removesuffix("-st")), params.root)

    @staticmethod
    def _load(p: DROClassificationParams) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if p.dataset == "digits-st":
            return tuple(offline.digits(p.data_seed, keep_fraction=p.keep_fraction))  # type: ignore[return-value]
        if p.dataset == "breast-cancer":
            return tuple(offline.breast_cancer(p.data_seed))  # type: ignore[return-value]
        name = cast(cifar.Name, p.dataset.removesuffix("-st"))
        with config_field(f"task.dataset = {p.dataset!r}"):
            train_images, train_labels = cifar.load_cifar(name, "train", p.root, verify_md5=p.verify_md5)
            test_images, test_labels = cifar.load_cifar(name, "test", p.root, verify_md5=p.verify_md5)
        keep = cifar.cifar_st(train_labels, variant=p.st_variant, seed=p.data_seed)

        def scale(images: Tensor) -> Tensor:
            return (images.float() / 255 - CIFAR_MEAN) / CIFAR_STD

        return scale(train_images[keep]), train_labels[keep], scale(test_images), test_labels

    def _module(self, p: DROClassificationParams) -> torch.nn.Module:
        kind = p.model if p.model != "auto" else ("resnet20" if p.dataset.startswith("cifar") else "linear")
        if kind == "resnet20":
            if not p.dataset.startswith("cifar"):
                raise ConfigError(f"task.model = 'resnet20' needs a CIFAR dataset, not task.dataset = {p.dataset!r}")
            from fedcomp.models.resnet import resnet20

            return resnet20(self.classes, running_stats=p.batchnorm != "batch")
        if self.x_train.ndim != 2:  # images: the linear model and the MLP take the offline sets' feature vectors
            raise ConfigError(f"task.model = {kind!r} takes feature vectors, and task.dataset = {p.dataset!r} holds "
                              f"images; allowed with it: resnet20 (or auto)")
        features = self.x_train.shape[1]
        return mlp([features, p.hidden, self.classes] if kind == "mlp" else [features, self.classes])

    @staticmethod
    def _composition(p: DROClassificationParams) -> dro_losses.Composition:
        if p.objective == "kl":
            return dro_losses.kl_dro(p.lam, shift=p.shift, scale=p.kl_scale)
        if p.objective == "chi2":
            return dro_losses.chi2_dro(p.lam, variant=p.chi2_variant)
        return dro_losses.Composition(lambda l: l.mean(), lambda l: l.new_zeros(1), lambda z: z.sum())

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        from fedcomp.models.resnet import init_flat

        return {"x": init_flat(self.model.module, gen)}

    # -- oracles -----------------------------------------------------------------------------------------------
    def sample(self, client: int, size: int | None, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.batch_at(client, self.sample_positions(client, size, gen))

    # per-example access, for methods that keep one dual weight per training example (parallel-pdsgd)
    def examples(self, client: int) -> int:
        """n_k: the client's number of training examples."""
        return int(self.shards[client].numel())

    def sample_positions(self, client: int, size: int | None, gen: torch.Generator) -> Tensor:
        """Positions in the client's shard of a batch of ``size`` (with replacement; all of them when None)."""
        n = self.examples(client)
        return torch.arange(n) if size is None else torch.randint(n, (size,), generator=gen)

    def batch_at(self, client: int, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The batch of the client's examples at ``positions`` (what :meth:`sample` draws)."""
        pool = self.shards[client][positions]
        features, labels = self.train_on_device
        return self.gather(features, pool), self.gather(labels, pool)

    @property
    def dual_penalty(self) -> dro_losses.DualPenalty | None:
        """The objective's min-max game over per-example weights (None for ``objective: erm``).

        chi^2 with ``chi2_variant: as_printed`` still names the chi^2 game: the printed form is a sign error
        of it, not another game (see :mod:`fedcomp.losses.dro`)."""
        p = self.params
        if p.objective == "kl":
            return dro_losses.DualPenalty("kl", p.lam, 1.0 if p.kl_scale == "lambda" else 1.0 / p.lam)
        if p.objective == "chi2":
            return dro_losses.DualPenalty("chi2", p.lam)
        return None

    def example_losses(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        features, labels = batch
        return F.cross_entropy(self.model(x, features), labels, reduction="none")

    def inner(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        return self.composition.inner(self.example_losses(x, batch))

    @property
    def log_scalable(self) -> bool:
        """Whether :meth:`inner_scaled` applies: the KL objective, whose g is a mean of exponentials and whose
        f = a log z + b, so g and its estimates may be carried at any scale e^-s (FedDRO's ``kl: shifted``)."""
        return bool(self.params.objective == "kl")

    def inner_scaled(self, x: Tensor, batch: tuple[Tensor, Tensor], log_scale: float) -> Tensor:
        """g_k(x; b) e^-log_scale, computed without forming g_k: mean exp((l - c - lambda s) / lambda) (KL only)."""
        if not self.log_scalable:
            raise ValueError(f"task.objective = {self.params.objective!r}: only 'kl' has a log-scalable inner value")
        p = self.params
        return dro_losses.kl_inner(self.example_losses(x, batch), p.lam, p.shift + p.lam * log_scale)

    def outer(self, z: Tensor) -> Tensor:
        return self.composition.outer(z)

    def plain(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        return self.composition.plain(self.example_losses(x, batch))

    # -- evaluation --------------------------------------------------------------------------------------------
    def _check_chi2_closed_form(self, losses: Tensor) -> None:
        """Warn (once per run) when the chi^2 closed form the objective uses is only an upper bound of the robust
        loss: some l_i < mean l - lambda puts a negative weight on example i (the simplex constraint binds)."""
        p = self.params
        if p.objective != "chi2" or p.chi2_variant != "derived" or self._warned_chi2:
            return
        if not dro_losses.chi2_feasible(losses, p.lam):
            self._warned_chi2 = True
            lowest, mean = float(losses.min()), float(losses.mean())
            warnings.warn(
                f"task.lam = {p.lam:g}: the chi^2 closed form is only an upper bound of the robust loss at this model "
                f"(a training loss {lowest:.3g} < mean {mean:.3g} - lambda gets a negative weight); robust_loss "
                f"overstates the simplex maximum -- a larger lam keeps it exact",
                UserWarning,
                stacklevel=2,
            )

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        def predict(x: Tensor, features: Tensor) -> Tensor:
            return torch.cat([self.model(x, chunk.to(self.device)).cpu() for chunk in features.split(2048)])

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            x = state["x"].detach().to(self.device)
            with self.model.evaluation():
                test_pred = predict(x, self.x_test).argmax(1)
                train_logits = predict(x, self.train_on_device[0])
            recall = [float((test_pred[self.y_test == c] == c).float().mean()) for c in self.y_test.unique().tolist()]
            losses = F.cross_entropy(train_logits, self.y_train, reduction="none")
            self._check_chi2_closed_form(losses)
            return {
                "test_accuracy": float((test_pred == self.y_test).float().mean()),
                "worst_class_accuracy": min(recall),
                "robust_loss": float(self.composition.value(losses)),
                "train_accuracy": float((train_logits.argmax(1) == self.y_train).float().mean()),
            }

        return evaluate


