"""Imbalanced binary classification: one task for the LocalSCGDAM paper's Table 1 (EXPERIMENTS.md E10-E12)
and the FCSG paper's AUPRC Table 2 (E3); presets pick the options.

**Data.** :func:`fedcomp.datasets.binary.load_binary` builds the binary training part (``construction:
ratio`` keeps floor(r/(1-r) n_neg) positives, the LocalSCGDAM rule; ``drop`` keeps ``keep_fraction`` of
each positive class, E3's rule) and the test part as the papers keep it. The training part is split over
the clients by ``partition`` (``stratified``: an equal share of each class per client, the default;
``stride``: D-AUPRC's split). Offline sets: breast-cancer (the default), digits and mnist5k.

**Parameters.** Every problem kind sees the same variables: x = (w, a, b) -- the network's flat weights
followed by the AUC auxiliaries a, b -- and y = [alpha], the AUC dual (cross-entropy and AP losses ignore
a, b and alpha; their gradients there are 0). Scores h are sigmoid(logit) (``score: sigmoid``, LibAUC's
convention, ALGORITHMS.md S6 [inferred]) or the raw logit; cross-entropy always uses the logit.

**Kinds** (ALGORITHMS.md sections 6 and 9):

* ``plain`` (the task object itself) -- binary cross-entropy on the logit, for FedAvg with CE, LocalSGDM,
  SCAFFOLD, FedProx. Batches are uniform draws from the client's data, or, with ``positives_per_batch``,
  that many positives first and negatives after (D-AUPRC's sampler; assumed for the CE baselines too, A6
  [inferred]); the minimax and compositional kinds draw their batches the same way. For LocalSGDM_RL:
  :meth:`ImbalancedBinary.class_weighted_loss`, :meth:`~ImbalancedBinary.monitor_batches`,
  :attr:`~ImbalancedBinary.monitor_slice` and ``prior``.
* ``minimax`` (:class:`MinimaxView`) -- the AUC square loss (``auc_form``: the paper's form or LibAUC's
  margin form; :mod:`fedcomp.losses.auc`) with (a, b) from x and alpha = y, for CoDA, CODA+,
  LocalSGDAM. The prior p is the real training positive ratio unless ``prior`` fixes it (P2, S4). The
  view also gives ``scores(x, batch)`` and ``labels(batch)`` (CoDA's dual restart) and ``auc_ab(x)`` with
  ``margin`` (CODA+'s closed-form dual step; margin 0 for the paper's form, whose dual optimum is b - a).
* ``compositional-minimax`` (:class:`CompositionalMinimaxView`) -- LocalSCGDAM's problem (EXPERIMENTS.md
  1.5): inner g(x; xi) = x - rho (grad_w CE(w; xi), 0, 0) on a CE batch xi, built with ``torch.func.grad``
  so that its vector-Jacobian product is the exact v - rho H v (a Hessian-vector product; the identity
  Jacobian is the algorithm's option); outer f(z, y; zeta) = the AUC loss with the weights and a, b taken
  from z. xi and zeta are independent draws (LocalSCGDAM's ``algorithm.batches: shared`` makes them one, S5).
* ``conditional`` (:class:`ConditionalView`) -- the AP surrogate for the FCSG family (EXPERIMENTS.md 1.3):
  outer samples = n positives of the client; inner batch = D-AUPRC's positives-first batch of m examples
  that starts with those n positives and continues with m - n negatives (``ap_inner: positives-first``,
  the default), or m uniform draws from the client's data independent of the outer ones (``iid``).

**Metrics** (first = headline), all on the server model x, in evaluation mode, in chunks of
``eval_batch`` test examples (ResNet20 and DenseNet121 normalise with the server's BatchNorm running
statistics, ``batchnorm: averaged`` by default, see :data:`~fedcomp.platform.tasks.base.BatchNorm`; with
``batchnorm: batch`` with each chunk's statistics): ``test_auroc`` and ``test_ap`` (scikit-learn's ``roc_auc_score`` and
``average_precision_score`` on the full test set; scores = logits, which rank like sigmoid outputs without
float32 saturation ties), ``client_auroc_mean`` and ``client_auroc_var`` (Table 1's per-device mean and
variance, population variance ddof 0), ``test_accuracy`` (logit > 0). **Inference:** Table 1 evaluates
"each device's model", but right after an averaging round every device holds the same model; we read the
per-device numbers as the server model's AUROC on each client's equal stratified share of the test set
(same scores as the full-set metrics, data split by ``partition.stratified`` with ``data_seed``). A share
that lacks one class has no AUROC (nan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedcomp.datasets import imbalance, partition
from fedcomp.losses import auc as auc_losses
from fedcomp.models import convnets
from fedcomp.models.functional import FlatModel
from fedcomp.models.mlp import mlp
from fedcomp.platform.errors import ConfigError, config_field
from fedcomp.platform.kinds import COMPOSITIONAL_MINIMAX, CONDITIONAL, MINIMAX
from fedcomp.platform.registry import register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.tasks.builtins import IMBALANCED_BINARY, ImbalancedBinaryParams

AUTO_MODEL: dict[str, str] = {
    "breast-cancer": "linear",
    "digits": "linear",
    "mnist5k": "mnist-conv",
    "mnist": "mnist-conv",
    "fashionmnist": "fashion-conv",
    "cifar10": "resnet20",
    "cifar100": "resnet20",
    "stl10": "resnet20",
    "catvsdog": "resnet20",
    "melanoma": "densenet121",
}
"""``model: auto``: linear on the offline sets, D-AUPRC's conv net on MNIST (E3), our small CNN on
FashionMNIST (the paper's is unknown), ResNet20 on CIFAR10/100, STL10, CATvsDOG and DenseNet121 on Melanoma
(E10). Table 2's CIFAR-10 runs use ``model: cifar-conv`` (D-AUPRC's CIFARModel) explicitly."""


Batch = tuple[Tensor, Tensor]


@register_task(IMBALANCED_BINARY)
class ImbalancedBinary(Task):
    """The task object is the ``plain`` problem; :meth:`problem` gives the other kinds' views."""

    params: ImbalancedBinaryParams
    model: FlatModel

    def __init__(self, params: ImbalancedBinaryParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        split = self._load(params)
        self.x_train, self.y_train, self.x_test, self.y_test = split.x_train, split.y_train, split.x_test, split.y_test
        held = int(self.y_test.sum())
        if held in (0, self.y_test.numel()):  # every evaluation would be nan (and scikit-learn warn each time)
            raise ConfigError(f"task.dataset = {params.dataset!r}: its test split holds {held} positives and "
                              f"{self.y_test.numel() - held} negatives; test_auroc and test_ap need both (a larger "
                              f"set, or one with both classes in its test split)")
        self.prior = float(params.prior if params.prior is not None else split.prior)
        """p of the AUC loss: the training positive ratio unless the parameters fix it."""
        self.shards = self._partition(self.y_train, clients, params)
        self.positives = [s[self.y_train[s] == 1] for s in self.shards]
        self.negatives = [s[self.y_train[s] == 0] for s in self.shards]
        for c, (pos, neg) in enumerate(zip(self.positives, self.negatives)):
            if pos.numel() == 0 or neg.numel() == 0:
                raise ConfigError(
                    f"federation.clients = {clients}: client {c} gets {pos.numel()} positives and {neg.numel()} "
                    f"negatives of task.dataset = {params.dataset!r}; every client needs both (use fewer clients)"
                )
        self.model_name = self._model_name(params, self.x_train)
        module = self._module(self.model_name, params, self.x_train)
        self.batchnorm = params.batchnorm
        self.model = FlatModel(module.to(self.device))
        self.train_on_device = self.resident(self.x_train, self.y_train)
        """(features, labels) of the training part on the task's device, where steps index them."""
        self.dim = self.model.dim
        """Size of the network's flat weights w; x = (w, a, b) has ``dim + 2`` entries."""
        self.monitor_slice: slice = convnets.output_weight_slice(module)
        """Positions in x of the output layer's weight matrix (the Ratio Loss monitor's gradient)."""
        # per instance, since it depends on the model: batch-statistics BatchNorm does not run under vmap
        has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
        self.vmappable = not has_bn  # type: ignore[misc]
        self._monitor: list[Batch] | None = None

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def check_data(cls, params: ImbalancedBinaryParams) -> None:
        from fedcomp.datasets import binary

        with config_field(f"task.dataset = {params.dataset!r}"):
            binary.require_binary(params.dataset, params.root)

    @staticmethod
    def _load(p: ImbalancedBinaryParams) -> Any:
        from fedcomp.datasets import binary

        with config_field(f"task.dataset = {p.dataset!r}"):
            return binary.load_binary(
                p.dataset,
                construction=p.construction,
                ratio=p.ratio,
                keep_fraction=p.keep_fraction,
                positive_rule=p.positive_rule,
                seed=p.data_seed,
                root=p.root,
                verify_md5=p.verify_md5,
                image_size=p.image_size,
            )

    @staticmethod
    def _partition(labels: Tensor, clients: int, p: ImbalancedBinaryParams) -> list[Tensor]:
        split = partition.stratified if p.partition == "stratified" else partition.stride
        try:
            return split(labels, clients, p.data_seed)
        except ValueError as error:
            raise ConfigError(f"federation.clients = {clients}: {error}") from None

    @staticmethod
    def _model_name(p: ImbalancedBinaryParams, features: Tensor) -> str:
        name = AUTO_MODEL[p.dataset] if p.model == "auto" else p.model
        if features.dim() == 2 and name not in ("linear", "mlp"):
            raise ConfigError(
                f"task.model = {name!r}: task.dataset = {p.dataset!r} is tabular ({features.shape[1]} features); "
                "allowed: 'linear', 'mlp'"
            )
        return name

    @staticmethod
    def _module(name: str, p: ImbalancedBinaryParams, features: Tensor) -> nn.Module:
        if name in ("linear", "mlp"):
            width = int(np.prod(features.shape[1:]))
            return nn.Sequential(nn.Flatten(), mlp([width, p.hidden, 1] if name == "mlp" else [width, 1]))
        channels, height, width = features.shape[1:]
        if name == "resnet20":
            from fedcomp.models.resnet import resnet20

            return resnet20(1, in_channels=channels, running_stats=p.batchnorm != "batch")
        if height != width:
            raise ConfigError(
                f"task.model = {name!r}: needs square images; task.dataset = {p.dataset!r} gives {height} x {width}"
            )
        try:
            if name == "densenet121":
                if height < 32:
                    raise ValueError(f"image_size = {height}: too small for densenet121 (needs at least 32 x 32)")
                return convnets.densenet121(1, in_channels=channels, running_stats=p.batchnorm != "batch")
            build = {
                "mnist-conv": convnets.mnist_conv,
                "cifar-conv": convnets.cifar_conv,
                "fashion-conv": convnets.fashion_conv,
            }
            return build[name](channels, height)
        except ValueError as error:
            raise ConfigError(f"task.model = {name!r} on task.dataset = {p.dataset!r}: {error}") from None

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        """x = (w from :func:`~fedcomp.models.resnet.init_flat` with ``init``, a = 0, b = 0); y = [alpha = 0]."""
        from fedcomp.models.resnet import init_flat

        w = init_flat(self.model.module, gen, self.params.init)
        return {"x": torch.cat([w, torch.zeros(2)]), "y": torch.zeros(1)}

    def problem(self, kind: str) -> Any:
        super().problem(kind)  # checks the kind
        if kind == MINIMAX:
            return MinimaxView(self)
        if kind == COMPOSITIONAL_MINIMAX:
            return CompositionalMinimaxView(self)
        if kind == CONDITIONAL:
            return ConditionalView(self)
        return self

    # -- model and losses --------------------------------------------------------------------------------------
    def logits(self, x: Tensor, features: Tensor) -> Tensor:
        """The network's logit for each example, from the first ``dim`` entries of x; shape [n]."""
        return self.model(x[: self.dim], features).reshape(-1)

    def scores(self, x: Tensor, features: Tensor) -> Tensor:
        """h of the AUC and AP losses: sigmoid(logit), or the logit with ``score: logit``."""
        logits = self.logits(x, features)
        return torch.sigmoid(logits) if self.params.score == "sigmoid" else logits

    def auc_loss(self, x: Tensor, y: Tensor, batch: Batch) -> Tensor:
        """The AUC square loss at network weights x[:dim], a = x[dim], b = x[dim + 1] and alpha = y[0]."""
        features, labels = batch
        p = self.params
        return auc_losses.auc_square_loss(
            self.scores(x, features), labels, x[self.dim], x[self.dim + 1], y[0], self.prior,
            form=p.auc_form, margin=p.margin,
        )  # fmt: skip

    # -- plain kind --------------------------------------------------------------------------------------------
    def sample_positions(self, client: int, size: int | None, gen: torch.Generator) -> Tensor:
        """Indices into the training part of a batch of ``size`` of the client's examples (all when None):
        uniform with replacement, or ``positives_per_batch`` positives first (:func:`~fedcomp.datasets.
        imbalance.positives_first`)."""
        shard = self.shards[client]
        if size is None:
            return shard
        k = self.params.positives_per_batch
        if k is None:
            return shard[torch.randint(shard.numel(), (size,), generator=gen)]
        if k > size:
            raise ConfigError(f"task.positives_per_batch = {k}: must be at most the batch size {size}")
        return imbalance.positives_first(self.positives[client], self.negatives[client], size, k, gen)

    def batch_at(self, positions: Tensor) -> Batch:
        """(features, labels) of the training examples at ``positions``, on the task's device (indexed there)."""
        features, labels = self.train_on_device
        return self.gather(features, positions), self.gather(labels, positions)

    def sample_batch(self, client: int, size: int, gen: torch.Generator) -> Batch:
        return self.batch_at(self.sample_positions(client, size, gen))

    def loss(self, x: Tensor, batch: Batch) -> Tensor:
        """Binary cross-entropy on the logit (a and b do not enter)."""
        features, labels = batch
        return F.binary_cross_entropy_with_logits(self.logits(x, features), labels.to(x.dtype))

    def class_weighted_loss(self, x: Tensor, batch: Batch, weights: Tensor) -> Tensor:
        """mean_i weights[y_i] * BCE_i, ``weights`` of shape [2] (LocalSGDM_RL's Ratio Loss form)."""
        features, labels = batch
        return auc_losses.class_weighted_bce(self.logits(x, features), labels, weights.to(x.device))

    def monitor_batches(self) -> list[Batch]:
        """One balanced auxiliary batch per class (index = class): min(``monitor_per_class``, class sizes)
        training examples of each class drawn without replacement, once, with ``data_seed`` -- the data of
        the Ratio Loss monitor (ALGORITHMS.md 9.6)."""
        if self._monitor is None:
            gen = generator(self.params.data_seed, "monitor")
            pools = [torch.nonzero(self.y_train == c).flatten() for c in (0, 1)]
            size = min(self.params.monitor_per_class, *(pool.numel() for pool in pools))
            self._monitor = [self.batch_at(pool[torch.randperm(pool.numel(), generator=gen)[:size]]) for pool in pools]
        return self._monitor

    # -- evaluation --------------------------------------------------------------------------------------------
    def predict(self, x: Tensor, features: Tensor) -> Tensor:
        """Logits of ``features`` at x, in evaluation mode (running statistics, where the model keeps them) and
        chunks of ``eval_batch``, on the CPU."""
        with self.model.evaluation():
            x = x.detach().to(self.device)
            return torch.cat([self.logits(x, chunk.to(self.device)).cpu() for chunk in features.split(self.params.eval_batch)])

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        from sklearn.metrics import average_precision_score

        labels = self.y_test.numpy()
        try:
            shares = [s.numpy() for s in partition.stratified(self.y_test, self.clients, self.params.data_seed)]
        except ValueError as error:
            raise ConfigError(f"federation.clients = {self.clients}: test set shares: {error}") from None

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            logits = self.predict(state["x"], self.x_test)
            scores = logits.double().numpy()
            if not np.isfinite(scores).all():  # a diverged model: no ranking to score (the run goes on)
                return {name: float("nan") for name in self.metrics}
            per_client = np.array([_auroc(labels[s], scores[s]) for s in shares])
            return {
                "test_auroc": _auroc(labels, scores),
                "test_ap": float(average_precision_score(labels, scores)),
                "client_auroc_mean": float(per_client.mean()),
                "client_auroc_var": float(per_client.var(ddof=0)),
                "test_accuracy": float(((logits > 0).long() == self.y_test).float().mean()),
            }

        return evaluate


def _auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """scikit-learn's ROC AUC, or nan when one class is missing."""
    from sklearn.metrics import roc_auc_score

    if labels.min() == labels.max():
        return float("nan")
    return float(roc_auc_score(labels, scores))


class _AUCView:
    """What the AUC kinds share: the prior, scores and labels of a batch (CoDA's dual restart), and (a, b)
    read off x with the margin of the loss (CODA+'s closed-form dual step)."""

    def __init__(self, task: ImbalancedBinary) -> None:
        self.task, self.vmappable, self.prior, self.dim = task, task.vmappable, task.prior, task.dim

    @property
    def margin(self) -> float:
        """m of ``auc_form: margin``; 0 for the paper's form, whose saddle point is the margin form's at m = 0."""
        return self.task.params.margin if self.task.params.auc_form == "margin" else 0.0

    def auc_ab(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(a, b): the two entries of x after the network's weights."""
        return x[self.dim], x[self.dim + 1]

    def scores(self, x: Tensor, batch: Batch) -> Tensor:
        """h of every example of the batch at x, shape [n]."""
        return self.task.scores(x, batch[0])

    def labels(self, batch: Batch) -> Tensor:
        return batch[1]


class MinimaxView(_AUCView):
    """The ``minimax`` kind: min_(w,a,b) max_alpha of the AUC square loss on the client's batches.

    ``split`` is ignored: the primal and dual batches come from the same training data."""

    def sample(self, client: int, split: str, size: int | None, gen: torch.Generator) -> Batch:
        return self.task.batch_at(self.task.sample_positions(client, size, gen))

    def loss(self, x: Tensor, y: Tensor, batch: Batch) -> Tensor:
        return self.task.auc_loss(x, y, batch)


class CompositionalMinimaxView(_AUCView):
    """The ``compositional-minimax`` kind: g(x; xi) = x - rho (grad_w CE(w; xi), 0, 0), f(z, y; zeta) = AUC loss."""

    def _draw(self, client: int, n: int, gen: torch.Generator) -> Batch:
        return self.task.batch_at(self.task.sample_positions(client, n, gen))

    def sample_inner(self, client: int, n: int, gen: torch.Generator) -> Batch:
        return self._draw(client, n, gen)

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Batch:
        return self._draw(client, n, gen)

    def inner(self, x: Tensor, xi: Batch) -> Tensor:
        """x - rho (grad_w CE(w; xi), 0, 0); the CE gradient comes from ``torch.func.grad``, so the value is
        differentiable in x (by autograd and by ``torch.func``) through the Hessian of CE."""
        grad = torch.func.grad(lambda z: self.task.loss(z, xi))(x)
        step: Tensor = x - self.task.params.rho * grad
        return step

    def outer(self, z: Tensor, y: Tensor, zeta: Batch) -> Tensor:
        return self.task.auc_loss(z, y, zeta)


class ConditionalView:
    """The ``conditional`` kind: the AP surrogate with outer samples = positives, inner = a batch (module doc).

    In ``positives-first`` mode the inner draw holds only the m - n negatives that follow the n outer
    positives; :meth:`loss` puts the outer positives in front, so the network sees D-AUPRC's batch of m in
    one forward pass (no example twice, which matters for batch-statistics BatchNorm)."""

    def __init__(self, task: ImbalancedBinary) -> None:
        self.task, self.vmappable, self.dim = task, task.vmappable, task.dim

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Batch:
        """``n`` of the client's positives (without replacement when it has that many)."""
        t = self.task
        return t.batch_at(imbalance.positives_first(t.positives[client], t.negatives[client], n, n, gen))

    def sample_inner(self, client: int, outer: Batch, m: int, gen: torch.Generator) -> Batch:
        """The rest of the positives-first batch of ``m`` (m - n negatives), or ``m`` iid draws."""
        t, n = self.task, int(outer[1].shape[0])
        if t.params.ap_inner == "iid":
            return t.batch_at(t.shards[client][torch.randint(t.shards[client].numel(), (m,), generator=gen)])
        if m <= n:
            raise ConfigError(
                f"algorithm.inner_batch = {m}: the positives-first inner batch starts with the {n} outer positives "
                "and must be larger (raise inner_batch above outer_batch and first_batch, or set task.ap_inner = 'iid')"
            )
        return t.batch_at(imbalance.positives_first(t.positives[client], t.negatives[client], m - n, 0, gen))

    def loss(self, x: Tensor, outer: Batch, inner: Batch) -> Tensor:
        """-mean over the outer positives of u_pos / u_all against the inner batch (AP surrogate)."""
        t, n = self.task, int(outer[1].shape[0])
        scores = t.scores(x, torch.cat([outer[0], inner[0]]))
        if t.params.ap_inner == "iid":
            inner_scores, inner_labels = scores[n:], inner[1]
        else:
            inner_scores, inner_labels = scores, torch.cat([outer[1], inner[1]])
        return auc_losses.ap_surrogate_loss(scores[:n], inner_scores, inner_labels, t.params.ap_margin)
