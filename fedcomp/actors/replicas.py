"""The round program replicated on the client actors (``federation.server: replicated``).

Every client actor holds a copy of the :class:`~fedcomp.platform.server.Server` -- the global state, the cohort
sampler, the algorithm's round program -- over a :class:`GroupFederation`. A federation call runs this actor's
members of the cohort on its own :class:`~fedcomp.platform.federation.ClientHost`, then the actors exchange their
partial sums in their group and each combines them in actor order as the server's own
:func:`~fedcomp.platform.federation.combine` does (:meth:`~fedcomp.actors.collective.Group.combined`; large sums
split: each actor averages a share and sends the others its means). So every replica
holds, after every call, the state a single server would hold, bit for bit, and no message goes through the driver
or a server actor between rounds: the driver starts a run of rounds on every actor at once and hears back from
replica 0 only (each round's record, its evaluation, whether the state is finite).

Which actor runs which cohort member is decided by each replica's own :class:`~fedcomp.actors.routing.Router`,
fed only with what every replica sees (the gathered replies), so all replicas decide alike. A client's private
state stays with the actor that ran it; a checkpoint gathers it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fedcomp.actors.collective import Group
from fedcomp.actors.routing import Router
from fedcomp.platform.algorithms.base import Exchanged, Outcome, Tensors
from fedcomp.platform.config import Config
from fedcomp.platform.federation import ClientHost, Layout, Partial, exchange_by_steps
from fedcomp.platform.run_checks import state_finite
from fedcomp.platform.server import Server

REPLY_EVERY_S = 0.1
"""How often replica 0 sends the replies of the rounds it has run since it last sent (besides at evaluated rounds
and at the end)."""
SLOWEST_COMPUTE = "actor compute (slowest actor each call)"
"""The key, in a replica's profile, of the seconds each call's slowest actor computed, summed over the calls."""
AtCall = Callable[..., None]
"""Called with ``(round, sub)`` before this actor runs a call's members (``(round, sub, step)`` for a step of an
exchange): the client actor's fault injection."""


class GroupFederation:
    """A replica's federation: this actor's share of each call, averaged with the other actors' in the group."""

    def __init__(
        self, host: ClientHost, group: Group, rank: int, groups: Sequence[Sequence[int]], routing: str, at_call: AtCall
    ) -> None:
        self.host, self.group, self.rank = host, group, rank
        self.groups, self.routing = groups, routing
        self.router = Router(groups, routing)
        self.at_call = at_call
        self.in_exchange: tuple[str, int, int, dict[int, list[int]], int] = ("", -1, 0, {}, 0)
        """The exchange in progress: its program, round and sub-round, each actor's members and the answers so far."""
        self.profile = {"actor compute (this replica)": 0.0, "group gathers": 0.0}
        """Seconds in this actor's clients' programs and in the gathers (waiting for the slowest actor included)."""
        self.slowest_s = 0.0
        """Seconds in the programs of each call's slowest actor, summed over the calls (as a server counts its
        actors' compute; not a phase of this replica's time)."""
        self.busy_s = 0.0
        """This actor's seconds of compute in the call in progress (told to the others with its partial)."""

    def call(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0) -> Outcome:
        layout = Layout.of(payload)
        members = self.router.assign(program, cohort)
        mine = members.get(self.rank)
        partial = None
        if mine:
            self.at_call(round, sub)
            partial = self._timed(lambda: self.host.run(program, round, mine, payload, layout, sub))
        return self._combine(partial, layout.total, program, members)

    def begin(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0, last: bool = False) -> Outcome:
        layout = Layout.of(payload)
        members = self.router.assign(program, cohort)
        self.in_exchange = (program, round, sub, members, 0)
        mine = members.get(self.rank)
        partial = None
        if mine:
            self.at_call(round, sub, 0)
            partial = self._timed(lambda: self.host.begin(program, round, mine, payload, layout, sub, last))
        return self._combine(partial, layout.total, program, members if last else None)

    def resume(self, means: Tensors, last: bool = False) -> Outcome:
        program, round, sub, members, step = self.in_exchange
        self.in_exchange = (program, round, sub, members, step + 1)
        layout = Layout.of(means)
        partial = None
        if members.get(self.rank):
            self.at_call(round, sub, step + 1)
            partial = self._timed(lambda: self.host.resume(means, layout, last))
        return self._combine(partial, layout.total, program, members if last else None)

    def exchange(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int, steps: int) -> Exchanged:
        return exchange_by_steps(self, program, round, cohort, payload, sub, steps)

    def _timed(self, run: Callable[[], Partial]) -> Partial:
        started = time.perf_counter()
        partial = run()
        partial.private = {}  # the host keeps its clients' state; a checkpoint asks for it
        self.busy_s = time.perf_counter() - started
        self.profile["actor compute (this replica)"] += self.busy_s
        return partial

    def _combine(
        self, partial: Partial | None, floats_down: int, program: str, members: dict[int, list[int]] | None
    ) -> Outcome:
        """Every actor's partial, combined in actor order; for a call's end (``members``), the router learns where
        private state is now."""
        started = time.perf_counter()
        outcome, private, slowest_s = self.group.combined(partial, floats_down, self.busy_s)
        self.profile["group gathers"] += time.perf_counter() - started
        self.slowest_s += slowest_s
        self.busy_s = 0.0
        if members is not None:
            self.router.learn(program, members, {i: private[i] for i in members})
        return outcome

    def private_states(self) -> dict[int, Tensors]:
        """The private states this actor holds (a checkpoint merges every actor's)."""
        held = (c for c in self.router.held_by(self.rank) if self.host.private.get(c))
        return {c: {k: v.detach().cpu().clone() for k, v in self.host.private[c].items()} for c in held}

    def load_private_states(self, states: dict[int, Tensors]) -> None:
        """Restore the run's private states (all of them, on every replica): each goes to its client's home actor,
        and the router starts afresh, as every other replica's does."""
        self.router = Router(self.groups, self.routing)
        placed = self.router.place(list(states))
        self.host.load_private({c: states[c] for c in placed.get(self.rank, [])})

    def describe(self) -> dict[str, Any]:
        return {"name": "ray", "server": "replicated"}

    def close(self) -> None:
        pass


