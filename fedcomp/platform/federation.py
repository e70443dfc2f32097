"""Client hosting and the in-process federation.

:class:`ClientHost` holds a set of clients -- a task copy, the algorithm and each client's private state --
and runs a named client program for the cohort members it hosts, returning one partial sum. Both backends
use it: :class:`LocalFederation` hosts every client in one ClientHost in this process; the Ray backend
(``fedcomp.actors``) wraps one ClientHost per actor. Sums are accumulated in float64 and combined in a
fixed order, so the averages do not depend on how clients are packed into hosts.

Module buffers (BatchNorm running statistics, where the task's model keeps them) are each client's own
state, outside the algorithm's records: the host puts a client's statistics into the task's model around
every step of its programs and keeps them with its private state. A broadcast that holds ``buffers`` asks
the clients to send theirs back with their outputs; non-empty ones replace the clients' own first (the
``averaged`` policy; :class:`~fedcomp.platform.rounds.Round` decides what goes down).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
import torch
from torch import Tensor

from fedcomp.platform import compiled
from fedcomp.platform.accelerator import ExactSum, configure, exact_sums, one_thread
from fedcomp.platform.algorithms.base import Algorithm, ClientContext, Exchanged, Outcome, StepInfo, Tensors
from fedcomp.platform.catalog import algorithm_class, task_class
from fedcomp.platform.config import Config, FederationConfig
from fedcomp.platform.errors import PlatformError, ResourceError, add_note
from fedcomp.platform.oracles import FUSED_SGD
from fedcomp.platform.rng import generator
from fedcomp.platform.state import BUFFERS, Means
from fedcomp.platform.tasks.base import Task
from fedcomp.platform.vectorised import can_lockstep, lockstep_local_steps, lockstep_pays, why_not_lockstep

T = TypeVar("T")
P = ParamSpec("P")


def build_task(config: Config, device: str = "cpu") -> Task:
    return task_class(config.task_name)(config.task, config.run.seed, config.federation.clients, device)


def build_algorithm(config: Config) -> Algorithm[Any, Any]:
    return algorithm_class(config.algorithm_name)(config.algorithm)


@dataclass(frozen=True)
class Layout:
    """Names and sizes of the tensors packed, in this order, into one flat buffer on the wire."""

    keys: tuple[str, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, state: Tensors) -> Layout:
        keys = tuple(sorted(state))
        return cls(keys, tuple(int(state[k].numel()) for k in keys))

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def pack(self, state: Tensors, dtype: type = np.float32) -> np.ndarray:
        if not self.keys:
            return np.zeros(0, dtype)
        return torch.cat([state[k].detach().reshape(-1).cpu() for k in self.keys]).numpy().astype(dtype, copy=False)

    def unpack(self, flat: np.ndarray, device: str | torch.device = "cpu", copy: bool = True) -> Tensors:
        """The named tensors in ``flat`` (float32): copies, each in memory of its own (broadcast buffers are
        read-only), or with ``copy`` false views of ``flat`` itself on the CPU (an array the caller owns and lets go).

        Each copy is allocated on its own, as :meth:`copy` does on the in-process backend, rather than split out of
        one tensor: a piece at an offset into a shared buffer is aligned differently, and some CPU kernels (MKL's
        among them) then add in another order -- FedDRO's model at d = 26,600 ended a round in other last bits on
        Ray than in process."""
        if not copy:
            tensor = torch.from_numpy(flat.astype(np.float32, copy=False)).to(device)
            return dict(zip(self.keys, tensor.split(list(self.sizes))))
        ends = np.cumsum(self.sizes)
        return {k: torch.tensor(flat[end - n:end], dtype=torch.float32, device=device)
                for k, n, end in zip(self.keys, self.sizes, ends.tolist())}

    def copy(self, state: Tensors, device: str | torch.device = "cpu") -> Tensors:
        """What ``unpack(pack(state), device)`` gives -- flat float32 copies, in this layout's order -- without the
        round trip through one NumPy buffer (the in-process backend's broadcasts)."""
        return {k: state[k].detach().reshape(-1).to(device=device, dtype=torch.float32, copy=True) for k in self.keys}

    def receive(self, payload: np.ndarray | Tensors, device: str | torch.device = "cpu") -> Tensors:
        """A broadcast as the host's tensors: unpacked from the wire (a flat buffer) or copied (named tensors)."""
        return self.copy(payload, device) if isinstance(payload, dict) else self.unpack(payload, device)


@dataclass
class Partial:
    """One host's reply to a client program: float64 sums of the outputs over the clients it ran."""

    layout: Layout
    sums: np.ndarray
    clients: int
    samples: int
    private: dict[int, Tensors] = field(default_factory=dict)
    """Copies of the clients' private (unsynchronised) state after the program, for recovery and checkpoints."""
    has_private: bool = False
    """Whether the program left private state (kept true when ``private`` travels separately)."""
    compute_s: float = 0.0
    """Seconds the host spent in the call (unpacking the broadcast, the clients' program, summing)."""
    losses: tuple[float, ...] = ()
    """Each client's loss: :func:`combine` adds them exactly (``math.fsum``), so the mean loss does not depend
    on how clients are packed into hosts (adding per-host sums differed in the last bits)."""

    @property
    def loss_sum(self) -> float:
        """The exact sum of the clients' losses."""
        return math.fsum(self.losses)


MEAN_BLOCK = 65_536
"""Floats :func:`mean_of` forms at a time: its float64 total stays in the core's cache, so a large model's sums are
read once and its means written once (rather than a model-sized total written and read back twice)."""


def mean_of(sums: Iterable[np.ndarray], clients: int, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """The cohort mean (float32) of hosts' float64 partial sums of ``size`` floats, added in the given order: the
    one place the average is formed, by the server (:func:`combine`) and by client actors that average among
    themselves (``federation.transport: collective``), so both give the same bits. Each element is
    ``((0.0 + s_1) + s_2 + ...) / clients`` in float64, rounded once to float32 (beyond its range: inf); written
    into ``out`` where given (float32, ``size`` floats), else into a new array."""
    parts = list(sums)
    means = np.empty(size, np.float32) if out is None else out
    total = np.empty(min(size, MEAN_BLOCK), np.float64)
    with np.errstate(over="ignore"):
        for start in range(0, size, MEAN_BLOCK):
            end = min(start + MEAN_BLOCK, size)
            block = total[: end - start]
            if parts:
                np.add(parts[0][start:end], 0.0, out=block)  # as if added to zeros: -0.0 becomes 0.0
                for part in parts[1:]:
                    block += part[start:end]
            else:
                block.fill(0.0)
            np.divide(block, clients, out=means[start:end], casting="unsafe")
    return means


@dataclass(frozen=True)
class Averages:
    """The cohort means of some partials as one flat float32 buffer in their layout, with the counts: what
    :func:`combine` unpacks into an :class:`Outcome`, and what the client actors' group sends from actor 0 to the
    others (``fedcomp.actors.collective``)."""

    layout: Layout
    flat: np.ndarray
    clients: int
    samples: int
    loss: float

    @classmethod
    def of(cls, partials: Sequence[Partial], means: np.ndarray | None = None) -> Averages:
        """The partial sums averaged in the given, fixed order (``means``: their :func:`mean_of`, where it was formed
        already -- by the actors' group, block by block as the sums arrived)."""
        layout = partials[0].layout
        clients = sum(p.clients for p in partials)
        flat = mean_of((p.sums for p in partials), clients, layout.total) if means is None else means
        return cls(layout, flat, clients, sum(p.samples for p in partials),
                   math.fsum(loss for p in partials for loss in p.losses) / clients)

    def outcome(self, floats_down: int) -> Outcome:
        return Outcome(means=self.layout.unpack(self.flat, copy=False), clients=self.clients, samples=self.samples,
                       loss=self.loss, floats_up=self.layout.total, floats_down=floats_down)


def combine(partials: Sequence[Partial], floats_down: int) -> Outcome:
    """Average the partial sums (in the given, fixed order) into an :class:`Outcome`."""
    return Averages.of(partials).outcome(floats_down)


def exchange_by_steps(
    federation: Any, program: str, round: int, cohort: list[int], payload: Tensors, sub: int, steps: int
) -> Exchanged:
    """An exchange as the server drives it: ``begin``, then ``steps`` times ``resume`` with the means of the last
    yield (every backend's way; the Ray backend's collective transport averages among the actors instead)."""
    out = federation.begin(program, round, cohort, payload, sub, last=steps == 0)
    yields = []
    for step in range(steps):
        yields.append(out)
        out = federation.resume(out.means, last=step == steps - 1)
    return Exchanged(yields, out)


@dataclass
class Session:
    """A generator program mid-exchange on a host: each hosted cohort member's generator, and where it is."""

    program: str
    round: int
    sub: int
    broadcast: Tensors
    programs: dict[int, Generator[Any, Any, Any]]
    running: dict[int, Tensor]
    """Each client's running statistics between the generator's steps (empty without module buffers)."""
    returned: bool
    """Whether the broadcast asked for the running statistics back."""
    step: int = 0
    """How many times the server has answered (0 after ``begin``)."""


def _host_entry(method: Callable[Concatenate[ClientHost, P], T]) -> Callable[Concatenate[ClientHost, P], T]:
    """A host's entry point, run with one torch thread under ``run.deterministic`` (:func:`one_thread`) and its
    SGD steps fused under ``federation.fused_sgd`` (:data:`~fedcomp.platform.oracles.FUSED_SGD`) and its gradients
    compiled under ``federation.torch_compile`` (:func:`fedcomp.platform.compiled.enabled`)."""

    @functools.wraps(method)
    def wrapper(host: ClientHost, /, *args: P.args, **kwargs: P.kwargs) -> T:
        fed = host.config.federation
        token = FUSED_SGD.set(fed.fused_sgd)
        session = host.session  # a resumed exchange's, as it was: the call may end it before it raises
        try:
            eager = host.not_compiled if fed.torch_compile else None
            with one_thread(host.config.run.deterministic), compiled.enabled(eager):
                return method(host, *args, **kwargs)
        except PlatformError:
            raise  # fedcomp's own one line says what and where
        except Exception as error:  # a bug in an algorithm or task: its traceback, and which program met it
            add_note(error, host.program_note(method.__name__, tuple(args), session))
            raise
        finally:
            FUSED_SGD.reset(token)

    return wrapper


class ClientHost:
    """Hosts clients ``clients``: runs client programs and keeps each client's private state."""

    def __init__(self, config: Config, clients: Iterable[int], device: str = "cpu") -> None:
        self.config = config
        self.clients = sorted(clients)
        self.device = device
        with one_thread(config.run.deterministic):  # what the task computes as it is built (its data's statistics)
            self.task = build_task(config, device)
        self.algorithm = build_algorithm(config)
        self.problem = self.task.problem(self.algorithm.kind)
        self.lockstep_off = why_not_lockstep(self.algorithm, self.problem) if config.federation.vectorise else None
        """Why ``federation.vectorise`` steps no client of this run in lockstep, where it cannot (said once)."""
        self.model = self.task.running_statistics()
        """The model whose running statistics each client keeps (None: no module buffers)."""
        self.private: dict[int, Tensors] = {}
        self.sums = ExactSum()
        """Every call's float64 sums, each client's outputs added as the client finishes."""
        self.session: Session | None = None
        """The generator program in progress (between ``begin`` and its last ``resume``)."""
        self.not_compiled: set[object] = set()
        """Under ``federation.torch_compile``: the (oracle, function) pairs found not to compile, which run eagerly
        from then on (:mod:`fedcomp.platform.compiled`)."""

    def program_note(self, entry: str, args: tuple[Any, ...], session: Session | None) -> str:
        """Which client program a bug in the algorithm or task met, said beside its traceback: the host's ``entry``
        (``run`` and ``begin``: from their arguments, a program's name, its round and the cohort members here;
        ``resume``: from the exchange's ``session`` as the call found it)."""
        if entry == "resume":
            if session is None:
                return "fedcomp: raised in a client program resumed with no exchange under way"
            program, round, cohort = session.program, session.round, sorted(session.programs)
        else:
            program, round, cohort = args[0], args[1], list(args[2])
        members = ", ".join(map(str, cohort)) if len(cohort) <= 6 else f"{cohort[0]}, {cohort[1]}, ..., {cohort[-1]}"
        return (f"fedcomp: raised in client program {program!r} of algorithm {self.config.algorithm_name!r} on task "
                f"{self.config.task_name!r}, round {round + 1}, for {len(cohort)} client{'s' if len(cohort) != 1 else ''} "
                f"({members})")

    def load_private(self, states: dict[int, Tensors]) -> None:
        """Restore private states (after a checkpoint or when this host replaces a dead one), copied into memory of
        their own (see :meth:`Layout.unpack`): they replace whatever this host kept, so a client with no state in
        ``states`` starts afresh (as it did then)."""
        self.private = {c: {k: v.to(self.device, copy=True) for k, v in s.items()} for c, s in states.items()}

    @_host_entry
    def run(
        self, program: str, round: int, cohort: Sequence[int], payload: np.ndarray | Tensors, layout: Layout, sub: int = 0
    ) -> Partial:
        """Run ``algorithm.<program>`` for the cohort members in ``cohort`` (all hosted here), in order; the
        reply carries copies of their private state. ``payload``: the broadcast packed by ``layout`` (from
        another process) or as named tensors (in-process; copied, not packed). The default local-steps
        program runs the clients in lockstep under ``vmap`` where the algorithm and task allow it (same numbers)."""
        started = time.perf_counter()
        broadcast = layout.receive(payload, self.device)
        clients, starts, contexts, returned = self._open(cohort, broadcast, round, sub)
        results: Iterable[tuple[Tensors, Tensors, StepInfo]] | None = None
        if (
            self.config.federation.vectorise and self.model is None
            and can_lockstep(self.algorithm, self.problem, program, len(clients))
            and lockstep_pays(starts, self.device)
        ):  # fmt: skip
            results = lockstep_local_steps(self.algorithm, self.problem, starts, contexts)
        if results is None:
            results = self._one_at_a_time(self.algorithm.program(program), starts, contexts, returned)
        return self._close(clients, results, broadcast, started)

    def _one_at_a_time(
        self, run_one: Callable[..., tuple[Tensors, Tensors, StepInfo]], starts: list[Tensors],
        contexts: list[ClientContext], returned: bool,
    ) -> Iterator[tuple[Tensors, Tensors, StepInfo]]:
        """Each client's result, computed when asked for (so :meth:`_close` counts and drops one before the next)."""
        for state, ctx in zip(starts, contexts):
            yield self._attach_running(*self._with_running(state, lambda: run_one(self.problem, state, ctx)), returned)  # noqa: B023 (called at once)

    @_host_entry
    def begin(
        self, program: str, round: int, cohort: Sequence[int], payload: np.ndarray | Tensors, layout: Layout,
        sub: int = 0, last: bool = False,
    ) -> Partial:
        """Start the generator program ``algorithm.<program>`` for the cohort members here and run each to its
        first yield (``last``: to its end): the partial sums of what they yielded (returned)."""
        started = time.perf_counter()
        broadcast = layout.receive(payload, self.device)
        clients, starts, contexts, returned = self._open(cohort, broadcast, round, sub)
        run_one = self.algorithm.program(program)
        programs = {c: run_one(self.problem, state, ctx) for c, state, ctx in zip(clients, starts, contexts)}
        running = {c: state[BUFFERS] for c, state in zip(clients, starts) if BUFFERS in state}
        self.session = Session(program, round, sub, broadcast, programs, running, returned)
        return self._advance(next, last, started)

    @_host_entry
    def resume(self, payload: np.ndarray | Tensors, layout: Layout, last: bool = False) -> Partial:
        """Send the server's answer (the means of the last yield) into every generator of the session and run
        each to its next yield (``last``: to its end)."""
        started = time.perf_counter()
        if self.session is None:
            raise RuntimeError("ClientHost.resume without a generator program in progress (begin first)")
        means = layout.receive(payload, self.device)
        self.session.step += 1
        return self._advance(lambda gen: gen.send(Means({k: v.clone() for k, v in means.items()})), last, started)

    def _advance(self, step: Callable[[Generator[Any, Any, Any]], Any], last: bool, started: float) -> Partial:
        """Run ``step`` on every generator of the session; sum the yields, or close the session at its end."""
        session = self.session
        assert session is not None
        yielded, results = [], []
        for client, gen in session.programs.items():
            state = {BUFFERS: session.running[client]} if client in session.running else {}
            try:
                value, running = self._with_running(state, lambda: step(gen))  # noqa: B023 (called at once)
                yielded.append(value)
            except StopIteration as stop:
                running = self._take_running()
                results.append(self._attach_running(stop.value, running, session.returned))
            if running is not None:
                session.running[client] = running
        if len(results if last else yielded) != len(session.programs):
            self.session = None
            raise RuntimeError(
                f"client program {session.program!r} is out of step with the server: after {session.step} answers "
                f"every client should have {'returned' if last else 'yielded'}, but {len(results)} of "
                f"{len(session.programs)} returned"
            )
        if not last:
            return self._sum(yielded, started)
        self.session = None
        return self._close(list(session.programs), results, session.broadcast, started)

    def _open(
        self, cohort: Sequence[int], broadcast: Tensors, round: int, sub: int
    ) -> tuple[list[int], list[Tensors], list[ClientContext], bool]:
        """The hosted cohort members in order, each one's state (its own, or a first one, overwritten by the
        broadcast; with its running statistics where the model keeps them), its context (its keyed random
        streams), and whether the broadcast asks for the running statistics back. Takes ``buffers`` out of
        ``broadcast``."""
        seed = self.config.run.seed
        down = broadcast.pop(BUFFERS, None)
        clients = sorted(cohort)
        starts, contexts = [], []
        for client in clients:
            stream = self.task.stream_id(client)
            start = self.private.get(client)
            if start is None:
                start = self.algorithm.start_state(broadcast)
                if self.model is not None:
                    start[BUFFERS] = self.model.initial_buffers().to(self.device)
            state = self.algorithm.begin({**start, **broadcast})  # programs never write the broadcast: in-place steps copy what they write
            if self.model is not None and down is not None and down.numel():
                state[BUFFERS] = down.clone()
            starts.append(state)
            contexts.append(ClientContext(client, round, sub, lambda *ids, s=stream: generator(seed, "client-step", s, *ids)))
        return clients, starts, contexts, down is not None

    def _with_running(self, state: Tensors, step: Callable[[], T]) -> tuple[T, Tensor | None]:
        """``step()`` with the client's running statistics (``state["buffers"]``) in the task's model; its
        result and the statistics after it (None without module buffers)."""
        if self.model is None:
            return step(), None
        self.model.running = state[BUFFERS]
        value = step()
        return value, self._take_running()

    def _take_running(self) -> Tensor | None:
        return None if self.model is None else self.model.running

    @staticmethod
    def _attach_running(
        result: tuple[Tensors, Tensors, StepInfo], running: Tensor | None, returned: bool
    ) -> tuple[Tensors, Tensors, StepInfo]:
        """A client program's result with its running statistics kept in its state and, when the broadcast
        asked for them, added to its outputs."""
        if running is None:
            return result
        state, outputs, info = result
        return {**state, BUFFERS: running}, ({**outputs, BUFFERS: running} if returned else outputs), info

    @staticmethod
    def _sum(outputs: Sequence[Tensors], started: float) -> Partial:
        """The partial sums of the clients' outputs (what a host returns for one exchange): float64, in client
        order, added on the outputs' device and copied to the host once."""
        layout = Layout.of(outputs[0])
        return Partial(layout, exact_sums(outputs, layout.keys), len(outputs), 0, compute_s=time.perf_counter() - started)

    def _close(
        self, clients: list[int], results: Iterable[tuple[Tensors, Tensors, StepInfo]],
        broadcast: Tensors, started: float,
    ) -> Partial:
        """Sum the clients' outputs and keep each one's private state, a client at a time as ``results`` gives
        them (its outputs are let go once counted); the reply carries copies of the private states."""
        if not clients:
            raise ValueError("ClientHost.run needs a non-empty cohort")
        layout: Layout | None = None
        samples, losses, private = 0, [], {}
        for client, (state, outputs, info) in zip(clients, results):
            if layout is None:
                layout = Layout.of(outputs)
                self.sums.begin(layout.keys)
            self.sums.add(outputs)
            samples += info.samples
            losses.append(info.loss)
            # only the private fields are kept: the broadcast ones come again with the next broadcast, and
            # round-local fields are set again by Algorithm.begin
            dropped = (outputs.keys() | broadcast.keys() | self.algorithm.round_local) - {BUFFERS}
            kept = {k: v.detach() for k, v in state.items() if k not in dropped}
            self.private[client] = kept
            if kept:
                private[client] = {k: v.cpu() for k, v in kept.items()}
        assert layout is not None
        return Partial(layout, self.sums.value(), len(clients), samples, private, bool(private),
                       time.perf_counter() - started, tuple(losses))


def local_device(fed: FederationConfig, deterministic: bool = True) -> str:
    """The device of the in-process backend: CUDA when asked for (or 'auto' and present), else the CPU; on CUDA
    this process's determinism flags are set (``run.deterministic``, :func:`~fedcomp.platform.accelerator.configure`)."""
    has_cuda = torch.cuda.is_available()
    if fed.gpus_per_client != "auto" and fed.gpus_per_client > 0 and not has_cuda:
        raise ResourceError(
            f"federation.gpus_per_client = {fed.gpus_per_client:g} but this machine has no CUDA GPU for the "
            f"local backend; use federation.gpus_per_client = 0 or 'auto'"
        )
    wanted = has_cuda if fed.gpus_per_client == "auto" else fed.gpus_per_client > 0
    device = "cuda" if wanted else "cpu"
    configure(device, deterministic)
    return device


class LocalFederation:
    """Every client in one in-process :class:`ClientHost`: the reference backend (tests, debugging)."""

    def __init__(self, config: Config) -> None:
        self.host = ClientHost(config, range(config.federation.clients), local_device(config.federation, config.run.deterministic))
        self.private: dict[int, Tensors] = {}

    def call(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0) -> Outcome:
        layout = Layout.of(payload)
        partial = self.host.run(program, round, cohort, payload, layout, sub)
        self.private.update(partial.private)
        return combine([partial], layout.total)

    def begin(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0, last: bool = False) -> Outcome:
        layout = Layout.of(payload)
        partial = self.host.begin(program, round, cohort, payload, layout, sub, last)
        self.private.update(partial.private)
        return combine([partial], layout.total)

    def resume(self, means: Tensors, last: bool = False) -> Outcome:
        layout = Layout.of(means)
        partial = self.host.resume(means, layout, last)
        self.private.update(partial.private)
        return combine([partial], layout.total)

    def exchange(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int, steps: int) -> Exchanged:
        return exchange_by_steps(self, program, round, cohort, payload, sub, steps)

    def private_states(self) -> dict[int, Tensors]:
        return dict(self.private)

    def load_private_states(self, states: dict[int, Tensors]) -> None:
        self.private = dict(states)
        self.host.load_private(states)

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, object]:
        off = self.host.lockstep_off
        return {"name": "local", "device": self.host.device, **({"lockstep_off": off} if off else {})}
