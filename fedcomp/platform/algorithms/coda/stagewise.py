"""What CoDA and CODA+ share: stages of proximal primal-dual local steps around a reference point v_ref, and
how a new stage's v_ref is formed (``algorithm.stage_average``).

Within a stage every client takes local steps v <- v - eta_s (d_v + (1/gamma)(v - v_ref)), alpha ascends, and the
server averages (x, y) every I_s steps; at a stage's first round CoDA restarts the dual (:mod:`.stages`). A new
stage's v_ref is the previous stage's output:

* ``global`` (the papers; the default): CoDA's DSG returns ``(1/K) sum_k (1/T) sum_t v_t^k``, the time average
  of every client's iterates, and CODA+'s stage output is the same average (ALGORITHMS.md 6.2, 9.4). Each client
  sums its own iterates over the stage (private state); the stage's last round uploads each client's average
  with its model (d more floats, once a stage), the server averages them into v_ref and the next stage starts
  from it (``restart_from: average``) or from the last averaged iterate (``last``: v_ref then goes down once, at
  the stage's first round). Clients keep v_ref between rounds; under partial participation, where a cohort may
  hold a client that missed the stage's first round, v_ref goes down every round.
* ``local`` (the reference code, ZhishuaiGuo/DistributedAUC): each client's own time average of the previous
  stage is its v_ref, and (``restart_from: average``) its restart point; nothing more is communicated.
* ``per-round`` (this platform's first reading): the time average of the per-round cohort means, exact under
  partial participation: every round uploads the sum of the round's iterates and broadcasts v_ref (2d + 1 floats
  each way).

Counters: one model round per round, (x, y) each way (plus the above); CoDA's dual restart is one embedding
exchange inside its stage's first round (4 class-wise sums up, their means down), scored at the round's start
point. Schedules are pure functions of the round index; every state field exists from ``init``/``join``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import (
    Algorithm,
    ClientContext,
    Exchange,
    StepInfo,
    Tensors,
    batch_size,
    mean_loss,
)
from fedcomp.platform.algorithms.builtins import StagewiseHParams
from fedcomp.platform.algorithms.coda.stages import StagePlan, class_sums, dual_restart_value, stage_plan
from fedcomp.platform.kinds import MINIMAX
from fedcomp.platform.oracles import grad_xy_and_value
from fedcomp.platform.problems import MinimaxProblem
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import Means, MinimaxModel, State

__all__ = ["Proximal", "StageClient", "StageServer", "Stagewise", "StagewiseHParams"]


@dataclass(frozen=True)
class Proximal(MinimaxModel):
    """(x, y) with the stage's reference point: a ``per-round`` broadcast, a ``global`` server."""

    v_ref: Tensor


@dataclass(frozen=True)
class StageServer(Proximal):
    """The ``per-round`` server: the stage's running sum of the cohort-mean iterates beside (x, y, v_ref)."""

    x_acc: Tensor


@dataclass(frozen=True)
class StageClient(MinimaxModel):
    """A ``global`` / ``local`` client: (x, y) from each broadcast; private, the stage it last ran in (0: none),
    its v_ref for that stage, and the sum and count of its own iterates there."""

    stage: Tensor
    anchor: Tensor
    total: Tensor
    count: Tensor


@dataclass(frozen=True)
class StageClientRef(StageClient):
    """What a ``global`` client reads when the round's broadcast carries v_ref."""

    v_ref: Tensor


RECORDS: dict[str, tuple[type[State], type[State]]] = {
    "global": (Proximal, StageClient), "local": (MinimaxModel, StageClient), "per-round": (StageServer, MinimaxModel),
}
"""stage_average -> (server record, client record)."""
Restart = Generator[Mapping[str, Tensor], Means, tuple[Tensor, StepInfo]]
"""The dual restart inside a client program: yields the class-wise sums, returns (y, its oracle calls)."""


