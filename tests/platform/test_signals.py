"""SIGTERM answered as Ctrl-C: by whatever handles SIGINT now (Tune's graceful stop during a sweep), else by
``KeyboardInterrupt`` (a real signal to this process, with its handlers put back afterwards); and after a SIGTERM,
a cluster lost inside a farewell ends the process with its words (in a process of its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fedcomp.platform.signals import stop_on_sigterm


@pytest.fixture
def handlers():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGINT, before[0])
    signal.signal(signal.SIGTERM, before[1])


def test_sigterm_goes_to_the_sigint_handler_in_place(handlers):
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    stop_on_sigterm()
    os.kill(os.getpid(), signal.SIGTERM)
    assert caught == [signal.SIGINT]


@pytest.mark.parametrize("sigint", [signal.default_int_handler, signal.SIG_DFL, signal.SIG_IGN])
def test_sigterm_without_a_python_sigint_handler_is_a_keyboard_interrupt(handlers, sigint):
    signal.signal(signal.SIGINT, sigint)
    stop_on_sigterm()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # not reached: the handler runs as the signal arrives


WATCHED = """
import os, signal, sys, threading, time
from fedcomp.platform import signals
state = {{"alive": True}}
signals.depends_on(lambda: state["alive"])
signal.signal(signal.SIGINT, lambda signum, frame: None)  # a graceful stop that carries on, as Tune's does
signals.stop_on_sigterm()
with signals.farewell(lambda: "kept what a kill keeps"):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)
    state["alive"] = {alive_inside}
    time.sleep(2)
state["alive"] = False  # the process stops its cluster as it ends
time.sleep(0.5)
print("ended normally")
"""


@pytest.mark.parametrize("lost_inside", [False, True])
def test_after_a_sigterm_a_lost_cluster_ends_the_process_with_its_farewell(lost_inside):
    """Lost inside the farewell: the words, exit 130 at once; lost only after it was left: a normal end."""
    done = subprocess.run([sys.executable, "-c", WATCHED.format(alive_inside=not lost_inside)], capture_output=True,
                          text=True, timeout=120)
    if lost_inside:
        assert done.returncode == 130, done.stderr
        assert done.stderr.strip().splitlines()[-1] == "fedcomp: interrupted: kept what a kill keeps"
        assert "ended normally" not in done.stdout
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "ended normally" and "interrupted" not in done.stderr


def test_without_a_sigterm_a_lost_cluster_is_not_watched():
    code = WATCHED.format(alive_inside=False).replace("    os.kill(os.getpid(), signal.SIGTERM)\n", "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ended normally", done.stderr
