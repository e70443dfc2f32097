"""The backend choice: the one place that knows both the in-process and the Ray backend."""

from __future__ import annotations

from fedcomp.platform.config import Config
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.server import Server, ServerLike


def make_server(config: Config) -> ServerLike:
    """An in-process server for ``federation.backend: local``, else a Ray server actor."""
    if config.federation.backend == "local":
        return Server(config, LocalFederation)
    from fedcomp.actors.server_actor import RayServer

    return RayServer(config)
