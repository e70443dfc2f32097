"""FedNest and its variants -- "FedNest: Federated Bilevel, Minimax, and Compositional Optimization"
(Tarzanagh et al., ICML 2022), Algorithms 1-4, as restated in ``reference/ALGORITHMS.md`` section 7.

One round here is one FedNest *epoch* (outer iteration k), made of communication sub-rounds, each counted:

* FedInn (SVRG on y, 2 rounds): q = <grad_y g_i(x, y)>; every client runs ``inner_steps`` steps
  y_i <- y_i - beta (grad_y g_i(x, y_i; z) - grad_y g_i(x, y; z) + q) on one batch z per step; y = <y_i>.
  FedNest_SGD and LFedNest use plain local SGD on y instead (1 round).
* FedIHGP (1 + N' rounds): p_0 = (N / l) <grad_y f_i(x, y)>, then N' ~ U{0..N-1} rounds of
  p_n = <(I - H_i / l) p_{n-1}> with H_i = grad^2_yy g_i -- an unbiased truncated Neumann estimate of
  [grad^2_yy g]^{-1} grad_y f (``ihgp: paper``). ``deterministic``: p = (1/l) sum_{n=0..N} (I - H/l)^n
  grad_y f in 1 + N rounds. ``code``: the authors' code -- fixed N rounds, no N/l factor, each client
  multiplying its own counter by (I - H_i / l), the server adding (1/n) <counter> -- **[derived from the
  code reading in ALGORITHMS.md 7.5; reconstruction]**, with the indirect term scaled by 1/l as in the
  hyper-representation code.
* FedOut (2 rounds): h = <grad_x f_i(x, y) - grad^2_xy g_i(x, y) p>; every client runs ``local_steps``
  (tau) steps x_i <- x_i - alpha (grad_x f_i(x_i, y; z) - grad_x f_i(x, y; z) + h); x = <x_i>.
  For minimax problems (g = -f) the indirect term vanishes and FedIHGP is skipped.

Rounds per epoch: FedNest 2T + N' + 3 (2T + N + 3 with a fixed N), FedNest_SGD T + N' + 3, LFedNest T + 1
(local hypergradients with each client's own Hessian, tau local outer steps, then x averaged),
LFedNest_SVRG 2T + 2 **[inferred]**. FedAvg-S: tau simultaneous local SGDA steps, then x and y averaged.
Anchors, grad_y f, Hessian products and hypergradients use each client's full local data unless
``oracle_batch`` is set (the code's choice; pitfall N4); clients are resampled for every FedInn call,
for S_0 and each Neumann round of FedIHGP, and for FedOut.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext, Federation, StepInfo, batch_size
from fedcomp.platform.algorithms.legacy import DictAlgorithm, RoundContext, State
from fedcomp.platform.rounds import RoundRecord
from fedcomp.platform.params import Params
from fedcomp.platform.oracles import grad_xy, grad_y, hvp_yy, jvp_xy
from fedcomp.platform.problems import BILEVEL, MINIMAX, BilevelProblem, MinimaxProblem
from fedcomp.platform.registry import register_algorithm


class FedNestHParams(Params):
    """alpha (``lr``), beta (``inner_lr``), tau (``local_steps``), T (``inner_rounds``), N, 1/l and batches."""

    lr: float = Field(0.01, gt=0, description="outer step size alpha")
    inner_lr: float = Field(0.01, gt=0, description="inner step size beta")
    local_steps: int = Field(1, ge=1, description="local outer steps tau in FedOut")
    inner_rounds: int = Field(1, ge=1, description="FedInn calls per epoch (T)")
    inner_steps: int = Field(5, ge=1, description="local steps per FedInn call")
    neumann_terms: int = Field(5, ge=1, description="Neumann terms N")
    neumann_lr: float = Field(0.01, gt=0, description="Neumann step 1/l (l bounds the Hessian of g in y)")
    ihgp: Literal["paper", "deterministic", "code"] = Field("paper", description="FedIHGP variant")
    inner_batch: int | None = Field(64, ge=1, description="batch of local inner steps; null = all local data")
    outer_batch: int | None = Field(None, ge=1, description="batch of local outer steps; null = all local data")
    oracle_batch: int | None = Field(None, ge=1, description="batch of anchors, HVPs, hypergradients; null = all")



class _Nested(DictAlgorithm):
    """Shared client programs and sub-round helpers of the FedNest family."""

    kind = BILEVEL
    HParams = FedNestHParams
    synced = ("x", "y")
    inner: ClassVar[Literal["svrg", "sgd"]]
    outer: ClassVar[Literal["svrg", "local", "local-svrg"]]

    def init_state(self, params: State) -> State:
        return {"x": params["x"].clone(), "y": params["y"].clone()}

    def local_step(self, problem: Any, client: int, state: State, step: int, gen: torch.Generator) -> tuple[State, StepInfo]:
        raise NotImplementedError("the FedNest family runs its own round programs")

    # -- helpers -------------------------------------------------------------------------------------------
    def _oracle_batch(self, problem: BilevelProblem, ctx: ClientContext, split: str, tag: int) -> Any:
        return problem.sample(ctx.client, split, self.hp.oracle_batch, ctx.rng(ctx.round, ctx.sub, tag))

    def _neumann_local(self, problem: BilevelProblem, x: Tensor, y: Tensor, batch: Any, v: Tensor) -> Tensor:
        """(1/l) sum_{n=0..N} (I - H_i/l)^n v with the client's own Hessian (LFedNest's local FedIHGP)."""
        eta, term, total = self.hp.neumann_lr, v, v.clone()
        for _ in range(self.hp.neumann_terms):
            term = term - eta * hvp_yy(lambda a, b: problem.inner_loss(a, b, batch), x, y, term)
            total = total + term
        return eta * total

    def _hypergradient(self, problem: BilevelProblem, x: Tensor, y: Tensor, p: Tensor | None, ctx: ClientContext) -> tuple[Tensor, float, int]:
        outer = self._oracle_batch(problem, ctx, "outer", 0)
        gx, _ = grad_xy(lambda a, b: problem.outer_loss(a, b, outer), x, y)
        loss = float(problem.outer_loss(x, y, outer))
        samples = batch_size(outer)
        if p is not None and not problem.minimax:
            inner = self._oracle_batch(problem, ctx, "inner", 1)
            gx = gx - jvp_xy(lambda a, b: problem.inner_loss(a, b, inner), x, y, p)
            samples += batch_size(inner)
        return gx, loss, samples

    # -- client programs (run by the federation, named in the round program) ---------------------------------
    def inner_anchor(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """q_i = grad_y g_i(x, y) on the client's inner data."""
        batch = self._oracle_batch(problem, ctx, "inner", 0)
        q = grad_y(lambda a, b: problem.inner_loss(a, b, batch), state["x"], state["y"])
        return state, {"q": q}, StepInfo(batch_size(batch), float(problem.inner_loss(state["x"], state["y"], batch)))

    def inner_local(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """``inner_steps`` local steps on y: SVRG-corrected with the anchor q when q is sent, else plain SGD."""
        x, y0 = state["x"], state["y"]
        y, q, samples, loss = y0.clone(), state.get("q"), 0, 0.0
        for s in range(self.hp.inner_steps):
            batch = problem.sample(ctx.client, "inner", self.hp.inner_batch, ctx.rng(ctx.round, ctx.sub, s))
            g_inner = lambda a, b: problem.inner_loss(a, b, batch)  # noqa: E731
            direction = grad_y(g_inner, x, y)
            if q is not None:  # SVRG: the same batch at the round's y, plus the global anchor
                direction = direction - grad_y(g_inner, x, y0) + q
            samples += batch_size(batch) * (2 if q is not None else 1)
            loss += float(problem.inner_loss(x, y, batch)) / self.hp.inner_steps
            y = y - self.hp.inner_lr * direction
        return state, {"y": y}, StepInfo(samples, loss)

    def ihgp_start(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """grad_y f_i(x, y) on the client's outer data (the server scales it)."""
        batch = self._oracle_batch(problem, ctx, "outer", 0)
        v = grad_y(lambda a, b: problem.outer_loss(a, b, batch), state["x"], state["y"])
        return state, {"p": v}, StepInfo(batch_size(batch), float(problem.outer_loss(state["x"], state["y"], batch)))

    def ihgp_step(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """p_i = (I - H_i / l) p with H_i the client's Hessian of g in y."""
        batch = self._oracle_batch(problem, ctx, "inner", 0)
        p = state["p"]
        p = p - self.hp.neumann_lr * hvp_yy(lambda a, b: problem.inner_loss(a, b, batch), state["x"], state["y"], p)
        return state, {"p": p}, StepInfo(batch_size(batch))

    def ihgp_code_step(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """The code's variant: the client's own counter c_i <- (I - H_i / l) c_i, started at p_0 in this epoch."""
        batch = self._oracle_batch(problem, ctx, "inner", 0)
        fresh = "ihgp_round" not in state or int(state["ihgp_round"]) != ctx.round
        c = state["p"] if fresh else state["ihgp_c"]
        c = c - self.hp.neumann_lr * hvp_yy(lambda a, b: problem.inner_loss(a, b, batch), state["x"], state["y"], c)
        state = {**state, "ihgp_c": c, "ihgp_round": torch.tensor(float(ctx.round))}
        return state, {"c": c}, StepInfo(batch_size(batch))

    def hypergrad(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """h_i = grad_x f_i(x, y) - grad^2_xy g_i(x, y) p (just grad_x f_i for minimax problems)."""
        h, loss, samples = self._hypergradient(problem, state["x"], state["y"], state.get("p"), ctx)
        return state, {"h": h}, StepInfo(samples, loss)

    def local_hypergrad(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """h_i with the client's own Neumann series (LFedNest_SVRG's averaged local hypergradients)."""
        x, y = state["x"], state["y"]
        p = None
        if not problem.minimax:
            outer, inner = self._oracle_batch(problem, ctx, "outer", 2), self._oracle_batch(problem, ctx, "inner", 3)
            v = grad_y(lambda a, b: problem.outer_loss(a, b, outer), x, y)
            p = self._neumann_local(problem, x, y, inner, v)
        h, loss, samples = self._hypergradient(problem, x, y, p, ctx)
        return state, {"h": h}, StepInfo(samples, loss)

    def outer_svrg(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """tau steps x_i <- x_i - alpha (grad_x f_i(x_i, y; z) - grad_x f_i(x, y; z) + h)."""
        x0, y, h = state["x"], state["y"], state["h"]
        x, samples = x0.clone(), 0
        for s in range(self.hp.local_steps):
            batch = problem.sample(ctx.client, "outer", self.hp.outer_batch, ctx.rng(ctx.round, ctx.sub, s))
            f = lambda a, b: problem.outer_loss(a, b, batch)  # noqa: E731
            x = x - self.hp.lr * (grad_xy(f, x, y)[0] - grad_xy(f, x0, y)[0] + h)
            samples += 2 * batch_size(batch)
        return state, {"x": x}, StepInfo(samples)

    def local_outer(self, problem: BilevelProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """LFedNest: tau local steps x_i <- x_i - alpha h_i(x_i) with purely local hypergradients."""
        x, y, samples, loss = state["x"].clone(), state["y"], 0, 0.0
        for s in range(self.hp.local_steps):
            local = ClientContext(ctx.client, ctx.round, ctx.sub * 1000 + s, ctx.rng)
            _, out, info = self.local_hypergrad(problem, {"x": x, "y": y}, local)
            x = x - self.hp.lr * out["h"]
            samples, loss = samples + info.samples, info.loss
        return state, {"x": x}, StepInfo(samples, loss)

    # -- server: one epoch ---------------------------------------------------------------------------------
    def round(self, federation: Federation, state: State, ctx: RoundContext) -> tuple[State, RoundRecord]:
        epoch = _Epoch(federation, ctx)
        x, y = state["x"], state["y"]
        for _ in range(self.hp.inner_rounds):  # FedInn, T times, each on a fresh cohort
            cohort = epoch.next_cohort()
            if self.inner == "svrg":
                q = epoch.call("inner_anchor", cohort, {"x": x, "y": y})["q"]
                y = epoch.call("inner_local", cohort, {"x": x, "y": y, "q": q})["y"]
            else:
                y = epoch.call("inner_local", cohort, {"x": x, "y": y})["y"]
        if self.outer == "local":
            x = epoch.call("local_outer", epoch.next_cohort(), {"x": x, "y": y})["x"]
        else:
            if self.outer == "local-svrg":
                cohort = epoch.next_cohort()
                h = epoch.call("local_hypergrad", cohort, {"x": x, "y": y})["h"]
            else:
                p = None if ctx.problem.minimax else self._fedihgp(epoch, ctx, x, y)
                cohort = epoch.next_cohort()
                h = epoch.call("hypergrad", cohort, {"x": x, "y": y, **({"p": p} if p is not None else {})})["h"]
                epoch.train_loss = epoch.last_loss
            x = epoch.call("outer_svrg", cohort, {"x": x, "y": y, "h": h})["x"]
        steps = self.hp.inner_rounds * self.hp.inner_steps + self.hp.local_steps
        return {"x": x, "y": y}, epoch.record(steps)

    def _fedihgp(self, epoch: "_Epoch", ctx: RoundContext, x: Tensor, y: Tensor) -> Tensor:
        hp = self.hp
        v = epoch.call("ihgp_start", epoch.next_cohort(), {"x": x, "y": y})["p"]
        if hp.ihgp == "paper":
            n_prime = int(torch.randint(hp.neumann_terms, (1,), generator=ctx.rng("neumann")))
            p = hp.neumann_terms * hp.neumann_lr * v
            for _ in range(n_prime):
                p = epoch.call("ihgp_step", epoch.next_cohort(), {"x": x, "y": y, "p": p})["p"]
            return p
        if hp.ihgp == "deterministic":
            term, total = v, v.clone()
            for _ in range(hp.neumann_terms):
                term = epoch.call("ihgp_step", epoch.next_cohort(), {"x": x, "y": y, "p": term})["p"]
                total = total + term
            return hp.neumann_lr * total
        total = v.clone()  # "code": p_0 + sum_n (1/n) <c_i>, c_i the clients' own powers applied to p_0
        for n in range(1, hp.neumann_terms + 1):
            total = total + epoch.call("ihgp_code_step", epoch.next_cohort(), {"x": x, "y": y, "p": v})["c"] / n
        return hp.neumann_lr * total


class _Epoch:
    """Bookkeeping of one epoch's sub-rounds: call numbering, fresh cohorts and counters."""

    def __init__(self, federation: Federation, ctx: RoundContext) -> None:
        self.federation, self.ctx = federation, ctx
        self.calls = self.cohorts = self.samples = self.floats_up = self.floats_down = 0
        self.last_loss = self.train_loss = float("nan")

    def next_cohort(self) -> list[int]:
        cohort = self.ctx.cohort(self.cohorts)
        self.cohorts += 1
        return cohort

    def call(self, program: str, cohort: list[int], payload: State) -> State:
        out = self.federation.call(program, self.ctx.round, cohort, payload, self.calls)
        self.calls += 1
        self.samples += out.samples
        self.floats_up += out.floats_up
        self.floats_down += out.floats_down
        self.last_loss = out.loss
        return out.means

    def record(self, local_steps: int) -> RoundRecord:
        loss = self.train_loss if self.train_loss == self.train_loss else self.last_loss
        return RoundRecord(self.calls, local_steps, self.samples, self.floats_up, self.floats_down, loss)


@register_algorithm("fednest")
class FedNest(_Nested):
    """FedNest: T x FedInn (SVRG), FedIHGP, FedOut (SVRG); 2T + N + 3 rounds per epoch."""

    inner, outer = "svrg", "svrg"
    description = "FedNest: federated bilevel/minimax with SVRG FedInn, FedIHGP, FedOut (Tarzanagh et al. 2022)"


@register_algorithm("fednest-sgd")
class FedNestSGD(_Nested):
    """FedNest with FedInn by local SGD (1 round per call); T + N + 3 rounds per epoch."""

    inner, outer = "sgd", "svrg"
    description = "FedNest_SGD: FedNest with local SGD in FedInn (ablation)"


@register_algorithm("lfednest")
class LFedNest(_Nested):
    """Light FedNest: local SGD on y, then local hypergradient steps on x; T + 1 rounds per epoch."""

    inner, outer = "sgd", "local"
    description = "LFedNest: local FedInn and local hypergradients, T+1 rounds (reconstructed from the code)"


@register_algorithm("lfednest-svrg")
class LFedNestSVRG(_Nested):
    """LFedNest with SVRG FedInn, averaged local hypergradients and SVRG outer steps; 2T + 2 rounds."""

    inner, outer = "svrg", "local-svrg"
    description = "LFedNest_SVRG: SVRG FedInn, averaged local hypergradients (code only; inferred)"


class FedAvgSHParams(Params):
    lr: float = Field(0.01, gt=0, description="descent step on x")
    inner_lr: float = Field(0.01, gt=0, description="ascent step on y")
    local_steps: int = Field(1, ge=1, description="simultaneous local steps per round")
    outer_batch: int | None = Field(None, ge=1, description="batch per step; null = all local data")


@register_algorithm("fedavg-s")
class FedAvgS(DictAlgorithm):
    """FedAvg-S (Hou et al. 2021): local simultaneous SGDA x <- x - alpha grad_x f, y <- y + beta grad_y f;
    x and y averaged every ``local_steps`` steps."""

    kind = MINIMAX
    HParams = FedAvgSHParams
    synced = ("x", "y")
    description = "FedAvg-S: local simultaneous gradient descent-ascent, x and y averaged (minimax)"

    def init_state(self, params: State) -> State:
        return {"x": params["x"].clone(), "y": params["y"].clone()}

    def local_step(
        self, problem: MinimaxProblem, client: int, state: State, step: int, gen: torch.Generator
    ) -> tuple[State, StepInfo]:
        batch = problem.sample(client, "outer", self.hp.outer_batch, gen)
        gx, gy = grad_xy(lambda a, b: problem.loss(a, b, batch), state["x"], state["y"])
        new = {"x": state["x"] - self.hp.lr * gx, "y": state["y"] + self.hp.inner_lr * gy}
        return new, StepInfo(batch_size(batch), float(problem.loss(state["x"], state["y"], batch)))


__all__ = ["FedAvgS", "FedNest", "FedNestSGD", "LFedNest", "LFedNestSVRG"]
