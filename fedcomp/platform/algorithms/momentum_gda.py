"""Local descent-ascent with momentum: the loop that LocalSCGDAM (:mod:`.local_scgdam`) and LocalSGDAM
(:mod:`.local_sgdam`) share -- "Federated Compositional Deep AUC Maximization" (Zhang, Zhang, Yang, Souvenir,
Gao; NeurIPS 2023), Algorithm 1, as restated in ``reference/ALGORITHMS.md`` sections 9.2 and 9.3 (A17, A18).

With eta = ``lr``, every iteration t of both algorithms moves with the previous momenta, then refreshes them
from fresh gradients (gx, gy) at the new point::

    x = x - gamma_x eta u                              # descent with the previous momentum
    y = y + gamma_y eta v                              # ascent
    u = (1 - beta_x eta) u + beta_x eta gx             # x-side momentum
    v = (1 - beta_y eta) v + beta_y eta gy             # y-side momentum

The init estimates u and v from samples of their own (the pseudo-code's init). How the sequence maps onto local
steps (global index s = round * p + i): step 0 runs the init on its own draws and then iteration t = 0 on the
next draws; every step s >= 1 runs iteration t = s. So the p-th step of round r ends iteration t = (r + 1) p - 1
and the server averages exactly where the pseudo-code does. The init's draws are part of step 0 (drawn first),
so its sample count is twice that of later steps. Both algorithms are a draw and a pure update
(:class:`~fedcomp.platform.algorithms.base.LocalSteps`), so a host may run its clients in lockstep.

``dual: clamp`` keeps y in [0, 999] after each ascent step (LibAUC's margin form, pitfall S7); the paper's y is
unconstrained. The paper needs beta_x eta, beta_y eta in (0, 1) for its theory; here 1 is allowed too (a fresh
estimate, no averaging over time). The values in the paper's Appendix B are unavailable; the defaults are
ALGORITHMS.md 9.9's starting points **[inferred from LibAUC defaults]**: gamma_x eta = gamma_y eta = 0.1,
beta_x eta = beta_y eta = 0.9.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import LocalSteps
from fedcomp.platform.algorithms.builtins import MomentumGDAHParams

__all__ = ["DUAL_CLAMP", "MomentumGDA", "MomentumGDAHParams"]

DUAL_CLAMP = (0.0, 999.0)
"""LibAUC's range for the dual variable of its margin AUC loss (``torch.clamp(alpha, 0, 999)``)."""


class MomentumGDA(LocalSteps[Any, Any]):
    """The two descent-ascent moves with the previous momenta, and the momenta's update. A step's draw holds one
    batch, or two at the momenta's first estimate (the init's own draw first). A state here is any record with
    fields x, y, u and v."""

    def _move(self, state: Any) -> tuple[Tensor, Tensor]:
        hp = self.hp
        x = state.x - hp.gamma_x * hp.lr * state.u
        y = state.y + hp.gamma_y * hp.lr * state.v
        if hp.dual == "clamp":
            y = y.clamp(*DUAL_CLAMP)
        return x, y

    def _momenta(self, state: Any, gx: Tensor, gy: Tensor) -> tuple[Tensor, Tensor]:
        """u, v after an iteration whose fresh gradients are (gx, gy)."""
        bx, by = self.hp.beta_x * self.hp.lr, self.hp.beta_y * self.hp.lr
        return (1 - bx) * state.u + bx * gx, (1 - by) * state.v + by * gy

    def draw(self, problem: Any, client: int, step: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        """Step 0 draws the pseudo-code's init batches before the iteration's."""
        return self._draws(problem, client, 2 if step == 0 else 1, gen)

    def _draws(self, problem: Any, client: int, n: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        """``n`` independent draws of one iteration's samples, and the examples drawn."""
        draws = [self._draw(problem, client, gen) for _ in range(n)]
        return tuple(batch for batch, _ in draws), sum(examples for _, examples in draws)

    @abstractmethod
    def _draw(self, problem: Any, client: int, gen: torch.Generator) -> tuple[Any, int]:
        """One iteration's samples and the examples drawn."""
