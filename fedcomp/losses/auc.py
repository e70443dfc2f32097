"""Losses of imbalanced binary classification: the AUC min-max square loss, the average-precision
surrogate and class-weighted cross-entropy (EXPERIMENTS.md 1.3-1.5, ALGORITHMS.md 6.2 and 9).

Pure tensor functions of scores and labels; nothing here holds state. Labels are {0, 1} (1 = positive);
the papers' +-1 labels map to these with -1 -> 0. Scores ``h`` are whatever the task feeds in (sigmoid
outputs in [0, 1] by default, raw logits as an option); the formulas do not depend on that choice.

**AUC min-max square loss** (Ying et al. 2016; the LocalSCGDAM and CoDA papers), prior p = P(y = 1),
minimised over the network and the two auxiliaries (a, b), maximised over the dual alpha; batch mean of

* ``form="paper"`` (default; EXPERIMENTS.md 1.4):
  F = (1-p)(h-a)^2 1[y=1] + p(h-b)^2 1[y=0] + 2(1+alpha)(p h 1[y=0] - (1-p) h 1[y=1]) - p(1-p) alpha^2;
* ``form="margin"`` (LibAUC ``AUCMLoss`` v1, margin m):
  F = (1-p)(h-a)^2 1[y=1] + p(h-b)^2 1[y=0] + 2 alpha (p(1-p) m + p h 1[y=0] - (1-p) h 1[y=1]) - p(1-p) alpha^2.
  LibAUC keeps alpha >= 0 by clamping in its optimiser; that is an algorithm's choice, not the loss's.

The two differ in the dual's linear term only: paper = margin with m = 0 plus the alpha-free term
2(p h 1[y=0] - (1-p) h 1[y=1]), which moves the network's gradient but not the optimum in (a, b, alpha).
On fixed scores F is a convex quadratic in (a, b) and a concave one in alpha with no cross terms, so the
saddle point has a closed form (:func:`auc_optimum`, derived here): with n_+, n_- the class counts of a
batch of n, q_+ = n_+/n, q_- = n_-/n and mu_+, mu_- the class means of h,

  a* = mu_+,  b* = mu_-,  alpha* = q_- mu_- / (1-p) - q_+ mu_+ / p  (+ m for the margin form),

which is E[h | neg] - E[h | pos] (+ m) when p equals the batch's positive fraction q_+. Under LibAUC's
constraint alpha >= 0 the constrained maximiser is max(alpha*, 0) (the function is a concave parabola).

**Average-precision surrogate** (FCSG paper eq. 6 and ``xidongwu/D-AUPRC``): for each positive i of the
outer batch and every example j of the inner batch, l_ij = max(s - (h_i - h_j), 0)^2 (squared hinge,
margin s); u_all,i = mean_j l_ij, u_pos,i = mean_j 1[y_j = 1] l_ij; loss = -mean_i u_pos,i / u_all,i.
Autograd of it is FCSG's estimator (the mean over the inner batch sits inside f(u1, u2) = -u1/u2).
:func:`ap_weighted_surrogate` is D-AUPRC's equivalent form -- a loss with the same gradient, built from
detached weights (u_pos,i - u_all,i 1[y_j = 1]) / u_all,i^2 on l_ij. When the inner batch contains the
positive i itself (D-AUPRC's batches do), l_ii = s^2 > 0 keeps u_all,i positive; with independent inner
draws u_all,i can be 0 (nothing scores within s of h_i): then that positive counts as ranked first,
precision 1, with zero gradient (every l_ij and its derivative vanish there) -- a convention of ours.

**Class-weighted cross-entropy**: mean_i weights[y_i] * BCE(logit_i, y_i) (the Ratio Loss family's form,
ALGORITHMS.md 9.6; the weights come from the algorithm).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "AUCForm",
    "AUCOptimum",
    "ap_surrogate_loss",
    "ap_weighted_surrogate",
    "auc_optimum",
    "auc_square_loss",
    "class_weighted_bce",
]

AUCForm = Literal["paper", "margin"]
FORMS = ("paper", "margin")


class AUCOptimum(NamedTuple):
    """The saddle point (a*, b*, alpha*) of the AUC square loss on fixed scores (0-d tensors)."""

    a: Tensor
    b: Tensor
    alpha: Tensor


def _check_prior(prior: float) -> None:
    if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0 < prior < 1:
        raise ValueError(f"prior = {prior!r}: must be a number strictly between 0 and 1")


def _check_form(form: str, margin: float) -> None:
    if form not in FORMS:
        raise ValueError(f"form = {form!r}: allowed: {', '.join(map(repr, FORMS))}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise ValueError(f"margin = {margin!r}: must be a finite number")


def auc_square_loss(
    scores: Tensor,
    labels: Tensor,
    a: Tensor,
    b: Tensor,
    alpha: Tensor,
    prior: float,
    *,
    form: AUCForm = "paper",
    margin: float = 1.0,
) -> Tensor:
    """Batch mean of the AUC min-max square loss F(h, a, b, alpha) (module docstring); a 0-d tensor.

    Args:
        scores: h, shape [n].
        labels: {0, 1}, shape [n] (any dtype).
        a, b, alpha: 0-d (or one-entry) tensors; differentiable.
        prior: p in (0, 1), the positive class prior (fixed, not estimated from the batch).
        form: ``"paper"`` (default) or ``"margin"`` (LibAUC v1).
        margin: m of the margin form (ignored by the paper's form).
    """
    _check_prior(prior)
    _check_form(form, margin)
    p = float(prior)
    pos = labels.to(scores.dtype)
    neg = 1 - pos
    a, b, alpha = a.reshape(()), b.reshape(()), alpha.reshape(())
    square = (1 - p) * (scores - a) ** 2 * pos + p * (scores - b) ** 2 * neg
    gap = p * scores * neg - (1 - p) * scores * pos
    if form == "paper":
        per_example = square + 2 * (1 + alpha) * gap
    else:
        per_example = square + 2 * alpha * (p * (1 - p) * margin + gap)
    return per_example.mean() - p * (1 - p) * alpha**2


def auc_optimum(
    scores: Tensor, labels: Tensor, prior: float, *, form: AUCForm = "paper", margin: float = 1.0
) -> AUCOptimum:
    """The closed-form saddle point (a*, b*, alpha*) of :func:`auc_square_loss` on fixed scores.

    a* and b* are the class means of the scores; alpha* = q_- mu_- / (1-p) - q_+ mu_+ / p (+ ``margin``
    for the margin form), where q_+- are the batch's class fractions (derivation in the module docstring).

    Raises:
        ValueError: when the batch lacks one of the classes (a* or b* is then undetermined).
    """
    _check_prior(prior)
    _check_form(form, margin)
    scores = scores.detach()
    pos = labels.to(torch.bool)
    n_pos, n = int(pos.sum()), scores.numel()
    if n_pos == 0 or n_pos == n:
        raise ValueError(
            f"labels with {n_pos} positives of {n}: the closed form needs both classes in the batch"
        )
    p = float(prior)
    mu_pos, mu_neg = scores[pos].mean(), scores[~pos].mean()
    q_pos, q_neg = n_pos / n, (n - n_pos) / n
    alpha = q_neg * mu_neg / (1 - p) - q_pos * mu_pos / p
    if form == "margin":
        alpha = alpha + margin
    return AUCOptimum(mu_pos, mu_neg, alpha)


def _pairwise_hinge(pos_scores: Tensor, scores: Tensor, margin: float) -> Tensor:
    """l_ij = max(s - (h_i - h_j), 0)^2 for positives i (rows) and inner examples j (columns)."""
    return torch.clamp(margin - (pos_scores[:, None] - scores[None, :]), min=0) ** 2


def _check_ap(pos_scores: Tensor, scores: Tensor, labels: Tensor, margin: float) -> None:
    if pos_scores.dim() != 1 or pos_scores.numel() == 0:
        raise ValueError(f"pos_scores of shape {tuple(pos_scores.shape)}: must be a non-empty 1-D tensor")
    if scores.dim() != 1 or scores.numel() == 0 or labels.shape != scores.shape:
        raise ValueError(
            f"scores of shape {tuple(scores.shape)} and labels of shape {tuple(labels.shape)}: "
            "must be non-empty 1-D tensors of the same length"
        )
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
        raise ValueError(f"margin = {margin!r}: must be a positive number")


def _ap_parts(
    pos_scores: Tensor, scores: Tensor, labels: Tensor, margin: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(l [n, m], u_all [n], u_pos [n], safe u_all [n] with 1 where u_all = 0)."""
    ell = _pairwise_hinge(pos_scores, scores, margin)
    u_all = ell.mean(1)
    u_pos = (ell * labels.to(ell.dtype)[None, :]).mean(1)
    safe = torch.where(u_all > 0, u_all, torch.ones_like(u_all))
    return ell, u_all, u_pos, safe


def ap_surrogate_loss(pos_scores: Tensor, scores: Tensor, labels: Tensor, margin: float = 0.1) -> Tensor:
    """-mean_i u_pos,i / u_all,i: the AP surrogate over the outer positives' scores ``pos_scores`` [n]
    against the inner batch (``scores``, ``labels``) [m] with squared-hinge margin ``margin`` (s).

    A positive with u_all,i = 0 contributes precision 1 (see the module docstring). Differentiable in both
    score tensors; pass the same network's scores for positives that are also in the inner batch.
    """
    _check_ap(pos_scores, scores, labels, margin)
    _, u_all, u_pos, safe = _ap_parts(pos_scores, scores, labels, margin)
    precision = torch.where(u_all > 0, u_pos / safe, torch.ones_like(u_pos))
    return -precision.mean()


def ap_weighted_surrogate(pos_scores: Tensor, scores: Tensor, labels: Tensor, margin: float = 0.1) -> Tensor:
    """D-AUPRC's weighted form: (1/(n m)) sum_ij w_ij l_ij with detached w_ij = (u_pos,i - u_all,i
    1[y_j = 1]) / u_all,i^2. Its value is not the surrogate's, but its gradient equals the gradient of
    :func:`ap_surrogate_loss` (d(-u_pos/u_all)/dl_ij = w_ij / m; positives with u_all,i = 0 get weight 0)."""
    _check_ap(pos_scores, scores, labels, margin)
    ell, u_all, u_pos, safe = _ap_parts(pos_scores, scores, labels, margin)
    with torch.no_grad():
        weights = (u_pos[:, None] - u_all[:, None] * labels.to(ell.dtype)[None, :]) / safe[:, None] ** 2
        weights = torch.where(u_all[:, None] > 0, weights, torch.zeros_like(weights))
    return (weights * ell).mean()


def class_weighted_bce(logits: Tensor, labels: Tensor, weights: Tensor) -> Tensor:
    """mean_i weights[y_i] * BCE(logit_i, y_i) for {0, 1} labels and ``weights`` of shape [2]."""
    if weights.shape != (2,):
        raise ValueError(f"weights of shape {tuple(weights.shape)}: must have shape [2] (one weight per class)")
    per_example = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    return (weights.to(logits.dtype)[labels.long()] * per_example).mean()
