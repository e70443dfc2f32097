"""GCIVR as one of the FedDRO paper's parallel baselines (``reference/ALGORITHMS.md`` section 8.4); the
parallel setting is described in :mod:`~fedcomp.platform.algorithms.dro_baselines`.

**GCIVR** (``gcivr``; Haddadpour, Kamani, Mahdavi, Karbasi, ICLR 2022; read from ``mlscientist/GCIVR``). The
server keeps G ~ g(x_t) and J ~ the Jacobian of g at x_t (d_g x d), updated by the SARAH/SPIDER recursion on one
batch b_k per client shared by both points:

    G_t = G_{t-1} + <g_k(x_t; b_k) - g_k(x_{t-1}; b_k)>
    J_t = J_{t-1} + <dg_k(x_t; b_k) - dg_k(x_{t-1}; b_k)>
    every ``refresh_every`` steps instead: G_t = <g_k(x_t; B_k)>, J_t = <dg_k(x_t; B_k)>  (B_k: ``refresh_batch``)
    d_t = <grad h_k(x_t; b_k)> + J_t^T grad f(G_t)
    x_{t+1} = x_t - eta d_t                      (or an Adagrad step: ``optimizer: adagrad``)

One model round per step **[inferred]** (ALGORITHMS.md 8.4: how GCIVR was distributed over FedDRO's clients is
unknown): each client uploads the d_g value difference, the d_g x d Jacobian difference and its plain gradient
in one message and downloads x_t. Why the Jacobian and not the direction: for d_g = 1, J is the code's grad G
and d_t = grad main + grad G / G is exactly its update (f = log); for any d_g it is what GCIVR/CIVR track, it
keeps the recursion a martingale in the map g alone, and it needs one exchange per step -- a recursion on the
direction grad g(x)^T grad f(G) itself would need G_t before the clients could form it (a second exchange per
step) and would no longer reduce to the code for d_g = 1. The cost is d_g model-sized vectors per client per step
(one for the DRO tasks). The plain part h is not variance-reduced: the code computes its gradient directly
(on the full batch), so each step uses <grad h_k(x_t; b_k)>; at a refresh step all three come from B_k.

Code vs paper (policy in ALGORITHMS.md 0.3): the released loop never refreshes (``refresh_every: null``, the
default -- the published Adult curves came from it, with full batches, where the recursion is exact); the
paper's periodic refresh is ``refresh_every: q``. The code starts from G ~ U(0, 1) and grad G = 0, which leaves
permanent offsets g(x_0) - G_0 and -grad g(x_0) in a loop that never refreshes; the default ``init: estimate``
starts from fresh estimates at x_0 instead, ``init: code`` reproduces the code (x_prev = x_0, so its first step
uses grad h alone). The code steps with Adagrad (lr 0.01); the default here is plain SGD with FedDRO's lr
schedule, so that learning-rate grids mean the same thing across the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedcomp.platform.algorithms import builtins
from fedcomp.platform.algorithms.base import ClientContext, StepInfo, Tensors, batch_size
from fedcomp.platform.algorithms.builtins import GCIVRHParams
from fedcomp.platform.algorithms.feddro import Compositional
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.oracles import inner_and_jacobian, outer_grad, plain_grad
from fedcomp.platform.problems import GlobalCompositionalProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import Model


@dataclass(frozen=True)
class Estimates(Model):
    """GCIVR's server: x_t and the SARAH estimates of g(x_t) and of its Jacobian, with Adagrad's accumulator."""

    G: Tensor
    """G ~ g(x_t) (d_g floats)."""
    J: Tensor
    """J ~ the Jacobian of g at x_t (d_g x d, flat)."""
    accum: Tensor
    """Adagrad's sum of squared directions (zero and unused with ``optimizer: sgd``)."""


@dataclass(frozen=True)
class SeenModel(Model):
    """GCIVR's client: the broadcast x_t and the model it received the step before (for the differences)."""

    x_seen: Tensor
    seen_at: Tensor
    """The step x_seen was received at ([1] float; -1: none yet, so x_{-1} = x_0)."""


