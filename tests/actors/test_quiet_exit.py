"""A Ray worker stopped with SIGTERM goes without a traceback (:mod:`fedcomp.actors.quiet_exit`): the lost
``SystemExit`` of a SIGTERM that lands in a weakref callback is not reported, every other lost exception is, and
fedcomp's actors install the hook in their processes."""

from __future__ import annotations

import subprocess
import sys
import weakref
from typing import Any

import pytest

from fedcomp.actors.quiet_exit import DropLostExits, drop_lost_exits

# What Ray's worker does with SIGTERM (a handler raising SystemExit), with the signal landing while a weakref
# callback runs: Python cannot raise it there and reports it as an exception ignored.
SIGTERM_IN_A_CALLBACK = """
import os, signal, sys, weakref
{install}
def ray_like_handler(signum, frame):
    raise SystemExit(1)
signal.signal(signal.SIGTERM, ray_like_handler)
class Thing: pass
thing = Thing()
def callback(ref):
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(1000))  # the handler runs at the next bytecode, inside this callback
keep = weakref.ref(thing, callback)
del thing
print("still here")
"""


@pytest.mark.parametrize("install", [False, True])
def test_a_sigterm_landing_in_a_weakref_callback_is_reported_only_without_the_hook(install):
    code = SIGTERM_IN_A_CALLBACK.format(
        install="from fedcomp.actors.quiet_exit import drop_lost_exits; drop_lost_exits()" if install else "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "still here\n"
    if install:
        assert done.stderr == ""
    else:  # the report fedcomp leaves out: what Ray forwarded to a Ctrl-C'd sweep's terminal
        assert "Exception ignored in" in done.stderr and done.stderr.rstrip().endswith("SystemExit: 1")


def test_every_other_lost_exception_reaches_the_previous_hook(monkeypatch):
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    drop_lost_exits()
    drop_lost_exits()  # once: the hook does not wrap itself
    assert isinstance(sys.unraisablehook, DropLostExits) and sys.unraisablehook.previous == seen.append

    class Thing:
        pass

    for error in (SystemExit(1), ValueError("lost"), KeyboardInterrupt()):
        thing = Thing()
        keep = weakref.ref(thing, lambda ref, error=error: (_ for _ in ()).throw(error))
        del thing
        assert keep() is None
    assert [type(u.exc_value) for u in seen] == [ValueError, KeyboardInterrupt]
