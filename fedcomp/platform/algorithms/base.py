"""What every algorithm is: frozen hyperparameters, a typed client state and a typed server state, client
programs, and a round program that says what each communication round does.

* ``Client`` / ``Server``: :class:`~fedcomp.platform.state.State` records. The server state is the whole
  global state (server momentum, control variates and FedDRO's y-bar included) and a checkpoint is that
  record plus the clients' records. Each broadcast overwrites the client fields that share a name with it;
  the client's other fields are private and stay on the client between rounds.
* ``init(variables) -> Server`` and ``join(broadcast) -> Client`` (a client's state the first time it takes part).
* ``start(fed, server) -> Server``: once, before round 0, the part of the initial server state that needs the
  clients or the task (FedDRO's first estimate y-bar_0; PDSGD's dual weights, one per training example); by
  default nothing. Its communication counts in round 0 (the first row of counters).
* ``round(fed, server) -> Server``: the round program, over the primitives of
  :class:`~fedcomp.platform.rounds.Round`; the round counts its communication itself.

The common family -- q local steps on every cohort client, then average -- is :class:`LocalSteps`: an
algorithm writes ``draw`` (the step's samples, keyed randomness) and a pure ``update``; the round program
is inherited. Nothing here imports Ray.

In-place steps: an algorithm of that family may also write ``update_``, the same floats as ``update`` written
into the client state's own tensors (the fields it names in ``mutates``, which each program copies once)
with ``torch._foreach_*`` ops over the gradient's pieces (:class:`~fedcomp.platform.oracles.Pieces`: the
model's parameter gradients as autograd makes them), so that a step assembles and allocates no flat vector. The program runs
``update_`` where it may (never in lockstep: ``vmap`` batches the pure ``update``); the conformance suite and
``benchmarks/same_numbers.py`` hold it to ``update``'s bits.
"""

from __future__ import annotations

import functools
import inspect
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch
from torch import Tensor

# re-exported: algorithms import them from here (and a user's hyperparameters subclass CommonHParams)
from fedcomp.platform.algorithms.builtins import CommonHParams as CommonHParams
from fedcomp.platform.errors import AlgorithmError, did_you_mean
from fedcomp.platform.oracles import (
    LOCKSTEP as LOCKSTEP,
    Pieces as Pieces,
    grad_and_loss as grad_and_loss,
    grad_and_loss_factors as grad_and_loss_factors,
    grad_and_loss_pieces as grad_and_loss_pieces,
)
from fedcomp.platform.params import Params
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import Means, State

C = TypeVar("C", bound=State)
S = TypeVar("S", bound=State)
Tensors = dict[str, Tensor]
"""A state or message as it crosses the wire: named flat float32 tensors."""


@dataclass
class StepInfo:
    """What one client program reports besides its outputs: oracle calls made and its mean training loss."""

    samples: int = 0
    loss: float = 0.0


def mean_loss(losses: list[Tensor] | list[float]) -> float:
    """The mean of a client program's step losses, read after its last step: the same float64 sum of
    ``float(loss) / q`` in step order as adding them up step by step, but one read for a GPU per program instead
    of one per step (reading a tensor on a GPU waits for every kernel queued before it, so a read per step keeps
    the host from queueing the next step while the GPU runs this one); 0-dim tensors are stacked and read at once
    (their values exact: stacking only widens a dtype)."""
    q, total = len(losses), 0.0
    if q and all(isinstance(loss, Tensor) and loss.dim() == 0 for loss in losses):
        values = torch.stack(typing.cast(list[Tensor], losses)).tolist()
    else:
        values = [float(loss) for loss in losses]
    for value in values:
        total += value / q
    return total


@dataclass(frozen=True)
class ClientContext:
    """Everything a client program may use besides the state: who it is, which (sub-)round, its random streams."""

    client: int
    round: int
    sub: int
    """Which call of the round this is (round programs with several sub-rounds number their calls)."""
    rng: Callable[..., torch.Generator]
    """``rng(*ids)`` -> the client's generator keyed by ``ids`` (e.g. its global local-step index)."""


@dataclass
class Outcome:
    """The server's view of one client program run over a cohort: means of outputs plus counters."""

    means: Tensors
    clients: int
    samples: int
    loss: float
    floats_up: int = 0
    """Floats each participating client uploaded."""
    floats_down: int = 0
    """Floats each participating client downloaded."""


