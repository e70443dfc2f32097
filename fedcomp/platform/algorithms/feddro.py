"""FedDRO and vanilla FedAvg for compositional problems -- "FedDRO: Federated Compositional Optimization for
Distributionally Robust Learning", Algorithms 1 and 2, as restated in ``reference/ALGORITHMS.md`` section 8.

Problem: min_x h(x) + f((1/K) sum_k g_k(x)) with a low-dimensional inner value g_k(x) in R^{d_g}.

**FedDRO** (Algorithm 2). Every local step t, every client k, on one batch b (the same samples for both
evaluations of g_k):

    y_k = (1 - beta) (y_bar - g_k(x_k_prev; b)) + g_k(x_k; b)       # hybrid estimator on function values
    y_bar = <y_k>                                                  # exchanged EVERY step (d_g floats)
    x_k_prev = x_k;  x_k = x_k - eta (grad h_k(x_k; b) + grad g_k(x_k; b)^T grad f(y_bar))
    every I steps: x_k = <x_k>                                     # model round

The per-step exchange is a federation call whose payload and reply are the d_g-float y alone; the model
and the previous iterate stay on the clients between model rounds. One call both finishes step t - 1
(the x update, which needs the y_bar just averaged) and starts step t (the new y_k), so a round of I
steps is I + 1 calls: I embedding exchanges and one model round. The initial y_bar is the average of
one-batch estimates of g_k at x_0 (one more exchange, in round 0).

**Modified FedAvg** (``fedavg-co-shared-y``, Theorem 4.2): y_bar = <g_k(x_k; b)> every step -- FedDRO with
beta = 1. **Vanilla FedAvg** (``fedavg-co-1`` / ``fedavg-co-2``, Algorithm 1): each client uses its own
y_k = g_k(x_k) between model rounds; at a model round case I resets y_k = g_k(x_bar) locally, case II
averages y_k = <g_k(x_bar)> (a low-dimensional exchange inside the same round).
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
from fedcomp.platform.problems import COMPOSITIONAL_GLOBAL, GlobalCompositionalProblem
from fedcomp.platform.registry import register_algorithm


class CompositionalHParams(Params):
    """eta (``lr``) with an optional step schedule, I (``local_steps``) and the batch |b| per client."""

    lr: float = Field(0.01, gt=0, description="step size eta")
    local_steps: int = Field(1, ge=1, description="local steps I between model rounds")
    outer_batch: int | None = Field(16, ge=1, description="batch |b| per client and step; null = all local data")
    lr_milestones: list[int] = Field(default_factory=list, description="rounds after which lr is multiplied by lr_factor")
    lr_factor: float = Field(0.1, gt=0, description="lr multiplier at each milestone (the paper: 0.1 after 90 rounds)")

    def lr_at(self, round: int) -> float:
        """The step size of round ``round`` (a schedule of the round index, not a mutable state)."""
        return self.lr * self.lr_factor ** sum(round >= m for m in self.lr_milestones)


class FedDROHParams(CompositionalHParams):
    beta: float = Field(0.1, gt=0, le=1, description="momentum weight of the y estimator, in (0, 1]")


def _value_and_vjp(problem: GlobalCompositionalProblem, x: Tensor, batch: Any, v: Tensor) -> tuple[Tensor, Tensor]:
    """grad h_k(x; b) + grad g_k(x; b)^T v, and h_k(x; b) + v.g_k(x; b) (a scalar whose gradient that is)."""
    x = x.detach().requires_grad_(True)
    surrogate = problem.plain(x, batch) + problem.inner(x, batch) @ v
    (grad,) = torch.autograd.grad(surrogate, x)
    return grad, surrogate.detach()


def _outer_grad(problem: GlobalCompositionalProblem, z: Tensor) -> Tensor:
    z = z.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(problem.outer(z), z)
    return grad


class _Compositional(DictAlgorithm):
    kind = COMPOSITIONAL_GLOBAL
    synced = ("x",)

    def init_state(self, params: State) -> State:
        return {"x": params["x"].clone()}

    def local_step(self, problem: Any, client: int, state: State, step: int, gen: torch.Generator) -> tuple[State, StepInfo]:
        raise NotImplementedError("compositional algorithms run their own round programs")

    def _batch(self, problem: GlobalCompositionalProblem, ctx: ClientContext, step: int) -> Any:
        return problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(step))


@register_algorithm("feddro")
class FedDRO(_Compositional):
    """FedDRO: hybrid estimator of g shared every local step, model averaged every I steps."""

    HParams: ClassVar[type[Params]] = FedDROHParams
    description = "FedDRO: y (d_g floats) averaged every local step, x every I steps (FedDRO Alg. 2)"
    transient_programs = frozenset({"dro_start", "dro_continue"})

    @property
    def beta(self) -> float:
        return self.hp.beta

    # -- client programs -------------------------------------------------------------------------------------
    def dro_init(self, problem: GlobalCompositionalProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """y_k = g_k(x_0; b): the clients' share of the initial estimate; x_prev starts at x_0."""
        batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(-1))
        x = state["x"]
        return {"x_local": x.clone(), "x_prev": x.clone()}, {"y": problem.inner(x, batch).detach()}, StepInfo(batch_size(batch))

    def _start(self, problem: GlobalCompositionalProblem, state: State, y_bar: Tensor, step: int, ctx: ClientContext) -> tuple[Tensor, StepInfo]:
        batch = self._batch(problem, ctx, step)
        with torch.no_grad():
            new, old = problem.inner(state["x_local"], batch), problem.inner(state["x_prev"], batch)
        return (1 - self.beta) * (y_bar - old) + new, StepInfo(2 * batch_size(batch))

    def _finish(self, problem: GlobalCompositionalProblem, state: State, y_bar: Tensor, step: int, ctx: ClientContext) -> tuple[State, StepInfo]:
        batch = self._batch(problem, ctx, step)  # the same batch as the step's start: keyed by the step
        grad, value = _value_and_vjp(problem, state["x_local"], batch, _outer_grad(problem, y_bar))
        x = state["x_local"]
        new = {**state, "x_prev": x, "x_local": x - self.hp.lr_at(ctx.round) * grad}
        return new, StepInfo(batch_size(batch), float(value))

    def dro_start(self, problem: GlobalCompositionalProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """Take the averaged model (x_prev stays the client's own last iterate) and start the round's first step."""
        state = {**state, "x_local": state["x"].clone()}
        y, info = self._start(problem, state, state["y"], ctx.round * self.hp.local_steps, ctx)
        return state, {"y": y}, info

    def dro_continue(self, problem: GlobalCompositionalProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """Finish step t - 1 with the y_bar just averaged, start step t."""
        step = ctx.round * self.hp.local_steps + ctx.sub
        state, done = self._finish(problem, state, state["y"], step - 1, ctx)
        y, info = self._start(problem, state, state["y"], step, ctx)
        return state, {"y": y}, StepInfo(done.samples + info.samples, done.loss)

    def dro_finish(self, problem: GlobalCompositionalProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """Finish the round's last step and hand the model in for averaging."""
        step = ctx.round * self.hp.local_steps + self.hp.local_steps - 1
        state, done = self._finish(problem, state, state["y"], step, ctx)
        return state, {"x": state["x_local"]}, done

    # -- server ------------------------------------------------------------------------------------------------
    def round(self, federation: Federation, state: State, ctx: RoundContext) -> tuple[State, RoundRecord]:
        cohort, steps = ctx.cohort(0), self.hp.local_steps
        d, samples, exchanges, loss = state["x"].numel(), 0, 0, float("nan")
        y_bar = state.get("y")
        if y_bar is None:  # round 0: the initial estimate y_bar_0 = <g_k(x_0; b)>, one exchange
            out = federation.call("dro_init", ctx.round, cohort, {"x": state["x"]}, sub=-1)
            y_bar, samples, exchanges = out.means["y"], out.samples, 1
        dg = y_bar.numel()
        out = federation.call("dro_start", ctx.round, cohort, {"x": state["x"], "y": y_bar}, sub=0)
        y_bar, samples = out.means["y"], samples + out.samples
        for s in range(1, steps):
            out = federation.call("dro_continue", ctx.round, cohort, {"y": y_bar}, sub=s)
            y_bar, samples, loss = out.means["y"], samples + out.samples, out.loss
        out = federation.call("dro_finish", ctx.round, cohort, {"y": y_bar}, sub=steps)
        samples, loss = samples + out.samples, out.loss
        exchanges += steps
        record = RoundRecord(
            comm_rounds=1, local_steps=steps, samples=samples, floats_up=d, floats_down=d, train_loss=loss,
            embedding_exchanges=exchanges, embedding_floats_up=exchanges * dg, embedding_floats_down=exchanges * dg,
        )
        return {"x": out.means["x"], "y": y_bar}, record


class _NoMomentumHParams(CompositionalHParams):
    """Modified FedAvg has no beta: its estimate is the plain batch value g_k(x_k; b)."""


@register_algorithm("fedavg-co-shared-y")
class FedAvgSharedY(FedDRO):
    """Modified FedAvg (FedDRO paper, Theorem 4.2): y_bar = <g_k(x_k; b)> every step (FedDRO with beta = 1)."""

    HParams = _NoMomentumHParams
    description = "Modified FedAvg for compositional problems: g_k values averaged every step (FedDRO Thm 4.2)"

    @property
    def beta(self) -> float:
        return 1.0


class _VanillaCO(_Compositional):
    """Vanilla FedAvg for compositional problems: local y_k = g_k(x_k) between model rounds."""

    HParams = CompositionalHParams
    case: ClassVar[Literal[1, 2]]

    def co_inner_value(self, problem: GlobalCompositionalProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """g_k(x_bar; b), for case II's averaged reset."""
        batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(ctx.round * self.hp.local_steps, "reset"))
        return state, {"y": problem.inner(state["x"], batch).detach()}, StepInfo(batch_size(batch))

    def co_local_steps(self, problem: GlobalCompositionalProblem, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """I steps x <- x - eta grad g_k(x)^T grad f(y_k), y_k <- g_k(x) at the new point."""
        x, first = state["x"], ctx.round * self.hp.local_steps
        if "y" in state:
            y = state["y"]  # case II: the averaged g_k(x_bar)
        else:  # case I: the client's own g_k(x_bar)
            batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(first, "reset"))
            y = problem.inner(x, batch).detach()
        samples, loss = 0, 0.0
        for s in range(self.hp.local_steps):
            batch = problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(first + s))
            grad, value = _value_and_vjp(problem, x, batch, _outer_grad(problem, y))
            x = x - self.hp.lr_at(ctx.round) * grad
            with torch.no_grad():
                y = problem.inner(x, batch)
            samples, loss = samples + 2 * batch_size(batch), float(value)
        return state, {"x": x}, StepInfo(samples, loss)

    def round(self, federation: Federation, state: State, ctx: RoundContext) -> tuple[State, RoundRecord]:
        cohort, d = ctx.cohort(0), state["x"].numel()
        payload, samples, exchanges, dg = {"x": state["x"]}, 0, 0, 0
        if self.case == 2:
            out = federation.call("co_inner_value", ctx.round, cohort, {"x": state["x"]}, sub=0)
            payload["y"], samples, exchanges, dg = out.means["y"], out.samples, 1, out.means["y"].numel()
        out = federation.call("co_local_steps", ctx.round, cohort, payload, sub=1)
        record = RoundRecord(
            comm_rounds=1, local_steps=self.hp.local_steps, samples=samples + out.samples, floats_up=d,
            floats_down=d, train_loss=out.loss, embedding_exchanges=exchanges,
            embedding_floats_up=exchanges * dg, embedding_floats_down=exchanges * dg,
        )
        return {"x": out.means["x"]}, record


@register_algorithm("fedavg-co-1")
class FedAvgCO1(_VanillaCO):
    """Vanilla FedAvg for compositional problems, case I: y_k = g_k(x_bar) reset locally at each model round."""

    case = 1
    description = "Vanilla FedAvg for CO, case I: only x shared (FedDRO Alg. 1; stalls for I > 1)"


@register_algorithm("fedavg-co-2")
class FedAvgCO2(_VanillaCO):
    """Vanilla FedAvg for compositional problems, case II: y_k = <g_k(x_bar)> at each model round."""

    case = 2
    description = "Vanilla FedAvg for CO, case II: x and <g_k(x_bar)> shared at model rounds (FedDRO Alg. 1)"
