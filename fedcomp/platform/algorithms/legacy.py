"""The first core's algorithm API, kept while the algorithms move to the typed one in
:mod:`fedcomp.platform.algorithms.base`: untyped dict states whose ``synced`` keys are averaged, and round
programs over the raw federation that build their :class:`~fedcomp.platform.rounds.RoundRecord` themselves.
Algorithms still written against it: CoDA / CODA+, LocalSCGDAM / LocalSGDAM.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext, Federation, StepInfo
from fedcomp.platform.params import Params
from fedcomp.platform.rounds import RoundRecord

State = dict[str, Tensor]
"""A client's (or the server's) algorithm state: named flat float32 tensors."""


@dataclass(frozen=True)
class RoundContext:
    """What a server-side round program may use besides the federation and the state."""

    round: int
    cohort: Callable[[int], list[int]]
    """``cohort(k)`` -> the clients of the round's k-th sampled cohort (programs that resample clients per
    sub-round, as FedNest does, ask for 0, 1, ...; cohort 0 is the round's)."""
    rng: Callable[..., torch.Generator]
    """``rng(*ids)`` -> a server-side generator keyed by the round and ``ids``."""
    problem: Any
    """The task's problem object for the algorithm's kind (for properties such as ``minimax``; no data)."""
    clients: int | None = None
    """N, the number of registered clients (``federation.clients``), for server updates that scale by the
    participating share |S|/N (SCAFFOLD's control variate); ``None`` in contexts built by hand without it."""


class DictAlgorithm(ABC):
    """Base class: subclasses set ``kind``, ``HParams``, ``synced`` and write ``init_state``/``local_step``."""

    name: ClassVar[str]
    kind: ClassVar[str]
    HParams: ClassVar[type[Params]]
    synced: ClassVar[tuple[str, ...]]
    """State keys averaged over the cohort at each communication; the rest of the state stays on the client."""
    description: ClassVar[str] = ""
    vectorisable: ClassVar[bool] = False
    """Whether the ``local_steps`` program may run a host's clients in lockstep under ``torch.func.vmap``
    (see :class:`DrawUpdate`)."""
    transient_programs: ClassVar[frozenset[str]] = frozenset()
    """Client programs whose effect on private state need not be saved after each call: they run in a
    sequence that ends with a saving program (FedDRO's per-step calls end with the model round), and a
    replacement client replays them from the federation's log. Every other program's private state is
    saved after each call."""

    def __init__(self, hparams: Params) -> None:
        self.hp: Any = hparams

    # -- what the runtime uses (the same names as the typed API's) ----------------------------------
    @property
    def averaged(self) -> tuple[str, ...]:
        return self.synced

    round_local: ClassVar[frozenset[str]] = frozenset()

    def begin(self, state: State) -> State:
        return state

    def start_state(self, broadcast: State) -> State:
        return self.init_state(broadcast)

    def program(self, name: str) -> Callable[[Any, State, ClientContext], tuple[State, State, StepInfo]]:
        return getattr(self, name)

    # -- client side ------------------------------------------------------------------------------
    @abstractmethod
    def init_state(self, params: State) -> State:
        """The state a client starts from, given the variables (``x``, maybe ``y``) it first receives.

        On the server it is called with the task's initial variables; its ``synced`` keys are the initial
        global state.
        """

    @abstractmethod
    def local_step(
        self, problem: Any, client: int, state: State, step: int, gen: torch.Generator
    ) -> tuple[State, StepInfo]:
        """One local update of one client at global step index ``step`` (0-based); returns a new state."""

    def local_steps(self, problem: Any, state: State, ctx: ClientContext) -> tuple[State, State, StepInfo]:
        """Client program: ``q`` local steps from the broadcast state; outputs the ``synced`` keys."""
        q = self.hp.local_steps
        total = StepInfo()
        for s in range(q):
            step = ctx.round * q + s
            state, info = self.local_step(problem, ctx.client, state, step, ctx.rng(step))
            total.samples += info.samples
            total.loss += info.loss / q
        return state, {k: state[k] for k in self.synced}, total

    # -- server side ------------------------------------------------------------------------------
    def round(self, federation: Federation, state: State, ctx: RoundContext) -> tuple[State, RoundRecord]:
        """One round of the algorithm (one server iteration; possibly several communication sub-rounds).

        This default: q local steps on every client of ``ctx.cohort(0)``, then average ``synced``.
        """
        out = federation.call("local_steps", ctx.round, ctx.cohort(0), {k: state[k] for k in self.synced})
        record = RoundRecord(
            comm_rounds=1,
            local_steps=self.hp.local_steps,
            samples=out.samples,
            floats_up=out.floats_up,
            floats_down=out.floats_down,
            train_loss=out.loss,
        )
        return {**state, **out.means}, record


class DictDrawUpdate(DictAlgorithm):
    """An algorithm whose local step is ``update(draw(...))``: drawing the step's samples (keyed randomness,
    one client at a time) apart from a pure tensor update. The update uses ``torch.func`` transforms only, so
    a host can run the clients it holds in lockstep under ``torch.func.vmap`` (:mod:`fedcomp.platform.vectorised`)
    with the same numbers as one at a time."""

    vectorisable: ClassVar[bool] = True

    @abstractmethod
    def draw(self, problem: Any, client: int, step: int, gen: torch.Generator) -> tuple[Any, int]:
        """The step's samples (a tuple of tensors, the same shapes for every client) and their oracle count."""

    @abstractmethod
    def update(self, problem: Any, state: State, batch: Any, step: int) -> tuple[State, Tensor]:
        """The new state and the step's training loss (a 0-d tensor), from the state and the drawn samples."""

    def update_tensors(self, problem: Any, state: State, batch: Any, step: int) -> tuple[State, Tensor]:
        return self.update(problem, state, batch, step)

    def local_step(self, problem: Any, client: int, state: State, step: int, gen: torch.Generator) -> tuple[State, StepInfo]:
        batch, samples = self.draw(problem, client, step, gen)
        state, loss = self.update(problem, state, batch, step)
        return state, StepInfo(samples, float(loss))
