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

from fedcomp.platform.signals import answering_sigterm


@pytest.fixture
def handlers():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGINT, before[0])
    signal.signal(signal.SIGTERM, before[1])


def test_sigterm_goes_to_the_sigint_handler_in_place(handlers):
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    with answering_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
    assert caught == [signal.SIGINT]


@pytest.mark.parametrize("sigint", [signal.default_int_handler, signal.SIG_DFL, signal.SIG_IGN])
def test_sigterm_without_a_python_sigint_handler_is_a_keyboard_interrupt(handlers, sigint):
    signal.signal(signal.SIGINT, sigint)
    with answering_sigterm(), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # not reached: the handler runs as the signal arrives


BETWEEN_CALLS = """
import os, signal, time
from fedcomp.platform import signals
{before}
with signals.answering_sigterm():  # a fedcomp call: a run, which starts Ray (whose handler fedcomp replaces)
    signal.signal(signal.SIGTERM, lambda signum, frame: print("Ray's", flush=True))
    signals.stop_on_sigterm()
{between}
with signals.answering_sigterm():  # the next
    pass
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(1)
print("carried on")
"""
MINE = "signal.signal(signal.SIGTERM, lambda signum, frame: print('mine', flush=True))"


@pytest.mark.parametrize("before, between, code, out", [
    ("", "", -signal.SIGTERM, ""),  # Python's default: killed by the signal (143 from a shell)
    (MINE, "", 0, "mine\ncarried on"),
    ("", MINE, 0, "mine\ncarried on"),  # set between two calls: it was lost to fedcomp's
], ids=["default", "set-before", "set-between"])
def test_between_fedcomp_calls_sigterm_does_what_it_did_before_them(before, between, code, out):
    """A notebook's process idling after a Ray run got a KeyboardInterrupt (the kernel caught it and lived on)."""
    script = BETWEEN_CALLS.format(before=before, between=between)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (code, out), done.stderr
    assert "KeyboardInterrupt" not in done.stderr


WATCHED = """
import os, signal, sys, threading, time
from fedcomp.platform import signals
state = {{"alive": True}}
signals.depends_on(lambda: state["alive"])
signal.signal(signal.SIGINT, lambda signum, frame: None)  # a graceful stop that carries on, as Tune's does
call = signals.answering_sigterm()  # a fedcomp call under way
call.__enter__()
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


IN_A_C_CALL = """
import hashlib, os, signal, threading, time
from fedcomp.platform import signals
signals.depends_on(lambda: False)  # the cluster went with the signal
call = signals.answering_sigterm()  # a fedcomp call under way
call.__enter__()
ITERATIONS = 2**31 - 1  # minutes
with signals.farewell(lambda: "kept what a kill keeps"):
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"x", b"y", ITERATIONS)  # in C, the GIL released, no look at signals
    print(f"the C call ended after {time.perf_counter() - started:.1f} s", flush=True)
"""


def test_the_watch_starts_as_the_sigterm_arrives_while_the_main_thread_sits_in_a_c_call():
    """Python runs its handler only when the main thread is back in bytecode (here: after minutes); Ray's own exit
    does not wait so long."""
    done = subprocess.run([sys.executable, "-c", IN_A_C_CALL], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == "fedcomp: interrupted: kept what a kill keeps"


def test_a_forked_child_s_sigterm_is_its_own():
    """The wakeup fd is inherited by a forked child; its signals must not start the parent's watch."""
    code = IN_A_C_CALL.replace("threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()", """pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    os.waitpid(pid, 0)""").replace("ITERATIONS = 2**31 - 1", "ITERATIONS = 3_000_000")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "the C call ended" in done.stdout and "interrupted" not in done.stderr, done.stderr


def test_a_wakeup_fd_held_by_an_asyncio_loop_stays_its_own_and_the_handler_still_watches():
    code = """
import asyncio, os, signal, time
from fedcomp.platform import signals
loop = asyncio.new_event_loop()
loop.add_signal_handler(signal.SIGUSR1, lambda: None)  # asyncio takes the wakeup fd for its handlers
theirs = signal.set_wakeup_fd(-1)
signal.set_wakeup_fd(theirs)
signals.depends_on(lambda: False)
signal.signal(signal.SIGINT, lambda signum, frame: None)  # a graceful stop that carries on, as Tune's does
call = signals.answering_sigterm()  # a fedcomp call under way
call.__enter__()
assert signal.set_wakeup_fd(theirs) == theirs, "fedcomp took the loop's wakeup fd"
with signals.farewell(lambda: "kept what a kill keeps"):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
print("not watched")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == "fedcomp: interrupted: kept what a kill keeps"


def test_a_ctrl_c_inside_an_import_held_whole_comes_after_it(handlers):
    from fedcomp.platform.signals import whole_imports

    signal.signal(signal.SIGINT, signal.default_int_handler)
    finished = []
    with pytest.raises(KeyboardInterrupt), whole_imports():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # a KeyboardInterrupt would have come here
        finished.append(True)
    assert finished and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # another handler than Python's: left as it is, nothing held
    with whole_imports():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


CUT_IMPORT = """
import os, signal, sys
import fedcomp

signal.signal(signal.SIGINT, signal.default_int_handler)  # a Jupyter kernel's (a process started from one that
# ignores SIGINT, a test worker's, inherits SIG_IGN, and fedcomp then leaves it alone)

class Interrupting:  # Ctrl-C as torch is half imported (its C part loaded, torch.nn looked up)
    fired = False

    def find_spec(self, name, path=None, target=None):
        if name == "torch.nn" and not Interrupting.fired:
            Interrupting.fired = True
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupting())
over = {"federation.backend": "local", "run.rounds": 2, "federation.clients": 4, "run.progress": "none",
        "run.out": sys.argv[1]}
try:
    fedcomp.run("quickstart", over)
except KeyboardInterrupt as error:
    print("INTERRUPTED", type(error).__name__, error)
print("AGAIN", fedcomp.run("quickstart", over).final["round"])
"""


def test_a_ctrl_c_during_a_notebooks_first_torch_import_leaves_the_next_run_working(tmp_path):
    """It broke torch for the process's life: every later run failed ("partially initialized module 'torch' has no
    attribute 'cuda'")."""
    done = subprocess.run([sys.executable, "-c", CUT_IMPORT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["INTERRUPTED Interrupted nothing was kept (no checkpoint yet)", "AGAIN 2"], done.stdout
