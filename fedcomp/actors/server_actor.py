"""The server actor (runs the round program next to the client actors) and the driver's proxy to it, which
can also hold the server in the driver's own process (``federation.server: driver``).

The server itself (torch, the task) is imported where it is built: a driver that runs it in an actor never
imports torch.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from fedcomp.actors import kept
from fedcomp.actors.cluster import (
    actor_options,
    adopt_env,
    cluster_nodes,
    config_here,
    connect,
    describe_resources,
    fedcomp_env,
    node_lost_notice,
    plan_actors,
    resume_advice,
)
from fedcomp.actors.federation import _death, unwrap, wait_ready
from fedcomp.actors.quiet_exit import drop_lost_exits_in_a_worker
from fedcomp.platform.config import Config
from fedcomp.platform.errors import ActorLost
from fedcomp.platform.server_like import RoundReply

drop_lost_exits_in_a_worker()  # a server actor stopped with SIGTERM, even before its constructor ran, goes without a traceback


class ServerActor:
    """Holds the :class:`Server` (global state, evaluation data) and the client actors it starts."""

    def __init__(self, config: Config | Mapping[str, Any], in_actor: bool = True, keep: bool = False,
                 incarnation: int = 0, env: Mapping[str, str] | None = None) -> None:
        self.setup(config, in_actor, keep, incarnation, env)

    def setup(self, config: Config | Mapping[str, Any], in_actor: bool = True, keep: bool = False,
              incarnation: int = 0, env: Mapping[str, str] | None = None) -> None:
        """Build the server and start (or, ``keep``, take kept) client actors: the constructor, and a kept
        server actor's rebuild for the next run (:mod:`fedcomp.actors.kept`); ``config`` as its dict in an actor
        (:func:`~fedcomp.actors.cluster.config_here`). ``incarnation``: server actors of this run started before it
        (the ones that died). ``env``: the driver's ``FEDCOMP_*`` variables in an actor
        (:func:`~fedcomp.actors.cluster.adopt_env`), passed on to the client actors it starts."""
        import torch

        from fedcomp.actors.federation import RayFederation
        from fedcomp.platform.server import Server

        adopt_env(env)
        if keep:
            kept.keep_between_runs()
        if in_actor:  # in the driver (federation.server: driver) the user's torch settings stay as they are
            torch.set_num_threads(1)
        self.error: Exception | None = None
        """An error building the server or its client actors, raised by :meth:`ready` (an exception leaving
        an actor's constructor reaches the driver only as text, after Ray has printed its traceback)."""
        try:
            self.server = Server(config_here(config), RayFederation)
        except Exception as error:
            self.error = error
        # Fault injection for the reliability tests: FEDCOMP_FAULT_KILL="server<r>" makes the run's first server
        # actor exit (a real process exit) as it is asked to run round r.
        self.exit_at = {item for item in os.environ.get("FEDCOMP_FAULT_KILL", "").split(",") if incarnation == 0}

    def ready(self) -> str:
        """The node this server runs on (once it and its client actors are up)."""
        if self.error is not None:
            raise self.error
        return str(ray.get_runtime_context().get_node_id())

    def placement(self) -> list[dict[str, Any]]:
        return list(self.server.federation.placement)  # type: ignore[attr-defined]

    def run_round(self, evaluate: bool = False) -> dict[str, Any]:
        """The round's record, with what the driver checks after every round in the same reply: whether the
        global state is finite, and the client actors replaced during the round; with ``evaluate``, also the
        evaluation after the round and the seconds it took (one driver -> server actor hop, not two)."""
        from fedcomp.platform.run_checks import state_finite

        if f"server{self.server.counters.round + 1}" in self.exit_at:
            os._exit(1)
        record, evaluation, evaluate_s = self.server.one_round(evaluate)
        return {
            "record": record,
            "evaluation": evaluation,
            "evaluate_s": evaluate_s,
            "model_finite": state_finite(self.server.tensors()),
            "replacements": self.server.federation.take_replacements(),  # type: ignore[attr-defined]
        }

    def evaluate(self) -> dict[str, float]:
        return self.server.evaluate()

    def checkpoint(self) -> dict[str, Any]:
        return self.server.checkpoint()

    def checkpoint_file(self, extra: dict[str, Any]) -> bytes:
        return self.server.checkpoint_file(extra)

    def restore(self, checkpoint: dict[str, Any] | bytes) -> None:
        """Back to ``checkpoint``: the server's, or a checkpoint file's content (:meth:`checkpoint_file`)."""
        from fedcomp.platform.results import server_checkpoint

        self.server.restore(server_checkpoint(checkpoint))

    def restarts(self) -> int:
        return self.server.federation.restarts  # type: ignore[attr-defined]

    def profile(self) -> dict[str, float]:
        return self.server.profile()

    def describe(self) -> dict[str, Any]:
        return self.server.describe()

    def close(self) -> None:
        self.server.close()


RemoteServer = ray.remote(ServerActor)


class RayServer:
    """Driver-side proxy with the :class:`~fedcomp.platform.server.ServerLike` interface: to a server actor, or
    (``federation.server: driver``) to the same :class:`ServerActor` held in this process.

    A server actor that dies (its process killed, its node gone: its client actors go with it) is started again, up
    to ``federation.max_retries`` times, from the last checkpoint the driver received (or from the start), and the
    rounds since then run again, unseen: the same numbers, since every random draw is keyed by (seed, client,
    round, step).
    """

    def __init__(self, config: Config) -> None:
        cluster = connect(config.federation.ray_address, modules=config.modules())
        plan = plan_actors(config.federation, cluster, cluster_nodes())  # fail here, at once, on a shortfall
        self.config, self.plan = config, plan
        self.driver_s = 0.0
        self.finite = True
        self.replacements: list[dict[str, Any]] = []
        self.actor: Any = None
        self.options: dict[str, Any] = {}
        self.here: ServerActor | None = None
        self.round = 0
        """Rounds run and handed to the caller."""
        self.asked = 0
        """Rounds the server actor has been asked to run: its round once it has run them (a caller that stops early
        leaves one asked for, untaken)."""
        self.saved: tuple[int, dict[str, Any] | bytes] | None = None
        """The round and content of the last checkpoint file the server actor saved (or of the checkpoint it was
        restored from): where a new server actor starts from, if this one dies."""
        self.incarnation = 0
        self.node: str | None = None
        """The node the server actor runs on."""
        if config.federation.server == "driver":
            # The CPU share planned for the server stays unasked: the driver's process does that work here.
            self.here = ServerActor(config, in_actor=False)
            self.here.ready()
            return
        self.options = actor_options({"CPU": plan.server_cpus})
        self._start()

    def _start(self, waiting: Callable[[], str | None] | None = None) -> None:
        """Start the server actor (``waiting``: see :func:`~fedcomp.actors.federation.wait_ready`)."""
        self.actor = kept.start("server", RemoteServer, self.options, self.config.to_dict(), keep=kept.keeping(),
                                incarnation=self.incarnation, env=fedcomp_env())
        kept.release()  # kept actors this run could not use would hold resources its own actors wait for
        try:
            # The server's constructor starts and awaits the client actors under the same deadline.
            [self.node] = wait_ready([self.actor], ["the server actor"], self.start_s, waiting)
        except BaseException:
            ray.kill(self.actor)
            raise

    @property
    def start_s(self) -> float:
        """How long a server actor may take to start, with its client actors."""
        return 2 * self.config.federation.actor_timeout_s + 60

    def _node_lost(self) -> Callable[[], str | None]:
        """While a server actor in place of a dead one waits for room: whether the dead one's node left the cluster,
        said once as found (else the wait is silent until its deadline)."""
        round = self.round + 1
        return node_lost_notice(
            self.node, lambda gone: f"round {round}: {gone} left the cluster with the server actor; the one in its "
            f"place asks for {self.options.get('num_cpus', 0):g} CPU, and its client actors for theirs, and waits up "
            f"to {self.start_s:g} s for room (available now: {describe_resources()})",
            lambda: resume_advice(self.config.federation.clients, self.plan.cpus, self.plan.server_cpus))

    def _call(self, method: str, *args: Any) -> Any:
        if self.here is not None:
            return getattr(self.here, method)(*args)
        while True:
            try:
                return ray.get(getattr(self.actor, method).remote(*args))
            except RayTaskError as error:
                raise unwrap(error) from None
            except RayActorError as error:
                self._revive(error)

    def _revive(self, error: RayActorError) -> None:
        """Start another server actor in place of the dead one, at the caller's round: from the last checkpoint,
        the rounds since run again (one that dies meanwhile is started again in turn).

        Raises:
            ActorLost: ``federation.max_retries`` server actors have been started again already.
        """
        retries = self.config.federation.max_retries
        while True:
            reason = _death(error)
            if self.incarnation == retries:
                raise ActorLost(f"federation.server = 'actor': the server actor died ({reason}); the server's state "
                                f"lived there" + (f" (started again {retries} times: federation.max_retries = "
                                                  f"{retries})" if retries else ""))
            with contextlib.suppress(Exception):  # gone already, or its node: let go of what Ray still holds for it
                ray.kill(self.actor)
            self.incarnation += 1
            self._start(self._node_lost())
            start, content = self.saved or (0, None)
            try:
                if content is not None:
                    ray.get(self.actor.restore.remote(content))
                for _ in range(start, self.asked):  # the rounds since, unseen; their client actors' replacements told
                    self.replacements.extend(ray.get(self.actor.run_round.remote(False))["replacements"])
                break
            except RayTaskError as failed:
                raise unwrap(failed) from None
            except RayActorError as again:
                error = again
        self.replacements.append({
            "round": self.round + 1, "actor": "server", "clients": [], "incarnation": self.incarnation,
            "reason": reason, "rerun": f"from round {start}'s checkpoint, and re-ran the rounds since" if start else
            "from the start, and re-ran the rounds since"})

    def run_round(self) -> dict[str, Any]:
        started = time.perf_counter()
        reply = self._call("run_round", False)
        self.asked += 1
        return self._take(reply, started)[0]

    def run_rounds(self, evaluated: Sequence[bool]) -> Iterator[RoundReply]:
        """The rounds (see :class:`~fedcomp.platform.server.ServerLike`), each with its evaluation in the same call
        to the server actor. The next round's call is submitted before this round's reply is awaited, so the server
        actor starts it as soon as it has replied, while the reply travels and the caller uses it: the driver ->
        server actor hop leaves the rounds' critical path. A caller that stops early leaves the server actor at
        most one round further on."""
        if self.actor is None:
            for evaluate in evaluated:
                started = time.perf_counter()
                yield self._take(self._call("run_round", evaluate), started)
            return
        evaluated = list(evaluated)
        done = 0
        while done < len(evaluated):
            pending = deque([self.actor.run_round.remote(evaluated[done])])
            self.asked += 1
            try:
                while pending:
                    submitted = done + len(pending)
                    if submitted < len(evaluated):  # queued behind the round the server actor runs now: at most
                        pending.append(self.actor.run_round.remote(evaluated[submitted]))  # one round ahead of the caller
                        self.asked += 1
                    started = time.perf_counter()
                    reply = ray.get(pending.popleft())
                    done += 1
                    yield self._take(reply, started)
            except RayTaskError as error:
                raise unwrap(error) from None
            except RayActorError as error:
                self.asked = self.round  # the rounds left go to the new server actor, from the caller's round
                self._revive(error)

    def _take(self, reply: dict[str, Any], started: float) -> RoundReply:
        """Note what the driver checks after every round (finite model, replaced actors) and the seconds it waited
        for the reply beyond the evaluation (``profile``'s driver -> server actor hop)."""
        self.round += 1
        self.driver_s += time.perf_counter() - started - reply["evaluate_s"]
        self.finite = reply["model_finite"]
        self.replacements.extend(reply["replacements"])
        return reply["record"], reply["evaluation"], reply["evaluate_s"]

    def model_finite(self) -> bool:
        """Whether the global state was finite after the last round (checked in the server actor)."""
        return self.finite

    def take_replacements(self) -> list[dict[str, Any]]:
        """Client actors replaced since the last call: round (1-based), actor, clients, reason."""
        taken, self.replacements = self.replacements, []
        return taken

    def profile(self) -> dict[str, float]:
        """Seconds per phase of the rounds so far (see :meth:`Server.profile`), plus the driver's calls to
        the server actor beyond the server's own time in them."""
        phases = self._call("profile")
        phases["driver -> server actor call"] = self.driver_s - sum(phases.values())
        return phases

    def evaluate(self) -> dict[str, float]:
        return self._call("evaluate")

    def checkpoint(self) -> dict[str, Any]:
        return self._call("checkpoint")

    def checkpoint_file(self, extra: dict[str, Any]) -> bytes:
        content: bytes = self._call("checkpoint_file", extra)  # saved in the server actor: the driver gets bytes
        self.saved = (self.asked, content)  # calls run in order: the rounds asked for ran first
        return content

    def restore(self, checkpoint: dict[str, Any]) -> None:
        self._call("restore", checkpoint)
        self.round = self.asked = int(checkpoint["counters"]["round"])
        self.saved = (self.round, checkpoint)

    def restarts(self) -> int:
        """Client actors replaced after dying, so far."""
        return self._call("restarts")

    def describe(self) -> dict[str, Any]:
        return self._call("describe")

    def placement(self) -> list[dict[str, Any]]:
        """Per client actor: its clients, node id, assigned GPU ids and torch device."""
        return self._call("placement")

    def close(self) -> None:
        if self.here is not None:
            self.here.close()
            return
        with contextlib.suppress(Exception):  # the actor may already be gone; killing it below is what matters
            ray.get(self.actor.close.remote())
        kept.give_back("server", self.options, self.actor)
