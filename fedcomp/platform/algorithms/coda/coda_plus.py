"""CODA+ (``coda-plus``; Yuan, Guo, Xu, Ying, Yang, ICML 2021; **[code: LibAUC PESG / CODASCA example]**), as
restated in ``reference/ALGORITHMS.md`` 6.2 (A7)::

    for stage s = 1, 2, ...:          T_s = T0 local steps,  eta_s = eta_0 3^-(s-1),  I_s = I (default)
        v_ref = x_0 (s = 1), else the previous stage's output (``stage_average``, :mod:`.stagewise`); alpha
                carries over; the stage continues from the last iterate (``restart_from: last``, LibAUC)
        for each local step:  d_v   = clip(g_v, c) + (1/gamma)(v - v_ref) + wd v     # clip: elementwise, as LibAUC
                              v     = v - eta_s d_v
                              alpha = clamp(alpha + eta_s g_alpha, 0, 999)           # LibAUC's margin semantics
        every I_s steps: the server averages v and alpha

``dual_step: closed-form`` replaces g_alpha by LibAUC's 2(m + b - a) - 2 alpha, with (a, b) the primal's new values
and m the task's margin (it needs :class:`~.stages.MarginAUCProblem`). LibAUC starts v_ref at small random values;
here the first stage's v_ref is x_0. ``period_growth: g`` makes the period grow by stages, I_s = min(I g^(s-1), T0)
-- the CODA+ paper lets I_s increase; this geometric shape with a constant T_s is **[inferred]**, the default g = 1
is the reference code's constant period.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedcomp.platform.algorithms.builtins import CODA_PLUS, CODAPlusHParams
from fedcomp.platform.algorithms.coda.stages import MarginAUCProblem
from fedcomp.platform.algorithms.coda.stagewise import Stagewise
from fedcomp.platform.algorithms.momentum_gda import DUAL_CLAMP
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.registry import register_algorithm

__all__ = ["CODAPlus", "CODAPlusHParams"]


@register_algorithm(CODA_PLUS)
class CODAPlus(Stagewise):
    """CODA+: stagewise proximal local primal-dual SGD with clipping, weight decay and alpha >= 0."""

    hp: CODAPlusHParams

    def lengths(self, stage: int) -> tuple[int, int]:
        period = min(self.hp.local_steps * self.hp.period_growth ** (stage - 1), self.hp.stage_steps)
        return self.hp.stage_steps, period

    def check(self, problem: Any, y: Tensor) -> None:
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
