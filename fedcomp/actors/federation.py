"""RayFederation: client actors hosting clients, driven from the server.

Per call: the payload is packed into one flat float32 buffer and ``ray.put`` once (small ones are inlined
in the call, pickled once with the call's other arguments into one message for every actor); every actor
that runs cohort members (:class:`~fedcomp.actors.routing.Router` says which: members without private state
are spread evenly) gets it and returns one float64 partial sum over them; replies are collected
with ``ray.wait`` under a deadline and combined in actor order (so the averages do not depend on arrival order
or packing). An actor that dies is replaced by a fresh one that gets the private state it held back from the
object store (each reply leaves a copy there; the router knows which actor holds whose), and only its share
of the round is run again -- which gives the same numbers as an undisturbed round, because every random draw
is keyed by (seed, client, step).

A generator program (``begin`` / ``resume``, for ``fed.exchange``) lives in its actor between the steps of
an exchange and cannot be shipped; a replacement actor re-creates it from the clients' saved state and
replays the logged answers (the means sent so far).

With ``federation.transport: graph`` the calls whose payload travels inline go through one compiled Ray graph
over the actors instead (:mod:`fedcomp.actors.graph`); their replies carry the clients' private state, which the
federation puts in the object store itself; a retry after an actor died always goes by calls. With
``transport: collective`` an exchange goes to every actor in one call and the actors answer its steps among
themselves (:mod:`fedcomp.actors.collective`); what an actor's death leaves unfinished runs again by calls.

The calls' tensor code is imported where the calls are made (a server actor, or a driver holding the server):
the driver of a replicated server uses this class to start, place and replace the client actors only, and
imports no torch.
"""

from __future__ import annotations

import math
import pickle
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayChannelError, RayChannelTimeoutError, RayTaskError

from fedcomp.actors import kept
from fedcomp.actors.client_actor import ClientActor
from fedcomp.actors.cluster import (
    ActorPlan,
    actor_options,
    cluster_nodes,
    describe_resources,
    fedcomp_env,
    node_lost_notice,
    plan_actors,
    probe_footprint_on_cluster,
    resume_advice,
    through_ray_client,
)
from fedcomp.actors.graph import ActorGraph
from fedcomp.actors.group_terms import JOIN_TIMEOUT_S, GroupBroken
from fedcomp.actors.routing import Router
from fedcomp.platform.config import Config
from fedcomp.platform.errors import ClientFailure, PlatformError, ResourceError, add_note, first_line, shortened

if TYPE_CHECKING:
    from fedcomp.actors.collective import History
    from fedcomp.platform.algorithms.base import Exchanged, Outcome, Tensors
    from fedcomp.platform.federation import Layout, Partial

RemoteClient = ray.remote(ClientActor)
Submit = Callable[[Any, list[int]], Any]
"""One step of a federation call on one actor: ``submit(actor, its cohort members) -> (partial, private) refs``."""
INLINE_BYTES = 100 * 1024
PHASES = ("serialise broadcast", "submit actor calls", "actor compute (slowest actor)",
          "transport, scheduling, replies", "combine partials")
"""Where the time of a federation call goes: packing and ``ray.put`` of the broadcast; issuing the actor
calls; the slowest actor's own time in the call (the critical path of the compute); everything else until
the last reply is in (argument transfer, actor scheduling and queueing, reply serialisation and fetch); and
adding up the partial sums."""


def unwrap(error: RayTaskError) -> BaseException:
    """The error an actor raised (through any number of actor layers), as the local backend raises it: a fedcomp
    error as the same one line; another (a bug in a user's algorithm or task) as the same exception, the actor's
    traceback added as its note (Ray's own wrapper said it in Ray's words, with terminal colour codes)."""
    cause = _cause(error)
    if isinstance(cause, PlatformError):
        return cause
    if not isinstance(cause, Exception):
        return error
    add_note(cause, f"raised in a Ray actor: {COLOUR.sub('', str(error)).strip()}")
    return cause


COLOUR = re.compile(r"\x1b\[[0-9;]*m")
"""A terminal colour code, as Ray writes the actor's name in its error text."""


