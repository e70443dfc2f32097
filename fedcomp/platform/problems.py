"""Problem kinds: what a task offers an algorithm, as protocols of oracles over explicit parameters.

Parameters are always a flat float32 tensor ``x`` passed in explicitly, so an algorithm can evaluate the
same mini-batch at two points (Acc-FCSG-M, SVRG, SCAFFOLD, FedDRO) and differentiate through the oracles
(Hessian-vector products for FedNest and MAML). A task implements one or more kinds; an algorithm declares
the one kind it needs. Later kinds (compositional, compositional-minimax, bilevel, minimax) are further
protocols in this module with their own oracles; the federation and runner do not change.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

PLAIN = "plain"
CONDITIONAL = "conditional"

KIND_DESCRIPTIONS = {
    PLAIN: "(1/K) sum_k E l_k(x): stochastic gradients of a single-level loss",
    CONDITIONAL: "(1/K) sum_k E_xi f_xi(E_{eta|xi} g_eta(x, xi)): outer sample, then inner samples given it",
}


@runtime_checkable
class PlainProblem(Protocol):
    """min_x (1/K) sum_k E_z l(x; z) with client ``k`` drawing ``z`` from its own distribution."""

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
