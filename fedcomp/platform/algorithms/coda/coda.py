"""CoDA (``coda``; Guo, Liu, Yuan, Shen, Liu, Yang, ICML 2020; **[code: ZhishuaiGuo/DistributedAUC]**), as restated
in ``reference/ALGORITHMS.md`` 9.4 (A19); class C6, kind ``minimax``: the primal v = x = (w, a, b), the dual
y = [alpha], the task's ``loss(x, y, batch)``::

    for stage s = 1, 2, ...:          T_s = T0 3^(s-1) local steps,  eta_s = eta_0 3^-(s-1)
        v_ref = x_0 (s = 1), else the previous stage's output (``stage_average``, :mod:`.stagewise`);
                the stage starts from v_ref (``restart_from: average``) or from the last iterate
        dual restart: every client scores n_s forward-only batches at the stage's start point; the class-wise
                score sums and counts are all-reduced; alpha = mean negative score - mean positive score
        for each local step:  g_v, g_alpha = grad F(v, alpha; z) on one batch z
                              v     = v - eta_s (g_v + (1/gamma)(v - v_ref))        # proximal SGD on (w, a, b)
                              alpha = alpha + eta_s g_alpha                          # simultaneous ascent
        every I steps: the server averages v and alpha

n_s = 3^s batches of ``outer_batch`` examples (the code; ``restart_batches`` fixes it instead). alpha* =
E[h | negative] - E[h | positive] maximises the paper's (1 + alpha) square-loss form for fixed w (EXPERIMENTS.md
1.4), and m + E[h | negative] - E[h | positive] LibAUC's margin form **[derived]**: the restart adds the problem's
``margin`` where it has one. The code's two defects are not copied (ALGORITHMS.md 9.4): b's proximal term uses
(b - b_ref), and the dual step changes alpha at every step; nor its (a, b) restart from their values at the
previous stage's start. ``coda_mode: plain_local_sgda`` is the minimal baseline the LocalSCGDAM paper describes:
local SGDA with a constant step, no stages, no proximal term, no dual restart (:class:`PlainLocalSGDA`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext, StepInfo, Tensors
from fedcomp.platform.algorithms.builtins import CODA, CoDAHParams
from fedcomp.platform.algorithms.coda.stages import ScoredProblem, StagePlan
from fedcomp.platform.algorithms.coda.stagewise import Stagewise
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.problems import MinimaxProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import MinimaxModel

__all__ = ["CoDA", "CoDAHParams", "PlainLocalSGDA"]


@register_algorithm(CODA)
class CoDA(Stagewise):
    """CoDA: stagewise proximal local SGDA with dual restarts; v = (w, a, b) and alpha averaged every I steps."""

    hp: CoDAHParams
    restarts_dual = True

    def __new__(cls, hparams: Any = None) -> CoDA:
        """``coda_mode: plain_local_sgda`` builds :class:`PlainLocalSGDA` (no stages: another server state)."""
        plain = hparams is not None and hparams.coda_mode == "plain_local_sgda"
        return super().__new__(PlainLocalSGDA if plain else cls)

    def check(self, problem: Any, y: Tensor) -> None:
        """The dual restart needs the task's scores and labels, and a scalar dual."""
        if not isinstance(problem, ScoredProblem):
            raise ConfigError(
                f"algorithm.name = {self.name!r} restarts the dual from class-wise mean scores, but the task's problem "
                f"{type(problem).__name__} has no scores(x, batch) / labels(batch); allowed without them: "
                f"algorithm.coda_mode = 'plain_local_sgda'"
            )
        if y.numel() != 1:
            raise ConfigError(
                f"algorithm.name = {self.name!r}: the dual restart needs a scalar dual y, got {y.numel()} entries; "
                f"allowed without it: algorithm.coda_mode = 'plain_local_sgda'"
            )

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

    restarts_dual = False

    def __init__(self, hparams: Any) -> None:
        super().__init__(hparams)
        self.Server = self.Client = MinimaxModel  # type: ignore[misc]

    def init(self, variables: Tensors) -> MinimaxModel:
        return MinimaxModel(x=variables["x"].clone(), y=variables["y"].clone())

    def plan(self, round: int) -> StagePlan:
        q = self.hp.local_steps
        return StagePlan(stage=1, first=round == 0, steps=q, first_step=round * q, lr=self.hp.lr, previous_length=0)

    def round(self, fed: Round, server: MinimaxModel) -> MinimaxModel:
        return server.replace(**fed.local_steps(server, self.hp.local_steps))

    def local_steps(
        self, problem: MinimaxProblem, client: MinimaxModel, ctx: ClientContext
    ) -> tuple[MinimaxModel, Tensors, StepInfo]:
        """Client program: I local SGDA steps from the broadcast (x, y)."""
        x, y, _, info = self.steps(problem, client.x, client.y, None, self.plan(ctx.round), ctx)
        return client.replace(x=x, y=y), {"x": x, "y": y}, info