def _cause(error: RayTaskError) -> BaseException | None:
    """The exception an actor raised, through any number of actor layers."""
    cause: Any = error
    while isinstance(cause, RayTaskError):
        cause = getattr(cause, "cause", None)
    return cast(BaseException | None, cause)


def wait_ready(actors: list[Any], what: list[str], timeout: float, waiting: Callable[[], str | None] | None = None) -> list[Any]:
    """Block until every actor answers ``ready`` (returns the answers); name the ones not placed in time.
    ``waiting``: asked every second while they are not all placed, for why they may wait (said in the error).

    Raises:
        ResourceError: an actor was not placed within ``timeout``.
        PlatformError: the error an actor's constructor met (e.g. a missing data root), as raised there.
        ClientFailure: an actor's process died while starting.
    """
    refs = [a.ready.remote() for a in actors]
    deadline, why = time.monotonic() + timeout, None
    while True:
        left = deadline - time.monotonic()
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(left, 1.0) if waiting else left))
        if not pending or left <= 1.0 or waiting is None:
            break
        why = why or waiting()
    if pending:
        missing = [what[refs.index(r)] for r in pending]
        raise ResourceError(
            f"{len(pending)} of {len(refs)} actors did not start within {timeout:g}s "
            f"({'; '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}){f', after {why}' if why else ''}; "
            f"available now: {describe_resources()}"
        )
    try:
        return ray.get(refs)
    except RayTaskError as error:
        raise unwrap(error) from None
    except RayActorError as error:
        raise ClientFailure(f"an actor died while starting ({first_line(error)})") from None