@dataclass
class Exchanged:
    """What an exchange (``fed.exchange``) gave the server: the cohort means of each step's yield, in order (their
    ``floats_up`` the floats each client sent), and the outcome of the program's end."""

    steps: list[Outcome]
    final: Outcome


class Federation(Protocol):
    """Where client programs run (in-process or on Ray actors); identical numbers either way."""

    def call(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0) -> Outcome:
        """Run ``algorithm.<program>`` on every cohort client with ``payload``; return the means of its outputs."""
        ...

    def begin(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0, last: bool = False) -> Outcome:
        """Start the generator program ``algorithm.<program>`` on every cohort client with ``payload`` and run
        it to its first yield (``last``: to its end); the means of what it yielded (returned)."""
        ...

    def resume(self, means: Tensors, last: bool = False) -> Outcome:
        """Send ``means`` into every cohort client's generator and run it to its next yield (``last``: its end)."""
        ...

    def exchange(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int, steps: int) -> Exchanged:
        """Run the generator program ``algorithm.<program>`` on every cohort client with ``payload``, answering each
        of its ``steps`` yields with the cohort means of what it yielded: each step's means, then the outcome of its
        end."""
        ...

    def private_states(self) -> dict[int, Tensors]:
        """Copies of every client's private (unsynchronised) state, for checkpoints."""
        ...

    def load_private_states(self, states: dict[int, Tensors]) -> None:
        """Restore the clients' private states from a checkpoint."""
        ...

    def close(self) -> None:
        """Release processes and resources."""
        ...

    def describe(self) -> dict[str, Any]:
        """Where the clients run (recorded in ``run.json``)."""
        ...


Exchange = Generator[Mapping[str, Tensor], Means, tuple[C, Mapping[str, Tensor], StepInfo]]
"""A client program run by ``fed.exchange`` (``Exchange[Client]``): it yields the values to exchange, receives
their cohort means, and returns (new client state, outputs to average, info)."""

ClientProgram = Callable[[Any, Any, ClientContext], tuple[Any, Mapping[str, Tensor], StepInfo]]
"""``program(problem, client_state, ctx) -> (new client state, outputs to average, info)``; a program run by
``fed.exchange`` is a generator that yields values to exchange before it returns that triple."""


