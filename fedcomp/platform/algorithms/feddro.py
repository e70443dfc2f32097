"""FedDRO and vanilla FedAvg for compositional problems -- "FedDRO: Federated Compositional Optimization for
Distributionally Robust Learning", Algorithms 1 and 2, as restated in ``reference/ALGORITHMS.md`` section 8.

Problem: min_x h(x) + f((1/K) sum_k g_k(x)) with a low-dimensional inner value g_k(x) in R^{d_g}.

**FedDRO** (Algorithm 2). Every local step t, every client k, on one batch b (the same samples for both
evaluations of g_k):

    y_k = (1 - beta) (y_bar - g_k(x_k_prev; b)) + g_k(x_k; b)       # hybrid estimator on function values
    y_bar = <y_k>                                                  # exchanged EVERY step (d_g floats)
    x_k_prev = x_k;  x_k = x_k - eta (grad h_k(x_k; b) + grad g_k(x_k; b)^T grad f(y_bar))
    every I steps: x_k = <x_k>                                     # model round

y_bar_0 = <g_k(x_0; b)> is the server's starting estimate (:meth:`FedDRO.start`, one exchange before round 0).
A local step is cut at its exchange: one federation call ends step t - 1 (the move, which needs the y_bar
just averaged) and begins step t (the new y_k), so a round of I steps is I + 1 calls, counted as what the
protocol sends: I exchanges of d_g floats and one model round. The model and the previous iterate stay on
the clients between calls (the per-step calls broadcast y_bar alone).

**Modified FedAvg** (``fedavg-co-shared-y``, Theorem 4.2): y_bar = <g_k(x_k; b)> every step -- FedDRO with
beta = 1. **Vanilla FedAvg** (``fedavg-co-1`` / ``fedavg-co-2``, Algorithm 1): each client descends with its
own y_k = g_k(x_k) between model rounds, from a reset at x_bar: its own g_k(x_bar) in case I, the average
<g_k(x_bar)> in case II (a low-dimensional exchange inside the model round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from fedcomp.platform.algorithms.base import Algorithm, ClientContext, StepInfo, Tensors, batch_size
from fedcomp.platform.oracles import outer_grad, plain_inner_vjp
from fedcomp.platform.params import Params
from fedcomp.platform.problems import COMPOSITIONAL_GLOBAL, GlobalCompositionalProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import State


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


@dataclass(frozen=True)
class Model(State):
    x: Tensor


@dataclass(frozen=True)
class ModelEstimate(Model):
    y: Tensor
    """y-bar, the cohort mean of the clients' estimates of g (d_g floats)."""


@dataclass(frozen=True)
class DROClient(ModelEstimate):
    x_prev: Tensor
    """The client's previous local iterate (its own, never averaged)."""


def unsent() -> Tensor:
    """A message field the protocol has not sent yet (an empty tensor). A client record holds every field a
    round's calls broadcast; a split step's first call carries the ones that only its second call fills."""
    return torch.zeros(0)


class Compositional(Algorithm):
    """The FedDRO paper's problem kind; the server starts from x_0."""

    kind = COMPOSITIONAL_GLOBAL
    HParams: ClassVar[type[Params]] = CompositionalHParams
    Client = Server = Model
    hp: CompositionalHParams

    def init(self, variables: Tensors) -> Model:
        return Model(x=variables["x"].clone())

    def sample(self, problem: GlobalCompositionalProblem, ctx: ClientContext, *ids: Any) -> Any:
        """The client's batch b keyed by ``ids`` (the same ids give the same batch)."""
        return problem.sample(ctx.client, self.hp.outer_batch, ctx.rng(*ids))


