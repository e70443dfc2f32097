"""Distributionally robust objectives as compositional problems h + f(g) (FedDRO, EXPERIMENTS.md 1.6-1.7).

Pure torch functions of per-example losses (or logits); nothing here holds state. The DRO problem over m
examples is ``min_x max_{p in simplex} sum_i p_i l_i(x) - lam * D(p, uniform)``; its two reformulations
are written as a plain part h, a low-dimensional inner value g (a vector of one entry, d_g = 1, so
clients can exchange it every step) and an outer function f, with Phi = h + f(g):

* **KL** (D = sum p_i log(m p_i)): value ``lam * log mean exp(l / lam)``. With a constant shift c
  (pitfall D7 in ALGORITHMS.md 8.7), ``g = mean exp((l - c) / lam)`` and ``f(z) = lam * log z + c``, h = 0.
  The shift keeps ``exp`` finite for large losses or small lam and leaves Phi and its gradient unchanged
  (``grad f(g) * grad g`` loses the factor exp(-c/lam) in g and regains it in 1/g). c must be the same on
  every client; if it changes, rescale a stored inner estimate with :func:`kl_rescale`.
  ``scale="paper"`` is FedDRO's eq. (4), which drops the outer factor lam: f(z) = log z + c / lam (same
  minimiser, gradients divided by lam -- it interacts with the learning-rate grid).
* **chi^2** (D = (m/2) sum (p_i - 1/m)^2): with only the sum-to-one constraint, the maximiser is
  p_i = 1/m + (l_i - mean l)/(lam m) and the value is ``mean l + var(l) / (2 lam)`` (population variance).
  ``variant="derived"`` (default) writes it as h = mean(l + l^2/(2 lam)), g = mean l, f(z) = -z^2/(2 lam).
  FedDRO's eq. (5) prints h = -mean(l^2)/(2 lam), f(z) = +z^2/(2 lam): the *negated* variance term without
  the mean loss, whose minimisation would spread the losses apart. ``variant="as_printed"`` reproduces it
  only to document the discrepancy. The closed form is exact only while every p_i >= 0, i.e.
  l_i >= mean l - lam for all i (:func:`chi2_feasible`); otherwise the simplex constraint binds (the
  mini-batch :func:`robust_loss` handles that case exactly).
* **Equal-opportunity fairness** (GCIVR's ``1-DRO_fairness.py``, FedDRO's E9): h = BCE over all rows;
  for each protected group k, c_k = BCE over the group's label-1 rows - overall BCE - epsilon;
  g = (1/(G+1)) (1 + sum_k exp(alpha c_k / gamma)), a soft maximum of {0, c_1, ..., c_G}; f = log.
* **FastDRO** (Levy, Carmon, Duchi, Sidford 2020) mini-batch robust loss: best-response weights over
  the batch for a CVaR or chi^2 uncertainty set, found by sorting or bisection *without gradient*;
  loss = sum p_i l_i - reg * D(p), whose gradient is sum p_i grad l_i (Danskin). ``geometry="kl"`` is the
  KL-penalised set over the whole simplex (CVaR with no cap): p = softmax(l / reg) and the loss is the batch
  KL objective reg log mean exp(l / reg) -- the objective FedDRO's KL inner value estimates, so FastDRO can
  be compared with FedDRO on one objective.

Inner values are 1-D tensors of one entry (the ``inner_dim = 1`` vector of
:class:`~fedcomp.platform.problems.GlobalCompositionalProblem`); outer functions return scalars.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, NamedTuple, TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from typing_extensions import Required, Unpack

__all__ = [
    "Composition",
    "DualPenalty",
    "chi2_dro",
    "chi2_feasible",
    "chi2_inner",
    "chi2_outer",
    "chi2_plain",
    "chi2_value",
    "EO_DEFAULTS",
    "EOOptions",
    "eo_constraints",
    "eo_exponents",
    "eo_inner",
    "eo_outer",
    "eo_plain",
    "eo_value",
    "kl_dro",
    "kl_inner",
    "kl_outer",
    "kl_rescale",
    "kl_value",
    "project_simplex",
    "RobustSet",
    "robust_loss",
    "robust_weights",
]

KLScale = Literal["lambda", "paper"]
Chi2Variant = Literal["derived", "as_printed"]
Geometry = Literal["cvar", "chi2", "kl"]


class Composition(NamedTuple):
    """Phi(l) = plain(l) + outer(inner(l)) for a vector ``l`` of per-example losses."""

    plain: Callable[[Tensor], Tensor]
    """h: losses -> scalar (a batch mean, so client means average to the global h)."""
    inner: Callable[[Tensor], Tensor]
    """g: losses -> inner value of shape [1] (a batch mean)."""
    outer: Callable[[Tensor], Tensor]
    """f: inner value [1] -> scalar; the same on every client."""

    def value(self, losses: Tensor) -> Tensor:
        return self.plain(losses) + self.outer(self.inner(losses))


class DualPenalty(NamedTuple):
    """The min-max game behind a DRO objective, for methods that keep the weights p explicitly (PDSGD):
    ``scale * max_{p in simplex} (sum_i p_i l_i - lam * D(p, uniform))``."""

    divergence: Literal["kl", "chi2"]
    """D: ``"kl"`` = sum p_i log(m p_i); ``"chi2"`` = (m/2) sum (p_i - 1/m)^2."""
    lam: float
    """The regularisation weight lambda > 0."""
    scale: float = 1.0
    """Outer factor of the objective (1/lam for the KL objective with ``scale="paper"``)."""


# ----------------------------------------------------------------------------------------------- KL


def kl_inner(losses: Tensor, lam: float, shift: float = 0.0) -> Tensor:
    """g = mean_i exp((l_i - shift) / lam), shape [1]."""
    _check_losses(losses)
    _check_positive("lam", lam)
    _check_finite("shift", shift)
    return torch.exp((losses - shift) / lam).mean().reshape(1)


def kl_outer(z: Tensor, lam: float, shift: float = 0.0, scale: KLScale = "lambda") -> Tensor:
    """f(z) = lam log z + shift (``"lambda"``), or log z + shift / lam (``"paper"``, FedDRO eq. 4)."""
    _check_positive("lam", lam)
    _check_finite("shift", shift)
    _check_choice("scale", scale, ("lambda", "paper"))
    log = torch.log(z).sum()
    return lam * log + shift if scale == "lambda" else log + shift / lam


def kl_value(losses: Tensor, lam: float, scale: KLScale = "lambda") -> Tensor:
    """The direct value lam log mean exp(l / lam) (or without the factor lam), computed with logsumexp."""
    _check_losses(losses)
    _check_positive("lam", lam)
    _check_choice("scale", scale, ("lambda", "paper"))
    value = torch.logsumexp(losses / lam, 0) - math.log(losses.numel())
    return lam * value if scale == "lambda" else value


def kl_rescale(y: Tensor, lam: float, old_shift: float, new_shift: float) -> Tensor:
    """An inner estimate made with ``old_shift`` re-expressed for ``new_shift``: y exp((old - new) / lam)."""
    _check_positive("lam", lam)
    return y * math.exp((old_shift - new_shift) / lam)


def kl_dro(lam: float, *, shift: float = 0.0, scale: KLScale = "lambda") -> Composition:
    """KL-regularised DRO as h = 0, g = mean exp((l - shift)/lam), f = lam log z + shift (see module doc)."""
    _check_positive("lam", lam)
    _check_finite("shift", shift)
    _check_choice("scale", scale, ("lambda", "paper"))
    return Composition(
        _zero_plain,
        functools.partial(kl_inner, lam=lam, shift=shift),
        functools.partial(kl_outer, lam=lam, shift=shift, scale=scale),
    )


# ---------------------------------------------------------------------------------------------- chi^2


def chi2_plain(losses: Tensor, lam: float, variant: Chi2Variant = "derived") -> Tensor:
    """h = mean(l + l^2 / (2 lam)) (derived) or -mean(l^2) / (2 lam) (as printed in FedDRO eq. 5)."""
    _check_losses(losses)
    _check_positive("lam", lam)
    _check_choice("variant", variant, ("derived", "as_printed"))
    squares = (losses**2).mean() / (2 * lam)
    return losses.mean() + squares if variant == "derived" else -squares


def chi2_inner(losses: Tensor) -> Tensor:
    """g = mean l, shape [1]."""
    _check_losses(losses)
    return losses.mean().reshape(1)


def chi2_outer(z: Tensor, lam: float, variant: Chi2Variant = "derived") -> Tensor:
    """f(z) = -z^2 / (2 lam) (derived) or +z^2 / (2 lam) (as printed)."""
    _check_positive("lam", lam)
    _check_choice("variant", variant, ("derived", "as_printed"))
    square = (z**2).sum() / (2 * lam)
    return -square if variant == "derived" else square


def chi2_value(losses: Tensor, lam: float, variant: Chi2Variant = "derived") -> Tensor:
    """Direct value: mean l + var(l) / (2 lam) (derived) or -var(l) / (2 lam) (as printed); population var."""
    _check_losses(losses)
    _check_positive("lam", lam)
    _check_choice("variant", variant, ("derived", "as_printed"))
    variance = losses.var(unbiased=False) / (2 * lam)
    return losses.mean() + variance if variant == "derived" else -variance


def chi2_feasible(losses: Tensor, lam: float) -> bool:
    """Whether the closed form's weights 1/m + (l_i - mean l)/(lam m) are all non-negative."""
    _check_losses(losses)
    _check_positive("lam", lam)
    return bool((losses >= losses.mean() - lam).all())


