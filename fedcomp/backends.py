"""The backend choice: the one place that knows both the in-process and the Ray backend."""

from __future__ import annotations

import sys

from fedcomp.platform.config import Config
from fedcomp.platform.server_like import ServerLike


def make_server(config: Config) -> ServerLike:
    """An in-process server for ``federation.backend: local``; else a Ray server actor (or the server in this
    process, ``federation.server: driver``), or replicas of the server on the client actors (``replicated``).
    Each is imported here, when chosen: a Ray run's driver with the server replicated or in an actor imports no
    torch."""
    if config.federation.backend == "local":
        from fedcomp.platform.federation import LocalFederation
        from fedcomp.platform.server import Server

        return Server(config, LocalFederation)
    if config.federation.server == "replicated":
        from fedcomp.actors.replicated_server import GroupUnavailable, ReplicatedServer

        try:
            return ReplicatedServer(config)
        except GroupUnavailable as error:  # the same numbers with the server here (and no more processes to place)
            # (the actors could not form their group, or a Ray Client's driver cannot wait on their stream)
            print(f"fedcomp: warning: the server cannot be replicated on the client actors here ({error}); "
                  f"this run's server runs in the driver and reaches them by actor calls (federation.server: driver, "
                  f"transport: calls; the same numbers)", file=sys.stderr, flush=True)
            config = config.replace(**{"federation.server": "driver", "federation.transport": "calls"})
    from fedcomp.actors.server_actor import RayServer

    return RayServer(config)
