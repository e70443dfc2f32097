"""LocalSGDM_RL -- LocalSGDM (:mod:`.local_sgdm`) on the Ratio Loss of Wang, Xu, Wang, Zhu (AAAI 2021), the
LocalSCGDAM paper's baseline A21 (``reference/ALGORITHMS.md`` section 9.6).

**LocalSGDM_RL** (``local-sgdm-rl``) -- a **reconstruction**: ALGORITHMS.md 9.6 marks the Ratio Loss and its
monitor **[unknown]** in the papers available here, so this follows the form public re-implementations of
Wang et al. use (read, not copied). LocalSGDM on a class-weighted cross-entropy whose weights the server
sets at the start of every round from the global model x:

    for each class c: Delta W_c = d l(x; A_c) / d W       (A_c: a balanced auxiliary batch of class c only,
                                                            W: the output layer's weights, unweighted loss)
    Ra_c = (C - 1) |Delta W_c|_1 / sum_{c' != c} |Delta W_c'|_1          (``ratio: magnitude``, the default)
    Ra_c = | mean over W's entries of (C - 1) Delta W_c / (sum_c' Delta W_c' - Delta W_c) |   (``entry-mean``)
    w_c  = alpha_rl + beta_rl * Ra_c                        (defaults 1 and 0.1 **[inferred]**, from a public
                                                            re-implementation)

``entry-mean`` is the form the public re-implementations use. With a single-logit binary model it is
ill-conditioned: an entry whose other-class gradient is near zero (a feature the well-fitted class barely
activates) makes that entry's ratio, and with it the weight, explode -- measured on mnist5k with the
FashionMNIST CNN: weights of 9.5, then 40, at rounds 13 and 20, and the run collapsed to a constant
predictor (AUROC 0.50). The ratio of gradient magnitudes measures the same thing (how much more the
class's own auxiliary data pulls on the output layer than the others' data) without division by single
entries, so it is the default here -- our choice, not a paper's.

The weights w (C floats) travel with x in the round's broadcast and stay fixed for the round's p local steps.
An under-fitted (minority) class has large auxiliary gradients relative to the others, so its Ra and weight
grow. Which entries enter the mean: for C = 2 all of W's entries -- with one logit (the binary tasks here)
W is that logit's weight row; with two logits the two rows' gradients are negatives of each other, so every
entry gives the same ratios. For C > 2, W is the [C, H] matrix (row-major) and class c's ratio uses row c,
as the re-implementations do. Entries whose denominator is exactly 0 (e.g. dead ReLU units) are left out of
the mean, and a class with no usable entry gets Ra = 1 (the balanced value) -- a guard the re-implementations
do not have (they would return NaN).

``weights: prior`` is the approximation ALGORITHMS.md 9.6 allows **[inferred]**: no monitor; the same
ratio computed from the known global class prior (positive fraction p of a binary task) with inverse
frequencies in place of the auxiliary gradients, Ra_c = (C - 1)(1/pi_c) / sum_{c' != c} (1/pi_c'), i.e.
Ra_1 = (1 - p)/p and Ra_0 = p/(1 - p), so the weights are fixed for the whole run.

What a task offers for it is :class:`RatioLossProblem` (monitor) or :class:`ClassPriorProblem` (prior); the
server-side monitor's auxiliary batches are not counted in ``samples`` (they are not clients' oracle calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import grad_and_loss
from fedcomp.platform.algorithms.builtins import LOCAL_SGDM_RL, LocalSGDMRLHParams
from fedcomp.platform.algorithms.local_sgdm import LocalSGDM, ModelMomentum
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import State

__all__ = [
    "ClassPriorProblem",
    "LocalSGDMRL",
    "LocalSGDMRLHParams",
    "RatioLossProblem",
    "monitor_ratios",
    "prior_ratios",
    "ratio_estimates",
]


@runtime_checkable
class RatioLossProblem(Protocol):
    """A plain problem that LocalSGDM_RL's server-side monitor can read (``weights: monitor``)."""

    monitor_slice: slice
    """Positions in x of the output layer's weight (row-major [rows, H]; one row for a single-logit model)."""

    def class_weighted_loss(self, x: Tensor, batch: Any, weights: Tensor) -> Tensor:
        """The loss of the batch with example i weighted by ``weights[label_i]`` (C weights, one per class)."""
        ...

    def monitor_batches(self) -> list[Any]:
        """The auxiliary balanced data, one batch per class: item c holds examples of class c only."""
        ...


@runtime_checkable
class ClassPriorProblem(Protocol):
    """A binary plain problem with a known global positive fraction (``weights: prior``)."""

    prior: float
    """The fraction of positive (class 1) training examples over all clients."""

    def class_weighted_loss(self, x: Tensor, batch: Any, weights: Tensor) -> Tensor:
        """The loss of the batch with example i weighted by ``weights[label_i]``."""
        ...


# ------------------------------------------------------------------------------------------------ the monitor


