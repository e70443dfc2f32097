"""Descent steps: ``x - lr * d`` as torch.optim takes it (one fused multiply-add), and the plain SGD step of
the local-steps family, out of place and in place with the same bits (in place under ``federation.fused_sgd``:
the model's linear layers stepped by their gradients' factors, other roundings; :func:`grad_and_loss_factors`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedcomp.platform.oracles import grad_and_loss, grad_and_loss_factors


def descend(x: Tensor, direction: Tensor, lr: float | Tensor) -> Tensor:
    """``x - lr * direction`` as one fused multiply-add (rounded once, as ``torch.optim.SGD``'s
    ``p.add_(d, alpha=-lr)``): one pass over x where the two-step product and difference take two, and the
    same bits whether x is whole, cut into pieces (:func:`descend_`) or batched under ``vmap`` -- where
    configurations stepped in lockstep each bring their own ``lr`` as a tensor. A new tensor."""
    if isinstance(lr, Tensor):  # float64 in lockstep: rounded to x's dtype, as ``alpha`` is
        return torch.addcmul(x, direction, lr.to(x.dtype), value=-1)
    return torch.add(x, direction, alpha=-lr)


def descend_(x: list[Tensor], direction: list[Tensor], lr: float) -> None:
    """:func:`descend` in place on each piece of x (the same bits)."""
    torch._foreach_add_(x, direction, alpha=-lr)


def sgd_step(problem: Any, x: Tensor, batch: tuple[Any, ...], lr: float) -> tuple[Tensor, Tensor]:
    """One SGD step on the problem's loss at x: ``(x - lr grad, loss)`` (:func:`descend`), a new tensor."""
    grad, loss = grad_and_loss(problem, x, *batch)
    return descend(x, grad, lr), loss


def sgd_step_(problem: Any, x: Tensor, batch: tuple[Any, ...], lr: float) -> Tensor:
    """:func:`sgd_step` in place on x (the same bits); returns the loss. Under ``federation.fused_sgd`` the
    model's linear weights take their gradients' factors (:func:`grad_and_loss_factors`: other roundings there)."""
    grad, loss = grad_and_loss_factors(problem, x, *batch)
    descend_(grad.of(x), grad, lr)
    grad.add_factors_(x, -lr)
    return loss
