"""Federated MAML: one task object, two problem views (conditional and compositional), shared by the
meta-learning tasks (``sinewave``, ``omniglot``, ``fewshot-mnist``).

An *episode* is one learning task i with a support set (what adaptation sees) and a query set (what the
adapted model is judged on). Adaptation is ``adapt_steps`` gradient steps of the support loss at rate
lambda = ``adapt_lr``, starting from the meta-parameters x:

    fast_i(x) = x - lambda grad L_i(x; support_i)          (repeated adapt_steps times)

``maml: second-order`` (default, pitfall F8) keeps the graph of the adaptation step, so meta-gradients flow
through it (Hessian-vector products of the support loss); ``first-order`` detaches the support gradient
(first-order MAML, an explicitly labelled approximation). Tasks are looped over one by one: under
``torch.func.vmap`` the second-order meta-gradient of a net with BatchNorm in training mode disagrees with
the loop (``EXPERIMENTS.md`` E2), and the loop is exact for every model.

* **Conditional view** (FCSG paper section 5.2; kind ``conditional``): the outer sample xi is a task with
  its query set, the inner samples eta | xi are support examples of *that* task;
  loss = mean_i L_i(x - lambda grad L_i(x; eta_i); query_i). ``inner_batch`` m >= the support size uses the
  whole support set (the paper's setting); a smaller m uses m support examples drawn without replacement.
* **Compositional view** (Local-SCGDM slides; kind ``compositional``): g_k(x) = E_i fast_i(x) and
  f_k(y) = E_i L_i(y; query_i), the task expectation taken separately inside g (tasks xi, support sets) and
  inside f (independent tasks zeta, query sets) -- the modelling the FCSG paper criticises.
  :meth:`CompositionalView.sample_pairs` draws tasks whose support feeds g and query feeds f (the FCSG
  code's per-task variant of Local-SCGD(M)).

With one fixed task per client and m = the whole support set the two views are the same objective, and
Local-SCGD with gamma = 1 takes FCSG's steps (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._pytree import register_pytree_node

from fedcomp.models.functional import FlatModel
from fedcomp.platform.kinds import CONDITIONAL
from fedcomp.platform.tasks.base import Task


@dataclass(frozen=True)
class Episodes:
    """``n`` tasks: support inputs [n, S, ...] and targets [n, S], query inputs [n, Q, ...] and targets [n, Q]."""

    support_x: Tensor
    support_y: Tensor
    query_x: Tensor
    query_y: Tensor

    def __len__(self) -> int:
        return int(self.support_x.shape[0])

    def __getitem__(self, i: int) -> Episodes:
        return Episodes(self.support_x[i : i + 1], self.support_y[i : i + 1], self.query_x[i : i + 1], self.query_y[i : i + 1])

    def to(self, device: torch.device) -> Episodes:
        return Episodes(*(t.to(device) for t in (self.support_x, self.support_y, self.query_x, self.query_y)))


register_pytree_node(  # so lockstep clients can stack and vmap episodes (``register_dataclass`` is torch 2.7+)
    Episodes,
    lambda e: ([getattr(e, f.name) for f in fields(e)], None),
    lambda values, _: Episodes(*values),
)


# -- models -------------------------------------------------------------------------------------------------------


class Conv4(nn.Module):
    """The FCSG MAML code's 4-layer conv net (``config_om``; EXPERIMENTS.md E2): three 3x3 stride-2 convs and a
    2x2 conv, 64 filters, each followed by ReLU then BatchNorm (batch statistics always, no running
    statistics), then a linear head: 28 -> 13 -> 6 -> 2 -> 1, about 91.8 k parameters for 5 ways."""

    def __init__(self, ways: int, channels: int = 64, in_channels: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for kernel, stride in ((3, 2), (3, 2), (3, 2), (2, 1)):
            layers += [nn.Conv2d(c, channels, kernel, stride), nn.ReLU(), nn.BatchNorm2d(channels, track_running_stats=False)]
            c = channels
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, ways)

    def forward(self, images: Tensor) -> Tensor:
        logits: Tensor = self.head(self.features(images).flatten(1))
        return logits


def init_flat_kaiming(module: nn.Module, gen: torch.Generator) -> Tensor:
    """As the FCSG MAML code: Kaiming-normal conv/linear weights, zero biases, BatchNorm weight 1 and bias 0."""
    parts = []
    for mod in module.modules():
        for name, param in mod.named_parameters(recurse=False):
            value = torch.zeros(param.shape)
            if isinstance(mod, (nn.Conv2d, nn.Linear)) and name == "weight":
                nn.init.kaiming_normal_(value, mode="fan_in", nonlinearity="relu", generator=gen)
            elif isinstance(mod, nn.BatchNorm2d) and name == "weight":
                value.fill_(1.0)
            parts.append(value.reshape(-1))
    return torch.cat(parts)


# -- the two views --------------------------------------------------------------------------------------------------


class ConditionalView:
    """The ``conditional`` kind of a meta-learning task (see the module docstring)."""

    def __init__(self, task: MetaTask) -> None:
        self.task = task
        self.vmappable = task.vmappable

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Episodes:
        return self.task.episodes(client, n, gen)

    def sample_inner(self, client: int, outer: Episodes, m: int, gen: torch.Generator) -> Tensor | None:
        """Positions of m support examples of each task (None: the whole support set, when m >= its size)."""
        size = outer.support_y.shape[1]
        if m >= size:
            return None
        return torch.stack([torch.randperm(size, generator=gen)[:m] for _ in range(len(outer))])

    def loss(self, x: Tensor, outer: Episodes, inner: Tensor | None) -> Tensor:
        task, total = self.task, x.new_zeros(())
        for i in range(len(outer)):
            sx, sy = outer.support_x[i], outer.support_y[i]
            if inner is not None:
                sx, sy = sx[inner[i]], sy[inner[i]]
            fast = task.adapt(x, sx.to(task.device), sy.to(task.device), task.params.adapt_steps, task.second_order)
            total = total + task.loss_fn(task.model(fast, outer.query_x[i].to(task.device)), outer.query_y[i].to(task.device))
        return total / len(outer)


class CompositionalView:
    """The ``compositional`` kind of a meta-learning task (see the module docstring)."""

    def __init__(self, task: MetaTask) -> None:
        self.task = task
        self.vmappable = task.vmappable

    def sample_inner(self, client: int, n: int, gen: torch.Generator) -> Episodes:
        return self.task.episodes(client, n, gen)

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Episodes:
        return self.task.episodes(client, n, gen)

    def sample_pairs(self, client: int, n: int, gen: torch.Generator) -> list[tuple[Episodes, Episodes]]:
        episodes = self.task.episodes(client, n, gen)
        return [(episodes[i], episodes[i]) for i in range(n)]

    def inner(self, x: Tensor, xi: Episodes) -> Tensor:
        """g_k(x; xi) = mean over the tasks of the adapted weights (support sets only)."""
        task = self.task
        total = torch.zeros_like(x)
        for i in range(len(xi)):
            sx, sy = xi.support_x[i].to(task.device), xi.support_y[i].to(task.device)
            total = total + task.adapt(x, sx, sy, task.params.adapt_steps, task.second_order)
        return total / len(xi)

    def outer(self, y: Tensor, zeta: Episodes) -> Tensor:
        """f_k(y; zeta) = mean over the tasks of the query loss at y (query sets only)."""
        task = self.task
        losses = [
            task.loss_fn(task.model(y, zeta.query_x[i].to(task.device)), zeta.query_y[i].to(task.device))
            for i in range(len(zeta))
        ]
        return torch.stack(losses).mean()


class MetaTask(Task):
    """Base of the meta-learning tasks: adaptation, both views, and evaluation on fixed held-out episodes.

    Subclasses set ``self.model`` (a :class:`FlatModel`), ``loss_fn``, and write :meth:`episodes` (training
    episodes of a client) and :meth:`eval_episodes` (the held-out episodes, drawn once).
    """

    model: FlatModel
    loss_fn: Callable[[Tensor, Tensor], Tensor]

    @property
    def second_order(self) -> bool:
        order: str = self.params.maml
        return order == "second-order"

    def problem(self, kind: str) -> Any:
        super().problem(kind)  # checks the kind
        return ConditionalView(self) if kind == CONDITIONAL else CompositionalView(self)

    def episodes(self, client: int, n: int, gen: torch.Generator) -> Episodes:
        """``n`` training episodes of client ``client``, drawn with ``gen``."""
        raise NotImplementedError

    def eval_episodes(self) -> Episodes:
        """The held-out episodes every evaluation uses (fixed by the task's data seed)."""
        raise NotImplementedError

    def adapt(self, x: Tensor, sx: Tensor, sy: Tensor, steps: int, create_graph: bool) -> Tensor:
        """x after ``steps`` gradient steps of the support loss at ``adapt_lr``.

        The support gradient comes from ``torch.func.grad``, so the result is differentiable in x by autograd
        and by ``torch.func`` alike (second-order MAML); ``create_graph=False`` detaches it (first-order MAML:
        d fast / d x = I; also what evaluation uses)."""

        def support_loss(p: Tensor) -> Tensor:
            return self.loss_fn(self.model(p, sx), sy)

        fast = x
        for _ in range(steps):
            grad = torch.func.grad(support_loss)(fast)
            fast = fast - self.params.adapt_lr * (grad if create_graph else grad.detach())
        return fast

    def evaluate_episodes(self, x: Tensor, episodes: Episodes, steps: int) -> tuple[list[float], list[Tensor]]:
        """Per-episode query loss and query predictions after ``steps`` adaptation steps (no meta-graph)."""
        losses, preds = [], []
        x = x.detach().to(self.device)
        for i in range(len(episodes)):
            sx, sy = episodes.support_x[i].to(self.device), episodes.support_y[i].to(self.device)
            fast = self.adapt(x, sx, sy, steps, create_graph=False).detach()
            with torch.no_grad():
                out = self.model(fast, episodes.query_x[i].to(self.device))
                losses.append(float(self.loss_fn(out, episodes.query_y[i].to(self.device))))
            preds.append(out.cpu())
        return losses, preds

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        episodes = self.eval_episodes()
        steps = self.params.eval_steps

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            return self.metrics_of(state["x"], episodes, steps)

        return evaluate

    def metrics_of(self, x: Tensor, episodes: Episodes, steps: int) -> dict[str, float]:
        raise NotImplementedError


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits, labels)


def mse(pred: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(pred.squeeze(-1), target)