def ratio_estimates(delta: Tensor, form: Literal["magnitude", "entry-mean"] = "entry-mean") -> Tensor:
    """Ra_c for every class from the auxiliary gradients ``delta`` ([C, L]: row c = Delta W_c, flattened).

    ``entry-mean``: C = 2: the mean runs over all L entries; C > 2: over row c of each [C, L / C] matrix (see the
    module doc). ``magnitude``: (C - 1) |Delta W_c|_1 / sum_{c' != c} |Delta W_c'|_1 over the same entries.
    """
    classes = delta.shape[0]
    if classes < 2:
        raise ValueError(f"ratio_estimates needs gradients of 2 classes or more, got {classes}")
    if classes > 2:
        if delta.shape[1] % classes:
            raise ValueError(
                f"the monitored weight has {delta.shape[1]} entries, not a multiple of the {classes} classes: "
                f"for C > 2 monitor_slice must cover the [C, H] output weight"
            )
        delta = delta.view(classes, classes, -1)
    others = delta.sum(0, keepdim=True) - delta
    ratios = []
    for c in range(classes):
        num, den = (classes - 1) * delta[c], others[c]
        if classes > 2:
            num, den = num[c], den[c]
        if form == "magnitude":
            if classes > 2:
                own, rest = delta[c, c].abs().sum(), delta[:, c].abs().sum(0) - delta[c, c].abs()
            else:
                own, rest = delta[c].abs().sum(), delta.abs().sum(0) - delta[c].abs()
            total = rest.sum()
            ratios.append((classes - 1) * own / total if bool(total > 0) else delta.new_ones(()))
            continue
        usable = den != 0
        if not bool(usable.any()):
            ratios.append(delta.new_ones(()))
        else:
            ratios.append((num[usable] / den[usable]).mean().abs())
    return torch.stack(ratios)


def monitor_ratios(problem: RatioLossProblem, x: Tensor, form: Literal["magnitude", "entry-mean"] = "entry-mean") -> Tensor:
    """Ra at the global model ``x``: gradients of the (unweighted) loss on each class's auxiliary batch."""
    rows = []
    for batch in problem.monitor_batches():
        grad, _ = grad_and_loss(problem, x, batch)
        rows.append(grad[problem.monitor_slice].reshape(-1))
    return ratio_estimates(torch.stack(rows), form)


def prior_ratios(prior: float) -> Tensor:
    """Ra from a binary class prior (positive fraction ``prior``): [p / (1 - p), (1 - p) / p]."""
    if not 0 < prior < 1:
        raise ValueError(f"prior = {prior!r}: the positive fraction must be in (0, 1)")
    inverse = 1 / torch.tensor([1 - prior, prior], dtype=torch.float64)
    classes = inverse.numel()
    return ((classes - 1) * inverse / (inverse.sum() - inverse)).float()


class _Weighted:
    """The plain-problem view of a class-weighted loss, so :func:`grad_and_loss` (and ``vmap``) apply."""

    def __init__(self, problem: RatioLossProblem | ClassPriorProblem, weights: Tensor) -> None:
        self.problem, self.weights = problem, weights
        self.model = getattr(problem, "model", None)
        """The task's network, for in-place steps (:func:`~fedcomp.platform.oracles.grad_and_loss_pieces`)."""

    def loss(self, x: Tensor, batch: Any) -> Tensor:
        return self.problem.class_weighted_loss(x, batch, self.weights)


# ------------------------------------------------------------------------------------------------ the algorithm


@dataclass(frozen=True)
class WeightedClient(ModelMomentum):
    w: Tensor
    """The round's class weights (broadcast with the model)."""


@register_algorithm(LOCAL_SGDM_RL)
class LocalSGDMRL(LocalSGDM):
    """LocalSGDM on the Ratio Loss: CE weighted per class by w = alpha_rl + beta_rl Ra, Ra set by the server
    each round (a reconstruction; see the module doc)."""

    Client = WeightedClient
    hp: LocalSGDMRLHParams

    def _loss(self, problem: Any, state: WeightedClient) -> Any:  # type: ignore[override]
        return _Weighted(problem, state.w)

    def check_problem(self, problem: Any) -> None:
        """The monitor's weights need the task's class-weighted loss and monitor batches; the prior's, its class
        prior: said when the server is built (it was said at the first round, after the actors started)."""
        needed: tuple[str, ...] = ("class_weighted_loss", "monitor_batches", "monitor_slice")
        offered: type = RatioLossProblem
        if self.hp.weights != "monitor":
            needed, offered = ("class_weighted_loss", "prior"), ClassPriorProblem
        if not isinstance(problem, offered):
            lacking = ", ".join(name for name in needed if not hasattr(problem, name))
            raise ConfigError(
                f"algorithm.name = 'local-sgdm-rl' with weights '{self.hp.weights}' needs a task that offers "
                f"{', '.join(needed)}; the task's problem {type(problem).__name__} lacks {lacking}"
            )

    def class_weights(self, problem: Any, x: Tensor) -> Tensor:
        """The round's weights w_c = alpha_rl + beta_rl * Ra_c from the monitor at ``x`` or from the prior (a problem
        :meth:`check_problem` passed)."""
        if self.hp.weights == "monitor":
            ratios = monitor_ratios(problem, x, self.hp.ratio)
        else:
            ratios = prior_ratios(float(problem.prior))
        return (self.hp.alpha_rl + self.hp.beta_rl * ratios).to(x.dtype)

    def round(self, fed: Round, server: State) -> State:
        """The monitor's weights at the global x go out with the model (C more floats down); then LocalSGDM."""
        weights = self.class_weights(fed.problem, server.x)  # type: ignore[attr-defined]
        return server.replace(**fed.local_steps({**self.broadcast(server), "w": weights}, self.hp.local_steps))
