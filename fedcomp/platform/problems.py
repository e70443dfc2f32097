"""Problem kinds: what a task offers an algorithm, as protocols of oracles over explicit parameters.

Parameters are always a flat float32 tensor ``x`` passed in explicitly, so an algorithm can evaluate the
same mini-batch at two points (Acc-FCSG-M, SVRG, SCAFFOLD, FedDRO) and differentiate through the oracles
(Hessian-vector products for FedNest and MAML). A task implements one or more kinds; an algorithm declares
the one kind it needs (the kinds' names: :mod:`fedcomp.platform.kinds`). Later kinds (compositional, compositional-minimax, bilevel, minimax) are further
protocols in this module with their own oracles; the federation and runner do not change.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from fedcomp.platform import kinds

Split = Literal["inner", "outer"]
"""Which of a client's data an oracle reads: the inner problem's (training) or the outer one's (validation)."""


@runtime_checkable
class PlainProblem(Protocol):
    """min_x (1/K) sum_k E_z l(x; z) with client ``k`` drawing ``z`` from its own distribution.

    Optional: a task whose loss is the mean cross-entropy of its model (``self.model``, a
    :class:`~fedcomp.models.functional.FlatModel`) on a batch's features and labels may say so with
    ``classifier_inputs(batch) -> (features, labels)``; the oracles then differentiate it without autograd's tape
    where the model is a perceptron (:func:`fedcomp.platform.oracles.untaped`: the same bits, checked at first use)."""

    def sample_batch(self, client: int, size: int, gen: torch.Generator) -> Any:
        """Draw ``size`` examples of client ``client``'s data with ``gen``."""
        ...

    def loss(self, x: Tensor, batch: Any) -> Tensor:
        """Mean loss of the batch at parameters ``x`` (differentiable in ``x``)."""
        ...


@runtime_checkable
class ConditionalProblem(Protocol):
    """min_x (1/K) sum_k E_xi f_xi( E_{eta|xi} g_eta(x, xi) ) -- the FCSG paper's problem (its eq. 1)."""

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Any:
        """Draw ``n`` outer samples xi of client ``client``."""
        ...

    def sample_inner(self, client: int, outer: Any, m: int, gen: torch.Generator) -> Any:
        """Draw ``m`` inner samples eta ~ P(eta | xi) for each outer sample."""
        ...

    def loss(self, x: Tensor, outer: Any, inner: Any) -> Tensor:
        """Mean over outer samples of f_xi( mean_j g_{eta_j}(x, xi) ) -- the empirical nested objective."""
        ...


@runtime_checkable
class BilevelProblem(Protocol):
    """min_x (1/K) sum_k f_k(x, y*(x)) with y*(x) = argmin_y (1/K) sum_k g_k(x, y) (FedNest's problem).

    Gradients, Hessian-vector products and mixed products of f_k and g_k come from
    :mod:`fedcomp.platform.oracles` by automatic differentiation of the two losses.
    """

    minimax: bool
    """True when g_k = -f_k (then the indirect part of the hypergradient vanishes)."""

    def sample(self, client: int, split: Split, size: int | None, gen: torch.Generator) -> Any:
        """A batch of ``size`` examples of the client's ``split`` data, or all of it when ``size`` is None."""
        ...

    def outer_loss(self, x: Tensor, y: Tensor, batch: Any) -> Tensor:
        """f_k(x, y) on the batch."""
        ...

    def inner_loss(self, x: Tensor, y: Tensor, batch: Any) -> Tensor:
        """g_k(x, y) on the batch."""
        ...


@runtime_checkable
class MinimaxProblem(Protocol):
    """min_x max_y (1/K) sum_k f_k(x, y)."""

    def sample(self, client: int, split: Split, size: int | None, gen: torch.Generator) -> Any: ...

    def loss(self, x: Tensor, y: Tensor, batch: Any) -> Tensor:
        """f_k(x, y) on the batch (minimised in x, maximised in y)."""
        ...


class MinimaxAsBilevel:
    """The bilevel view of a minimax problem: f_k = loss, g_k = -loss, one data split for both."""

    minimax = True

    def __init__(self, problem: MinimaxProblem) -> None:
        self.problem = problem

    def sample(self, client: int, split: Split, size: int | None, gen: torch.Generator) -> Any:
        return self.problem.sample(client, split, size, gen)

    def outer_loss(self, x: Tensor, y: Tensor, batch: Any) -> Tensor:
        return self.problem.loss(x, y, batch)

    def inner_loss(self, x: Tensor, y: Tensor, batch: Any) -> Tensor:
        return -self.problem.loss(x, y, batch)


@runtime_checkable
class GlobalCompositionalProblem(Protocol):
    """min_x Phi(x) = h(x) + f((1/K) sum_k g_k(x)), h = (1/K) sum_k h_k -- FedDRO's problem (its eq. 2).

    The inner map g_k: R^d -> R^{d_g} is low-dimensional (often d_g = 1), so its value can be exchanged
    cheaply; the outer function f is the same for every client and deterministic.
    """

    inner_dim: int
    """d_g, the dimension of g_k's value."""

    def sample(self, client: int, size: int | None, gen: torch.Generator) -> Any:
        """A batch of ``size`` of the client's examples (all of them when ``size`` is None)."""
        ...

    def inner(self, x: Tensor, batch: Any) -> Tensor:
        """g_k(x) estimated on the batch: a vector of ``inner_dim`` values."""
        ...

    def outer(self, z: Tensor) -> Tensor:
        """f(z), a scalar."""
        ...

    def plain(self, x: Tensor, batch: Any) -> Tensor:
        """h_k(x) on the batch (a zero tensor when the problem has no plain part)."""
        ...


