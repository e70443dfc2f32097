"""The FedDRO paper's non-federated baselines, run "in parallel" over the clients -- ``reference/ALGORITHMS.md``
sections 8.4 and 8.6.

Problem: min_x Phi(x) = h(x) + f(g(x)), h = (1/K) sum_k h_k, g = (1/K) sum_k g_k, g_k(x) in R^{d_g}. The paper
compares FedDRO (with I = 1) against centralised methods whose per-step work is K times one client's (K x 16
samples per step). Here each is a synchronous parallel method: every step the clients compute their share on
their own batches, one model-sized round averages it, and the server takes the step. Clients hold no model
between steps (GCIVR keeps the last model it received, for its two-point differences).

**Parallel MBSGD** (``parallel-mbsgd``; Ghadimi & Lan 2013, customised for compositional problems as in
ALGORITHMS.md 8.6). Per step: y = <g_k(x_t; b_k)> (one low-dimensional exchange), then on an independent batch
b'_k, d_t = <grad h_k(x_t; b'_k) + grad g_k(x_t; b'_k)^T grad f(y)> and x_{t+1} = x_t - eta d_t (one model round).
Biased (f(y) with a batch estimate y), as the paper says.

**Parallel FastDRO** (``parallel-fastdro``; Levy, Carmon, Duchi, Sidford 2020). Needs per-example losses
(:class:`ExampleLossProblem`). Per step every client sends its batch's b per-example losses (a low-dimensional
exchange), the server computes best-response weights p over the pooled K x b losses with
:func:`fedcomp.losses.dro.robust_weights` (no gradient), each client gets its b weights back and
uploads grad sum_{i in b_k} p_i l_i(x_t), and x_{t+1} = x_t - eta sum_k (that) (one model round). The task's
own h, g, f are not used: FastDRO minimises its mini-batch robust loss. Geometry, size and regulariser used by
FedDRO are **[unknown]**; the default is chi^2 with rho = 1 and no penalty. ``geometry: kl`` with ``size: null``
and ``reg: lambda`` is the batch KL objective lambda log mean exp(l / lambda) over the pooled K x b losses
(p = softmax(l / lambda)): on it FastDRO computes what FedDRO with beta = 1 (``fedavg-co-shared-y``) computes
on the KL task with that lambda -- the same step on the same batches, up to rounding -- so the two can be
compared on one objective.

GCIVR and PDSGD, run the same way, are in :mod:`~fedcomp.platform.algorithms.gcivr` and
:mod:`~fedcomp.platform.algorithms.pdsgd`.

Counters (per participating client): ``floats_up``/``floats_down`` count the model-sized message of the step;
``embedding_*`` the low-dimensional exchanges (MBSGD's y, FastDRO's losses and weights, PDSGD's positions,
losses and weights). They count what the protocol sends; the simulation moves FastDRO's and PDSGD's per-example
vectors as zero-padded K x b vectors (the federation returns means only), which the counters do not charge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from fedcomp.losses.dro import robust_loss, robust_weights
from fedcomp.platform.algorithms.base import ClientContext, Exchange, StepInfo, Tensors, batch_size
from fedcomp.platform.algorithms.builtins import PARALLEL_FASTDRO, PARALLEL_MBSGD, FastDROHParams, ParallelHParams
from fedcomp.platform.algorithms.feddro import Compositional
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.oracles import outer_grad, plain_inner_vjp, weighted_example_grad
from fedcomp.platform.problems import GlobalCompositionalProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import Model, unsent

__all__ = [
    "CohortWeights",
    "ExampleLossProblem",
    "FastDROHParams",
    "IndexedExampleProblem",
    "ParallelFastDRO",
    "ParallelHParams",
    "ParallelMBSGD",
    "count_step",
    "slot",
]


@runtime_checkable
class ExampleLossProblem(Protocol):
    """A problem that exposes its per-example losses (what FastDRO's robust loss reweights)."""

    def sample(self, client: int, size: int | None, gen: torch.Generator) -> Any:
        """A batch of ``size`` of the client's examples (all of them when ``size`` is None)."""
        ...

    def example_losses(self, x: Tensor, batch: Any) -> Tensor:
        """The losses of the batch's examples at ``x``, shape [n], differentiable in ``x``."""
        ...


@runtime_checkable
class IndexedExampleProblem(ExampleLossProblem, Protocol):
    """A problem whose examples have stable positions, so a method can keep one dual weight per example."""

    clients: int

    def examples(self, client: int) -> int:
        """n_k, the client's number of examples."""
        ...

    def sample_positions(self, client: int, size: int | None, gen: torch.Generator) -> Tensor:
        """Positions (in 0..n_k-1) of a batch of ``size`` examples drawn uniformly with replacement."""
        ...

    def batch_at(self, client: int, positions: Tensor) -> Any:
        """The batch of the client's examples at ``positions``."""
        ...


# ------------------------------------------------------------------------------------------------ states


@dataclass(frozen=True)
class CohortWeights(Model):
    """FastDRO's and PDSGD's client: x_t, the cohort's client ids (each client's slot in the pooled vectors:
    the federation returns means only) and the server's weights of the pooled examples, by slot."""

    cohort: Tensor
    w: Tensor


def slot(cohort: Tensor, client: int) -> int:
    """The client's position in the cohort (the payload carries the cohort's ids as floats)."""
    hits = (cohort == client).nonzero()
    if hits.numel() != 1:
        raise ValueError(f"client {client} is not in the broadcast cohort {cohort.tolist()}")
    return int(hits[0, 0])


def count_step(fed: Round, d: int, up: int, down: int) -> None:
    """One parallel step as the protocol sends it: a model round (d floats each way) and one low-dimensional
    exchange of ``up`` / ``down`` floats (the simulation's zero-padded cohort vectors are not charged)."""
    fed.count(comm_rounds=1, floats_up=d, floats_down=d, local_steps=1,
              embedding_exchanges=1, embedding_floats_up=up, embedding_floats_down=down)


# ------------------------------------------------------------------------------------------------ MBSGD


@register_algorithm(PARALLEL_MBSGD)
class ParallelMBSGD(Compositional):
    """Mini-batch SGD for compositional problems in parallel: y = <g_k(x; b)>, then a step on a fresh batch b'."""


    def step(self, problem: GlobalCompositionalProblem, client: Model, ctx: ClientContext) -> Exchange[Model]:
        """g_k(x_t; b_k) exchanged for y = <g_k>, then grad h_k + grad g_k^T grad f(y) on an independent b'_k."""
        inner = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round, "inner"))
        with torch.no_grad():
            g = problem.inner(client.x, inner)
        y = (yield {"y": g}).y
        batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round))
        grad, h, _ = plain_inner_vjp(problem, client.x, batch, outer_grad(problem, y)[0])
        return client, {"grad": grad}, StepInfo(batch_size(inner) + batch_size(batch), float(h))

    def round(self, fed: Round, server: Model) -> Model:
        """x_t down, g_k up and y = <g_k> down (one exchange), the gradient up (the model round), the step."""
        means = fed.exchange("step", fed.cohort(), server, 1)
        fed.count(local_steps=1)
        with torch.no_grad():
            fed.train_loss = fed.train_loss + float(fed.problem.outer(means.y))
        return Model(x=server.x - self.hp.lr_at(fed.number) * means.grad)