@register_algorithm(builtins.GCIVR)
class GCIVR(Compositional):
    """GCIVR as a synchronous parallel method: SARAH recursion on g and its Jacobian, one model round per step."""

    Client, Server = SeenModel, Estimates
    hp: GCIVRHParams

    def join(self, broadcast: Tensors) -> SeenModel:
        x = broadcast["x"]
        return SeenModel(x=x.clone(), x_seen=x.clone(), seen_at=torch.tensor([-1.0]))

    # -- client programs -------------------------------------------------------------------------------------
    def fresh_estimates(self, problem: GlobalCompositionalProblem, client: SeenModel, ctx: ClientContext) -> tuple[SeenModel, Tensors, StepInfo]:
        """g_k, its Jacobian and grad h_k at the broadcast x on the refresh batch B_k."""
        batch = problem.sample(ctx.client, self.hp.refresh_batch, ctx.rng(ctx.round, "refresh"))
        g, jac = inner_and_jacobian(problem, client.x, batch)
        grad_h, h = plain_grad(problem, client.x, batch)
        outputs = {"g": g, "jac": jac.reshape(-1), "grad_h": grad_h}
        return self.seen(client, ctx), outputs, StepInfo(batch_size(batch), float(h))

    def differences(self, problem: GlobalCompositionalProblem, client: SeenModel, ctx: ClientContext) -> tuple[SeenModel, Tensors, StepInfo]:
        """g_k and its Jacobian at the broadcast x_t minus at x_{t-1} on one batch, and grad h_k(x_t)."""
        batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round))
        g, jac = inner_and_jacobian(problem, client.x, batch)
        grad_h, h = plain_grad(problem, client.x, batch)
        n, seen_at = batch_size(batch), int(client.seen_at)
        if seen_at != ctx.round - 1:
            raise ConfigError(self._stale(ctx))
        if seen_at < 0:  # x_{-1} = x_0 (init 'code'): the differences vanish
            dg, djac, samples = torch.zeros_like(g), torch.zeros_like(jac), n
        else:
            g_prev, jac_prev = inner_and_jacobian(problem, client.x_seen, batch)
            dg, djac, samples = g - g_prev, jac - jac_prev, 2 * n
        outputs = {"dg": dg, "djac": djac.reshape(-1), "grad_h": grad_h}
        return self.seen(client, ctx), outputs, StepInfo(samples, float(h))

    @staticmethod
    def seen(client: SeenModel, ctx: ClientContext) -> SeenModel:
        """Keep the model just received, for the next step's differences, and its step index."""
        return client.replace(x_seen=client.x, seen_at=torch.tensor([float(ctx.round)]))

    @staticmethod
    def _stale(ctx: ClientContext) -> str:
        return (
            f"gcivr: client {ctx.client} did not take part in step {ctx.round - 1}, so it cannot form the "
            f"difference at step {ctx.round}; gcivr needs every client every step (federation.clients_per_round: null)"
        )

    # -- server ------------------------------------------------------------------------------------------------
    def start(self, fed: Round, server: Model) -> Estimates:
        """G_0 ~ U(0, 1), J_0 = 0 as in the code (with init 'estimate' step 0 replaces them by fresh estimates)."""
        dg = int(fed.problem.inner_dim)
        G = torch.rand(dg, generator=fed.rng("gcivr-init"))
        return Estimates(x=server.x, G=G, J=torch.zeros(dg * server.x.numel()), accum=torch.zeros_like(server.x))

    def refreshes(self, t: int) -> bool:
        """Fresh estimates at step t: step 0 with init 'estimate', then every ``refresh_every`` steps."""
        if t == 0:
            return self.hp.init == "estimate"
        return self.hp.refresh_every is not None and t % self.hp.refresh_every == 0

    def round(self, fed: Round, server: Estimates) -> Estimates:
        t, x = fed.number, server.x
        if self.refreshes(t):
            est = fed.call("fresh_estimates", fed.cohort(), Model(x=x))
            G, J = est.g, est.jac
        else:
            est = fed.call("differences", fed.cohort(), Model(x=x))
            G, J = server.G + est.dg, server.J + est.djac
        fed.count(local_steps=1)
        direction = est.grad_h + J.view(G.numel(), x.numel()).T @ outer_grad(fed.problem, G)[0]
        lr, accum = self.hp.lr_at(t), server.accum
        if self.hp.optimizer == "adagrad":  # torch.optim.Adagrad with lr_decay = 0, initial accumulator 0
            accum = accum + direction**2
            x = x - lr * direction / (accum.sqrt() + self.hp.adagrad_eps)
        else:
            x = x - lr * direction
        with torch.no_grad():
            fed.train_loss = fed.train_loss + float(fed.problem.outer(G))
        return Estimates(x=x, G=G, J=J, accum=accum)