@register_algorithm("feddro")
class FedDRO(Compositional):
    """FedDRO: hybrid estimator of g shared every local step, model averaged every I steps."""

    HParams: ClassVar[type[Params]] = FedDROHParams
    Client, Server = DROClient, ModelEstimate
    description = "FedDRO: y (d_g floats) averaged every local step, x every I steps (FedDRO Alg. 2)"
    transient_programs = frozenset({"begin_round", "next_step"})

    @property
    def beta(self) -> float:
        return self.hp.beta

    def join(self, broadcast: Tensors) -> DROClient:
        """x_prev starts at the first model the client receives."""
        return DROClient(x=broadcast["x"].clone(), y=broadcast["y"].clone(), x_prev=broadcast["x"].clone())

    # -- one local step: estimate, (exchange), move -----------------------------------------------------------
    def estimate(self, problem: GlobalCompositionalProblem, client: DROClient, step: int, ctx: ClientContext) -> tuple[Tensor, StepInfo]:
        """y_k = (1 - beta)(y_bar - g_k(x_prev; b)) + g_k(x; b), both on the step's batch b."""
        batch = self.sample(problem, ctx, step)
        with torch.no_grad():
            new, old = problem.inner(client.x, batch), problem.inner(client.x_prev, batch)
        return (1 - self.beta) * (client.y - old) + new, StepInfo(2 * batch_size(batch))

    def move(self, problem: GlobalCompositionalProblem, client: DROClient, step: int, ctx: ClientContext) -> tuple[DROClient, StepInfo]:
        """x_prev = x; x = x - eta (grad h_k(x; b) + grad g_k(x; b)^T grad f(y_bar)) on the step's batch b again."""
        batch = self.sample(problem, ctx, step)
        v, _ = outer_grad(problem, client.y)
        grad, h, g = plain_inner_vjp(problem, client.x, batch, v)
        x = client.x - self.hp.lr_at(ctx.round) * grad
        return client.replace(x=x, x_prev=client.x), StepInfo(batch_size(batch), float(h + g @ v))

    # -- client programs ---------------------------------------------------------------------------------------
    def initial_estimate(self, problem: GlobalCompositionalProblem, client: DROClient, ctx: ClientContext) -> tuple[DROClient, Tensors, StepInfo]:
        """y_k = g_k(x_0; b), the client's share of y_bar_0."""
        batch = self.sample(problem, ctx, -1)
        return client, {"y": problem.inner(client.x, batch).detach()}, StepInfo(batch_size(batch))

    def begin_round(self, problem: GlobalCompositionalProblem, client: DROClient, ctx: ClientContext) -> tuple[DROClient, Tensors, StepInfo]:
        """From the averaged model (x_prev stays the client's own last iterate): the round's first estimate."""
        y, info = self.estimate(problem, client, ctx.round * self.hp.local_steps, ctx)
        return client, {"y": y}, info

    def next_step(self, problem: GlobalCompositionalProblem, client: DROClient, ctx: ClientContext) -> tuple[DROClient, Tensors, StepInfo]:
        """Step t - 1's move with the y_bar just averaged, then step t's estimate (t: the call's ``sub``)."""
        step = ctx.round * self.hp.local_steps + ctx.sub
        client, moved = self.move(problem, client, step - 1, ctx)
        y, info = self.estimate(problem, client, step, ctx)
        return client, {"y": y}, StepInfo(moved.samples + info.samples, moved.loss)

    def end_round(self, problem: GlobalCompositionalProblem, client: DROClient, ctx: ClientContext) -> tuple[DROClient, Tensors, StepInfo]:
        """The round's last move; the model goes up for averaging."""
        client, moved = self.move(problem, client, (ctx.round + 1) * self.hp.local_steps - 1, ctx)
        return client, {"x": client.x}, moved

    # -- server ------------------------------------------------------------------------------------------------
    def start(self, fed: Round, server: Model) -> ModelEstimate:
        """y_bar_0 = <g_k(x_0; b)>: one exchange of d_g floats (the clients hold x_0)."""
        y = fed.call("initial_estimate", fed.cohort(), ModelEstimate(x=server.x, y=unsent()), message=None).y
        fed.count(embedding_exchanges=1, embedding_floats_up=y.numel(), embedding_floats_down=y.numel())
        return ModelEstimate(x=server.x, y=y)

    def round(self, fed: Round, server: ModelEstimate) -> ModelEstimate:
        """I local steps with y exchanged at each (call s ends step s - 1 and begins step s), then the model round."""
        cohort, steps = fed.cohort(), self.hp.local_steps
        y = fed.call("begin_round", cohort, server, sub=0, message=None).y
        for s in range(1, steps):
            y = fed.call("next_step", cohort, {"y": y}, sub=s, message=None).y
        x = fed.call("end_round", cohort, {"y": y}, sub=steps, message=None).x
        d, dg = x.numel(), y.numel()
        fed.count(comm_rounds=1, floats_up=d, floats_down=d, local_steps=steps,
                  embedding_exchanges=steps, embedding_floats_up=steps * dg, embedding_floats_down=steps * dg)
        return ModelEstimate(x=x, y=y)


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


