"""Client hosting and the in-process federation.

:class:`ClientHost` holds a set of clients -- a task copy, the algorithm and each client's private state --
and runs a named client program for the cohort members it hosts, returning one partial sum. Both backends
use it: :class:`LocalFederation` hosts every client in one ClientHost in this process; the Ray backend
(``fedcomp.actors``) wraps one ClientHost per actor. Sums are accumulated in float64 and combined in a
fixed order, so the averages do not depend on how clients are packed into hosts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import torch

from fedcomp.platform.algorithms.base import Algorithm, ClientContext, Outcome, State
from fedcomp.platform.config import Config, FederationConfig
from fedcomp.platform.errors import ResourceError
from fedcomp.platform.catalog import load_builtins
from fedcomp.platform.registry import ALGORITHMS, TASKS
from fedcomp.platform.rng import generator
from fedcomp.platform.vectorised import can_lockstep, lockstep_local_steps
from fedcomp.platform.tasks.base import Task


def build_task(config: Config, device: str = "cpu") -> Task:
    load_builtins()
    return TASKS[config.task_name](config.task, config.run.seed, config.federation.clients, device)


def build_algorithm(config: Config) -> Algorithm:
    load_builtins()
    return ALGORITHMS[config.algorithm_name](config.algorithm)


@dataclass(frozen=True)
class Layout:
    """Names and sizes of the tensors packed, in this order, into one flat buffer on the wire."""

    keys: tuple[str, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, state: State) -> "Layout":
        keys = tuple(sorted(state))
        return cls(keys, tuple(int(state[k].numel()) for k in keys))

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def pack(self, state: State, dtype: type = np.float32) -> np.ndarray:
        if not self.keys:
            return np.zeros(0, dtype)
        return torch.cat([state[k].detach().reshape(-1).cpu() for k in self.keys]).numpy().astype(dtype, copy=False)

    def unpack(self, flat: np.ndarray, device: str | torch.device = "cpu") -> State:
        tensor = torch.tensor(flat, dtype=torch.float32, device=device)  # copies: broadcast buffers are read-only
        return dict(zip(self.keys, tensor.split(list(self.sizes))))


@dataclass
class Partial:
    """One host's reply to a client program: float64 sums of the outputs over the clients it ran."""

    layout: Layout
    sums: np.ndarray
    clients: int
    samples: int
    loss_sum: float
    private: dict[int, State] = field(default_factory=dict)
    """Copies of the clients' private (unsynchronised) state after the program, for recovery and checkpoints."""
    has_private: bool = False
    """Whether the program left private state (kept true when ``private`` travels separately)."""
    compute_s: float = 0.0
    """Seconds the host spent in the call (unpacking the broadcast, the clients' program, summing)."""
    losses: tuple[float, ...] = ()
    """Each client's loss: :func:`combine` adds them exactly (``math.fsum``), so the mean loss does not depend
    on how clients are packed into hosts (adding per-host sums differed in the last bits)."""


def combine(partials: Sequence[Partial], floats_down: int) -> Outcome:
    """Average the partial sums (in the given, fixed order) into an :class:`Outcome`."""
    layout = partials[0].layout
    clients = sum(p.clients for p in partials)
    total = np.zeros(layout.total, np.float64)
    for p in partials:
        total += p.sums
    means = layout.unpack((total / clients).astype(np.float32))
    return Outcome(
        means=means,
        clients=clients,
        samples=sum(p.samples for p in partials),
        loss=math.fsum(loss for p in partials for loss in p.losses) / clients,
        floats_up=layout.total,
        floats_down=floats_down,
    )