class Algorithm(ABC, Generic[C, S]):
    """Base class: subclasses set ``kind``, ``HParams``, ``Client``, ``Server`` and write ``init`` and ``round``."""

    name: ClassVar[str]
    kind: ClassVar[str]
    HParams: ClassVar[type[Params]]
    Client: ClassVar[type[State]]
    Server: ClassVar[type[State]]
    description: ClassVar[str] = ""
    vectorisable: ClassVar[bool] = False
    """Whether the ``local_steps`` program may run a host's clients in lockstep under ``torch.func.vmap``."""
    round_local: ClassVar[frozenset[str]] = frozenset()
    """Client fields that live for one client program only (FedProx's proximal anchor): :meth:`begin` sets them
    when the program starts, and they are not kept on the client afterwards."""

    def __init__(self, hparams: Params) -> None:
        self.hp: Any = hparams

    @abstractmethod
    def init(self, variables: Tensors) -> State:
        """The server's state before round 0, from the task's initial variables (``x``, maybe ``y``): the whole
        ``Server`` record, or the part of it that :meth:`start` completes."""

    def check_problem(self, problem: Any) -> None:
        """Raise :class:`~fedcomp.platform.errors.ConfigError` when the task's ``problem`` lacks what these
        hyperparameters need; called when the server is built, before a run folder exists. By default nothing."""

    def start(self, fed: Round, server: Any) -> S:
        """Once, before round 0 (the server calls it with round 0's :class:`Round`, so what it communicates
        counts in round 0): the initial server state that needs the clients or the task's problem -- FedDRO's
        first estimate y-bar_0 = <g_k(x_0; b)>, PDSGD's dual weights over the task's examples. A server restored
        from a checkpoint does not start again. By default ``init``'s state as it is."""
        return server  # type: ignore[no-any-return]

    def join(self, broadcast: Tensors) -> C:
        """A client's state the first time it takes part, from the first broadcast it receives; by default the
        broadcast fields themselves: no program writes the tensors it is given (an in-place step copies the
        fields it writes first). An algorithm with private fields that start otherwise overrides this.

        Raises:
            AlgorithmError: a private field is in neither the broadcast nor :attr:`round_local`, naming it.
        """
        state = self.begin(dict(broadcast))
        missing = [name for name in self.Client.names() if name not in state]
        if missing:
            raise AlgorithmError(
                f"{type(self).__qualname__}: its Client record {self.Client.__name__} has {', '.join(missing)}, which "
                f"the server does not send (the broadcast holds {', '.join(sorted(broadcast)) or 'nothing'}) and which "
                f"no join starts: override join(broadcast) to give a client's first value (unsent() for one that its "
                f"first step makes), or add it to the Server record")
        return self.Client.of(state)  # type: ignore[return-value]

    @abstractmethod
    def round(self, fed: Round, server: S) -> S:
        """One server round (one iteration of the paper's outer loop); returns the new server state."""

    # -- what the runtime uses -------------------------------------------------------------------------
    @property
    def averaged(self) -> tuple[str, ...]:
        """Client fields the server keeps a copy of: broadcast to the cohort, averaged back by ``local_steps``."""
        server = set(self.Server.names())
        return tuple(n for n in self.Client.names() if n in server)

    def begin(self, state: Tensors) -> Tensors:
        """The client's state as a program starts (after the broadcast overwrote its shared fields): sets the
        :attr:`round_local` fields; by default there are none."""
        return state

    def start_state(self, broadcast: Tensors) -> Tensors:
        return self.join(broadcast).tensors()

    def reads(self, name: str) -> type[State]:
        """The record client program ``name`` is given: what its state parameter is annotated with when that is a
        record (FedNest's sub-round programs read the round's broadcast values, e.g. ``WithQ``), else ``Client``.
        It is built from the client's private fields and the broadcast."""
        return _annotated_record(type(self), name) or self.Client

    def program(self, name: str) -> Callable[[Any, Tensors, ClientContext], Any]:
        """The client program ``name`` on the wire form of the client state: it gets its :meth:`reads` record;
        the fields it does not read stay as they are (a generator stays a generator: what it yields and
        receives passes through)."""
        method = getattr(self, name, None)
        if not callable(method):  # a misspelt fed.call("...")
            methods = [n for n in dir(type(self)) if not n.startswith("_") and callable(getattr(type(self), n))]
            raise AlgorithmError(f"{type(self).__qualname__}: a round calls the client program {name!r}, which it "
                                 f"does not define{did_you_mean(name, methods)}")
        record = self.reads(name)
        if inspect.isgeneratorfunction(method):

            def exchange(problem: Any, state: Tensors, ctx: ClientContext) -> Generator[Any, Any, tuple[Tensors, Tensors, StepInfo]]:
                view, outputs, info = yield from method(problem, record.of(state), ctx)
                return {**state, **view.tensors()}, dict(outputs), info

            return exchange

        def run(problem: Any, state: Tensors, ctx: ClientContext) -> tuple[Tensors, Tensors, StepInfo]:
            view, outputs, info = method(problem, record.of(state), ctx)
            return {**state, **view.tensors()}, dict(outputs), info

        return run


@functools.cache
def _annotated_record(cls: type, name: str) -> type[State] | None:
    """The record the state parameter of ``cls.<name>`` is annotated with, if it is one (not a type variable)."""
    hints = typing.get_type_hints(getattr(cls, name))
    record = next((t for k, t in hints.items() if k not in ("self", "problem", "ctx", "return")), None)
    return record if isinstance(record, type) and issubclass(record, State) else None


