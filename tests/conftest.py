"""Shared fixtures: one real local Ray instance for the whole test session, and small configs."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from fedcomp.platform.config import TORCH_COMPILE_SINCE
from fedcomp.platform.environment import release_name, torch_release

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

RAY_TMP: str | None = None
"""Where every Ray of the test run makes its session folder (logs, sockets), removed when the run ends: Ray keeps each
session's folder in /tmp/ray otherwise, and the suite starts a hundred or so (381 MB after a day of runs here). Made by
the first pytest process; pytest-xdist's workers and every process a test starts inherit it, and the process that
made it removes it. Short, under /tmp, for Ray's socket paths. Left alone where RAY_TMPDIR is set."""
if "RAY_TMPDIR" not in os.environ:
    RAY_TMP = tempfile.mkdtemp(prefix="fedcomp-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    os.environ["RAY_TMPDIR"] = RAY_TMP


def pytest_unconfigure(config):
    if RAY_TMP is not None:
        shutil.rmtree(RAY_TMP, ignore_errors=True)

TEST_DEVICE = os.environ.get("FEDCOMP_TEST_DEVICE", "cpu")
"""``cpu`` (default): the suite checks the CPU path on every machine, a GPU workstation too -- ``auto`` GPU options
would otherwise put the local backend on its GPU while the session's Ray has none, and tests that compare the
two would compare devices. ``cuda``: the GPU checks, on a GPU machine (``FEDCOMP_TEST_DEVICE=cuda pytest
tests/platform/test_gpu.py tests/platform/test_host_reads.py tests/benchmarks/test_gpu_bench.py tests/benchmarks/test_maml_kernels.py``: the tests marked with ``tests.platform.test_gpu.CUDA`` and their neighbours)."""
if TEST_DEVICE not in ("cpu", "cuda"):
    raise pytest.UsageError(f"FEDCOMP_TEST_DEVICE = {TEST_DEVICE!r}: must be 'cpu' or 'cuda'")
GPU_PRESENT = os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None
"""An NVIDIA GPU on this machine, seen without initialising CUDA."""
if TEST_DEVICE == "cpu" and GPU_PRESENT:  # only there: Ray refuses to declare GPUs with CUDA_VISIBLE_DEVICES empty
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch looks: this process and every one it starts see no GPU

NEEDS_TORCH_COMPILE = pytest.mark.skipif(
    torch_release() < TORCH_COMPILE_SINCE,
    reason=f"federation.torch_compile needs torch {release_name(TORCH_COMPILE_SINCE)} or later",
)
"""Marks a test of ``federation.torch_compile``, which the config refuses on an older torch (the suite runs on the
oldest torch the package admits, 2.4, but for these)."""

_request: pytest.FixtureRequest | None = None


@pytest.fixture(autouse=True)
def _this_test(request):
    """Remembers the running test so that :func:`results_root` can give config helpers its tmp_path."""
    global _request
    _request = request
    yield
    _request = None


def results_root() -> str:
    """``run.out`` for config helpers that have no ``tmp_path`` of their own: a folder under the running
    test's ``tmp_path`` (so no test writes to a fixed path shared with other tests or other users)."""
    if _request is None:
        raise RuntimeError("results_root() is for use inside a running test")
    return str(Path(_request.getfixturevalue("tmp_path")) / "results")


MODULE_COSTS = Path(__file__).with_name("module_costs.json")
"""Each test module's CPU seconds in the whole suite, as ``benchmarks/suite_cpu.py`` last measured them."""


def pytest_collection_modifyitems(items):
    """A test that uses the session's Ray instance is a ``ray`` test, marked or not (``make check`` leaves them
    out; ``make test`` runs them). Under pytest-xdist each test process that runs one starts its own Ray
    session, so the two processes of ``make test`` may each hold one while other tests start clusters of their
    own (every one on ports Ray picks, with its own temporary folder).

    The costliest modules come first (:data:`MODULE_COSTS`; a module not measured yet first of all, in case it is
    costly), each module's tests in their order: ``make test`` hands modules to its two processes in this order
    (``--no-loadscope-reorder``), so the modules left at the end are cheap ones and neither process idles long
    waiting for the other's last module."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()) and item.get_closest_marker("ray") is None:
            item.add_marker(pytest.mark.ray)
    costs = json.loads(MODULE_COSTS.read_text()) if MODULE_COSTS.is_file() else {}
    items.sort(key=lambda item: -costs.get(item.nodeid.split("::")[0], math.inf))


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray (2 CPUs, no dashboard, small object store), started once per session."""
    import ray

    from fedcomp.actors.cluster import idle_daemons_not_started

    if not ray.is_initialized():
        with idle_daemons_not_started():  # as fedcomp starts a local Ray
            ray.init(
                address="local",  # always a fresh instance, never a cluster someone started with `ray start`
                num_cpus=2,
                num_gpus=0,
                include_dashboard=False,
                object_store_memory=150 * 1024**2,
                logging_level=logging.WARNING,
            )
    yield ray
    ray.shutdown()


def unraisable_hooks_in_a_fresh_worker(ray: Any, module: str) -> tuple[str, str]:
    """The type name of ``sys.unraisablehook`` in a new Ray worker process that has run nothing of fedcomp's, before
    and after it imports ``module`` (:mod:`fedcomp.actors.quiet_exit`)."""
    import importlib

    @ray.remote(num_cpus=0)
    class Fresh:
        def hook(self, load: str = "") -> str:
            if load:
                importlib.import_module(load)
            return type(sys.unraisablehook).__name__

    fresh = Fresh.remote()
    try:
        return ray.get(fresh.hook.remote()), ray.get(fresh.hook.remote(module))
    finally:
        ray.kill(fresh)


@pytest.fixture
def keeping(ray_session):
    """Ray actors kept from one run to the next (:mod:`fedcomp.actors.kept`, what a Tune trial process does), also
    from this test to the next test that keeps them: a run of such tests starts its actor processes once per shape
    of run, not per test (each fresh actor spends seconds of CPU importing torch; benchmarks/SUITE_CPU.md). Each
    run rebuilds the actors it takes from its own config, so a parity test on kept actors also checks that they
    give fresh ones' numbers."""
    from fedcomp.actors import kept

    kept.keep_between_runs()
    yield


@pytest.fixture
def batched_passes(monkeypatch) -> list[int]:
    """The rows (clients, times a sweep's configurations) of each batched untaped pass
    (``MlpPlan.batched_cross_entropy``) in this test, in order."""
    from fedcomp.models.mlp_gradient import MlpPlan

    passes: list[int] = []
    batched_pass = MlpPlan.batched_cross_entropy

    def counted(self, *args):  # type: ignore[no-untyped-def]
        passes.append(len(args[0][0]))
        return batched_pass(self, *args)

    monkeypatch.setattr(MlpPlan, "batched_cross_entropy", counted)
    return passes


@pytest.fixture(autouse=True)
def _fresh_actors_unless_keeping(request):
    """Before a test that uses the session's Ray without keeping actors, the kept ones are killed: its runs start
    fresh actors, and Ray work of its own (another process, Tune, actors it makes) finds the CPUs that idle kept
    actors would hold. Other tests leave them be (idle, they wait on a socket), so the next keeping test, also
    in another module, takes them."""
    if "ray_session" in request.fixturenames and "keeping" not in request.fixturenames:
        from fedcomp.actors import kept

        if kept.keeping():
            kept.keep_between_runs(False)


def router_of(server):
    """The Ray backend's router of ``server`` when it lives in this process (else None: local backend, server actor)."""
    return getattr(getattr(server, "federation", None), "router", None)


def record_routing(server):
    """The Ray backend's routing of each federation call of ``server`` (actor -> clients), appended as it runs;
    stays empty for a server without a router in this process (:func:`router_of`)."""
    calls = []
    router = router_of(server)
    if router is not None:
        assign = router.assign
        router.assign = lambda program, cohort: calls.append(assign(program, cohort)) or calls[-1]
    return calls


def failing_in_round(monkeypatch, index: int, error: BaseException | None = None):
    """Make ``Server.run_round`` raise ``error`` (default ``RuntimeError("power cut")``) as round index ``index``
    starts, the rounds before it run as ever: a run stopped after a checkpoint. Returns what puts the real one back."""
    from fedcomp.platform.server import Server

    real = Server.run_round

    def run_round(self):
        if self.counters.round == index:
            raise error if error is not None else RuntimeError("power cut")
        return real(self)

    monkeypatch.setattr(Server, "run_round", run_round)
    return lambda: monkeypatch.setattr(Server, "run_round", real)


def small(**overrides):
    """Overrides for a fast invariant-logreg run (4 clients, q = 5, 3 rounds, local backend)."""
    base = {
        "federation.backend": "local",
        "federation.clients": 4,
        "algorithm.local_steps": 5,
        "algorithm.first_batch": 4,
        "task.test_samples": 2000,
        "run.rounds": 3,
        "run.progress": "none",
    }
    base.update(overrides)
    return base
