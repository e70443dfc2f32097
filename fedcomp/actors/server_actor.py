"""The server actor (runs the round program next to the client actors) and the driver's proxy to it, which
can also hold the server in the driver's own process (``federation.server: driver``).

The server itself (torch, the task) is imported where it is built: a driver that runs it in an actor never
imports torch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from fedcomp.actors import kept
from fedcomp.actors.cluster import actor_options, cluster_nodes, config_here, connect, plan_actors
from fedcomp.actors.federation import _death, unwrap, wait_ready
from fedcomp.actors.quiet_exit import drop_lost_exits_in_a_worker
from fedcomp.platform.config import Config
from fedcomp.platform.errors import ActorLost
from fedcomp.platform.server_like import RoundReply

drop_lost_exits_in_a_worker()  # a server actor stopped with SIGTERM, even before its constructor ran, goes without a traceback


class ServerActor:
    """Holds the :class:`Server` (global state, evaluation data) and the client actors it starts."""

    def __init__(self, config: Config | Mapping[str, Any], in_actor: bool = True, keep: bool = False) -> None:
        self.setup(config, in_actor, keep)

    def setup(self, config: Config | Mapping[str, Any], in_actor: bool = True, keep: bool = False) -> None:
        """Build the server and start (or, ``keep``, take kept) client actors: the constructor, and a kept
        server actor's rebuild for the next run (:mod:`fedcomp.actors.kept`); ``config`` as its dict in an actor
        (:func:`~fedcomp.actors.cluster.config_here`)."""
        import torch

        from fedcomp.actors.federation import RayFederation
        from fedcomp.platform.server import Server

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

    def ready(self) -> int:
        if self.error is not None:
            raise self.error
        return len(self.server.federation.actors)  # type: ignore[attr-defined]

    def placement(self) -> list[dict[str, Any]]:
        return list(self.server.federation.placement)  # type: ignore[attr-defined]

    def run_round(self, evaluate: bool = False) -> dict[str, Any]:
        """The round's record, with what the driver checks after every round in the same reply: whether the
        global state is finite, and the client actors replaced during the round; with ``evaluate``, also the
        evaluation after the round and the seconds it took (one driver -> server actor hop, not two)."""
        from fedcomp.platform.run_checks import state_finite

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

    def restore(self, checkpoint: dict[str, Any]) -> None:
        self.server.restore(checkpoint)

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
    (``federation.server: driver``) to the same :class:`ServerActor` held in this process."""

    def __init__(self, config: Config) -> None:
        cluster = connect(config.federation.ray_address, modules=config.modules())
        plan = plan_actors(config.federation, cluster, cluster_nodes())  # fail here, at once, on a shortfall
        self.driver_s = 0.0
        self.finite = True
        self.replacements: list[dict[str, Any]] = []
        self.actor: Any = None
        self.options: dict[str, Any] = {}
        self.here: ServerActor | None = None
        if config.federation.server == "driver":
            # The CPU share planned for the server stays unasked: the driver's process does that work here.
            self.here = ServerActor(config, in_actor=False)
            self.here.ready()
            return
        self.options = actor_options({"CPU": plan.server_cpus})
        self.actor = kept.start("server", RemoteServer, self.options, config.to_dict(), keep=kept.keeping())
        kept.release()  # kept actors this run could not use would hold resources its own actors wait for
        try:
            # The server's constructor starts and awaits the client actors under the same deadline.
            wait_ready([self.actor], ["the server actor"], 2 * config.federation.actor_timeout_s + 60)
        except BaseException:
            ray.kill(self.actor)
            raise

    def _call(self, method: str, *args: Any) -> Any:
        if self.here is not None:
            return getattr(self.here, method)(*args)
        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except RayTaskError as error:
            raise unwrap(error) from None
        except RayActorError as error:
            raise _lost(error) from None

    def run_round(self) -> dict[str, Any]:
        started = time.perf_counter()
        return self._take(self._call("run_round", False), started)[0]

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
        plan, pending = iter(evaluated), deque[Any]()

        def submit() -> None:
            evaluate = next(plan, None)
            if evaluate is not None:
                pending.append(self.actor.run_round.remote(evaluate))

        submit()
        while pending:
            submit()  # queued behind the round the server actor runs now: at most one round ahead of the caller
            started = time.perf_counter()
            try:
                reply = ray.get(pending.popleft())
            except RayTaskError as error:
                raise unwrap(error) from None
            except RayActorError as error:
                raise _lost(error) from None
            yield self._take(reply, started)

    def _take(self, reply: dict[str, Any], started: float) -> RoundReply:
        """Note what the driver checks after every round (finite model, replaced actors) and the seconds it waited
        for the reply beyond the evaluation (``profile``'s driver -> server actor hop)."""
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
        return self._call("checkpoint_file", extra)  # saved in the server actor: the driver gets bytes

    def restore(self, checkpoint: dict[str, Any]) -> None:
        self._call("restore", checkpoint)

    def restarts(self) -> int:
        """Client actors replaced after dying, so far."""
        return self._call("restarts")

    def describe(self) -> dict[str, Any]:
        return self._call("describe")

    def placement(self) -> list[dict[str, Any]]:
        """Per client actor: its clients, node id, assigned GPU ids and torch device."""
        return self._call("placement")

    def close(self) -> None:
        try:
            self._call("close")
        except Exception:  # the actor may already be gone; killing it below is what matters
            pass
        if self.actor is not None:
            kept.give_back("server", self.options, self.actor)


def _lost(error: RayActorError) -> ActorLost:
    """The server actor's death as one line (its process was killed, or its node went): the server's state lives
    there, so the run stops and resumes from its checkpoint."""
    return ActorLost(f"federation.server = 'actor': the server actor died ({_death(error)}); the server's state "
                     f"lived there")