class RayFederation:
    """Clients packed ``clients_per_actor`` to a Ray actor (``auto``, the default: one actor a CPU or a GPU share;
    :func:`~fedcomp.actors.cluster.auto_clients_per_actor`)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.sent_config = config.to_dict()
        """What each client actor is sent of the config (:func:`~fedcomp.actors.cluster.config_here`)."""
        resources = ray.cluster_resources()
        probe = config.federation.gpu_packing == "auto" and resources.get("GPU", 0.0) > 0
        footprint = probe_footprint_on_cluster(config, self.timeout) if probe else None
        self.plan: ActorPlan = plan_actors(config.federation, resources, cluster_nodes(), footprint)
        self.router = Router(self.plan.groups, config.federation.routing)
        self.private_refs: dict[int, Any] = {}
        """Client -> the object holding its latest saved private state (the reply of the last saving call)."""
        self.replay: list[tuple[dict[int, list[int]], Submit]] = []
        """The steps of the exchange in progress since its start: what a replacement actor re-runs to catch up."""
        self.in_exchange: tuple[str, int, dict[int, list[int]]] = ("", -1, {})
        """The program and round of the exchange in progress, and each actor's members of its cohort."""
        self.restarts = 0
        self.replacements: list[dict[str, Any]] = []
        """Replaced actors not yet taken by :meth:`take_replacements`: round (1-based), actor, clients, reason."""
        self.profile: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        """Seconds spent per phase of ``call`` since the start (see :data:`PHASES`)."""
        self.transport = config.federation.transport
        """``collective``, ``calls`` or ``graph`` (``federation.transport``): read at every call."""
        if self.transport == "graph" and through_ray_client():  # a compiled graph is built where the driver runs
            print("fedcomp: warning: federation.transport = 'graph': a driver connected through a Ray Client (ray://) "
                  "cannot build a compiled graph; this run's calls go as actor calls (transport: calls; the same "
                  "numbers; the graph works with server: actor, which builds it on the cluster)",
                  file=sys.stderr, flush=True)
            self.transport = "calls"
        self.graph: ActorGraph | None = None
        """The compiled graph over the actors (``federation.transport: graph``; built at its first use)."""
        self.graph_calls = 0
        """Calls sent through the graph so far (each one's number, which a survivor's kept reply is matched by)."""
        self.group_ready = False
        """Whether the actors are joined in one process group (``transport: collective``; joined at its first use)."""
        self.group_failed = False
        """Whether they could not form one (then the run's exchanges go by calls)."""
        self.group_failure = ""
        """Why they could not (where they could not)."""
        self.incarnations = [0] * len(self.plan.groups)
        self.actors = [self._spawn(i) for i in range(len(self.plan.groups))]
        kept.release()  # kept actors this run could not use would hold resources its own actors wait for
        try:
            self.placement = wait_ready(self.actors, [self._describe(i) for i in range(len(self.actors))], self.timeout)
        except BaseException:
            self.close()
            raise

    @property
    def timeout(self) -> float:
        return self.config.federation.actor_timeout_s

    def _describe(self, i: int) -> str:
        return f"client actor {i} asking for {self.plan.resources(i)}"

    def _spawn(self, i: int) -> Any:
        options = actor_options(self.plan.resources(i))
        return kept.start("client", RemoteClient, options, self.sent_config, self.plan.groups[i], self.incarnations[i],
                          fedcomp_env())

    def _replace(self, i: int, round: int, reason: str) -> None:
        self._drop_graph()  # rebuilt over the new actor at its next use
        self.group_ready = False  # likewise the process group
        self.incarnations[i] += 1
        self.restarts += 1
        self.replacements.append({"round": round + 1, "actor": i, "clients": list(self.plan.groups[i]),
                                  "incarnation": self.incarnations[i], "reason": reason})
        self.actors[i] = self._spawn(i)
        self.placement[i] = wait_ready([self.actors[i]], [self._describe(i)], self.timeout,
                                       self._node_lost(i, self.placement[i].get("node"), round))[0]
        mine = self._private_of(self.router.held_by(i))
        if mine:
            ray.get(self.actors[i].load_private.remote(mine))
        for members, submit in self.replay:  # catch up on the steps since the last saving call
            if i in members:
                ray.get(submit(self.actors[i], members[i])[0], timeout=self.timeout)

    def _node_lost(self, i: int, node: str | None, round: int) -> Callable[[], str | None]:
        """While actor ``i``'s replacement waits for room: whether the node the dead actor was on left the cluster,
        said once as found (else the wait is silent until the deadline, 120 s by default, and its error would not
        say why no room came free)."""

        return node_lost_notice(
            node, lambda gone: f"round {round + 1}: {gone} left the cluster with client actor {i}; its replacement asks "
            f"for {self.plan.resources(i)} and waits up to federation.actor_timeout_s = {self.timeout:g} s for a node "
            f"with room (available now: {describe_resources()})",
            lambda: resume_advice(self.config.federation.clients, self.plan.cpus, self.plan.server_cpus))

    def _message(self, method: str, payload: Tensors, **args: Any) -> tuple[bytes, Any, Layout]:
        """One call's arguments for every actor: ``method`` and ``args`` with the payload's layout (and the payload
        itself when small) pickled once into one bytes object, plus the payload's object ref when it is large
        (None otherwise). Ray serialises each argument of each actor call on its own; one bytes argument took
        0.25-0.4 ms less per call to two actors to submit than the six arguments it replaced
        (``benchmarks/ray_transport.py``)."""
        from fedcomp.platform.federation import Layout

        started = time.perf_counter()
        layout = Layout.of(payload)
        flat = layout.pack(payload)
        # One object-store copy per round for model-sized payloads; small ones (below Ray's own inlining
        # limit) travel inside the call, which measured 1.5-4 ms faster per round for an 11 KB model.
        ref = ray.put(flat) if flat.nbytes > INLINE_BYTES else None
        message = pickle.dumps((method, {**args, "layout": layout, "payload": flat if ref is None else None}), protocol=5)
        self.profile["serialise broadcast"] += time.perf_counter() - started
        return message, ref, layout

    def call(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0) -> Outcome:
        message, ref, layout = self._message("run", payload, program=program, round=round, sub=sub)
        return self._step(message, ref, program, self.router.assign(program, cohort), round, layout.total, saving=True)

    def begin(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0, last: bool = False) -> Outcome:
        message, ref, layout = self._message("begin", payload, program=program, round=round, sub=sub, last=last)
        members = self.router.assign(program, cohort)
        self.in_exchange = (program, round, members)
        return self._step(message, ref, program, members, round, layout.total, saving=last)

    def resume(self, means: Tensors, last: bool = False) -> Outcome:
        message, ref, layout = self._message("resume", means, last=last)
        program, round, members = self.in_exchange
        return self._step(message, ref, program, members, round, layout.total, saving=last)

    def exchange(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int, steps: int) -> Exchanged:
        """An exchange: by ``begin`` and ``steps`` times ``resume``; with ``transport: collective``, in one call to
        every actor, the actors answering each step among themselves (:mod:`fedcomp.actors.collective`).

        Collectively, when an actor dies, it is replaced, and what did not finish runs again by calls, with the same
        numbers: if an actor finished, every step's means are known, and the others' members replay the exchange
        with them (``begin``, then ``resume`` with each step's means); else the whole exchange runs again."""
        from fedcomp.platform.algorithms.base import Exchanged, Outcome
        from fedcomp.platform.federation import combine, exchange_by_steps

        if self.transport != "collective" or steps == 0 or not self._join_group():
            return exchange_by_steps(self, program, round, cohort, payload, sub, steps)
        message, ref, layout = self._message("exchange", payload, program=program, round=round, sub=sub, steps=steps)
        members = self.router.assign(program, cohort)
        self.in_exchange = (program, round, members)
        replies, failed = self._collect_collective(message, ref, members, round, steps)
        partials = {i: p for i, (p, _) in replies.items() if p is not None and i in members}
        for i, reason in sorted(failed.items()):
            self._replace(i, round, reason)
        if not partials:  # nothing is lost: no member changed its clients' state
            return exchange_by_steps(self, program, round, cohort, payload, sub, steps)
        history = replies[min(partials)][1]
        rest = {i: members[i] for i in members if i not in partials}
        if rest:
            partials.update(self._replay_exchange(program, round, sub, payload, rest, history))
        self._book(program, members, partials, True, None)
        clients = sum(p.clients for p in partials.values())
        return Exchanged(
            [Outcome(lay.unpack(means), clients, 0, math.nan, lay.total, lay.total) for lay, means in history],
            combine([partials[i] for i in sorted(partials)], layout.total),
        )

    def _collect_collective(
        self, message: bytes, ref: Any, members: dict[int, list[int]], round: int, steps: int
    ) -> tuple[dict[int, tuple[Partial | None, History]], dict[int, str]]:
        """Send the exchange to every actor (joining them in a group first where they are not); their replies, and
        the actors that died (and how). An error a client program raised reaches the user as it was raised."""
        started = time.perf_counter()
        pending: dict[Any, tuple[int, Any]] = {}
        for i, actor in enumerate(self.actors):
            reply_ref, private_ref = actor.collective.remote(message, ref, members.get(i, []))
            pending[reply_ref] = (i, private_ref)
        self.profile["submit actor calls"] += time.perf_counter() - started
        replies: dict[int, tuple[Partial | None, History]] = {}
        failed: dict[int, str] = {}
        errors: dict[int, RayTaskError] = {}
        for r, i, private_ref in self._arrivals(pending, round, steps + 1):
            try:
                replies[i] = ray.get(r)
            except RayTaskError as error:
                if not isinstance(_cause(error), GroupBroken):
                    errors[i] = error
                _read_error(private_ref)  # the same error: read, so that Ray does not print it as unhandled
                continue
            except RayActorError as error:
                failed[i] = _death(error)
                continue
            partial = replies[i][0]
            if partial is not None and partial.has_private:
                self.private_refs.update({c: private_ref for c in members[i]})
        if len(replies) < len(self.actors):
            self.group_ready = False  # an actor died, raised or saw the group break: its members left it
        if errors:
            raise unwrap(errors[min(errors)]) from None
        return replies, failed

    def _replay_exchange(
        self, program: str, round: int, sub: int, payload: Tensors, members: dict[int, list[int]], history: History
    ) -> dict[int, Partial]:
        """Run an exchange whose answers are known (``history``) for ``members`` by calls: the final partials."""
        self.in_exchange = (program, round, members)
        self.replay = []
        calls = [self._message("begin", payload, program=program, round=round, sub=sub, last=False)]
        calls += [self._message("resume", lay.unpack(m), last=k == len(history) - 1)
                  for k, (lay, m) in enumerate(history)]
        partials: dict[int, Partial] = {}
        for message, ref, _ in calls:
            submit = self._submit(message, ref)
            partials = self._run_step(message, ref, submit, members, round)
            self.replay.append((members, submit))
        self.replay = []
        return partials

    def _join_group(self, warn: bool = True) -> bool:
        """Join every actor in one process group (once, and again after an actor was replaced); whether they are in
        one. When they cannot meet (e.g. a firewall between nodes), say so once (``warn``; why, in
        :attr:`group_failure`): the run's exchanges go by calls. When an actor died, this exchange goes by calls,
        which replace it; the next one tries again."""
        if self.group_ready or self.group_failed:
            return self.group_ready
        why, died = None, False
        try:
            address = ray.get(self.actors[0].group_address.remote(), timeout=self.timeout)
        except RayActorError:
            return False
        world = len(self.actors)
        refs = [a.join_group.remote(address, i, world, self.timeout) for i, a in enumerate(self.actors)]
        _, late = ray.wait(refs, num_returns=len(refs), timeout=self.timeout + JOIN_TIMEOUT_S)
        if late:
            why = f"they did not meet within {self.timeout + JOIN_TIMEOUT_S:g}s"
        for ref in (r for r in refs if r not in late):  # every answer is read: Ray reports an unread error
            try:
                ray.get(ref, timeout=0)
            except RayActorError:
                died = True
            except RayTaskError as error:
                why = why or first_line(_cause(error) or error)
        if died:  # this exchange goes by calls, which replace the dead actor; the next one tries again
            return False
        if why is not None:
            self.group_failed, self.group_failure = True, why
            if warn:
                print(f"fedcomp: warning: the client actors could not form a process group for collective exchanges "
                      f"({why}); this run's exchanges go by actor calls (the same numbers)", file=sys.stderr, flush=True)
            return False
        self.group_ready = True
        return True

    @staticmethod
    def _submit(message: bytes, ref: Any) -> Submit:
        """The call on one actor (``ClientActor.step``) with its members of the cohort: the same message for all."""
        return lambda actor, clients: actor.step.remote(message, ref, clients)

    def _step(
        self, message: bytes, ref: Any, program: str, members: dict[int, list[int]], round: int, floats_down: int,
        saving: bool,
    ) -> Outcome:
        """Run the call on every actor with members -- through the compiled graph where the transport is ``graph``
        and the payload travels inline, else by one actor call each -- replacing dead actors (up to
        ``max_retries`` times; a retry always goes by calls); log the step for replay unless it saves the clients'
        state (then tell the router where private state is now); combine the partials in actor order."""
        from fedcomp.platform.federation import combine

        submit = self._submit(message, ref)
        partials = self._run_step(message, ref, submit, members, round)
        self._book(program, members, partials, saving, submit)
        started = time.perf_counter()
        outcome = combine([partials[i] for i in sorted(partials)], floats_down)
        self.profile["combine partials"] += time.perf_counter() - started
        return outcome

    def _run_step(self, message: bytes, ref: Any, submit: Submit, members: dict[int, list[int]], round: int) -> dict[int, Partial]:
        """Every member actor's partial of the call, replacing dead actors (see :meth:`_step`)."""
        partials: dict[int, Partial] = {}
        todo = sorted(members)
        by_graph = self.transport == "graph" and ref is None
        for attempt in range(self.config.federation.max_retries + 1):
            if by_graph and attempt == 0:
                failed, todo = self._collect_graph(message, members, partials, round)
                if todo:  # alive but had not run it when the graph broke
                    failed.update(self._collect(submit, members, todo, partials, round))
            else:
                failed = self._collect(submit, members, todo, partials, round)
            if not failed:
                break
            if attempt == self.config.federation.max_retries:
                raise ClientFailure(
                    f"client actors {sorted(failed)} died in round {round + 1} {attempt + 1} times; "
                    f"federation.max_retries = {self.config.federation.max_retries}"
                )
            for i, reason in sorted(failed.items()):
                self._replace(i, round, reason)
            todo = sorted(failed)
        return partials

    def _book(self, program: str, members: dict[int, list[int]], partials: dict[int, Partial], saving: bool,
              submit: Submit | None) -> None:
        """After a call: where it saved the clients' state, tell the router who holds private state now (and forget
        the saved state of clients that have none); else log the step for a replacement to replay."""
        if saving:
            self.replay = []
            left = {i: partials[i].has_private for i in members}
            self.router.learn(program, members, left)
            for c in (c for i in members if not left[i] for c in members[i]):
                self.private_refs.pop(c, None)
        elif submit is not None:
            self.replay.append((members, submit))

    def _collect(
        self, submit: Submit, members: dict[int, list[int]], todo: list[int], partials: dict[int, Partial], round: int
    ) -> dict[int, str]:
        """Run the actors in ``todo``; store their partials; return the ones whose actor died (and how).

        Each actor also returns its clients' private state as a second object that stays in the object
        store (nothing crosses to the server unless a replacement actor or a checkpoint needs it).
        """
        started = time.perf_counter()
        pending: dict[Any, tuple[int, Any]] = {}
        for i in todo:
            partial_ref, private_ref = submit(self.actors[i], members[i])
            pending[partial_ref] = (i, private_ref)
        submitted = time.perf_counter()
        self.profile["submit actor calls"] += submitted - started
        failed: dict[int, str] = {}
        for r, i, private_ref in self._arrivals(pending, round):
            try:
                partials[i] = ray.get(r)
            except RayTaskError as error:  # the client program raised: the same error as on the local backend
                raise unwrap(error) from None
            except RayActorError as error:
                failed[i] = _death(error)
                continue
            if partials[i].has_private:
                self.private_refs.update({c: private_ref for c in members[i]})
        self._time_replies(partials, todo, submitted)
        return failed

    def _arrivals(self, pending: dict[Any, tuple[int, Any]], round: int, steps: int = 1) -> Iterator[tuple[Any, int, Any]]:
        """Each pending reply as it arrives: its ref, its actor and the actor's private-state ref (taken out of
        ``pending``), waiting up to the deadline (per step of a call of ``steps``) for the next one.

        Raises:
            ClientFailure: no reply arrived within the deadline.
        """
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=self.timeout * steps)
            if not ready:
                late = sorted(i for i, _ in pending.values())
                per = " per step" if steps > 1 else ""
                raise ClientFailure(f"client actors {late} did not answer round {round} within {self.timeout:g}s{per}")
            for r in ready:
                i, private_ref = pending.pop(r)
                yield r, i, private_ref

    def _time_replies(self, partials: dict[int, Partial], ran: list[int], submitted: float) -> None:
        compute = max((partials[i].compute_s for i in ran if i in partials), default=0.0)
        self.profile["actor compute (slowest actor)"] += compute
        self.profile["transport, scheduling, replies"] += time.perf_counter() - submitted - compute

    def _collect_graph(
        self, message: bytes, members: dict[int, list[int]], partials: dict[int, Partial], round: int
    ) -> tuple[dict[int, str], list[int]]:
        """Run the call through the compiled graph (compiled on first use); store the partials, and the private
        state they carry in the object store. Returns the actors that died (and how) and the live ones that had
        not run the call when the graph broke (to run by calls).

        Reading a broken graph fails for every actor: the graph is then torn down and each member actor asked for
        the reply it kept (:meth:`ClientActor.graph_reply`); it is rebuilt at its next use."""
        started = time.perf_counter()
        if self.graph is None:
            self.graph = ActorGraph(self.actors)  # a few hundred ms, not counted as submitting
            started = time.perf_counter()
        self.graph_calls += 1
        refs = self.graph.execute((message, members, self.graph_calls))
        submitted = time.perf_counter()
        self.profile["submit actor calls"] += submitted - started
        ran = sorted(members)
        try:
            replies = ray.get(refs, timeout=self.timeout)
        except RayTaskError as error:
            raise unwrap(error) from None
        except RayChannelTimeoutError:
            raise ClientFailure(f"client actors {ran} did not answer round {round} within {self.timeout:g}s") from None
        except (RayActorError, RayChannelError):
            replies = None
        failed: dict[int, str] = {}
        not_run: list[int] = []
        if replies is None:
            self._drop_graph()
            replies = [None] * len(self.actors)
            for i in ran:
                try:
                    replies[i] = ray.get(self.actors[i].graph_reply.remote(self.graph_calls), timeout=self.timeout)
                except RayActorError as error:
                    failed[i] = _death(error)
                    continue
                if replies[i] is None:
                    not_run.append(i)
        for i in ran:
            partial = replies[i]
            if partial is None:
                continue
            partials[i] = partial
            if partial.has_private:
                held = ray.put(partial.private)
                self.private_refs.update({c: held for c in members[i]})
            partial.private = {}
        self._time_replies(partials, ran, submitted)
        return failed, not_run

    def _drop_graph(self) -> None:
        if self.graph is not None:
            self.graph.teardown()
            self.graph = None

    def take_replacements(self) -> list[dict[str, Any]]:
        """The actor replacements since the last call (for the run's log and ``run.json``)."""
        taken, self.replacements = self.replacements, []
        return taken

    def _private_of(self, clients: list[int]) -> dict[int, Tensors]:
        """The latest private state of ``clients`` (fetched from the object store)."""
        by_ref: dict[Any, list[int]] = {}
        for c in clients:
            by_ref.setdefault(self.private_refs[c], []).append(c)
        out: dict[int, Tensors] = {}
        for ref, members in by_ref.items():
            states = ray.get(ref, timeout=self.timeout)
            out.update({c: states[c] for c in members if c in states})
        return out

    def private_states(self) -> dict[int, Tensors]:
        return self._private_of(sorted(self.private_refs))

    def load_private_states(self, states: dict[int, Tensors]) -> None:
        self.private_refs = {}
        refs = []
        placed = self.router.place(list(states))
        for i in range(len(self.actors)):  # every actor, so that none keeps a state the checkpoint does not hold
            mine = {c: states[c] for c in placed.get(i, [])}
            refs.append(self.actors[i].load_private.remote(mine))
            if mine:
                held = ray.put(mine)
                self.private_refs.update({c: held for c in mine})
        ray.get(refs, timeout=self.timeout)

    def describe(self) -> dict[str, Any]:
        return {
            "name": "ray",
            "server": self.config.federation.server,
            "routing": self.config.federation.routing,
            "transport": self.transport,
            "client_actors": len(self.actors),
            "clients_per_actor": len(self.plan.groups[0]),
            **({"gpu_packing": self.plan.packing} if self.plan.packing else {}),
            "cpus_per_actor": self.plan.cpus,
            "gpus_per_client": self.plan.gpus_per_client,
            "nodes": sorted({p["node"] for p in self.placement}),
            "devices": sorted({p["device"] for p in self.placement}),
            **({"cuda_flags": self.placement[0]["cuda_flags"]} if self.placement[0].get("cuda_flags") else {}),
            **({"lockstep_off": self.placement[0]["lockstep_off"]} if self.placement[0].get("lockstep_off") else {}),
            "gcs_address": ray.get_runtime_context().gcs_address,
        }

    def close(self) -> None:
        self._drop_graph()  # an actor takes part in one compiled graph at a time: a kept one joins the next run's
        if self.group_ready:  # likewise in one process group (each actor also leaves it when rebuilt)
            self.group_ready = False
            ray.wait([a.leave_group.remote() for a in self.actors], num_returns=len(self.actors), timeout=self.timeout)
        for i, actor in enumerate(self.actors):
            kept.give_back("client", actor_options(self.plan.resources(i)), actor)
        self.actors = []


def _read_error(ref: Any) -> None:
    """Read a reply that holds an error already dealt with (Ray prints an error no one read when its reference
    goes)."""
    try:
        ray.get(ref)
    except (RayTaskError, RayActorError):
        pass


def _death(error: RayActorError) -> str:
    """A short reason for an actor's death, from Ray's multi-line message (its exit detail where given)."""
    if isinstance(error, ActorUnavailableError):  # Ray's text: the actor's id and the RPC's error code
        return "unreachable: its process or node stopped answering"
    text = str(error)
    for line in text.splitlines():
        if "exit detail" in line.lower():
            detail = line.split("detail:", 1)[-1].strip().split(". ")[0].rstrip(".")
            return shortened(detail, 160) or "the actor process died"
    return first_line(error) if text.strip() else "the actor process died"