# ------------------------------------------------------------------------------------------------ FastDRO


@register_algorithm(PARALLEL_FASTDRO)
class ParallelFastDRO(Compositional):
    """FastDRO's batch robust loss in parallel: best-response weights over the pooled K x b losses."""

    Client = CohortWeights
    hp: FastDROHParams

    def example_losses(self, problem: ExampleLossProblem, client: CohortWeights, ctx: ClientContext) -> tuple[CohortWeights, Tensors, StepInfo]:
        """The batch's per-example losses at x_t, in the client's slot of a cohort-sized zero vector."""
        batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round))
        with torch.no_grad():
            losses = problem.example_losses(client.x, batch).reshape(-1)
        if losses.numel() != self.hp.outer_batch:
            raise ValueError(f"example_losses gave {losses.numel()} losses for a batch of {self.hp.outer_batch}")
        slots = losses.new_zeros(client.cohort.numel(), losses.numel())
        slots[slot(client.cohort, ctx.client)] = losses
        return client, {"losses": slots.reshape(-1)}, StepInfo(losses.numel(), float(losses.mean()))

    def weighted_gradient(self, problem: ExampleLossProblem, client: CohortWeights, ctx: ClientContext) -> tuple[CohortWeights, Tensors, StepInfo]:
        """grad sum_i p_i l_i(x_t) over the client's batch, with its slot of the server's weights p (constants)."""
        b = self.hp.outer_batch
        weights = client.w.view(-1, b)[slot(client.cohort, ctx.client)].detach()
        batch = problem.sample(ctx.client, b, ctx.rng(ctx.round))  # the same batch as the losses: keyed by the step
        return client, {"grad": weighted_example_grad(problem, client.x, batch, weights)}, StepInfo(b)

    def round(self, fed: Round, server: Model) -> Model:
        if not isinstance(fed.problem, ExampleLossProblem):
            raise ConfigError(
                f"algorithm.name = 'parallel-fastdro' needs per-example losses: the task's problem "
                f"{type(fed.problem).__name__} has no example_losses(x, batch)"
            )
        cohort, x, b = fed.cohort(), server.x, self.hp.outer_batch
        n, ids = len(cohort), torch.tensor(cohort, dtype=torch.float32)
        out = fed.call("example_losses", cohort, CohortWeights(x=x, cohort=ids, w=unsent()), message=None)
        pooled = out.losses * n  # each client filled only its own slot
        weights = robust_weights(pooled, **self.hp.robust)
        grads = fed.call("weighted_gradient", cohort, CohortWeights(x=x, cohort=ids, w=weights), message=None)
        fed.train_loss = float(robust_loss(pooled, **self.hp.robust))
        count_step(fed, x.numel(), up=b, down=b)
        direction = grads.grad * n  # sum over clients of sum_i p_i grad l_i
        return Model(x=x - self.hp.lr_at(fed.number) * direction)