class LocalSteps(Algorithm[C, S]):
    """An algorithm of the local-steps family: every cohort client takes ``local_steps`` steps
    ``update(draw(...))`` from the broadcast, then the server averages the shared fields.

    ``draw`` makes the step's samples (keyed randomness, one client at a time) and ``update`` is a pure tensor
    function using ``torch.func``-compatible oracles only, so a host can run the clients it holds in lockstep
    under ``torch.func.vmap`` (:mod:`fedcomp.platform.vectorised`) with the same numbers up to rounding.
    """

    vectorisable: ClassVar[bool] = True
    mutates: ClassVar[frozenset[str]] = frozenset()
    """Client fields :meth:`update_` writes in place (each program takes its own copies of them first); empty
    when the algorithm has no in-place step."""

    @abstractmethod
    def draw(self, problem: Any, client: int, step: int, gen: torch.Generator) -> tuple[Any, int]:
        """The step's samples (the same shapes for every client) and their oracle count."""

    @abstractmethod
    def update(self, problem: Any, state: C, batch: Any, step: int) -> tuple[C, Tensor]:
        """The new client state and the step's training loss (a 0-d tensor) from the drawn samples."""

    def update_(self, problem: Any, state: C, batch: Any, step: int) -> tuple[C, Tensor]:
        """:meth:`update` in place, bit for bit: the :attr:`mutates` fields of ``state`` (the program's own copies)
        are overwritten; returns the state (this record or a new one) and the loss. By default :meth:`update`
        itself (a new record), which is what an algorithm without an in-place step runs."""
        return self.update(problem, state, batch, step)

    def in_place(self) -> bool:
        """Whether local steps run :meth:`update_`: it exists and was written for the :meth:`update` in force
        (a subclass that changes ``update`` without its own ``update_`` runs ``update``)."""
        cls = type(self)
        return bool(self.mutates) and issubclass(_owner(cls, "update_"), _owner(cls, "update"))

    def broadcast(self, server: S) -> Tensors:
        """What the server sends each round: the fields it shares with the client state."""
        return {n: getattr(server, n) for n in self.averaged}

    def round(self, fed: Round, server: S) -> S:
        """q local steps on the round's cohort, then the cohort means of the shared fields."""
        return server.replace(**fed.local_steps(self.broadcast(server), self.hp.local_steps))

    def local_steps(self, problem: Any, state: C, ctx: ClientContext) -> tuple[C, Tensors, StepInfo]:
        """Client program: ``q`` local steps (global step index ``round * q + s``); outputs the shared fields."""
        q = self.hp.local_steps
        total = StepInfo()
        in_place = self.in_place() and not LOCKSTEP.get() and _floats(state, self.mutates) >= IN_PLACE_MIN_FLOATS
        if in_place:  # the state's tensors may be the broadcast other clients start from: step copies of them
            state = state.replace(**{n: getattr(state, n).clone(memory_format=torch.contiguous_format) for n in self.mutates})
        losses = []
        for s in range(q):
            step = ctx.round * q + s
            batch, samples = self.draw(problem, ctx.client, step, ctx.rng(step))
            state, loss = (self.update_ if in_place else self.update)(problem, state, batch, step)
            total.samples += samples
            losses.append(torch.as_tensor(loss).detach())  # no autograd graph kept until the read
        total.loss = mean_loss(losses)
        return state, {n: getattr(state, n) for n in self.averaged}, total

    def update_tensors(self, problem: Any, state: Tensors, batch: Any, step: int) -> tuple[Tensors, Tensor]:
        """:meth:`update` on the wire form of the state (what lockstep ``vmap`` batches)."""
        new, loss = self.update(problem, self.Client.of(state), batch, step)  # type: ignore[arg-type]
        return new.tensors(), loss


IN_PLACE_MIN_FLOATS = 100_000
"""Smallest state (floats in the :attr:`LocalSteps.mutates` fields) stepped in place: below it the pure
``update`` is faster -- allocating small vectors is cheap and the in-place path's per-parameter bookkeeping is
not (benchmarks/LOCAL_STEP.md: MLPs of 2.7k parameters 10 % slower in place, 76k even, 284k 1.1-1.3x faster).
Both paths give the same bits, so the choice changes only the time."""


def _floats(state: State, fields: frozenset[str]) -> int:
    return sum(int(getattr(state, n).numel()) for n in fields)


def _owner(cls: type, name: str) -> type:
    """The class in ``cls``'s method resolution order that defines ``name``."""
    return next(k for k in cls.__mro__ if name in vars(k))


def batch_size(batch: Any) -> int:
    """Examples in a batch (a tuple whose last item is a tensor of labels); 1 for data-free problems."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[-1], Tensor) and batch[-1].dim() > 0:
        return int(batch[-1].shape[0])
    return 1