def chi2_dro(lam: float, *, variant: Chi2Variant = "derived") -> Composition:
    """chi^2-regularised DRO as h + f(g) with g = mean l (see module doc for the two variants)."""
    _check_positive("lam", lam)
    _check_choice("variant", variant, ("derived", "as_printed"))
    return Composition(
        functools.partial(chi2_plain, lam=lam, variant=variant),
        chi2_inner,
        functools.partial(chi2_outer, lam=lam, variant=variant),
    )


# ----------------------------------------------------------------------------------- fairness (E9)


def eo_plain(logits: Tensor, labels: Tensor) -> Tensor:
    """h = binary cross-entropy with logits over all rows (the main loss)."""
    logits, labels = _logits_labels(logits, labels)
    return F.binary_cross_entropy_with_logits(logits, labels)


def eo_constraints(
    logits: Tensor,
    labels: Tensor,
    groups: Tensor,
    *,
    num_groups: int = 3,
    epsilon: float = 0.01,
    overall: Literal["all", "positives"] = "all",
) -> tuple[Tensor, Tensor]:
    """(c [G], present [G]): c_k = BCE over group k's label-1 rows - overall BCE - epsilon.

    ``groups`` holds group ids ``[N]`` in 0..G-1 or a 0/1 membership matrix ``[N, G]``. ``overall="all"``
    is GCIVR's code (the main loss over all rows of the batch); ``"positives"`` uses the BCE over all
    label-1 rows, the reading that matches the violation metric TPR_all - TPR_k **[inferred]**.
    ``present[k]`` is False when group k has no label-1 row in the batch; its c_k is then 0 - overall -
    epsilon and carries no information (:func:`eo_inner` drops it).
    """
    logits, labels = _logits_labels(logits, labels)
    _check_int("num_groups", num_groups, 1)
    _check_finite("epsilon", epsilon)
    _check_choice("overall", overall, ("all", "positives"))
    member = _membership(groups, logits.numel(), num_groups).to(device=logits.device, dtype=logits.dtype)
    per_row = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    positive = labels
    weights = member * positive[:, None]  # [N, G]
    counts = weights.sum(0)
    group_loss = (weights * per_row[:, None]).sum(0) / counts.clamp(min=1)
    if overall == "all":
        reference = per_row.mean()
    else:
        reference = (per_row * positive).sum() / positive.sum().clamp(min=1)
    return group_loss - reference - epsilon, counts > 0


