"""Actors kept between the runs of one process, so that the next run does not start processes again.

A Tune trial process that Tune reuses for the next trial (``reuse_actors``), or a packed trial running its
configurations one after another, would otherwise start a server actor and every client actor afresh for each
run: a new process each, importing torch, seconds per run. Where keeping is switched on, a finished run hands
its actors back here (each is checked alive when taken), keyed by the options they were started with (resources, environment), and the
next run's actors with the same options are taken from here and rebuilt from the new run's config by their own
``setup`` -- the code their constructor runs -- so a run on kept actors gives the same numbers as on fresh ones.

Keeping is off unless switched on (a plain ``fedcomp run`` kills its actors at the end, as before); the kept
actors die with the process that owns them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any, Literal

Kind = Literal["client", "server"]

_kept: dict[str, list[Any]] = {}
_keeping = False


def keep_between_runs(on: bool = True) -> None:
    """Switch keeping on (or off, which also kills every kept actor) for this process."""
    global _keeping
    _keeping = on
    if not on:
        release()


def keeping() -> bool:
    return _keeping


def _key(kind: Kind, options: Mapping[str, Any]) -> str:
    return json.dumps([kind, options], sort_keys=True, default=str)


def take(kind: Kind, options: Mapping[str, Any]) -> Any | None:
    """A live kept actor of ``kind`` started with ``options``, or None (keeping off, or none kept). Once a run
    has taken what it can use, it calls :func:`release`: kept actors it did not take hold resources (in a Tune
    trial, bundles of its placement group) that the actors it starts instead would wait for."""
    idle = _kept.get(_key(kind, options), []) if _keeping else []
    while idle:
        actor = idle.pop(0)
        if _answers(actor):
            return actor
    return None


def start(kind: Kind, remote_class: Any, options: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
    """A kept actor of ``kind`` rebuilt by ``setup(*args, **kwargs)`` (sent before any other call, so it runs
    first), or a new one of ``remote_class`` constructed with the same arguments."""
    actor = take(kind, options)
    if actor is None:
        return remote_class.options(**options).remote(*args, **kwargs)
    actor.setup.remote(*args, **kwargs)
    return actor


def give_back(kind: Kind, options: Mapping[str, Any], actor: Any) -> None:
    """Keep ``actor`` for the next run (checked alive when taken); kill it when keeping is off."""
    if _keeping:
        _kept.setdefault(_key(kind, options), []).append(actor)
    else:
        import ray

        ray.kill(actor)


def _answers(actor: Any, timeout: float = 10.0) -> bool:
    """Whether ``actor`` is alive (its process may have died since it was kept)."""
    import ray

    try:
        ray.get(actor.__ray_ready__.remote(), timeout=timeout)
        return True
    except Exception:  # died, hangs, or belongs to a Ray session since shut down (``ray.shutdown()``): not taken
        _kill(actor)
        return False


def release() -> None:
    """Kill every kept actor not taken (none kept: Ray is not imported)."""
    kept = [actor for actors in _kept.values() for actor in actors]
    _kept.clear()
    for actor in kept:
        _kill(actor)


def _kill(actor: Any) -> None:
    """Kill ``actor`` where it lives: a handle from a Ray session that has ended since (the user's ``ray.shutdown()``)
    has nothing left to kill, and Ray refuses it."""
    import ray

    with contextlib.suppress(Exception):
        ray.kill(actor)
