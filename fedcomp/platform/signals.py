"""SIGTERM stops fedcomp as Ctrl-C does.

Job schedulers (SLURM before a pre-emption, Kubernetes), ``ray job stop`` and ``timeout`` ask a process to stop
with SIGTERM. Python's default is to die at once, and a Ray driver answers it first in Ray's C++ (a stack dump on
stderr, then an abort) and then with ``sys.exit``; either way the user learns neither what was kept nor how to go
on. Answering it as Ctrl-C instead -- with whatever handles SIGINT now: Tune's graceful stop during a sweep, else
``KeyboardInterrupt`` -- lets a run say which round is checkpointed and how to continue it, and a sweep how to
resume.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


def stop_on_sigterm() -> None:
    """Answer SIGTERM in this process as Ctrl-C (from the main thread only, as Python allows; again after
    ``ray.init``, which puts its own handlers in place)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _as_ctrl_c)


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # Python's default raises KeyboardInterrupt; Tune's stops its fit gracefully
        handler(signal.SIGINT, frame)
    else:  # ignored or the system's default
        raise KeyboardInterrupt(signal.Signals(signum).name)