class EOOptions(TypedDict, total=False):
    """The equal-opportunity constraint's settings (GCIVR's defaults: 3 groups, eps 0.01, alpha 0.1, gamma 0.1)."""

    num_groups: int
    epsilon: float
    alpha: float
    gamma: float
    overall: Literal["all", "positives"]


EO_DEFAULTS = EOOptions(num_groups=3, epsilon=0.01, alpha=0.1, gamma=0.1, overall="all")


def eo_exponents(logits: Tensor, labels: Tensor, groups: Tensor, **options: Unpack[EOOptions]) -> tuple[Tensor, Tensor]:
    """alpha c_k / gamma for every group k, and whether group k has a label-1 row (:func:`eo_constraints`)."""
    o = EO_DEFAULTS | options
    _check_positive("alpha", o["alpha"])
    _check_positive("gamma", o["gamma"])
    c, present = eo_constraints(logits, labels, groups, num_groups=o["num_groups"], epsilon=o["epsilon"], overall=o["overall"])
    return o["alpha"] * c / o["gamma"], present


def eo_inner(logits: Tensor, labels: Tensor, groups: Tensor, **options: Unpack[EOOptions]) -> Tensor:
    """g = (1/(G+1)) (1 + sum_k exp(alpha c_k / gamma)), shape [1] (GCIVR: eps 0.01, alpha 0.1, gamma 0.1).

    A group with no label-1 row in the batch contributes no penalty (its exponential term is 0, as if
    c_k = -inf), so small mini-batches give finite values and gradients; full batches are unaffected.

    **On a mini-batch this is a biased estimate of g** (FedDRO's analysis assumes an unbiased one). Three
    sources, of both signs: exp of an estimated c_k (Jensen: too high, growing with alpha/gamma and the spread
    of the losses), each group's mean over a random number of label-1 rows (a ratio estimate), and the terms
    dropped for groups with no label-1 row in the batch (too low when a group's positives are rare). The bias is
    O(1/batch); on Adult with 16 rows per client it was measured ~11 % high, on the test's synthetic
    populations it is low (tests/losses/test_dro.py measures it over many draws against the full-data value).
    No unbiased option is offered: exp(alpha c_k / gamma) has no finite-sample unbiased plug-in estimate (a
    Poisson-type estimator needs unbiased c_k, i.e. draws stratified by group and label, which the task's
    uniform batches are not). Larger batches (``algorithm.outer_batch``) shrink it.
    """
    exponents, present = eo_exponents(logits, labels, groups, **options)
    terms = torch.where(present, torch.exp(exponents), torch.zeros_like(exponents))
    return ((1 + terms.sum()) / (len(exponents) + 1)).reshape(1)


