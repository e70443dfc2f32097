"""A small deterministic heterogeneous compositional problem for the FedDRO paper's negative result
(its Theorem 4.1 and 4.2): vanilla FedAvg (cases I and II) stalls away from a stationary point for I > 1,
while sharing the inner value every step (FedDRO, modified FedAvg) does not.

    Phi(x) = f( (1/K) sum_k g_k(x) ),  g_k(x) = A_k x + c_k in R^{d_g},  f(z) = sqrt(1 + ||z||^2) - 1

with A_k = A + ``heterogeneity`` * N(0, 1) entries and c_k ~ N(0, I) per client, d > d_g. f is smooth,
Lipschitz and non-quadratic; with the mean map A_bar of full row rank the stationary points are exactly
where g_bar(x) = 0 (so Phi* = 0). A client that trusts its own g_k instead of the average minimises
f(g_k(x)), whose stationary points differ -- the bias of vanilla FedAvg. Oracles are exact ("batches" are
empty), and ``grad_norm_sq`` = ||grad Phi(x_bar)||^2 = ||A_bar^T grad f(g_bar(x_bar))||^2 is exact.
**[derived]** (the paper does not print its counterexample; this one has the properties it needs).

**Theorem 5.1's drift term** (``plain_weight`` mu > 0): a heterogeneous plain part is added,

    h_k(x) = (mu / 2) sum_j d_kj (x_j - b_kj)^2,   d_kj ~ U(0.25, 1.75),  b_k ~ N(0, I),

whose curvatures differ between clients, so I local gradient steps on h_k followed by averaging do not
preserve the minimiser of h = (1/K) sum_k h_k (FedAvg's client drift; with equal curvatures a quadratic would
not drift). Sharing y every step removes the compositional bias but not this one: FedDRO with I > 1 then
stalls at a distance that shrinks with the step size, while I = 1 (x averaged every step) is gradient
descent on Phi and converges -- the heterogeneity term of Theorem 5.1, which the h = 0 problem cannot show.
``grad_norm_sq`` and ``objective`` then include h. mu = 0 (the default) is the Theorem 4.1 problem unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fedcomp.platform.registry import register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.tasks.builtins import HETEROGENEOUS_COMPOSITION, HeterogeneousCompositionParams


@dataclass(frozen=True)
class ClientFunctions:
    """Client k's g_k and h_k, as their tensors: a "batch" of one example (not a tuple, which would count its rows)
    that holds no Python number, so that a compiled oracle (``federation.torch_compile``) has one graph for every
    client rather than one each (dynamo takes a Python number as a constant)."""

    A: Tensor
    c: Tensor
    curvature: Tensor
    centre: Tensor


@register_task(HETEROGENEOUS_COMPOSITION)
class HeterogeneousComposition(Task):
    params: HeterogeneousCompositionParams

    def __init__(self, params: HeterogeneousCompositionParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(params.data_seed, "heterogeneous-composition", clients)
        d, dg = params.dim, params.inner_dim
        base = torch.randn(dg, d, generator=gen) / d**0.5
        self.A = base + params.heterogeneity * torch.randn(clients, dg, d, generator=gen) / d**0.5
        self.c = torch.randn(clients, dg, generator=gen)
        self.inner_dim = dg
        plain = generator(params.data_seed, "heterogeneous-composition-plain", clients)  # A, c unchanged by mu
        self.curvature = params.plain_weight * (0.25 + 1.5 * torch.rand(clients, d, generator=plain))
        self.centre = torch.randn(clients, d, generator=plain)

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": torch.zeros(self.params.dim)}

    def sample(self, client: int, size: int | None, gen: torch.Generator) -> ClientFunctions:
        """Exact oracles: the "batch" is the client's functions."""
        return ClientFunctions(self.A[client], self.c[client], self.curvature[client], self.centre[client])

    def inner(self, x: Tensor, batch: ClientFunctions) -> Tensor:
        value: Tensor = batch.A @ x + batch.c
        return value

    def outer(self, z: Tensor) -> Tensor:
        return torch.sqrt(1 + z @ z) - 1

    def plain(self, x: Tensor, batch: ClientFunctions) -> Tensor:
        if self.params.plain_weight == 0:
            return x.new_zeros(())
        return 0.5 * (batch.curvature * (x - batch.centre) ** 2).sum()

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        a_bar, c_bar = self.A.mean(0).double(), self.c.mean(0).double()
        curvature, centre = self.curvature.double(), self.centre.double()
        drift = self.params.plain_weight > 0

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            x = state["x"].detach().cpu().double()
            z = a_bar @ x + c_bar
            grad = a_bar.T @ (z / torch.sqrt(1 + z @ z))
            objective = torch.sqrt(1 + z @ z) - 1
            if drift:  # + grad h(x) = mean_k d_k (x - b_k), + h(x)
                grad = grad + (curvature * (x - centre)).mean(0)
                objective = objective + 0.5 * (curvature * (x - centre) ** 2).sum(1).mean()
            return {"grad_norm_sq": float(grad @ grad), "objective": float(objective)}

        return evaluate


