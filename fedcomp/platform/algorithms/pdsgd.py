"""PDSGD as one of the FedDRO paper's parallel baselines (``reference/ALGORITHMS.md`` section 8.6); the
parallel setting and the counters are described in :mod:`~fedcomp.platform.algorithms.dro_baselines`.

**Parallel PDSGD** (``parallel-pdsgd``; the paper's "primal-dual SGD approach to solve constrained problems
with many constraints", Xu 2020). **Reconstruction**: the paper gives no details and ALGORITHMS.md 8.6 marks
the formulation it was applied to **[unknown]**. Xu's method is an augmented-Lagrangian primal-dual SGD for
min f_0(x) s.t. f_j(x) <= 0 with many constraints; here it is the standard stochastic primal-dual (descent /
mirror-ascent) method on the DRO game itself, min_x max_{p in simplex} sum_i p_i l_i(x) - lam D(p, uniform)
over the m training examples (Nemirovski et al. 2009; Namkoong & Duchi 2016), which is what "primal-dual with
many constraints" amounts to for the KL / chi^2 objectives: one dual variable per training example. The dual
variable (m floats) lives on the server, in the algorithm state; see :class:`ParallelPDSGD`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedcomp.losses.dro import DualPenalty, project_simplex
from fedcomp.platform.algorithms.base import ClientContext, StepInfo, Tensors
from fedcomp.platform.algorithms.builtins import PARALLEL_PDSGD, PDSGDHParams
from fedcomp.platform.algorithms.dro_baselines import (
    CohortWeights,
    IndexedExampleProblem,
    count_step,
    slot,
)
from fedcomp.platform.algorithms.feddro import Compositional
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.oracles import weighted_example_grad
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import Model, unsent


@dataclass(frozen=True)
class Game(Model):
    """PDSGD's server: x_t and the dual weights p over all m training examples, kept as the divergence's
    ascent step needs them (:class:`KLGame`: log p; :class:`Chi2Game`: p). A checkpoint's field names which."""

    @classmethod
    def of(cls, tensors: Mapping[str, Tensor]) -> Game:
        if cls is Game:
            return (KLGame if "log_p" in tensors else Chi2Game).of(tensors)
        return super().of(tensors)


@dataclass(frozen=True)
class KLGame(Game):
    log_p: Tensor

    @classmethod
    def uniform(cls, x: Tensor, m: int) -> KLGame:
        return cls(x=x, log_p=torch.full((m,), -math.log(m)))

    def weights(self) -> Tensor:
        return self.log_p.exp()

    def penalty(self) -> float:
        """D(p, uniform) = sum_i p_i log(m p_i)."""
        return float((self.weights() * (self.log_p + math.log(self.log_p.numel()))).sum())

    def ascend(self, ghat: Tensor, tau: float, lam: float) -> KLGame:
        """Entropic mirror ascent: log p = (1 - tau) log p + (tau / lam) ghat - logsumexp(...)."""
        log_p = (1 - tau) * self.log_p + (tau / lam) * ghat
        return self.replace(log_p=log_p - torch.logsumexp(log_p, 0))


@dataclass(frozen=True)
class Chi2Game(Game):
    p: Tensor

    @classmethod
    def uniform(cls, x: Tensor, m: int) -> Chi2Game:
        return cls(x=x, p=torch.full((m,), 1.0 / m))

    def weights(self) -> Tensor:
        return self.p

    def penalty(self) -> float:
        """D(p, uniform) = (m / 2) sum_i (p_i - 1/m)^2."""
        m = self.p.numel()
        return float(((self.p - 1.0 / m) ** 2).sum() * m / 2)

    def ascend(self, ghat: Tensor, tau: float, lam: float) -> Chi2Game:
        """Projected ascent: p = Proj_simplex((1 - tau) p + (tau / m)(1 + ghat / lam))."""
        m = self.p.numel()
        return self.replace(p=project_simplex((1 - tau) * self.p + (tau / m) * (1 + ghat / lam)))


GAMES: dict[str, type[KLGame] | type[Chi2Game]] = {"kl": KLGame, "chi2": Chi2Game}