class ClientHost:
    """Hosts clients ``clients``: runs client programs and keeps each client's private state."""

    def __init__(self, config: Config, clients: Iterable[int], device: str = "cpu") -> None:
        self.config = config
        self.clients = sorted(clients)
        self.device = device
        self.task = build_task(config, device)
        self.algorithm = build_algorithm(config)
        self.problem = self.task.problem(self.algorithm.kind)
        self.private: dict[int, State] = {}

    def load_private(self, states: dict[int, State]) -> None:
        """Restore private states (after a checkpoint or when this host replaces a dead one)."""
        self.private.update({c: {k: v.to(self.device) for k, v in s.items()} for c, s in states.items()})

    def run(
        self, program: str, round: int, cohort: Sequence[int], payload: np.ndarray, layout: Layout, sub: int = 0
    ) -> Partial:
        """Run ``algorithm.<program>`` for the cohort members in ``cohort`` (all hosted here), in order; the
        reply carries copies of their private state unless the program is transient. The default local-steps
        program runs the clients in lockstep under ``vmap`` where the algorithm and task allow it (same numbers)."""
        started = time.perf_counter()
        broadcast = layout.unpack(payload, self.device)
        seed, sums, out_layout = self.config.run.seed, None, None
        samples, loss_sum, private, losses = 0, 0.0, {}, []
        clients = sorted(cohort)
        starts, contexts = [], []
        for client in clients:
            stream = self.task.stream_id(client)
            start = self.private.get(client)
            if start is None:
                start = self.algorithm.init_state(broadcast)
            starts.append({**start, **{k: v.clone() for k, v in broadcast.items()}})
            contexts.append(ClientContext(client, round, sub, lambda *ids, s=stream: generator(seed, "client-step", s, *ids)))
        results = None
        if self.config.federation.vectorise and can_lockstep(self.algorithm, self.problem, program, len(clients)):
            results = lockstep_local_steps(self.algorithm, self.problem, starts, contexts)
        if results is None:
            run_one = getattr(self.algorithm, program)
            results = [run_one(self.problem, state, ctx) for state, ctx in zip(starts, contexts)]
        for client, (state, outputs, info) in zip(clients, results):
            if out_layout is None:
                out_layout = Layout.of(outputs)
                sums = np.zeros(out_layout.total, np.float64)
            sums += out_layout.pack(outputs, np.float64)
            samples += info.samples
            loss_sum += info.loss
            losses.append(info.loss)
            kept = {k: v.detach() for k, v in state.items() if k not in outputs and k not in broadcast}
            self.private[client] = kept
            if kept and program not in self.algorithm.transient_programs:
                private[client] = {k: v.cpu() for k, v in kept.items()}
        if out_layout is None or sums is None:
            raise ValueError("ClientHost.run needs a non-empty cohort")
        elapsed = time.perf_counter() - started
        return Partial(out_layout, sums, len(cohort), samples, loss_sum, private, bool(private), elapsed, tuple(losses))


def local_device(fed: FederationConfig) -> str:
    """The device of the in-process backend: CUDA when asked for (or 'auto' and present), else the CPU."""
    has_cuda = torch.cuda.is_available()
    if fed.gpus_per_client == "auto":
        return "cuda" if has_cuda else "cpu"
    if fed.gpus_per_client > 0 and not has_cuda:
        raise ResourceError(
            f"federation.gpus_per_client = {fed.gpus_per_client:g} but this machine has no CUDA GPU for the "
            f"local backend; use gpus_per_client: 0 or 'auto'"
        )
    return "cuda" if fed.gpus_per_client > 0 else "cpu"


class LocalFederation:
    """Every client in one in-process :class:`ClientHost`: the reference backend (tests, debugging)."""

    def __init__(self, config: Config) -> None:
        self.host = ClientHost(config, range(config.federation.clients), local_device(config.federation))
        self.private: dict[int, State] = {}

    def call(self, program: str, round: int, cohort: list[int], payload: State, sub: int = 0) -> Outcome:
        layout = Layout.of(payload)
        partial = self.host.run(program, round, cohort, layout.pack(payload), layout, sub)
        self.private.update(partial.private)
        return combine([partial], layout.total)

    def private_states(self) -> dict[int, State]:
        return dict(self.private)

    def load_private_states(self, states: dict[int, State]) -> None:
        self.private = dict(states)
        self.host.load_private(states)

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, object]:
        return {"name": "local", "device": self.host.device}
