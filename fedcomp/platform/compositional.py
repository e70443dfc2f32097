"""Oracles of the ``compositional`` problem kind (f_k(g_k(x)), inner function local to each client).

* :func:`inner_value_vjp`: g_k(x; xi) and a function v -> (dg_k(x; xi)/dx)^T v on the *same* draw xi
  (one forward pass; the graph is kept until the product is taken);
* :func:`outer_grad`: grad f_k(y; zeta) and f_k(y; zeta).

For MAML, g_k(x; xi) = mean over tasks of the adapted weights x - lambda grad L_i(x; support_i), so the
vector-Jacobian product is second-order (a Hessian-vector product of the support loss) unless the task runs
first-order MAML.

Under lockstep clients (``vmap``; see :mod:`fedcomp.platform.vectorised`) both oracles use ``torch.func``
transforms instead of autograd; outside it they keep plain autograd (fewer operations for small models).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from fedcomp.platform.oracles import LOCKSTEP
from fedcomp.platform.problems import CompositionalProblem


def inner_value_vjp(problem: CompositionalProblem, x: Tensor, xi: Any) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """(g_k(x; xi), v -> (dg_k(x; xi)/dx)^T v); the product may be taken once."""
    if LOCKSTEP.get():
        value, pullback = torch.func.vjp(lambda z: problem.inner(z, xi), x)
        return value, lambda v: pullback(v)[0]
    x = x.detach().requires_grad_(True)
    value = problem.inner(x, xi)

    def vjp(v: Tensor) -> Tensor:
        if not value.requires_grad:  # g does not depend on x
            return torch.zeros_like(x)
        (grad,) = torch.autograd.grad(value, x, v, allow_unused=True)
        return torch.zeros_like(x) if grad is None else grad.detach()

    return value.detach(), vjp


def outer_grad(problem: CompositionalProblem, y: Tensor, zeta: Any) -> tuple[Tensor, Tensor]:
    """(grad f_k(y; zeta), f_k(y; zeta)) at the point ``y``."""
    if LOCKSTEP.get():
        return torch.func.grad_and_value(lambda z: problem.outer(z, zeta))(y)
    y = y.detach().requires_grad_(True)
    value = problem.outer(y, zeta)
    (grad,) = torch.autograd.grad(value, y)
    return grad.detach(), value.detach()