class Replica:
    """One client actor's copy of the server."""

    def __init__(self, config: Config, host: ClientHost, group: Group, rank: int, groups: Sequence[Sequence[int]],
                 at_call: AtCall) -> None:
        self.rank = rank
        federation = lambda c: GroupFederation(host, group, rank, groups, c.federation.routing, at_call)  # noqa: E731
        self.server = Server(config, federation, host.task if host.device == "cpu" else None)

    def profile(self) -> dict[str, float]:
        """This replica's phases (:meth:`~fedcomp.platform.server.Server.profile`), and under :data:`SLOWEST_COMPUTE`
        the seconds of each call's slowest actor (the same on every replica; not one of the phases)."""
        federation = self.server.federation
        assert isinstance(federation, GroupFederation)
        return {**self.server.profile(), SLOWEST_COMPUTE: federation.slowest_s}

    def rounds(self, evaluated: Sequence[bool]) -> Iterator[list[dict[str, Any]]]:
        """Run the rounds; replica 0 evaluates where asked and yields the rounds' replies (the others yield nothing):
        each round's record, its evaluation, the seconds that took, whether the global state is finite and the seconds
        since the previous round ended (replica 0's own round time, evaluation included). Replies are
        sent in batches -- at an evaluated round, at the end, and otherwise every :data:`REPLY_EVERY_S` -- since each
        message to the driver costs the actors' cores some of their time."""
        batch: list[dict[str, Any]] = []
        sent = ended = time.perf_counter()
        for k, evaluate in enumerate(evaluated):
            record, metrics, evaluate_s = self.server.one_round(evaluate and self.rank == 0)
            if self.rank != 0:
                continue
            finite, now = state_finite(self.server.tensors()), time.perf_counter()
            batch.append({"record": record, "evaluation": metrics, "evaluate_s": evaluate_s, "model_finite": finite,
                          "round_s": now - ended})
            ended = now
            if evaluate or k == len(evaluated) - 1 or time.perf_counter() - sent >= REPLY_EVERY_S:
                yield batch
                batch, sent = [], time.perf_counter()

    @staticmethod
    def merged(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The server's checkpoint (``parts[0]``, replica 0's :meth:`checkpoint`) with every actor's clients' private
        states (``parts``, in actor order)."""
        checkpoint = dict(parts[0])
        private = {c: state for part in parts for c, state in part["private"].items()}
        checkpoint["private"] = dict(sorted(private.items()))
        return checkpoint

    def checkpoint(self, with_state: bool) -> dict[str, Any]:
        """The server's checkpoint with this actor's private states (``with_state`` false: those alone)."""
        if with_state:
            return self.server.checkpoint()
        return {"private": self.server.federation.private_states()}
