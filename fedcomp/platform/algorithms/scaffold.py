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

Implementation: a :class:`LocalSteps` algorithm, so lockstep hosts can vectorise it. The client's program
outputs x := y_i and c := c + (c_i+ - c_i) at its last local step; their cohort means are <y_i> and
c + <c_i+ - c_i>, from which the server takes the two steps above (the same floats on the wire as the two
differences). The round's starting point x (``x_start``) and option I's c_i+ (``control_next``) are
round-local client fields, so c_i is the only private state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import LocalSteps, Tensors, grad_and_loss, grad_and_loss_pieces
from fedcomp.platform.algorithms.builtins import SCAFFOLD, ScaffoldHParams
from fedcomp.platform.problems import PlainProblem
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import State

__all__ = ["Scaffold", "ScaffoldHParams"]


@dataclass(frozen=True)
class ScaffoldServer(State):
    x: Tensor
    c: Tensor
    """The server control variate."""


@dataclass(frozen=True)
class ScaffoldClient(ScaffoldServer):
    c_i: Tensor
    """The client's control variate (private; zero until its first round)."""
    x_start: Tensor
    """The round's starting point x (round-local)."""
    control_next: Tensor
    """Option I's c_i+ = grad f_i(x; B_i), drawn at the round's first step (round-local)."""


@register_algorithm(SCAFFOLD)
class Scaffold(LocalSteps[ScaffoldClient, ScaffoldServer]):
    """Local steps corrected by c - c_i; x and c move by the cohort's mean changes (c scaled by |S|/N)."""

    Client, Server = ScaffoldClient, ScaffoldServer
    round_local = frozenset({"x_start", "control_next"})
    mutates = frozenset({"x"})

    def init(self, variables: Tensors) -> ScaffoldServer:
        x = variables["x"]
        return ScaffoldServer(x=x.clone(), c=torch.zeros_like(x))

    def join(self, broadcast: Tensors) -> ScaffoldClient:
        return super().join({**broadcast, "c_i": torch.zeros_like(broadcast["x"])})

    def begin(self, state: Tensors) -> Tensors:
        return {**state, "x_start": state["x"], "control_next": torch.zeros_like(state["x"])}

    def draw(self, problem: PlainProblem, client: int, step: int, gen: torch.Generator) -> tuple[tuple[Any, ...], int]:
        b = self.hp.outer_batch
        batch = problem.sample_batch(client, b, gen)
        if self.hp.control == "option1" and step % self.hp.local_steps == 0:
            extra = self.hp.control_batch or b
            return (batch, problem.sample_batch(client, extra, gen)), b + extra
        return (batch,), b

    def update(self, problem: PlainProblem, state: ScaffoldClient, batch: tuple[Any, ...], step: int) -> tuple[ScaffoldClient, Tensor]:
        control_next = self._control_next(problem, state, batch, step)
        grad, loss = grad_and_loss(problem, state.x, batch[0])
        y = state.x - self.hp.lr * (grad - state.c_i + state.c)
        return self._controls(state.replace(x=y), control_next, step), loss

    def update_(self, problem: PlainProblem, state: ScaffoldClient, batch: tuple[Any, ...], step: int) -> tuple[ScaffoldClient, Tensor]:
        """:meth:`update` with y written into x in place: ``d = (grad - c_i) + c``, ``d *= lr``, ``x -= d`` piece by
        piece (the same roundings); the control variates as there. (Not fused under ``federation.fused_sgd``: a
        linear weight would still need its correction ``c - c_i`` formed, weight-sized, which took the gain.)"""
        control_next = self._control_next(problem, state, batch, step)
        grad, loss = grad_and_loss_pieces(problem, state.x, batch[0])
        torch._foreach_sub_(grad, grad.of(state.c_i))
        torch._foreach_add_(grad, grad.of(state.c))
        torch._foreach_mul_(grad, self.hp.lr)
        torch._foreach_sub_(grad.of(state.x), grad)
        return self._controls(state, control_next, step), loss

    def _control_next(self, problem: PlainProblem, state: ScaffoldClient, batch: tuple[Any, ...], step: int) -> Tensor:
        """Option I's c_i+ (the gradient at the round's starting point, on the extra batch) at the round's first
        step; else what the client holds."""
        if step % self.hp.local_steps == 0 and self.hp.control == "option1":
            return grad_and_loss(problem, state.x, batch[1])[0]
        return state.control_next

    def _controls(self, stepped: ScaffoldClient, control_next: Tensor, step: int) -> ScaffoldClient:
        """The client after its step (``stepped.x`` is y): at the round's last step c_i <- c_i+ (option I's, or option
        II's (x_start - y) / (q lr) - c + c_i) and c tracks it, c <- c + (c_i+ - c_i)."""
        q = self.hp.local_steps
        new = stepped.replace(control_next=control_next)
        if step % q == q - 1:
            c_next = (control_next if self.hp.control == "option1"
                      else new.c_i - new.c + (new.x_start - new.x) / (q * self.hp.lr))
            new = new.replace(c=new.c + (c_next - new.c_i), c_i=c_next)
        return new

    def round(self, fed: Round, server: ScaffoldServer) -> ScaffoldServer:
        """x <- x + eta_g (<y_i> - x);  c <- c + (|S| / N) (<c + c_i+ - c_i> - c)."""
        cohort = fed.cohort()
        mean = fed.local_steps(server, self.hp.local_steps, cohort)
        share = len(cohort) / fed.clients
        return ScaffoldServer(
            x=server.x + self.hp.server_lr * (mean.x - server.x),
            c=server.c + share * (mean.c - server.c),
        )