@register_algorithm(PARALLEL_PDSGD)
class ParallelPDSGD(Compositional):
    """Stochastic primal-dual SGD on the DRO game, in parallel, with the per-example weights p on the server.

    The game (**reconstruction**, see the module doc) is ``s * min_x max_{p in simplex} sum_i p_i l_i(x) -
    lam D(p)`` over all m = sum_k n_k training examples, D the KL or chi^2 divergence from uniform of the
    task's objective (its ``dual_penalty``: the same lam, and s = 1/lam for KL with ``kl_scale: paper``), so
    its value in x is exactly the task's ``robust_loss`` (for chi^2: the simplex-constrained value, which the
    task's closed form equals while all its weights are >= 0). Step t, with each client k of the cohort C
    (n of the K clients) drawing b positions uniformly with replacement from its n_k examples, and
    c_k = (K / n)(n_k / b) the weight that makes pooled sums unbiased for sums over all m examples:

        w_i   = c_k p_i                  for the b examples i of client k      (the batch's primal weights)
        ghat  = sum over the pooled batch of c_k l_i(x_t) e_i                    (unbiased for (l_1..l_m)(x_t))
        x_{t+1} = x_t - eta s sum_k sum_{i in b_k} w_i grad l_i(x_t)            (unbiased for s sum_i p_i grad l_i)
        KL:    log p_{t+1} = (1 - tau) log p_t + (tau / lam) ghat  - logsumexp(...)   (entropic mirror ascent)
        chi^2: p_{t+1} = Proj_simplex((1 - tau) p_t + (tau / m)(1 + ghat / lam))       (projected ascent)

    Both dual steps are ascent steps on sum_i p_i ghat_i - lam D(p) with step tau / lam (KL) or tau / (lam m)
    (chi^2), written with the scale-free tau = ``dual_step`` in (0, 1]: tau = 1 jumps to the best response to
    ghat alone, a small tau averages ghat over about 1/tau steps (each example is drawn about once every
    m / (K b) steps, so tau well below K b / m is needed for p to track exp(l / lam) rather than one batch).
    Primal and dual steps are simultaneous (both at (x_t, p_t)); p_0 is uniform; eta follows ``lr``'s schedule.

    Protocol per step (one model round, one low-dimensional exchange): clients receive x_t and upload their
    b positions and losses (2b floats, in their cohort slot); the server returns each client's b weights w_i
    (b floats), updates p, and the clients upload sum_i w_i grad l_i (d floats). The server keeps p: m floats
    (log p for KL) in the algorithm state and checkpoint, O(m) time per step for KL (every entry contracts)
    and O(m log m) for chi^2 (the projection sorts). Clients' messages do not grow with m; positions travel
    as float32, exact below 2^24 examples per client.
    """

    Client, Server = CohortWeights, Game
    hp: PDSGDHParams

    # -- client programs -------------------------------------------------------------------------------------
    def example_losses(self, problem: IndexedExampleProblem, client: CohortWeights, ctx: ClientContext) -> tuple[CohortWeights, Tensors, StepInfo]:
        """The batch's positions and per-example losses at x_t, in the client's slot of cohort-sized vectors."""
        b = self.hp.outer_batch
        positions = problem.sample_positions(ctx.client, b, ctx.rng(ctx.round))
        with torch.no_grad():
            losses = problem.example_losses(client.x, problem.batch_at(ctx.client, positions)).reshape(-1)
        if losses.numel() != b:
            raise ValueError(f"example_losses gave {losses.numel()} losses for a batch of {b}")
        mine, n = slot(client.cohort, ctx.client), client.cohort.numel()
        pos_slots, loss_slots = losses.new_zeros(n, b), losses.new_zeros(n, b)
        pos_slots[mine], loss_slots[mine] = positions.to(losses.dtype), losses
        outputs = {"positions": pos_slots.reshape(-1), "losses": loss_slots.reshape(-1)}
        return client, outputs, StepInfo(b, float(losses.mean()))

    def weighted_gradient(self, problem: IndexedExampleProblem, client: CohortWeights, ctx: ClientContext) -> tuple[CohortWeights, Tensors, StepInfo]:
        """sum_i w_i grad l_i(x_t) over the client's batch, with its slot of the server's weights w (constants)."""
        b = self.hp.outer_batch
        weights = client.w.view(-1, b)[slot(client.cohort, ctx.client)].detach()
        positions = problem.sample_positions(ctx.client, b, ctx.rng(ctx.round))  # the same batch: keyed by the step
        grad = weighted_example_grad(problem, client.x, problem.batch_at(ctx.client, positions), weights)
        return client, {"grad": grad}, StepInfo(b)

    # -- server ------------------------------------------------------------------------------------------------
    def game(self, problem: Any) -> DualPenalty:
        """The game this run plays: the hyperparameters' divergence and lam, or the task's ``dual_penalty``."""
        if self.hp.divergence != "task":
            assert self.hp.lam is not None  # PDSGDHParams: lam comes with 'kl' and 'chi2'
            return DualPenalty(self.hp.divergence, float(self.hp.lam))
        penalty: DualPenalty | None = getattr(problem, "dual_penalty", None)
        if penalty is None:
            raise ConfigError(
                f"algorithm.divergence = 'task' but the task ({type(problem).__name__}) names no DRO game "
                f"(dual_penalty is None or missing); allowed: a KL / chi2 objective, or algorithm.divergence "
                f"'kl' | 'chi2' with algorithm.lam"
            )
        return penalty

    @staticmethod
    def examples(problem: Any) -> Tensor:
        """n_k of every client (the task must give its examples stable positions)."""
        if not isinstance(problem, IndexedExampleProblem):
            raise ConfigError(
                f"algorithm.name = 'parallel-pdsgd' needs per-example positions and losses: the task's problem "
                f"{type(problem).__name__} lacks examples / sample_positions / batch_at / example_losses"
            )
        return torch.tensor([problem.examples(k) for k in range(problem.clients)])

    def start(self, fed: Round, server: Model) -> Game:
        """p_0 uniform over the task's m training examples, kept as the game's divergence needs it."""
        m = int(self.examples(fed.problem).sum())
        return GAMES[self.game(fed.problem).divergence].uniform(server.x, m)

    def round(self, fed: Round, server: KLGame | Chi2Game) -> Game:
        problem, game = fed.problem, self.game(fed.problem)
        sizes = self.examples(problem)
        offsets, m = torch.cumsum(sizes, 0) - sizes, int(sizes.sum())
        p = server.weights()
        if p.numel() != m:
            raise ConfigError(f"the stored dual weights have {p.numel()} entries but the task has {m} examples")
        cohort, x, b = fed.cohort(), server.x, self.hp.outer_batch
        n, ids = len(cohort), torch.tensor(cohort, dtype=torch.float32)

        out = fed.call("example_losses", cohort, CohortWeights(x=x, cohort=ids, w=unsent()), message=None)
        positions = (out.positions * n).round().long().view(n, b)  # each client filled only its slot
        losses = (out.losses * n).view(n, b)
        members = torch.tensor(cohort)
        index = offsets[members].unsqueeze(1) + positions                     # global example ids [n, b]
        c = (problem.clients / n) * sizes[members].to(losses.dtype).unsqueeze(1) / b   # c_k per row [n, 1]
        weights = c * p[index]
        grads = fed.call("weighted_gradient", cohort, CohortWeights(x=x, cohort=ids, w=weights.reshape(-1)), message=None)
        direction = grads.grad * n  # sum over clients of sum_i w_i grad l_i

        ghat = torch.zeros(m, dtype=losses.dtype).index_add_(0, index.reshape(-1), (c * losses).reshape(-1))
        fed.train_loss = game.scale * (float((weights * losses).sum()) - game.lam * server.penalty())
        count_step(fed, x.numel(), up=2 * b, down=b)
        return server.ascend(ghat, self.hp.dual_step, game.lam).replace(x=x - self.hp.lr_at(fed.number) * game.scale * direction)
