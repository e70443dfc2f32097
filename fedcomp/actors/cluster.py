"""Joining or starting a Ray cluster, and sizing actor resource requests from what the cluster has.

Ray waits forever for resources that do not exist, so every request is checked against
``ray.cluster_resources()`` first and a shortfall fails at once with a message that names it.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Mapping

import ray

from fedcomp.actors.quiet import quiet_ray_start
from fedcomp.platform.config import FederationConfig
from fedcomp.platform.errors import ResourceError
from fedcomp.platform.progress import announce

GRANULARITY = 1e-4  # Ray's smallest fractional resource unit


def connect(address: str | None = None) -> dict[str, float]:
    """Join ``address`` (or ``$RAY_ADDRESS``) if given, reuse an initialised Ray, else start a local one.

    Returns the cluster's total resources.
    """
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, configure_logging=True)
        quiet_ray_start()
        announce(f"connecting to Ray at {address} ..." if address else "starting local Ray ...")
        started = time.perf_counter()
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(**kwargs)
        resources = ray.cluster_resources()
        announce(f"Ray ready in {time.perf_counter() - started:.1f} s: " + ", ".join(
            f"{resources.get(k, 0):g} {k}s" for k in ("CPU", "GPU") if k == "CPU" or resources.get(k)))
    return dict(ray.cluster_resources())


@dataclass(frozen=True)
class ActorPlan:
    """Which clients each actor hosts and what each actor asks Ray for."""

    groups: tuple[tuple[int, ...], ...]
    cpus: float
    gpus_per_client: float
    server_cpus: float

    def gpus(self, group: int) -> float:
        return floor_share(self.gpus_per_client * len(self.groups[group]))

    def resources(self, group: int) -> dict[str, float]:
        res = {"CPU": self.cpus}
        if self.gpus(group):
            res["GPU"] = self.gpus(group)
        return res


def floor_share(value: float) -> float:
    """``value`` rounded down to Ray's resource granularity."""
    return math.floor(value / GRANULARITY + 1e-9) * GRANULARITY


def plan_actors(fed: FederationConfig, cluster: Mapping[str, float]) -> ActorPlan:
    """Pack clients into actors and size their CPU/GPU requests for ``cluster`` (its total resources).

    Raises:
        ResourceError: GPUs or CPUs are asked for that the cluster does not have.
    """
    k, per = fed.clients, fed.clients_per_actor
    groups = tuple(tuple(range(i, min(i + per, k))) for i in range(0, k, per))
    total_gpus, total_cpus = float(cluster.get("GPU", 0.0)), float(cluster.get("CPU", 0.0))

    if fed.gpus_per_client == "auto":
        gpc = floor_share(min(1.0, total_gpus / k)) if total_gpus else 0.0
    else:
        gpc = float(fed.gpus_per_client)
        need = gpc * k
        if need > 0 and need > total_gpus + 1e-9:
            have = "has no GPUs" if not total_gpus else f"has {total_gpus:g}"
            raise ResourceError(
                f"federation.gpus_per_client = {gpc:g} needs {need:g} GPUs for {k} clients but the cluster {have}; "
                f"use gpus_per_client: 0 or 'auto'"
            )
        if gpc * per > 1 and not float(gpc * per).is_integer():
            raise ResourceError(
                f"federation.gpus_per_client = {gpc:g} x clients_per_actor = {per} asks one actor for "
                f"{gpc * per:g} GPUs; an actor can take a fraction of one GPU or whole GPUs"
            )

    n = len(groups)
    if fed.cpus_per_actor == "auto":
        cpus = floor_share(min(1.0, total_cpus / (n + 1)))
        if cpus < GRANULARITY:
            raise ResourceError(
                f"federation.clients = {k} with clients_per_actor = {per} makes {n} actors, too many for "
                f"{total_cpus:g} CPUs; raise federation.clients_per_actor"
            )
        server = cpus
    else:
        cpus = server = float(fed.cpus_per_actor)
        need = cpus * (n + 1)
        if need > total_cpus + 1e-9:
            raise ResourceError(
                f"federation.cpus_per_actor = {cpus:g} needs {need:g} CPUs for {n} client actors and the server "
                f"but the cluster has {total_cpus:g}"
            )
    return ActorPlan(groups, cpus, gpc, server)


def fedcomp_env() -> dict[str, str]:
    """``FEDCOMP_*`` variables of this process, passed on to the actors it starts."""
    return {k: v for k, v in os.environ.items() if k.startswith("FEDCOMP_")}


def actor_options(resources: Mapping[str, float]) -> dict:
    options: dict = {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0), "max_restarts": 0}
    env = fedcomp_env()
    if env:
        options["runtime_env"] = {"env_vars": env}
    return options


def describe_resources() -> str:
    avail = ray.available_resources()
    return ", ".join(f"{k}={avail.get(k, 0):g}" for k in ("CPU", "GPU") if k in ray.cluster_resources() or k == "CPU")