class _VanillaCO(Compositional):
    """Vanilla FedAvg for compositional problems: local y_k = g_k(x_k) between model rounds, from a reset."""

    def reset(self, problem: GlobalCompositionalProblem, x: Tensor, ctx: ClientContext) -> tuple[Tensor, Any]:
        """g_k(x_bar; b) on the round's reset batch b (and the batch)."""
        batch = self.sample(problem, ctx, ctx.round * self.hp.local_steps, "reset")
        return problem.inner(x, batch).detach(), batch

    def descend(self, problem: GlobalCompositionalProblem, x: Tensor, y: Tensor, ctx: ClientContext) -> tuple[Tensor, StepInfo]:
        """I steps x <- x - eta grad g_k(x; b)^T grad f(y_k), then y_k <- g_k(x; b) at the new point (same b)."""
        first, samples, loss = ctx.round * self.hp.local_steps, 0, 0.0
        for s in range(self.hp.local_steps):
            batch = self.sample(problem, ctx, first + s)
            v, _ = outer_grad(problem, y)
            grad, h, g = plain_inner_vjp(problem, x, batch, v)
            x = x - self.hp.lr_at(ctx.round) * grad
            with torch.no_grad():
                y = problem.inner(x, batch)
            samples, loss = samples + 2 * batch_size(batch), float(h + g @ v)
        return x, StepInfo(samples, loss)


@register_algorithm("fedavg-co-1")
class FedAvgCO1(_VanillaCO):
    """Vanilla FedAvg for compositional problems, case I: y_k = g_k(x_bar) reset locally at each model round."""

    description = "Vanilla FedAvg for CO, case I: only x shared (FedDRO Alg. 1; stalls for I > 1)"

    def local_steps(self, problem: GlobalCompositionalProblem, client: Model, ctx: ClientContext) -> tuple[Model, Tensors, StepInfo]:
        """The client's own reset y_k = g_k(x_bar; b), then I local steps."""
        y, _ = self.reset(problem, client.x, ctx)
        x, info = self.descend(problem, client.x, y, ctx)
        return Model(x=x), {"x": x}, info

    def round(self, fed: Round, server: Model) -> Model:
        return Model(x=fed.local_steps(server, self.hp.local_steps).x)


@register_algorithm("fedavg-co-2")
class FedAvgCO2(_VanillaCO):
    """Vanilla FedAvg for compositional problems, case II: y_k = <g_k(x_bar)> at each model round."""

    Client = ModelEstimate
    description = "Vanilla FedAvg for CO, case II: x and <g_k(x_bar)> shared at model rounds (FedDRO Alg. 1)"

    def inner_value(self, problem: GlobalCompositionalProblem, client: ModelEstimate, ctx: ClientContext) -> tuple[ModelEstimate, Tensors, StepInfo]:
        """g_k(x_bar; b), the client's share of the averaged reset."""
        y, batch = self.reset(problem, client.x, ctx)
        return client, {"y": y}, StepInfo(batch_size(batch))

    def local_steps(self, problem: GlobalCompositionalProblem, client: ModelEstimate, ctx: ClientContext) -> tuple[ModelEstimate, Tensors, StepInfo]:
        """I local steps from the averaged reset y = <g_k(x_bar)>."""
        x, info = self.descend(problem, client.x, client.y, ctx)
        return client, {"x": x}, info

    def round(self, fed: Round, server: Model) -> Model:
        """x_bar down, g_k(x_bar) up and its mean down (one exchange), I local steps, x up (the model round)."""
        cohort, steps = fed.cohort(), self.hp.local_steps
        y = fed.call("inner_value", cohort, ModelEstimate(x=server.x, y=unsent()), message=None).y
        x = fed.call("local_steps", cohort, ModelEstimate(x=server.x, y=y), message=None).x
        d, dg = x.numel(), y.numel()
        fed.count(comm_rounds=1, floats_up=d, floats_down=d, local_steps=steps,
                  embedding_exchanges=1, embedding_floats_up=dg, embedding_floats_down=dg)
        return Model(x=x)
