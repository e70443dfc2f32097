"""The backend choice: the one place that knows both the in-process and the Ray backend."""

from __future__ import annotations

from fedcomp.platform.config import Config
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.server import Server, ServerLike


def make_server(config: Config) -> ServerLike:
    """An in-process server for ``federation.backend: local``; else a Ray server actor (or the server in this
    process, ``federation.server: driver``), or replicas of the server on the client actors (``replicated``)."""
    if config.federation.backend == "local":
        return Server(config, LocalFederation)
    if config.federation.server == "replicated":
        from fedcomp.actors.replicated_server import ReplicatedServer

        return ReplicatedServer(config)
    from fedcomp.actors.server_actor import RayServer

    return RayServer(config)
