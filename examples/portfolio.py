"""A user's compositional task in one file: what ``fedcomp run examples/portfolio.yaml`` runs.

Task ``portfolio``: risk-averse (mean-variance) portfolio selection, the classic problem of the stochastic
compositional gradient literature (Wang, Fang and Liu's SCGD). Client k holds ``rows`` past returns r in R^d of
``assets`` assets, drawn from its own distribution (its own expected returns and volatilities); with holdings x
it maximises its portfolio's mean return less ``risk_aversion`` (lambda) times its variance. As a minimisation,

    min_x (1/K) sum_k f(g_k(x)),   g_k(x) = E_k[(r.x, (r.x)^2)] in R^2,   f(u) = -u_1 + lambda (u_2 - u_1^2),

so f(g_k(x)) = -E_k[r.x] + lambda Var_k(r.x). The inner value g_k(x) has 2 entries whatever d is, and f is not
linear in it: f of a mini-batch mean of g is a biased estimate of f(g_k(x)), which is why Local-SCGD keeps a
moving average u of g.

The optimum, in closed form. With m_k = E_k r and S_k = E_k r r^T (the client's empirical moments),

    (1/K) sum_k f(g_k(x)) = -mbar.x + lambda x^T C x,   mbar = (1/K) sum_k m_k,   C = (1/K) sum_k (S_k - m_k m_k^T),

a convex quadratic (C, the mean of the clients' covariances, is positive definite when each client has more rows
than assets): its gradient -mbar + 2 lambda C x vanishes at x* = C^{-1} mbar / (2 lambda), where the objective is
-mbar.x* / 2. C is the pooled second moment less the mean of the m_k m_k^T -- not the pooled covariance, whose
extra between-client spread of the means no client's variance sees. The task reports the gap to that optimum.

The task offers two problem kinds on the same data: ``compositional`` (Local-SCGD, Local-SCGDM: inner and outer
draws) and ``conditional`` (FCSG, FCSG-M, Acc-FCSG-M: each outer draw -- on which f does not depend -- with its
``inner_batch`` returns, whose mean estimates g).

Importing this file registers the task (``@register_task``); a config names the file (``task.module``), so that
every process of a run imports it (see ``examples/extension.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pydantic import Field, model_validator
from torch import Tensor

from fedcomp.extension import Params, Task, generator, kinds, register_task


class PortfolioParams(Params):
    assets: int = Field(5, ge=1, description="assets d (the size of x)")
    rows: int = Field(500, ge=2, description="past returns each client holds")
    risk_aversion: float = Field(1.0, gt=0, description="lambda, the weight of the variance")
    mean_return: float = Field(0.5, description="the assets' typical expected return per period")
    volatility: float = Field(1.0, gt=0, description="the assets' typical standard deviation per period")
    correlation: float = Field(0.3, ge=0, lt=1, description="the assets' correlation through one market factor")
    heterogeneity: float = Field(0.5, ge=0, description="spread of the clients' expected returns and volatilities")
    data_seed: int = Field(0, ge=0, description="seed of the clients' returns (run.seed seeds the run)")

    @model_validator(mode="after")
    def _more_rows_than_assets(self) -> PortfolioParams:
        if self.rows <= self.assets:  # else a client's covariance is singular, and C may be: no unique optimum
            raise ValueError(f"rows = {self.rows}: must exceed assets ({self.assets}) for a unique optimum")
        return self


@register_task("portfolio")
class Portfolio(Task):
    """min_x (1/K) sum_k -E_k[r.x] + lambda Var_k(r.x), as f(g_k(x)) with g_k(x) = E_k[(r.x, (r.x)^2)]."""

    Params = PortfolioParams
    kinds = frozenset({kinds.COMPOSITIONAL, kinds.CONDITIONAL})
    metrics = ("objective_gap", "objective", "distance_to_optimum")
    mode = "min"
    description = "mean-variance portfolio over heterogeneous clients, closed-form optimum (examples/portfolio.py)"

    def __init__(self, params: PortfolioParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        p = params
        gen = generator(p.data_seed, "portfolio", clients)
        d, n, spread = p.assets, p.rows, p.heterogeneity
        means = p.mean_return * (1 + 0.5 * torch.randn(d, generator=gen))  # the assets' expected returns
        means = means + spread * abs(p.mean_return) * torch.randn(clients, d, generator=gen)  # each client's own
        vols = p.volatility * torch.exp(0.5 * spread * torch.randn(clients, d, generator=gen))
        market = torch.randn(clients, n, 1, generator=gen)  # one factor moves every asset of a period
        own = torch.randn(clients, n, d, generator=gen)
        shocks = math.sqrt(p.correlation) * market + math.sqrt(1 - p.correlation) * own
        (self.returns,) = self.resident(means.unsqueeze(1) + vols.unsqueeze(1) * shocks)  # [K, n, d]
        self.risk_aversion = p.risk_aversion

    # ------------------------------------------------------------------ compositional: Local-SCGD, Local-SCGDM

    def sample_inner(self, client: int, n: int, gen: torch.Generator) -> Tensor:
        """``n`` of the client's past returns (rows of r), drawn with replacement."""
        return self.gather(self.returns[client], torch.randint(self.params.rows, (n,), generator=gen))

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> None:
        """Nothing: f is deterministic."""
        return None

    def inner(self, x: Tensor, returns: Tensor) -> Tensor:
        """g(x) on the draws: (mean of r.x, mean of (r.x)^2)."""
        gains = returns @ x
        return torch.stack([gains.mean(), gains.pow(2).mean()])

    def outer(self, u: Tensor, zeta: None = None) -> Tensor:
        """f(u) = -u_1 + lambda (u_2 - u_1^2): minus the mean plus lambda times the variance."""
        return -u[0] + self.risk_aversion * (u[1] - u[0].pow(2))

    def problem(self, kind: str) -> object:
        """The task itself for ``compositional``; for ``conditional`` a view of it, as the two kinds' protocols give
        ``sample_inner`` different arguments."""
        super().problem(kind)
        return self if kind == kinds.COMPOSITIONAL else _Conditional(self)

    # ------------------------------------------------------------------ model and metrics

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": torch.zeros(self.params.assets)}  # no holdings: objective 0

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        returns = self.returns.cpu().double()
        means = returns.mean(1)  # m_k, [K, d]
        second = torch.einsum("kni,knj->ij", returns, returns) / (returns.shape[0] * returns.shape[1])  # mean S_k
        mean = means.mean(0)
        covariance = second - means.T @ means / means.shape[0]  # C: the mean of the clients' covariances
        optimum = torch.linalg.solve(covariance, mean) / (2 * self.risk_aversion)

        def objective(x: Tensor) -> float:
            return float(-mean @ x + self.risk_aversion * x @ covariance @ x)

        least = objective(optimum)

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            x = state["x"].detach().cpu().double()
            value = objective(x)
            return {"objective_gap": value - least, "objective": value,
                    "distance_to_optimum": float((x - optimum).norm())}

        return evaluate


class _Conditional:
    """The portfolio as a conditional problem: outer draws xi, on which f does not depend, each with m returns."""

    def __init__(self, task: Portfolio) -> None:
        self.task = task

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> int:
        """``n`` outer draws: only their number matters."""
        return n

    def sample_inner(self, client: int, outer: int, m: int, gen: torch.Generator) -> Tensor:
        """``m`` of the client's returns for each outer draw: [outer, m, d]."""
        rows = torch.randint(self.task.params.rows, (outer, m), generator=gen)
        return self.task.gather(self.task.returns[client], rows)

    def loss(self, x: Tensor, outer: int, returns: Tensor) -> Tensor:
        """The mean over the outer draws of f(g estimated on that draw's m returns)."""
        gains = returns @ x  # [outer, m]
        return self.task.outer(torch.stack([gains.mean(1), gains.pow(2).mean(1)])).mean()
