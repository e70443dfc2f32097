"""What every algorithm is: frozen hyperparameters, an explicit per-client state, a local step, and a
round program that says what each communication round does.

The common round -- every cohort client runs ``q`` local steps from the broadcast state, then the server
averages the state keys named in ``synced`` -- is :meth:`Algorithm.round` plus the client program
:meth:`Algorithm.local_steps`; an algorithm that follows it only writes ``init_state`` and ``local_step``.
Algorithms with other communication patterns (per-step exchanges, sub-rounds) override ``round`` and add
client programs; the federation runs any client program by name. Nothing here imports Ray.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol

import torch
from pydantic import Field
from torch import Tensor

from fedcomp.platform.params import Params
from fedcomp.platform.oracles import LOCKSTEP, grad_and_loss  # noqa: F401  (re-exported: algorithms import them from here)

State = dict[str, Tensor]
"""A client's (or the server's) algorithm state: named flat float32 tensors."""


class CommonHParams(Params):
    """Hyperparameters every local-steps algorithm has (the design card's grid axes)."""

    lr: float = Field(0.01, gt=0, description="step size (alpha)")
    local_steps: int = Field(50, ge=1, description="local steps per communication round (q / p / I)")
    outer_batch: int = Field(1, ge=1, description="outer samples (or examples) per local step (b)")


@dataclass
class StepInfo:
    """What one client program reports besides its outputs: oracle calls made and its mean training loss."""

    samples: int = 0
    loss: float = 0.0


@dataclass(frozen=True)
class ClientContext:
    """Everything a client program may use besides the state: who it is, which (sub-)round, its random streams."""

    client: int
    round: int
    sub: int
    """Which call of the round this is (round programs with several sub-rounds number their calls)."""
    rng: Callable[..., torch.Generator]
    """``rng(*ids)`` -> the client's generator keyed by ``ids`` (e.g. its global local-step index)."""


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


@dataclass
class Outcome:
    """The server's view of one client program run over a cohort: means of outputs plus counters."""

    means: State
    clients: int
    samples: int
    loss: float
    floats_up: int = 0
    """Floats each participating client uploaded."""
    floats_down: int = 0
    """Floats each participating client downloaded."""
    extra: dict[str, float] = field(default_factory=dict)


class Federation(Protocol):
    """Where client programs run (in-process or on Ray actors); identical numbers either way."""

    def call(self, program: str, round: int, cohort: list[int], payload: State, sub: int = 0) -> Outcome:
        """Run ``algorithm.<program>`` on every cohort client with ``payload``; return the means of its outputs."""
        ...

    def private_states(self) -> dict[int, State]:
        """Copies of every client's private (unsynchronised) state, for checkpoints."""
        ...

    def load_private_states(self, states: dict[int, State]) -> None:
        """Restore the clients' private states from a checkpoint."""
        ...

    def close(self) -> None:
        """Release processes and resources."""
        ...

    def describe(self) -> dict[str, Any]:
        """Where the clients run (recorded in ``run.json``)."""
        ...


@dataclass
class RoundRecord:
    """What one round adds to the counters (floats: per participating client), and its training loss.

    ``comm_rounds`` and ``floats_*`` count model-sized messages; ``embedding_*`` count the low-dimensional
    exchanges some algorithms make between them (FedDRO's inner value, every local step).
    """

    comm_rounds: int
    local_steps: int
    samples: int
    floats_up: int
    floats_down: int
    train_loss: float
    embedding_exchanges: int = 0
    embedding_floats_up: int = 0
    embedding_floats_down: int = 0


class Algorithm(ABC):
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


class DrawUpdate(Algorithm):
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

    def local_step(self, problem: Any, client: int, state: State, step: int, gen: torch.Generator) -> tuple[State, StepInfo]:
        batch, samples = self.draw(problem, client, step, gen)
        state, loss = self.update(problem, state, batch, step)
        return state, StepInfo(samples, float(loss))


def batch_size(batch: Any) -> int:
    """Examples in a batch (a tuple whose last item is a tensor of labels); 1 for data-free problems."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[-1], Tensor) and batch[-1].dim() > 0:
        return int(batch[-1].shape[0])
    return 1