class Stagewise(Algorithm[Any, Any]):
    """Schedule, round program and client programs of the stagewise proximal primal-dual methods."""

    kind = MINIMAX
    Client: ClassVar[type[State]] = MinimaxModel
    Server: ClassVar[type[State]] = StageServer
    restarts_dual: ClassVar[bool] = False
    hp: StagewiseHParams

    def __init__(self, hparams: Any) -> None:
        super().__init__(hparams)
        self.Server, self.Client = RECORDS[self.hp.stage_average]  # type: ignore[misc]

    def init(self, variables: Tensors) -> State:
        x, y = variables["x"].clone(), variables["y"].clone()
        server = StageServer(x=x, y=y, v_ref=x.clone(), x_acc=torch.zeros_like(x))  # stage 1: v_ref = x_0
        return self.Server.of(server.tensors())

    def join(self, broadcast: Tensors) -> State:
        x, y = broadcast["x"].clone(), broadcast["y"].clone()
        if self.Client is MinimaxModel:
            return MinimaxModel(x, y)
        return StageClient(x, y, torch.tensor(0.0), x.clone(), torch.zeros_like(x), torch.tensor(0.0))

    @abstractmethod
    def lengths(self, stage: int) -> tuple[int, int]:
        """(T_s, I_s): the nominal local steps and the period of stage ``stage``."""

    def plan(self, round: int) -> StagePlan:
        """Where round ``round`` sits in the stage schedule."""
        return stage_plan(self.lengths, self.hp.lr, round)

    # -- server side ----------------------------------------------------------------------------------------------
    def round(self, fed: Round, server: Any) -> Any:
        """One round of stage s: I_s local steps from (x, y) around v_ref, CoDA's dual restart first in the stage's
        first round; a stage's end (``global``) or next start (``per-round``) forms the next v_ref."""
        self.check(fed.problem, server.y)
        plan, mode, cohort = self.plan(fed.number), self.hp.stage_average, fed.cohort()
        restart = int(plan.first and self.restarts_dual)
        if mode == "per-round":
            if plan.first and plan.stage > 1:
                v_ref = server.x_acc / plan.previous_length
                x = v_ref.clone() if self.hp.restart_from == "average" else server.x
                server = server.replace(x=x, v_ref=v_ref, x_acc=torch.zeros_like(x))
            means = self._run(fed, "streamed_round", cohort, Proximal(server.x, server.y, server.v_ref), plan, restart)
            return server.replace(x=means.x, y=means.y, x_acc=server.x_acc + means.x_sum)
        if mode == "local":
            means = self._run(fed, "stage_round", cohort, MinimaxModel(server.x, server.y), plan, restart)
            return server.replace(x=means.x, y=means.y)
        sends_ref = len(cohort) < fed.clients or (plan.first and plan.stage > 1 and self.hp.restart_from == "last")
        if sends_ref:
            means = self._run(fed, "stage_round_ref", cohort, server, plan, restart)
        else:
            means = self._run(fed, "stage_round", cohort, MinimaxModel(server.x, server.y), plan, restart)
        if not self.plan(fed.number + 1).first:
            return server.replace(x=means.x, y=means.y)
        v_ref = means.x_avg  # the stage's output (1/K) sum_k (1/T) sum_t v_t^k
        return Proximal(x=v_ref.clone() if self.hp.restart_from == "average" else means.x, y=means.y, v_ref=v_ref)

    def _run(self, fed: Round, program: str, cohort: list[int], broadcast: State, plan: StagePlan, restart: int) -> Means:
        means = fed.exchange(program, cohort, broadcast, restart)
        fed.count(local_steps=plan.steps)
        return means

    def check(self, problem: Any, y: Tensor) -> None:
        """Fail before any client work when the task lacks what the options need."""

    # -- client side ----------------------------------------------------------------------------------------------
    @abstractmethod
    def step(
        self, problem: Any, x: Tensor, y: Tensor, gx: Tensor, gy: Tensor, v_ref: Tensor | None, lr: float
    ) -> tuple[Tensor, Tensor]:
        """One local primal-dual step from the batch gradients (gx, gy); ``v_ref`` None: no proximal term."""

    def streamed_round(self, problem: MinimaxProblem, client: Proximal, ctx: ClientContext) -> Exchange[Proximal]:
        """``per-round``: the round's steps around the broadcast v_ref; outputs x, y and the sum of the iterates."""
        plan = self.plan(ctx.round)
        y, info = yield from self.restart(problem, client.x, client.y, plan, ctx)
        x, y, x_sum, steps = self.steps(problem, client.x, y, client.v_ref, plan, ctx)
        return client.replace(x=x, y=y), {"x": x, "y": y, "x_sum": x_sum}, _add(info, steps)

    def stage_round(self, problem: MinimaxProblem, client: StageClient, ctx: ClientContext) -> Exchange[StageClient]:
        """``global`` / ``local``: the round's steps around the client's own v_ref."""
        return (yield from self._stage_round(problem, client, None, ctx))

    def stage_round_ref(self, problem: MinimaxProblem, client: StageClientRef, ctx: ClientContext) -> Exchange[StageClient]:
        """``global``, v_ref broadcast: the round's steps around it."""
        return (yield from self._stage_round(problem, client, client.v_ref, ctx))

    def _stage_round(
        self, problem: MinimaxProblem, client: StageClient, v_ref: Tensor | None, ctx: ClientContext
    ) -> Exchange[StageClient]:
        plan = self.plan(ctx.round)
        client = self.enter_stage(client, v_ref, plan)
        y, info = yield from self.restart(problem, client.x, client.y, plan, ctx)
        x, y, x_sum, steps = self.steps(problem, client.x, y, client.anchor, plan, ctx)
        total, count = client.total + x_sum, client.count + plan.steps
        outputs = {"x": x, "y": y}
        if self.hp.stage_average == "global" and self.plan(ctx.round + 1).first:
            outputs["x_avg"] = total / count  # the client's (1/T) sum_t v_t^k, once a stage
        kept = StageClient(x, y, client.stage, client.anchor, total, count)
        return kept, outputs, _add(info, steps)

    def enter_stage(self, client: StageClient, v_ref: Tensor | None, plan: StagePlan) -> StageClient:
        """The client's stage fields for this round: kept within a stage (v_ref replaced where broadcast); at its
        first round of a stage, v_ref is the broadcast one, or (``local``) its own time average of the previous
        stage -- x restarting from it at the stage's first round under ``restart_from: average`` -- or else the
        start point x; its sums restart."""
        if int(client.stage) == plan.stage:
            return client if v_ref is None else client.replace(anchor=v_ref)
        x, anchor = client.x, client.x if v_ref is None else v_ref
        if self.hp.stage_average == "local" and int(client.stage) == plan.stage - 1 and float(client.count) > 0:
            anchor = client.total / client.count
            if plan.first and self.hp.restart_from == "average":
                x = anchor.clone()
        zero = torch.zeros_like(client.count)
        return StageClient(x, client.y, zero + plan.stage, anchor, torch.zeros_like(x), zero)

    def restart(self, problem: Any, x: Tensor, y: Tensor, plan: StagePlan, ctx: ClientContext) -> Restart:
        """CoDA's dual restart at a stage's first round (else y as it is): n_s = 3^s forward-only batches scored at
        x, their class-wise sums all-reduced, alpha = margin + mean negative - mean positive score (y kept when a
        class was not seen)."""
        if not (plan.first and self.restarts_dual):
            return y, StepInfo()
        n = getattr(self.hp, "restart_batches", None) or 3**plan.stage
        gen = ctx.rng(-1, plan.stage)  # apart from the local steps' streams (keyed by one step index)
        sums, samples = class_sums(problem, ctx.client, x, n, self.hp.outer_batch, gen)
        means = yield {"class_sums": sums}
        pos_sum, pos_count, neg_sum, neg_count = (float(v) for v in means.class_sums)
        alpha = dual_restart_value(pos_sum, pos_count, neg_sum, neg_count, float(getattr(problem, "margin", 0.0)))
        return (y if alpha is None else torch.full_like(y, alpha)), StepInfo(samples)

    def steps(
        self, problem: MinimaxProblem, x: Tensor, y: Tensor, v_ref: Tensor | None, plan: StagePlan, ctx: ClientContext
    ) -> tuple[Tensor, Tensor, Tensor, StepInfo]:
        """The round's I_s local steps: (x, y), the sum of the iterates x, and the oracle calls and mean loss."""
        x_sum, samples, losses = torch.zeros_like(x), 0, []
        for i in range(plan.steps):
            batch = problem.sample(ctx.client, "inner", self.hp.outer_batch, ctx.rng(plan.first_step + i))
            gx, gy, value = grad_xy_and_value(lambda a, b: problem.loss(a, b, batch), x, y)  # noqa: B023 (called in this iteration)
            x, y = self.step(problem, x, y, gx, gy, v_ref, plan.lr)
            x_sum = x_sum + x
            samples += batch_size(batch)
            losses.append(value.detach())
        return x, y, x_sum, StepInfo(samples, mean_loss(losses))


def _add(restart: StepInfo, steps: StepInfo) -> StepInfo:
    """The round's info: the restart's oracle calls and the local steps' calls and loss."""
    return StepInfo(restart.samples + steps.samples, steps.loss)
