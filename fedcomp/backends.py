"""The backend choice: the one place that knows both the in-process and the Ray backend."""

from __future__ import annotations

import importlib
import sys

from fedcomp.platform.config import Config
from fedcomp.platform.server_like import ServerLike
from fedcomp.platform.signals import whole_imports


def make_server(config: Config) -> ServerLike:
    """An in-process server for ``federation.backend: local``; else a Ray server actor (or the server in this
    process, ``federation.server: driver``), or replicas of the server on the client actors (``replicated``).
    Each is imported here, when chosen: a Ray run's driver with the server replicated or in an actor imports no
    torch."""
    _import_whole(config)
    if config.federation.backend == "local":
        from fedcomp.platform.federation import LocalFederation
        from fedcomp.platform.server import Server

        return Server(config, LocalFederation)
    if config.federation.server == "replicated":
        from fedcomp.actors.replicated_server import GroupUnavailable, ReplicatedServer

        try:
            return ReplicatedServer(config)
        except GroupUnavailable as error:  # the same numbers with the server elsewhere
            # (the actors could not form their group, or a Ray Client's driver cannot wait on their stream)
            if error.server == "actor":
                where, instead = "in a server actor on the cluster", {"server": "actor"}
            else:
                where, instead = "in the driver", {"server": "driver", "transport": "calls"}
            settings = ", ".join(f"{key}: {value}" for key, value in instead.items())
            print(f"fedcomp: warning: the server cannot be replicated on the client actors here ({error}); "
                  f"this run's server runs {where} and reaches them by actor calls ({settings}; the same numbers)",
                  file=sys.stderr, flush=True)
            config = config.replace(**{f"federation.{key}": value for key, value in instead.items()})
    from fedcomp.actors.server_actor import RayServer

    return RayServer(config)


def _import_whole(config: Config) -> None:
    """Import the modules the run's server needs -- Ray's, and torch where this process computes -- with Ctrl-C held
    back until they are whole (:func:`~fedcomp.platform.signals.whole_imports`): the first call of a notebook's
    process imports them, and one cut short would break every later run in it."""
    fed = config.federation
    names = ["fedcomp.actors.replicated_server", "fedcomp.actors.server_actor"] if fed.backend == "ray" else []
    if fed.backend == "local" or fed.server == "driver":
        names += ["fedcomp.platform.federation", "fedcomp.platform.server"]
    with whole_imports():
        for name in names:
            importlib.import_module(name)