@runtime_checkable
class CompositionalProblem(Protocol):
    """min_x (1/K) sum_k f_k(g_k(x)) with g_k(x) = E_xi g_k(x; xi) and f_k(y) = E_zeta f_k(y; zeta), both
    local to client k and with independent samples xi, zeta (Local-SCGD(M)'s problem; ALGORITHMS.md class C2).

    The oracles an algorithm uses -- g_k's value, its vector-Jacobian product (dg_k/dx)^T v and grad f_k --
    come from :func:`fedcomp.platform.oracles.inner_value_vjp` and
    :func:`~fedcomp.platform.oracles.outer_grad` by automatic differentiation of :meth:`inner` and
    :meth:`outer`.
    """

    def sample_inner(self, client: int, n: int, gen: torch.Generator) -> Any:
        """Draw ``n`` samples xi of client ``client``'s inner function."""
        ...

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Any:
        """Draw ``n`` samples zeta of the client's outer function (independent of the inner ones)."""
        ...

    def inner(self, x: Tensor, xi: Any) -> Tensor:
        """g_k(x; xi) averaged over the draws: a vector (differentiable in ``x``)."""
        ...

    def outer(self, y: Tensor, zeta: Any) -> Tensor:
        """f_k(y; zeta) averaged over the draws: a scalar (differentiable in ``y``)."""
        ...


@runtime_checkable
class PairedCompositionalProblem(CompositionalProblem, Protocol):
    """A compositional problem whose inner and outer samples can also be drawn in pairs from one source
    (MAML: the support and the query set of the same task), for the FCSG code's per-task variant of
    Local-SCGD(M)."""

    def sample_pairs(self, client: int, n: int, gen: torch.Generator) -> list[tuple[Any, Any]]:
        """``n`` pairs (xi_i, zeta_i), each a single draw, xi_i and zeta_i from the same source."""
        ...


@runtime_checkable
class CompositionalMinimaxProblem(Protocol):
    """min_x max_y (1/K) sum_k f_k( (1/K) sum_k' g_k'(x), y ) with g_k(x) = E_xi g_k(x; xi) and
    f_k(z, y) = E_zeta f_k(z, y; zeta) -- LocalSCGDAM's problem (ALGORITHMS.md class C4, section 9.1).

    The inner value may be as large as x itself (compositional deep AUC: g(x) = x - rho (grad_w CE(w), 0, 0)),
    so algorithms keep and average an estimate of it. The vector-Jacobian product (dg_k/dx)^T v comes from
    :func:`fedcomp.platform.oracles.inner_value_vjp` by automatic differentiation of :meth:`inner`
    (a Hessian-vector product when g contains a gradient step).
    """

    def sample_inner(self, client: int, n: int, gen: torch.Generator) -> Any:
        """A batch xi of ``n`` of client ``client``'s examples for the inner function."""
        ...

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Any:
        """A batch zeta of ``n`` examples for the outer function (independent of the inner draw)."""
        ...

    def inner(self, x: Tensor, xi: Any) -> Tensor:
        """g_k(x; xi): a vector, differentiable in ``x`` (with a graph deep enough for its VJP)."""
        ...

    def outer(self, z: Tensor, y: Tensor, zeta: Any) -> Tensor:
        """f_k(z, y; zeta): a scalar, differentiable in the inner value ``z`` and the dual variable ``y``."""
        ...


PROTOCOLS: dict[str, type] = {
    kinds.PLAIN: PlainProblem,
    kinds.CONDITIONAL: ConditionalProblem,
    kinds.BILEVEL: BilevelProblem,
    kinds.MINIMAX: MinimaxProblem,
    kinds.COMPOSITIONAL_GLOBAL: GlobalCompositionalProblem,
    kinds.COMPOSITIONAL: CompositionalProblem,
    kinds.COMPOSITIONAL_MINIMAX: CompositionalMinimaxProblem,
}
"""The protocol of each of fedcomp's problem kinds: what an algorithm of that kind calls on its problem."""


def lacks(problem: Any, kind: str) -> list[str]:
    """The methods of ``kind``'s protocol that ``problem`` (a task's ``problem(kind)``) does not have: checked as the
    server is built, so that a task missing one fails then, in one line, not mid-round where an algorithm calls it.
    Nothing for a kind of the user's own (not in :data:`PROTOCOLS`)."""
    protocol = PROTOCOLS.get(kind)
    if protocol is None:
        return []
    needed = dict.fromkeys(name for cls in reversed(protocol.__mro__) if getattr(cls, "_is_protocol", False)
                           for name, member in vars(cls).items() if callable(member) and not name.startswith("_"))
    return [name for name in needed if not callable(getattr(problem, name, None))]
