"""SIGTERM stops fedcomp as Ctrl-C does -- and at once where it took the local Ray with it.

Job schedulers (SLURM before a pre-emption, Kubernetes), ``ray job stop`` and ``timeout`` ask a process to stop
with SIGTERM. Python's default is to die at once, and a Ray driver answers it first in Ray's C++ (a stack dump on
stderr, then an abort) and then with ``sys.exit``; either way the user learns neither what was kept nor how to go
on. Answering it as Ctrl-C instead -- with whatever handles SIGINT now: Tune's graceful stop during a sweep, else
``KeyboardInterrupt`` -- lets a run say which round is checkpointed and how to continue it, and a sweep how to
resume.

A SIGTERM sent to the whole process group (``timeout``'s, a job scheduler's) also stops the daemons of the local
Ray this process started (Ray blocks SIGINT in them, not SIGTERM). A graceful stop then waits on a cluster that is
gone: Tune's for Ray's 60 s, after which Ray ends the process with exit 1 and a C++ error; a run's for its actors'
replies. So after a SIGTERM, a process that :func:`depends_on` a cluster and is inside a :func:`farewell` watches
the cluster, and when it stops answering, says the farewell and ends at once with exit code 130: what is on disk
then is what a kill leaves, and fedcomp resumes from that.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

WATCH_EVERY_S = 0.01
"""How often the watch after a SIGTERM asks whether the cluster still answers: often, as it races Ray's own
exit (code 1) tens of milliseconds after a local raylet is gone."""

_lifeline: list[Callable[[], bool]] = []
_farewells: list[Callable[[], str]] = []
_saying = threading.Lock()  # a farewell is not left while the watch says it


def stop_on_sigterm() -> None:
    """Answer SIGTERM in this process as Ctrl-C (from the main thread only, as Python allows; again after
    ``ray.init``, which puts its own handlers in place)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _as_ctrl_c)


def depends_on(alive: Callable[[], bool]) -> None:
    """Name what this process cannot go on without: ``alive()`` says whether it still answers (the Ray cluster it
    started or joined); quick, and callable from any thread."""
    _lifeline[:] = [alive]


@contextmanager
def farewell(words: Callable[[], str]) -> Iterator[None]:
    """While inside: should what this process :func:`depends_on` stop answering after a SIGTERM, print
    ``fedcomp: interrupted: <words()>`` and end the process at once with exit code 130. ``words`` runs on the
    watching thread, only then; it may tidy up first (a run with nothing kept removes its folder)."""
    _farewells.append(words)
    try:
        yield
    finally:
        with _saying:
            _farewells.remove(words)


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    if _lifeline and _farewells:
        threading.Thread(target=_watch, args=(_lifeline[0],), name="fedcomp-after-sigterm", daemon=True).start()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # Python's default raises KeyboardInterrupt; Tune's stops its fit gracefully
        handler(signal.SIGINT, frame)
    else:  # ignored or the system's default
        raise KeyboardInterrupt(signal.Signals(signum).name)


def _watch(alive: Callable[[], bool]) -> None:
    """Until the process leaves its farewells: when ``alive()`` turns false, say the innermost one and exit."""
    while _farewells:
        if not alive():
            with _saying:
                if _farewells:
                    words = _farewells[-1]()
                    sys.stdout.flush()
                    print(f"fedcomp: interrupted: {words}", file=sys.stderr, flush=True)
                    os._exit(130)
            return
        time.sleep(WATCH_EVERY_S)
