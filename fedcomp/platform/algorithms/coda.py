"""CoDA and CODA+ -- stagewise proximal primal-dual local SGD for the min-max AUC surrogate, as restated in
``reference/ALGORITHMS.md`` sections 9.4 (A19) and 6.2 (A7).

Problem (class C6, kind ``minimax``): min over the primal v = x = (w, a, b), max over the dual y = [alpha] of
(1/K) sum_k E F_k(v, alpha; z); the task's ``loss(x, y, batch)``, batches from ``sample(client, "inner", b, gen)``.

**CoDA** (``coda``; Guo, Liu, Yuan, Shen, Liu, Yang, ICML 2020; **[code: ZhishuaiGuo/DistributedAUC]**):

    for stage s = 1, 2, ...:          T_s = T0 3^(s-1) local steps,  eta_s = eta_0 3^-(s-1)
        v_ref = x_0 (s = 1), else the time average of the previous stage's (client-averaged) iterates;
                the stage starts from v_ref (``restart_from: average``, the code) or from the last iterate
        dual restart: every client scores n_s forward-only batches at the stage's start point and uploads its
                class-wise score sums and counts; alpha = mean negative score - mean positive score
        for each local step:  g_v, g_alpha = grad F(v, alpha; z) on one batch z
                              v     = v - eta_s (g_v + (1/gamma)(v - v_ref))        # proximal SGD on (w, a, b)
                              alpha = alpha + eta_s g_alpha                          # simultaneous ascent
        every I steps: the server averages v and alpha

n_s = 3^s batches of ``outer_batch`` examples (the code; ``restart_batches`` fixes it instead). For s >= 2 the code
restarts w from each worker's own time average (a per-worker v_ref that is never communicated); here v_ref is the
exact time average of the averaged iterates: each client uploads the sum of its iterates over the round with its
model (one more model-sized upload per round), and the server accumulates the cohort means over the stage.
alpha* = E[h | negative] - E[h | positive] maximises the paper's (1 + alpha) square-loss form for fixed w
(EXPERIMENTS.md 1.4), and m + E[h | negative] - E[h | positive] LibAUC's margin form (when the batch's class shares
equal the prior) **[derived]**: the restart adds the problem's ``margin`` where it has one (0 for the paper's
form). The server forms it from the cohort means of the four sums (the ratio of means is the ratio of sums); if one
class is missing from every client's scored batches alpha is left unchanged. The code's two defects
are not copied (ALGORITHMS.md 9.4): b's proximal term uses (b - b_ref), not (a - a_ref), and the dual step changes
alpha at every step. A third quirk of the code, not copied either: its (a, b) restart from their values at the
previous stage's start (their running average is never accumulated). ``coda_mode: plain_local_sgda`` is the
minimal baseline the LocalSCGDAM paper describes: local SGDA with a constant step, no stages, no proximal term, no
dual restart.

**CODA+** (``coda-plus``; Yuan, Guo, Xu, Ying, Yang, ICML 2021; **[code: LibAUC PESG / CODASCA example]**):

    for stage s = 1, 2, ...:          T_s = T0 local steps,  eta_s = eta_0 3^-(s-1),  I_s = I (default)
        v_ref = x_0 (s = 1), else the running average of the previous stage's iterates; alpha carries over;
                the stage continues from the last iterate (``restart_from: last``, LibAUC)
        for each local step:  d_v   = clip(g_v, c) + (1/gamma)(v - v_ref) + wd v     # clip: elementwise, as LibAUC
                              v     = v - eta_s d_v
                              alpha = clamp(alpha + eta_s g_alpha, 0, 999)           # LibAUC's margin semantics
        every I_s steps: the server averages v and alpha

``dual_step: closed-form`` replaces g_alpha by LibAUC's 2(m + b - a) - 2 alpha, with (a, b) the primal's new values
and m the task's margin (it needs :class:`MarginAUCProblem`). LibAUC starts v_ref at small random values; here the
first stage's v_ref is x_0. ``period_growth: g`` makes the period grow by stages, I_s = min(I g^(s-1), T0) -- the
CODA+ paper lets I_s increase; this geometric shape with a constant T_s is **[inferred]**, the default g = 1 is the
reference code's constant period.

State: a client keeps nothing between rounds (its record is the model (x, y) every message brings); the server
state (:class:`StageServer`) is x, y, the stage's v_ref and the stage's running sum of averaged iterates
``x_acc``, all present from ``init`` (v_ref = x_0, x_acc = 0: stage 1's values), so a checkpoint is that record
and a resumed run continues with identical numbers. Schedules are pure functions of the round index
(:meth:`_Stagewise.plan`). T0 (``stage_steps``) counts local steps; a stage ends at the first communication at or
after its T_s steps (T_s is rounded up to whole rounds, and the time average divides by the steps the stage really
ran). Counters: one model round per round; CoDA's dual restart is a low-dimensional exchange (4 floats up; its
download is the model it scores, as the simulation sends it). ``coda_mode: plain_local_sgda`` builds
:class:`PlainLocalSGDA`, whose server state is (x, y) alone.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import torch
from pydantic import Field
from torch import Tensor

from fedcomp.platform.algorithms.base import Algorithm, ClientContext, CommonHParams, StepInfo, Tensors, batch_size
from fedcomp.platform.algorithms.local_scgdam import DUAL_CLAMP, Model
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.oracles import grad_xy_and_value
from fedcomp.platform.params import Params
from fedcomp.platform.problems import MINIMAX, MinimaxProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import State

__all__ = [
    "CoDA",
    "CoDAHParams",
    "CODAPlus",
    "CODAPlusHParams",
    "MarginAUCProblem",
    "PlainLocalSGDA",
    "ScoredProblem",
    "StagePlan",
    "dual_restart_value",
]


@runtime_checkable
class ScoredProblem(Protocol):
    """A minimax AUC problem that exposes its per-example scores and labels (CoDA's dual restart); an optional
    ``margin`` attribute (LibAUC's margin form) is added to the restarted alpha."""

    def sample(self, client: int, split: Any, size: int | None, gen: torch.Generator) -> Any: ...

    def scores(self, x: Tensor, batch: Any) -> Tensor:
        """The score h(w; z) of every example of the batch at the primal ``x`` (shape [n]; no gradient needed)."""
        ...

    def labels(self, batch: Any) -> Tensor:
        """The batch's labels (shape [n]); an example is positive iff its label is > 0 ({0, 1} or {-1, 1})."""
        ...


@runtime_checkable
class MarginAUCProblem(Protocol):
    """A margin AUC problem whose scalars (a, b) can be read off the primal (CODA+'s closed-form dual step)."""

    margin: float

    def auc_ab(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(a, b), the auxiliary primal scalars inside ``x``."""
        ...


def dual_restart_value(
    pos_sum: float, pos_count: float, neg_sum: float, neg_count: float, margin: float = 0.0
) -> float | None:
    """alpha = margin + mean negative score - mean positive score; None when a class was not seen."""
    if pos_count <= 0 or neg_count <= 0:
        return None
    return margin + neg_sum / neg_count - pos_sum / pos_count


@dataclass(frozen=True)
class StagePlan:
    """Where a round sits in the stage schedule (a pure function of the round index)."""

    stage: int
    """s, 1-based."""
    first: bool
    """Whether the round opens its stage (then v_ref is reset, and CoDA restarts the dual)."""
    steps: int
    """Local steps in the round (the stage's period I_s)."""
    first_step: int
    """Global index of the round's first local step (keys the clients' random streams)."""
    lr: float
    """eta_s."""
    previous_length: int
    """T_{s-1}, the local steps of the previous stage (0 in stage 1)."""


@dataclass(frozen=True)
class Proximal(Model):
    """What a stagewise round's local steps read: the client's (x, y) and the stage's reference point."""

    v_ref: Tensor


@dataclass(frozen=True)
class StageServer(Proximal):
    """The server of a stagewise run: x, y, the stage's v_ref and the stage's running sum of averaged iterates."""

    x_acc: Tensor


class _StagewiseHParams(CommonHParams):
    lr: float = Field(0.1, gt=0, description="eta_0, the first stage's step size (divided by 3 at each new stage)")
    outer_batch: int = Field(32, ge=1, description="examples per local step")
    gamma: float = Field(2000.0, gt=0, description="proximal weight: the term is (1/gamma)(v - v_ref)")
    stage_steps: int = Field(5000, ge=1, description="T0: local steps of the first stage (rounded up to whole rounds)")



class CoDAHParams(_StagewiseHParams):
    """CoDA: eta_0 (``lr``), I (``local_steps``), T0 (``stage_steps``), gamma and the restart's options."""

    local_steps: int = Field(2, ge=1, description="I, local steps between averages (the reference code: 2)")
    coda_mode: Literal["stagewise", "plain_local_sgda"] = Field(
        "stagewise", description="the stagewise algorithm with dual restarts, or plain local SGDA"
    )
    restart_batches: int | None = Field(
        None, ge=1, description="batches each client scores at a dual restart; null = 3^s at stage s (the code)"
    )
    restart_from: Literal["average", "last"] = Field(
        "average", description="a stage starts from the previous stage's time average (the code) or its last iterate"
    )


class CODAPlusHParams(_StagewiseHParams):
    """CODA+: eta_0 (``lr``), I (``local_steps``), T0 (``stage_steps``), gamma, clip, weight decay, dual step."""

    local_steps: int = Field(8, ge=1, description="I, local steps between averages (the reference code: 8)")
    gamma: float = Field(500.0, gt=0, description="proximal weight: the term is (1/gamma)(v - v_ref)")
    stage_steps: int = Field(4000, ge=1, description="T0: local steps per stage (rounded up to whole rounds)")
    clip: float | None = Field(1.0, gt=0, description="elementwise clip of the primal gradient; null = none")
    weight_decay: float = Field(1e-4, ge=0, description="wd: the primal direction gains wd * v")
    dual_step: Literal["gradient", "closed-form"] = Field(
        "gradient", description="alpha ascends the batch gradient, or LibAUC's 2(m + b - a) - 2 alpha"
    )
    restart_from: Literal["average", "last"] = Field(
        "last", description="a stage continues from the last iterate (LibAUC) or restarts from the time average"
    )
    period_growth: int = Field(1, ge=1, description="g: the period of stage s is min(I g^(s-1), T0); 1 = constant")


class _Stagewise(Algorithm[Model, StageServer]):
    """Shared schedule, client programs and round program of the stagewise proximal primal-dual methods.

    Every message carries the model (x, y), which is all a client keeps (``Client``); a stagewise round's local
    steps also read the stage's v_ref from their broadcast (``Steps``), which the dual restart's does not carry.
    """

    kind = MINIMAX
    Client = Model
    Server: ClassVar[type[State]] = StageServer
    Steps: ClassVar[type[Model]] = Proximal
    restarts_dual: ClassVar[bool] = False

    def init(self, variables: Tensors) -> StageServer:
        x, y = variables["x"], variables["y"]
        return StageServer(x=x.clone(), y=y.clone(), v_ref=x.clone(), x_acc=torch.zeros_like(x))

    # -- schedule ----------------------------------------------------------------------------------------------
    @abstractmethod
    def lengths(self, stage: int) -> tuple[int, int]:
        """(T_s, I_s): the nominal local steps and the period of stage ``stage``."""

    def plan(self, round: int) -> StagePlan:
        """The stage, period, step offset and step size of round ``round``.

        Walks the stages from the first; once two consecutive stages have the same lengths, all later ones do
        (true of both schedules here), and the rest is a closed form.
        """
        stage, first_round, first_step, previous = 1, 0, 0, 0
        while True:
            nominal, period = self.lengths(stage)
            rounds = -(-nominal // period)  # the stage ends at the first communication at or after T_s steps
            length = rounds * period
            if self.lengths(stage + 1) == (nominal, period):
                skip = (round - first_round) // rounds
                if skip:
                    stage, first_round, first_step, previous = (
                        stage + skip, first_round + skip * rounds, first_step + skip * length, length
                    )
                break
            if round < first_round + rounds:
                break
            stage, first_round, first_step, previous = stage + 1, first_round + rounds, first_step + length, length
        offset = round - first_round
        return StagePlan(
            stage=stage, first=offset == 0, steps=period, first_step=first_step + offset * period,
            lr=self._stage_lr(stage), previous_length=previous,
        )

    def _stage_lr(self, stage: int) -> float:
        """eta_s = eta_0 / 3^(s-1); 0 once 3^(s-1) leaves the float range (s > 647)."""
        try:
            lr: float = self.hp.lr / 3.0 ** (stage - 1)
            return lr
        except OverflowError:
            return 0.0

    # -- server side ----------------------------------------------------------------------------------------------
    def round(self, fed: Round, server: StageServer) -> StageServer:
        """One round of stage s: at the stage's first round, v_ref = the previous stage's time average (x_0 in
        stage 1, from ``init``), and CoDA restarts the dual; then I_s local steps and the cohort means."""
        self.check(fed.problem)
        plan = self.plan(fed.number)
        if plan.first and plan.stage > 1:
            v_ref = server.x_acc / plan.previous_length
            x = v_ref.clone() if self.hp.restart_from == "average" else server.x
            server = server.replace(x=x, v_ref=v_ref, x_acc=torch.zeros_like(x))
        if plan.first and self.restarts_dual:
            server = server.replace(y=self.restart_dual(fed, server.x, server.y))
        means = fed.local_steps(Proximal(x=server.x, y=server.y, v_ref=server.v_ref), plan.steps)
        return server.replace(x=means.x, y=means.y, x_acc=server.x_acc + means.x_sum)

    def check(self, problem: Any) -> None:
        """Fail before any client work when the task lacks what the options need."""

    def restart_dual(self, fed: Round, x: Tensor, y: Tensor) -> Tensor:
        """CoDA's dual restart at the stage's start point x: alpha = margin + mean negative score - mean positive
        score over the cohort's scored batches; y unchanged when a class was not seen."""
        if not isinstance(fed.problem, ScoredProblem):
            raise ConfigError(
                f"algorithm.name = {self.name!r} restarts the dual from class-wise mean scores, but the task's problem "
                f"{type(fed.problem).__name__} has no scores(x, batch) / labels(batch); allowed without them: "
                f"algorithm.coda_mode = 'plain_local_sgda'"
            )
        if y.numel() != 1:
            raise ConfigError(
                f"algorithm.name = {self.name!r}: the dual restart needs a scalar dual y, got {y.numel()} entries; "
                f"allowed without it: algorithm.coda_mode = 'plain_local_sgda'"
            )
        sums = fed.call("coda_restart", fed.cohort(), Model(x=x, y=y), message="embedding").class_sums
        margin = float(getattr(fed.problem, "margin", 0.0))
        pos_sum, pos_count, neg_sum, neg_count = (float(v) for v in sums)
        alpha = dual_restart_value(pos_sum, pos_count, neg_sum, neg_count, margin=margin)
        return y if alpha is None else torch.full_like(y, alpha)

    # -- client side ----------------------------------------------------------------------------------------------
    @abstractmethod
    def step(
        self, problem: Any, x: Tensor, y: Tensor, gx: Tensor, gy: Tensor, v_ref: Tensor | None, lr: float
    ) -> tuple[Tensor, Tensor]:
        """One local primal-dual step from the batch gradients (gx, gy); ``v_ref`` None: no proximal term."""

    def local_steps(self, problem: MinimaxProblem, client: Model, ctx: ClientContext) -> tuple[Model, Tensors, StepInfo]:
        """Client program: the round's I_s local steps from the broadcast; outputs x, y and, in a stagewise round
        (a :class:`Proximal` record), the sum of the round's iterates x (for the server's exact time average)."""
        plan = self.plan(ctx.round)
        v_ref = client.v_ref if isinstance(client, Proximal) else None
        x, y = client.x, client.y
        x_sum, samples, loss = torch.zeros_like(x), 0, 0.0
        for i in range(plan.steps):
            batch = problem.sample(ctx.client, "inner", self.hp.outer_batch, ctx.rng(plan.first_step + i))
            gx, gy, value = grad_xy_and_value(lambda a, b: problem.loss(a, b, batch), x, y)  # noqa: B023 (called in this iteration)
            x, y = self.step(problem, x, y, gx, gy, v_ref, plan.lr)
            x_sum = x_sum + x
            samples += batch_size(batch)
            loss += float(value) / plan.steps
        outputs = {"x": x, "y": y} if v_ref is None else {"x": x, "y": y, "x_sum": x_sum}
        return client.replace(x=x, y=y), outputs, StepInfo(samples, loss)

    def coda_restart(self, problem: ScoredProblem, client: Model, ctx: ClientContext) -> tuple[Model, Tensors, StepInfo]:
        """Client program: class-wise score sums and counts of n_s forward-only batches at the broadcast x."""
        plan = self.plan(ctx.round)
        n = self.hp.restart_batches or 3**plan.stage
        gen = ctx.rng(-1, plan.stage)  # apart from the local steps' streams (keyed by one step index)
        sums, samples = torch.zeros(4, dtype=torch.float64), 0
        with torch.no_grad():
            for _ in range(n):
                batch = problem.sample(ctx.client, "inner", self.hp.outer_batch, gen)
                scores = problem.scores(client.x, batch).reshape(-1).double()
                positive = problem.labels(batch).reshape(-1).to(scores.device) > 0
                counts = positive.sum().double()
                sums += torch.stack([
                    scores[positive].sum(), counts, scores[~positive].sum(), positive.numel() - counts
                ]).cpu()
                samples += int(positive.numel())
        return client, {"class_sums": sums.float()}, StepInfo(samples)

    def reads(self, name: str) -> type[State]:
        """The local steps read their broadcast's record (``Steps``: with the stage's v_ref, or without)."""
        return self.Steps if name == "local_steps" else super().reads(name)


@register_algorithm("coda")
class CoDA(_Stagewise):
    """CoDA: stagewise proximal local SGDA with dual restarts; v = (w, a, b) and alpha averaged every I steps."""

    HParams: ClassVar[type[Params]] = CoDAHParams
    description = "CoDA: stagewise proximal local SGDA with dual restarts; x, y averaged (Guo et al. 2020; A19)"
    hp: CoDAHParams
    restarts_dual = True

    def __new__(cls, hparams: Any = None) -> CoDA:
        """``coda_mode: plain_local_sgda`` builds :class:`PlainLocalSGDA` (no stages: another server state)."""
        plain = hparams is not None and hparams.coda_mode == "plain_local_sgda"
        return super().__new__(PlainLocalSGDA if plain else cls)

    def lengths(self, stage: int) -> tuple[int, int]:
        return self.hp.stage_steps * 3 ** (stage - 1), self.hp.local_steps

    def step(
        self, problem: Any, x: Tensor, y: Tensor, gx: Tensor, gy: Tensor, v_ref: Tensor | None, lr: float
    ) -> tuple[Tensor, Tensor]:
        direction = gx if v_ref is None else gx + (x - v_ref) / self.hp.gamma
        return x - lr * direction, y + lr * gy


class PlainLocalSGDA(CoDA):
    """``coda_mode: plain_local_sgda``: local SGDA with the constant step eta_0 from the broadcast (x, y), no
    stages, no proximal term, no dual restart; x and y averaged every I steps."""

    Server = Steps = Model

    def init(self, variables: Tensors) -> Model:  # type: ignore[override]
        return Model(x=variables["x"].clone(), y=variables["y"].clone())

    def plan(self, round: int) -> StagePlan:
        q = self.hp.local_steps
        return StagePlan(stage=1, first=round == 0, steps=q, first_step=round * q, lr=self.hp.lr, previous_length=0)

    def round(self, fed: Round, server: Model) -> Model:  # type: ignore[override]
        return server.replace(**fed.local_steps(server, self.hp.local_steps))


@register_algorithm("coda-plus")
class CODAPlus(_Stagewise):
    """CODA+: stagewise proximal local primal-dual SGD with clipping, weight decay and alpha >= 0."""

    HParams: ClassVar[type[Params]] = CODAPlusHParams
    description = "CODA+: stagewise proximal local primal-dual SGD, alpha >= 0; x, y averaged (Yuan et al. 2021; A7)"
    hp: CODAPlusHParams

    def lengths(self, stage: int) -> tuple[int, int]:
        period = min(self.hp.local_steps * self.hp.period_growth ** (stage - 1), self.hp.stage_steps)
        return self.hp.stage_steps, period

    def check(self, problem: Any) -> None:
        if self.hp.dual_step == "closed-form" and not isinstance(problem, MarginAUCProblem):
            raise ConfigError(
                f"algorithm.dual_step = 'closed-form' needs the task's margin and auc_ab(x); the task's problem "
                f"{type(problem).__name__} has neither; allowed with it: gradient"
            )

    def step(
        self, problem: Any, x: Tensor, y: Tensor, gx: Tensor, gy: Tensor, v_ref: Tensor | None, lr: float
    ) -> tuple[Tensor, Tensor]:
        hp = self.hp
        assert v_ref is not None  # CODA+'s local steps always read a stage's reference point
        clipped = gx if hp.clip is None else gx.clamp(-hp.clip, hp.clip)
        x = x - lr * (clipped + (x - v_ref) / hp.gamma + hp.weight_decay * x)
        if hp.dual_step == "closed-form":
            a, b = problem.auc_ab(x)
            gy = 2 * (problem.margin + b - a) - 2 * y
        return x, (y + lr * gy).clamp(*DUAL_CLAMP)
