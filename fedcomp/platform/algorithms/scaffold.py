"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020) -- the LocalSCGDAM paper's extra
baseline A22, in its standard form (``reference/ALGORITHMS.md`` section 9.7).

Server state: the model x and the server control variate c. Each client i keeps a private control variate
c_i (zero until its first round; kept across rounds, also through rounds it sits out, and saved in
checkpoints as the clients' private state). A round, with cohort S of the N registered clients and p local
steps of size lr::

    every i in S:  y_i = x;  p times: y_i = y_i - lr (grad f_i(y_i; batch) - c_i + c)
                   option II (default):  c_i+ = c_i - c + (x - y_i) / (p lr)
                   option I:             c_i+ = grad f_i(x; B_i)   (one extra batch at x, drawn with the round's
                                                                    first; ``control_batch`` examples)
                   uploads y_i - x and c_i+ - c_i;  keeps c_i = c_i+
    server:        x = x + eta_g <y_i - x>,   c = c + (|S| / N) <c_i+ - c_i>

The defaults are the paper's: option II, eta_g = 1 and full participation (then c stays the mean of the
c_i). The loss of the LocalSCGDAM paper's STL10 run was presumably cross-entropy **[unknown]**: here it is
whatever the plain task's loss is.

Implementation: a :class:`DrawUpdate`, so lockstep hosts can vectorise it. The client's program outputs
x := y_i and c := c + (c_i+ - c_i) at its last local step; their cohort means are <y_i> and c + <c_i+ - c_i>,
from which the server takes the two steps above (the same floats on the wire as the two differences). The
round's starting point x is held in the state as ``x_start`` during the round only (option I also holds
c_i+ there as ``control_next``); both are dropped at the last step, so c_i is the only private state.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from fedcomp.platform.algorithms.base import CommonHParams, Federation, grad_and_loss
from fedcomp.platform.algorithms.legacy import DictDrawUpdate, RoundContext, State
from fedcomp.platform.rounds import RoundRecord
from fedcomp.platform.params import Params
from fedcomp.platform.problems import PLAIN, PlainProblem
from fedcomp.platform.registry import register_algorithm

__all__ = ["Scaffold", "ScaffoldHParams"]


class ScaffoldHParams(CommonHParams):
    """Local step lr (eta_l), p (``local_steps``), batch, the server step eta_g and the control update."""

    server_lr: float = Field(1.0, gt=0, description="eta_g, the server step on the averaged model change")
    control: Literal["option2", "option1"] = Field(
        "option2", description="c_i+ from the local progress (option II, the paper's default) or grad f_i(x) (option I)"
    )
    control_batch: int | None = Field(
        None, ge=1, description="option I: examples of the extra batch at x; null = outer_batch"
    )

    @model_validator(mode="after")
    def _check(self) -> "ScaffoldHParams":
        if self.control_batch is not None and self.control != "option1":
            raise ValueError(f"control_batch = {self.control_batch}: only option1 draws a control batch (control = {self.control!r})")
        return self


@register_algorithm("scaffold")
class Scaffold(DictDrawUpdate):
    """Local steps corrected by c - c_i; x and c move by the cohort's mean changes (c scaled by |S|/N)."""

    kind = PLAIN
    HParams: ClassVar[type[Params]] = ScaffoldHParams
    synced = ("x", "c")
    """The server's state and what each client's program outputs (its y_i and c + c_i+ - c_i); c_i is private."""
    description = "SCAFFOLD (Karimireddy et al. 2020): control variates correct the client drift (A22)"

    def init_state(self, params: State) -> State:
        x = params["x"]
        return {"x": x.clone(), "c": torch.zeros_like(x), "c_i": torch.zeros_like(x)}

    def draw(self, problem: PlainProblem, client: int, step: int, gen: torch.Generator) -> tuple[tuple, int]:
        b = self.hp.outer_batch
        batch = problem.sample_batch(client, b, gen)
        if self.hp.control == "option1" and step % self.hp.local_steps == 0:
            extra = self.hp.control_batch or b
            return (batch, problem.sample_batch(client, extra, gen)), b + extra
        return (batch,), b

    def update(self, problem: PlainProblem, state: State, batch: tuple, step: int) -> tuple[State, Tensor]:
        q, lr = self.hp.local_steps, self.hp.lr
        first, last = step % q == 0, step % q == q - 1
        y, c, c_i = state["x"], state["c"], state["c_i"]
        new: State = {k: v for k, v in state.items()}
        if first:
            new["x_start"] = y
            if self.hp.control == "option1":
                new["control_next"], _ = grad_and_loss(problem, y, batch[1])
        grad, loss = grad_and_loss(problem, y, batch[0])
        y = y - lr * (grad - c_i + c)
        new["x"] = y
        if last:
            if self.hp.control == "option1":
                c_next = new.pop("control_next")
            else:
                c_next = c_i - c + (new["x_start"] - y) / (q * lr)
            del new["x_start"]
            new["c"], new["c_i"] = c + (c_next - c_i), c_next
        return new, loss

    def round(self, federation: Federation, state: State, ctx: RoundContext) -> tuple[State, RoundRecord]:
        if ctx.clients is None:
            raise ValueError("scaffold needs the number of registered clients N (RoundContext.clients) for |S|/N")
        x, c = state["x"], state["c"]
        out = federation.call("local_steps", ctx.round, ctx.cohort(0), {"x": x, "c": c})
        share = out.clients / ctx.clients
        new = {
            **state,
            "x": x + self.hp.server_lr * (out.means["x"] - x),
            "c": c + share * (out.means["c"] - c),
        }
        record = RoundRecord(
            comm_rounds=1,
            local_steps=self.hp.local_steps,
            samples=out.samples,
            floats_up=out.floats_up,  # y_i - x and c_i+ - c_i
            floats_down=out.floats_down,  # x and c
            train_loss=out.loss,
        )
        return new, record
