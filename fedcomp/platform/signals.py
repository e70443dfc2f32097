"""SIGTERM stops fedcomp as Ctrl-C does -- and at once where it took the local Ray with it.

Job schedulers (SLURM before a pre-emption, Kubernetes), ``ray job stop`` and ``timeout`` ask a process to stop
with SIGTERM. Python's default is to die at once, and a Ray driver answers it first in Ray's C++ (a stack dump on
stderr, then an abort) and then with ``sys.exit``; either way the user learns neither what was kept nor how to go
on. Answering it as Ctrl-C instead -- with whatever handles SIGINT now: Tune's graceful stop during a sweep, else
``KeyboardInterrupt`` -- lets a run say which round is checkpointed and how to continue it, and a sweep how to
resume. Only while fedcomp works (:func:`answering_sigterm`): between its calls in a long-lived process (a notebook)
SIGTERM does what it did before fedcomp's first.

A SIGTERM sent to the whole process group (``timeout``'s, a job scheduler's) also stops the daemons of the local
Ray this process started (Ray blocks SIGINT in them, not SIGTERM). A graceful stop then waits on a cluster that is
gone: Tune's for Ray's 60 s, after which Ray ends the process with exit 1 and a C++ error; a run's for its actors'
replies. So after a SIGTERM, a process that :func:`depends_on` a cluster and is inside a :func:`farewell` watches
the cluster, and when it stops answering, says the farewell and ends at once with exit code 130: what is on disk
then is what a kill leaves, and fedcomp resumes from that.

It is a race: Ray's C++ ends the driver (exit code 1, no words) tens of milliseconds after its raylet. So the watch
starts as the signal arrives, not when Python next runs its handler -- the main thread may sit in a long C call (a Ray
wait, a matrix product): a thread reads the bytes that Python's C-level signal handler writes at once to the wakeup
fd (``signal.set_wakeup_fd``) and starts the watch on a SIGTERM's; and it looks every 2 ms, also at the local Ray's
log monitor, which ends at once where the raylet first shuts down (:func:`fedcomp.actors.cluster.started_daemons`).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

WATCH_EVERY_S = 0.002
"""How often the watch after a SIGTERM asks whether the cluster still answers: often, as it races Ray's own
exit (code 1) tens of milliseconds after a local raylet is gone (a look at the daemons' ``/proc`` files; see
:func:`fedcomp.actors.cluster.answering`)."""

_lifeline: list[Callable[[], bool]] = []
_farewells: list[Callable[[], str]] = []
_saying = threading.Lock()  # a farewell is not left while the watch says it
_watching = threading.Lock()  # held by the one watch a process starts
_wakeup: list[socket.socket] = []  # the sending end of this process's wakeup fd, once installed
_before: list[Any] = [None]  # the SIGTERM handler before the outermost fedcomp call under way, put back as it ends
_calls = [0]  # fedcomp's calls under way in this process (nested: a check's runs)


@contextmanager
def whole_imports() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back while modules are imported that an import cut short breaks for the process's life --
    torch's and Ray's first (in a notebook, an early Ctrl-C left every later run failing: "partially initialized
    module 'ray' has no attribute '_private'"); a Ctrl-C that came meanwhile is raised as it ends. Only in the main
    thread with Python's own handler in place (elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Answer SIGTERM in this process as Ctrl-C while a fedcomp call is under way (:func:`answering_sigterm`; from
    the main thread only, as Python allows; again after ``ray.init``, which puts its own handlers in place), and
    start the watch the moment one arrives."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _as_ctrl_c)
        _listen()


@contextmanager
def answering_sigterm() -> Iterator[None]:
    """A fedcomp call (a run, a sweep; the command line's whole process): inside, SIGTERM is answered as Ctrl-C; as
    the outermost call ends, the handler from before it is put back -- a notebook's process idling after a Ray run
    then ends on SIGTERM as any process does (Python's default), or runs the handler its user set, instead of
    raising a ``KeyboardInterrupt`` into whatever runs next."""
    outermost = _calls[0] == 0 and threading.current_thread() is threading.main_thread()
    if outermost:
        current = signal.getsignal(signal.SIGTERM)
        _before[0] = None if current is _as_ctrl_c else current  # None: not set from Python (a C handler)
    _calls[0] += 1
    stop_on_sigterm()
    try:
        yield
    finally:
        _calls[0] -= 1
        if outermost and _before[0] is not None:
            signal.signal(signal.SIGTERM, _before[0])


def _listen() -> None:
    """Make this process's wakeup fd ours and read it on a thread (started once). Where something else holds the
    wakeup fd (an asyncio loop's signal handlers), it stays theirs: the handler then starts the watch."""
    if not _wakeup:
        reader, sender = socket.socketpair()
        sender.setblocking(False)
        _wakeup.append(sender)
        threading.Thread(target=_read_wakeups, args=(reader,), name="fedcomp-signals", daemon=True).start()
    ours = _wakeup[0].fileno()
    current = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
    if current not in (-1, ours):
        signal.set_wakeup_fd(current)


def _forget_wakeup() -> None:
    """In a forked child: its signals are its own, not a reason for the parent to watch."""
    if not _wakeup:
        return
    try:
        current = signal.set_wakeup_fd(-1)
        if current != _wakeup[0].fileno():
            signal.set_wakeup_fd(current)  # not ours: put back
    except ValueError:  # forked from a thread that is not this child's main one
        pass
    _wakeup.clear()


os.register_at_fork(after_in_child=_forget_wakeup)


def _read_wakeups(reader: socket.socket) -> None:
    while data := reader.recv(64):
        if signal.SIGTERM in data:
            _start_watch()


def _start_watch() -> None:
    """Start the watch, once per process, where there is a cluster to watch and a farewell to say."""
    if _lifeline and _farewells and _watching.acquire(blocking=False):
        threading.Thread(target=_watch, args=(_lifeline[0],), name="fedcomp-after-sigterm", daemon=True).start()


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
    if not _calls[0]:
        _as_before(signum, frame)
        return
    _start_watch()  # started already where the wakeup fd told of the signal
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # Python's default raises KeyboardInterrupt; Tune's stops its fit gracefully
        handler(signal.SIGINT, frame)
    else:  # ignored or the system's default
        raise KeyboardInterrupt(signal.Signals(signum).name)


def _as_before(signum: int, frame: FrameType | None) -> None:
    """SIGTERM outside fedcomp's calls with fedcomp's handler still in place (one set outside a call, or none to put
    back): Python's default, the process ends, killed by the signal."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _watch(alive: Callable[[], bool]) -> None:
    """Until the process leaves its farewells: when ``alive()`` turns false, say the innermost one and exit."""
    try:
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
    finally:
        _watching.release()
