"""SIGTERM answered as Ctrl-C: by whatever handles SIGINT now (Tune's graceful stop during a sweep), else by
``KeyboardInterrupt``. A real signal to this process, with its handlers put back afterwards."""

from __future__ import annotations

import os
import signal
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
