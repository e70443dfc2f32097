"""What every FedNest sub-round and algorithm shares: the hyperparameters, the typed messages each sub-round
broadcasts (a client program reads the record its ``view`` parameter is annotated with), the keyed batches and
the fresh cohort per sub-round."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import Algorithm, ClientContext, StepInfo, Tensors
from fedcomp.platform.algorithms.builtins import FedNestHParams
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.kinds import BILEVEL
from fedcomp.platform.problems import BilevelProblem
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import MinimaxModel, State

__all__ = [
    "Cohorts", "Counted", "Counter", "CounterStep", "FedNestBase", "FedNestHParams", "Point", "Reply", "WithH",
    "WithP", "WithQ", "epoch_batch", "fresh_cohorts",
]


Point = MinimaxModel
"""(x, y): the server's state, a client's, and what every sub-round broadcasts (the min-max family's record)."""


@dataclass(frozen=True)
class WithQ(Point):
    q: Tensor
    """FedInn's SVRG anchor <grad_y g_i(x, y)>."""


@dataclass(frozen=True)
class WithP(Point):
    p: Tensor
    """A FedIHGP vector (p_{n-1}; for the ``code`` variant p_0), or its final estimate."""


@dataclass(frozen=True)
class WithH(Point):
    h: Tensor
    """The hypergradient: FedOut's SVRG anchor."""


@dataclass(frozen=True)
class Counter(Point):
    """A client of the ``code`` variant: its own Neumann counter, private, restarted once per epoch."""

    counter: Tensor
    """(I - H_i / l)^m p_0 after the client's m-th FedIHGP call of epoch ``counter_epoch``."""
    counter_epoch: Tensor
    """The epoch whose p_0 the counter started from (-1: none): the client's first call of an epoch restarts it."""


@dataclass(frozen=True)
class CounterStep(Counter):
    p: Tensor
    """p_0, broadcast with every call."""


V = TypeVar("V", bound=State)
Reply = tuple[V, Mapping[str, Tensor], StepInfo]
"""What a client program returns: its view (updated where it keeps private fields), outputs to average, counts."""
Counted = tuple[Tensor, StepInfo]
"""A client-side vector with the oracle calls (and loss) it took."""
Cohorts = Iterator[list[int]]


def fresh_cohorts(fed: Round) -> Cohorts:
    """The round's cohorts 0, 1, 2, ... in turn: FedNest samples a fresh cohort for every sub-round."""
    return (fed.cohort(k) for k in itertools.count())



class FedNestBase(Algorithm[Point, Point]):
    """The family's kind, records and keyed batches; the sub-round modules add their client programs."""

    kind = BILEVEL
    HParams = FedNestHParams
    Client: ClassVar[type[State]] = Point
    Server = Point
    hp: FedNestHParams

    def init(self, variables: Tensors) -> Point:
        return Point(x=variables["x"].clone(), y=variables["y"].clone())

    def _sample(
        self, problem: BilevelProblem, ctx: ClientContext, split: Literal["inner", "outer"], size: int | None, call: int, tag: int
    ) -> Any:
        """The client's batch of ``split`` keyed by (round, call, tag)."""
        return problem.sample(ctx.client, split, size, ctx.rng(ctx.round, call, tag))

    def _inner_batch(self, problem: BilevelProblem, ctx: ClientContext, step: int) -> Any:
        """FedInn's batch of local step ``step`` in this call, by ``inner_sampling``; its other randomness (dropout
        masks) is keyed by the step either way."""
        size = self.hp.inner_batch
        if self.hp.inner_sampling == "replacement" or size is None:
            return self._sample(problem, ctx, "inner", size, ctx.sub, step)
        n = problem.local_size(ctx.client, "inner")  # type: ignore[attr-defined]
        positions = epoch_batch(n, size, step, lambda e: ctx.rng(ctx.round, ctx.sub, -1 - e))
        return problem.sample_at(ctx.client, "inner", positions, ctx.rng(ctx.round, ctx.sub, step))  # type: ignore[attr-defined]

    def check_problem(self, problem: Any) -> None:
        if self.hp.inner_sampling == "epochs" and not all(hasattr(problem, a) for a in ("local_size", "sample_at")):
            raise ConfigError(
                f"algorithm.inner_sampling = 'epochs' needs a task whose clients hold local datasets: the task's "
                f"problem {type(problem).__name__} has no local_size / sample_at (allowed: 'replacement')"
            )


def epoch_batch(n: int, size: int, step: int, permutation_rng: Callable[[int], torch.Generator]) -> Tensor:
    """The positions of local step ``step``'s batch when steps walk through shuffled passes over ``n`` examples,
    each pass cut into batches of ``size`` and a smaller rest (a DataLoader with ``shuffle=True``): pass
    ``e = step // ceil(n / size)`` uses the permutation drawn from ``permutation_rng(e)``."""
    per_pass = -(-n // size)
    epoch, j = divmod(step, per_pass)
    return torch.randperm(n, generator=permutation_rng(epoch))[j * size : (j + 1) * size]
