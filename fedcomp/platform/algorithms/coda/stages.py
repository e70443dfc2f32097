"""The stage schedule and the dual restart of CoDA and CODA+, as pure functions (``reference/ALGORITHMS.md`` 9.4,
6.2).

A stage s has a nominal length T_s and a period I_s; it ends at the first communication at or after its T_s local
steps (T_s rounded up to whole rounds of I_s steps), and its step size is eta_s = eta_0 3^-(s-1). Where a round
sits in that schedule (:class:`StagePlan`) is a function of the round index alone, so a resumed run and every
client agree on it without communication.

CoDA's dual restart (the paper's alpha_{s-1}): alpha = margin + mean negative score - mean positive score at the
stage's start point, from the class-wise score sums and counts every client measures on its own batches and the
cohort all-reduces (four floats each way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["MarginAUCProblem", "ScoredProblem", "StagePlan", "class_sums", "dual_restart_value", "stage_plan"]


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


def stage_plan(lengths: Callable[[int], tuple[int, int]], lr0: float, round: int) -> StagePlan:
    """The stage, period, step offset and step size of round ``round`` under ``lengths(s) = (T_s, I_s)``.

    Walks the stages from the first; once two consecutive stages have the same lengths, all later ones do
    (true of both schedules here), and the rest is a closed form.
    """
    stage, first_round, first_step, previous = 1, 0, 0, 0
    while True:
        nominal, period = lengths(stage)
        rounds = -(-nominal // period)  # the stage ends at the first communication at or after T_s steps
        length = rounds * period
        if lengths(stage + 1) == (nominal, period):
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
        lr=stage_lr(lr0, stage), previous_length=previous,
    )


def stage_lr(lr0: float, stage: int) -> float:
    """eta_s = eta_0 / 3^(s-1); 0 once 3^(s-1) leaves the float range (s > 647)."""
    try:
        return lr0 / 3.0 ** (stage - 1)
    except OverflowError:
        return 0.0


def class_sums(problem: ScoredProblem, client: int, x: Tensor, batches: int, size: int, gen: torch.Generator) -> tuple[Tensor, int]:
    """(sum of positive scores, positives, sum of negative scores, negatives) over ``batches`` forward-only
    batches of ``size`` examples at the primal ``x``, as float32, with the examples scored."""
    sums, samples = torch.zeros(4, dtype=torch.float64), 0
    with torch.no_grad():
        for _ in range(batches):
            batch = problem.sample(client, "inner", size, gen)
            scores = problem.scores(x, batch).reshape(-1).double()
            positive = problem.labels(batch).reshape(-1).to(scores.device) > 0
            counts = positive.sum().double()
            sums += torch.stack([scores[positive].sum(), counts, scores[~positive].sum(), positive.numel() - counts]).cpu()
            samples += int(positive.numel())
    return sums.float(), samples


def dual_restart_value(
    pos_sum: float, pos_count: float, neg_sum: float, neg_count: float, margin: float = 0.0
) -> float | None:
    """alpha = margin + mean negative score - mean positive score; None when a class was not seen."""
    if pos_count <= 0 or neg_count <= 0:
        return None
    return margin + neg_sum / neg_count - pos_sum / pos_count