def eo_outer(z: Tensor) -> Tensor:
    """f(z) = log z."""
    return torch.log(z).sum()


def eo_value(logits: Tensor, labels: Tensor, groups: Tensor, **options: Unpack[EOOptions]) -> Tensor:
    """Phi = h + log g computed directly as h + logsumexp({0} + {alpha c_k / gamma}) - log(G + 1)."""
    exponents, present = eo_exponents(logits, labels, groups, **options)
    scores = torch.cat([exponents.new_zeros(1), exponents[present]])
    return eo_plain(logits, labels) + torch.logsumexp(scores, 0) - math.log(len(exponents) + 1)


# -------------------------------------------------------------------------------- FastDRO (batch)


def robust_weights(
    losses: Tensor,
    *,
    geometry: Geometry,
    size: float,
    reg: float = 0.0,
    tol: float = 1e-10,
    max_iter: int = 200,
) -> Tensor:
    """Best-response weights p (no gradient) of max_p sum p_i l_i - reg D(p) over the uncertainty set.

    * ``geometry="cvar"``: set {p in simplex: p_i <= 1/(size m)}, ``size`` = alpha in (0, 1];
      D = KL(p || uniform) = sum p_i log(m p_i). ``reg = 0``: the top floor(alpha m) losses get
      1/(alpha m) each and the next one the remainder (exact, by sorting). ``reg > 0``:
      p_i = min(exp((l_i - eta)/reg), 1/(alpha m)), eta by bisection so that sum p = 1.
    * ``geometry="chi2"``: set {p in simplex: (1/(2m)) sum (m p_i - 1)^2 <= size}, ``size`` = rho in
      (0, inf]; D = (m/2) sum (p_i - 1/m)^2 (FedDRO's D_chi2). ``size = inf, reg > 0`` (penalised):
      p_i = relu(l_i - eta)/(reg m); ``reg = 0, size < inf`` (constrained): p proportional to
      relu(l_i - eta) with eta such that the divergence equals rho (all weight on the largest losses when
      m <= 1 + 2 rho); both finite: Levy et al.'s p_i = relu(l_i - eta)/(m max(reg, ||relu(l - eta)|| /
      sqrt(m (1 + 2 rho)))).
    * ``geometry="kl"``: the whole simplex (``size`` must be inf), D = KL(p || uniform), ``reg`` = lambda > 0:
      p = softmax(l / reg) in closed form, and the robust loss is reg log mean exp(l / reg).

    Bisection runs in float64 for at most ``max_iter`` halvings or until |sum p - 1| <= ``tol``; the result
    is renormalised to sum to 1 and returned in ``losses``' dtype.
    """
    _check_losses(losses)
    _check_choice("geometry", geometry, ("cvar", "chi2", "kl"))
    _check_positive("tol", tol)
    _check_int("max_iter", max_iter, 1)
    if isinstance(reg, bool) or not isinstance(reg, (int, float)) or not math.isfinite(reg) or reg < 0:
        raise ValueError(f"reg = {reg!r}: must be a finite number >= 0")
    if geometry == "cvar" and (isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size <= 1):
        raise ValueError(f"size = {size!r}: for geometry 'cvar' it is alpha and must be in (0, 1]")
    if geometry == "chi2":
        if isinstance(size, bool) or not isinstance(size, (int, float)) or math.isnan(size) or size <= 0:
            raise ValueError(f"size = {size!r}: for geometry 'chi2' it is rho and must be in (0, inf]")
        if math.isinf(size) and reg == 0:
            raise ValueError("reg = 0 with size = inf: the chi2 set is then unbounded; give a finite size or reg > 0")
    if geometry == "kl":
        if size != float("inf"):
            raise ValueError(f"size = {size!r}: the 'kl' set is the whole simplex; size must be inf")
        if reg <= 0:
            raise ValueError(f"reg = {reg!r}: the 'kl' geometry needs reg = lambda > 0")
    with torch.no_grad():
        v = losses.detach().double()
        if geometry == "kl":
            return torch.softmax(v / reg, 0).to(losses.dtype)
        solve = _cvar_weights if geometry == "cvar" else _chi2_weights
        p = solve(v, size, reg, tol, max_iter)
        return (p / p.sum()).to(losses.dtype)


