"""A Ray worker stopped with SIGTERM goes without a traceback.

Ray stops an actor's process -- ``ray.kill``, Tune stopping a trial (all of them on Ctrl-C), a killed run's
client actors -- by SIGTERM, which the worker answers with Ray's handler: it starts the worker's exit, then
raises ``SystemExit``. When the signal lands while the process runs a weakref callback or a ``__del__`` (the
garbage collector runs them between any two bytecodes), Python cannot raise there: it reports the exception
as "Exception ignored in: <function WeakSet.__init__.<locals>._remove ...>" with a traceback ending in
"SystemExit: 1", and Ray forwards that report to the driver's terminal -- in a Ctrl-C'd sweep after the line
that says how to resume it (1 in 12 such sweeps here). The process is on its way out either way (the raylet
kills it 0.2 s later), so fedcomp's actors and trials leave out exactly that report; every other exception
Python cannot raise is reported as before.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fedcomp.platform.progress import in_a_ray_worker


class DropLostExits:
    """An unraisable hook that drops lost ``SystemExit``\\ s and hands everything else to ``previous``."""

    def __init__(self, previous: Callable[[Any], object]) -> None:
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, SystemExit):
            return
        self.previous(unraisable)


def drop_lost_exits() -> None:
    """Install :class:`DropLostExits` as this process's ``sys.unraisablehook`` (once; from any thread). For Ray
    worker processes only: the driver keeps Python's reports."""
    if not isinstance(sys.unraisablehook, DropLostExits):
        sys.unraisablehook = DropLostExits(sys.unraisablehook)


def drop_lost_exits_in_a_worker() -> None:
    """:func:`drop_lost_exits` where this process is a Ray worker; nothing in a driver. For modules whose code Ray
    loads into a worker before anything of it runs: Tune may start a trial process and stop it before it runs a
    trial (once, at the end of a 12-run sweep in ``benchmarks/sweep_overhead.py``)."""
    if in_a_ray_worker():
        drop_lost_exits()
