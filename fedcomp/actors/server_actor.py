"""The server actor (runs the round program next to the client actors) and the driver's proxy to it."""

from __future__ import annotations

import time
from typing import Any

import ray
import torch
from ray.exceptions import RayTaskError

from fedcomp.actors.cluster import actor_options, connect, plan_actors
from fedcomp.actors.federation import RayFederation, wait_ready
from fedcomp.platform.config import Config
from fedcomp.platform.errors import PlatformError
from fedcomp.platform.server import Server


class ServerActor:
    """Holds the :class:`Server` (global state, evaluation data) and the client actors it starts."""

    def __init__(self, config: Config) -> None:
        torch.set_num_threads(1)
        self.server = Server(config, RayFederation)

    def ready(self) -> int:
        return len(self.server.federation.actors)  # type: ignore[attr-defined]

    def placement(self) -> list[dict]:
        return list(self.server.federation.placement)  # type: ignore[attr-defined]

    def run_round(self) -> dict[str, Any]:
        return self.server.run_round()

    def evaluate(self) -> dict[str, float]:
        return self.server.evaluate()

    def checkpoint(self) -> dict[str, Any]:
        return self.server.checkpoint()

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


def _unwrap(error: RayTaskError) -> BaseException:
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, PlatformError) else error


class RayServer:
    """Driver-side proxy with the :class:`~fedcomp.platform.server.ServerLike` interface."""

    def __init__(self, config: Config) -> None:
        cluster = connect(config.federation.ray_address)
        plan = plan_actors(config.federation, cluster)  # fail here, at once, on a resource shortfall
        options = actor_options({"CPU": plan.server_cpus})
        self.driver_s = 0.0
        self.actor = RemoteServer.options(**options).remote(config)
        try:
            # The server's constructor starts and awaits the client actors under the same deadline.
            wait_ready([self.actor], ["the server actor"], 2 * config.federation.actor_timeout_s + 60)
        except RayTaskError as error:
            ray.kill(self.actor)
            raise _unwrap(error) from None
        except BaseException:
            ray.kill(self.actor)
            raise

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except RayTaskError as error:
            raise _unwrap(error) from None

    def run_round(self) -> dict[str, Any]:
        started = time.perf_counter()
        record = self._call("run_round")
        self.driver_s += time.perf_counter() - started
        return record

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

    def restore(self, checkpoint: dict[str, Any]) -> None:
        self._call("restore", checkpoint)

    def restarts(self) -> int:
        """Client actors replaced after dying, so far."""
        return self._call("restarts")

    def describe(self) -> dict[str, Any]:
        return self._call("describe")

    def placement(self) -> list[dict]:
        """Per client actor: its clients, node id, assigned GPU ids and torch device."""
        return self._call("placement")

    def close(self) -> None:
        try:
            self._call("close")
        except Exception:  # the actor may already be gone; killing it below is what matters
            pass
        ray.kill(self.actor)