class RobustSet(TypedDict, total=False):
    """The keyword arguments of :func:`robust_weights`, which :func:`robust_loss` passes on unchanged."""

    geometry: Required[Geometry]
    size: Required[float]
    reg: float
    tol: float
    max_iter: int


def robust_loss(losses: Tensor, **uncertainty: Unpack[RobustSet]) -> Tensor:
    """FastDRO's batch robust loss sum p_i l_i - reg D(p) with p = :func:`robust_weights` (held constant)."""
    p = robust_weights(losses, **uncertainty)
    m, reg = losses.numel(), uncertainty.get("reg", 0.0)
    if reg == 0:
        return (p * losses).sum()
    if uncertainty["geometry"] in ("cvar", "kl"):
        penalty = torch.where(p > 0, p * torch.log(m * p), torch.zeros_like(p)).sum()
    else:
        penalty = ((m * p - 1) ** 2).sum() / (2 * m)
    return (p * losses).sum() - reg * penalty


def project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of a 1-D tensor onto the probability simplex (sort-based, O(m log m)).

    The projection is relu(v - tau) with tau the unique threshold making it sum to 1 (Held, Wolfe and
    Crowder 1974; Duchi et al. 2008, Fig. 1).
    """
    if not isinstance(v, Tensor) or v.ndim != 1 or v.numel() == 0 or not v.is_floating_point():
        shape = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
        raise ValueError(f"v of shape {shape}: must be a non-empty 1-D floating tensor")
    u, _ = torch.sort(v, descending=True)
    cumulative = torch.cumsum(u, 0) - 1
    ranks = torch.arange(1, v.numel() + 1, dtype=v.dtype, device=v.device)
    support = int((u - cumulative / ranks > 0).nonzero().max()) + 1
    tau = cumulative[support - 1] / support
    return torch.clamp(v - tau, min=0)


def _cvar_weights(v: Tensor, alpha: float, reg: float, tol: float, max_iter: int) -> Tensor:
    m = v.numel()
    cap = 1.0 / (alpha * m)
    if reg == 0:
        cutoff = min(m, math.floor(round(alpha * m, 9)))
        order = torch.argsort(v, descending=True, stable=True)
        p = torch.zeros_like(v)
        p[order[:cutoff]] = cap
        if cutoff < m:
            p[order[cutoff]] = 1.0 - cutoff * cap
        return p

    def weights(eta: float) -> Tensor:
        return torch.clamp(torch.exp((v - eta) / reg), max=cap)

    # sum p is decreasing in eta: every entry is capped at eta_lo (sum = 1/alpha >= 1), and below 1/m at eta_hi.
    lo = float(v.min()) + reg * math.log(alpha * m)
    hi = float(v.max()) + reg * math.log(m)
    return weights(_bisect(lambda eta: float(weights(eta).sum()) - 1.0, lo, hi, tol, max_iter))


def _chi2_weights(v: Tensor, rho: float, reg: float, tol: float, max_iter: int) -> Tensor:
    m = v.numel()
    top = float(v.max())
    if top - float(v.min()) <= 1e-12 * max(1.0, abs(top)):
        return torch.full_like(v, 1.0 / m)
    if math.isinf(rho):

        def weights(eta: float) -> Tensor:
            return torch.relu(v - eta) / (reg * m)

        eta = _bisect(lambda e: float(weights(e).sum()) - 1.0, float(v.min()) - reg, top, tol, max_iter)
        return weights(eta)
    if m <= 1 + 2 * rho:
        p = (v == top).double()
        return p / p.sum()
    if reg == 0:

        def shape(eta: float) -> Tensor:
            w = torch.relu(v - eta)
            return w / w.sum()

        def excess(eta: float) -> float:  # increasing in eta: the divergence grows as mass concentrates
            return float(((m * shape(eta) - 1) ** 2).sum()) / (2 * m) - rho

        second = float(torch.unique(v)[-2])
        hi = second + 0.5 * (top - second)  # only the largest losses are weighted: excess(hi) >= 0 when m > 1 + 2 rho
        lo = float(v.min()) - (top - float(v.min()))
        while excess(lo) > 0:
            lo -= 2 * (hi - lo)
        return shape(_bisect(lambda e: -excess(e), lo, hi, tol, max_iter))

    def weights_both(eta: float) -> Tensor:
        w = torch.relu(v - eta)
        scale = max(reg, float(w.norm()) / math.sqrt(m * (1 + 2 * rho)))
        return w / (m * scale)

    lo = float(v.min()) - reg - 1
    return weights_both(_bisect(lambda e: float(weights_both(e).sum()) - 1.0, lo, top, tol, max_iter))


def _bisect(target: Callable[[float], float], lo: float, hi: float, tol: float, max_iter: int) -> float:
    """A root of a decreasing ``target`` with target(lo) >= 0 >= target(hi)."""
    mid = 0.5 * (lo + hi)
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        value = target(mid)
        if abs(value) <= tol:
            break
        if value > 0:
            lo = mid
        else:
            hi = mid
    return mid


# ------------------------------------------------------------------------------------------ helpers


def _zero_plain(losses: Tensor) -> Tensor:
    return losses.new_zeros(())


def _check_losses(losses: object) -> None:
    if not isinstance(losses, Tensor) or losses.ndim != 1 or losses.numel() == 0 or not losses.is_floating_point():
        shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
        raise ValueError(f"losses of shape {shape}: must be a non-empty 1-D floating tensor of per-example losses")


def _logits_labels(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.numel() == 0:
        raise ValueError("logits: must be a non-empty floating tensor of shape [N] or [N, 1]")
    logits = logits.reshape(-1) if logits.ndim == 2 and logits.shape[1] == 1 else logits
    if logits.ndim != 1:
        raise ValueError(f"logits of shape {tuple(logits.shape)}: must be [N] or [N, 1]")
    labels = torch.as_tensor(labels, device=logits.device).reshape(-1)
    if labels.numel() != logits.numel():
        raise ValueError(f"labels of size {labels.numel()}: must match the {logits.numel()} logits")
    return logits, labels.to(logits.dtype)


def _membership(groups: Tensor, n: int, num_groups: int) -> Tensor:
    groups = torch.as_tensor(groups)
    if groups.ndim == 1 and not groups.is_floating_point() and groups.dtype != torch.bool:
        if groups.numel() != n or (groups.numel() and (int(groups.min()) < 0 or int(groups.max()) >= num_groups)):
            raise ValueError(f"groups: must be {n} group ids in 0..{num_groups - 1}")
        return F.one_hot(groups.long(), num_groups)
    if groups.ndim == 2 and tuple(groups.shape) == (n, num_groups):
        return groups
    raise ValueError(
        f"groups of shape {tuple(groups.shape)}: must be [{n}] integer group ids "
        f"or a [{n}, {num_groups}] membership matrix"
    )


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} = {value!r}: must be a positive finite number")


def _check_finite(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} = {value!r}: must be a finite number")


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} = {value!r}: must be an integer >= {low}")


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} = {value!r}: allowed: {', '.join(map(repr, allowed))}")
