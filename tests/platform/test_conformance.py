"""One conformance suite over every registered algorithm (issue 15, item 5).

Every name in the algorithm registry runs on a tiny task of its problem kind (``TASK_FOR_KIND``, with the
per-algorithm options of ``ALGORITHM_OPTIONS``) and must show five properties:

1. the Ray backend gives the local backend's metrics, counters and final checkpoint bit for bit, with the
   clients packed 2 + 1 into two actors (so one actor hosts two clients and one hosts a single client), and
   the clients of a program that leaves no private state run on either actor (the balanced routing moves them);
   the same Ray server then resumes from the local run's mid-run checkpoint and repeats its rows, its calls
   now through a compiled graph over the same actors (``federation.transport: graph``); and again with the server
   replicated on the client actors (``federation.server: replicated``), before and after a restore;
2. a fresh server restored from a mid-run checkpoint finishes the run with the uninterrupted run's numbers;
3. checkpoints survive ``pickle`` and ``torch.save``/``torch.load``, and a second run with the same seed
   gives the same numbers;
4. what each round adds to the counters is what the algorithm's communication pattern says
   (``EXPECTED_COUNTERS``, written from the papers' protocols);
5. a bad hyperparameter is rejected in one line that names the field, the value and what is allowed,
   before anything is written.

A new algorithm is covered by registering it: it needs an ``EXPECTED_COUNTERS`` entry (its absence fails
with a message saying so) and, for a new problem kind, a ``TASK_FOR_KIND`` entry. The suite uses the stable
public surface -- ``load_config``, ``fedcomp.run``, the runner's ``drive``, ``make_server``, the server's
``checkpoint``/``restore``, the metrics rows -- plus the task registry for the model's dimensions, and, to keep
27 Ray runs within the time budget, builds the Ray-backed server in this process (:func:`ray_server`). A case
that fails today is kept and marked ``xfail(strict=True)`` in ``KNOWN_FAILURES`` with the measured reason.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import os
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import fedcomp
from fedcomp.api import make_server
from fedcomp.platform.catalog import load_builtins
from fedcomp.platform.config import Config, load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.registry import ALGORITHMS, TASKS
from fedcomp.platform.results import checkpoint_from_bytes
from fedcomp.platform.runner import drive
from tests.conftest import record_routing, router_of

load_builtins()  # every built-in registers its class, so that every one is checked

ROUNDS = 4
"""Rounds of every run."""
RESUME_AT = 2
"""The mid-run checkpoint that resumed runs start from (rounds completed)."""

# ------------------------------------------------------------------------------------------------ tasks

BREAST_CANCER = {"name": "imbalanced-binary", "dataset": "breast-cancer"}  # linear model, d = 33, y = [alpha]
TASK_FOR_KIND: dict[str, dict[str, Any]] = {
    "plain": BREAST_CANCER,
    "minimax": BREAST_CANCER,  # the AUC min-max view, with the scores CoDA's dual restart reads
    "compositional-minimax": BREAST_CANCER,  # compositional deep AUC: g(x) = x - rho grad CE (HVPs)
    "conditional": {"name": "invariant-logreg", "dim": 5, "test_samples": 200},
    "compositional": {  # MAML sinewave: g = adapted weights (second order)
        "name": "sinewave", "hidden": 4, "shots": 3, "queries": 3, "eval_tasks": 3, "eval_queries": 5, "eval_steps": 1,
    },
    "compositional-global": {"name": "heterogeneous-composition", "dim": 5, "inner_dim": 2},
    "bilevel": {"name": "hyper-representation", "hidden": 3, "per_client": 20},  # not minimax: FedIHGP runs
}
"""problem kind -> the task (and its options) every algorithm of that kind runs on; all are built-in tasks, so
Ray's workers import them like any other."""

DRO_BREAST_CANCER = {"name": "dro-classification", "dataset": "breast-cancer"}  # per-example losses, d_g = 1

SMALL: dict[str, int] = {
    "local_steps": 2, "outer_batch": 4, "inner_batch": 4, "first_batch": 4, "inner_steps": 2, "neumann_terms": 2,
    "oracle_batch": 8,
}
"""Hyperparameters lowered to these values where an algorithm has them (and its default is larger or null)."""

ALGORITHM_OPTIONS: dict[str, dict[str, dict[str, Any]]] = {
    # I > 1 so that the per-step exchanges between model rounds happen
    "feddro": {"algorithm": {"local_steps": 3}},
    "fedavg-co-shared-y": {"algorithm": {"local_steps": 3}},
    "fedavg-co-1": {"algorithm": {"local_steps": 2}},
    "fedavg-co-2": {"algorithm": {"local_steps": 2}},
    # FastDRO and PDSGD reweight per-example losses (PDSGD keeps one dual weight per training example)
    "parallel-fastdro": {"task": DRO_BREAST_CANCER},
    "parallel-pdsgd": {"task": DRO_BREAST_CANCER},
    # short stages, so that stage boundaries (v_ref, CoDA's dual restart) fall inside the run
    "coda": {"algorithm": {"stage_steps": 2}},  # stage 1: round 0; stage 2 (3 T0 steps): rounds 1-3
    "coda-plus": {"algorithm": {"stage_steps": 4}},  # stages of two rounds
    # tau > 1 local outer steps; FedNest keeps the paper's random N', FedNest_SGD the authors' code variant
    # (whose per-client counters are private state that checkpoints and actors must carry)
    "fednest": {"algorithm": {"local_steps": 2}},
    "fednest-sgd": {"algorithm": {"local_steps": 2, "ihgp": "code"}},
    "lfednest": {"algorithm": {"local_steps": 2}},
    "lfednest-svrg": {"algorithm": {"local_steps": 2}},
    "fedavg-s": {"algorithm": {"local_steps": 2}},
}
"""Per-algorithm task and hyperparameter options on top of ``TASK_FOR_KIND`` and ``SMALL``."""

NAMES = sorted(name for name, cls in ALGORITHMS.items() if cls.__module__.startswith("fedcomp."))
"""Every algorithm the package registers -- not test doubles other test modules register (e.g. test_exchange's
``test-talk``), so the cases do not depend on which test files pytest collected first."""


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Run this module's tiny models on one intra-op thread, as the Ray client actors do: on a busy 2-core
    machine a second thread's hand-offs made a FedNest run ~9x slower (1.3 s vs 0.14 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def raw_config(name: str) -> dict[str, Any]:
    """The conformance run of algorithm ``name``: its tiny task, small hyperparameters, 3 clients, local."""
    cls = ALGORITHMS[name]
    options = ALGORITHM_OPTIONS.get(name, {})
    if "task" not in options and cls.kind not in TASK_FOR_KIND:
        raise AssertionError(
            f"algorithm {name!r} needs a {cls.kind!r} problem: add a tiny task for that kind to TASK_FOR_KIND in "
            f"{__file__}"
        )
    algorithm: dict[str, Any] = {"name": name}
    for key, small in SMALL.items():
        field = cls.HParams.model_fields.get(key)
        if field is not None and (field.default is None or (isinstance(field.default, int) and field.default > small)):
            algorithm[key] = small
    algorithm.update(options.get("algorithm", {}))
    return {
        "task": dict(options.get("task", TASK_FOR_KIND[cls.kind])),
        "algorithm": algorithm,
        "federation": {"clients": 3, "backend": "local"},
        "run": {"seed": 0, "rounds": ROUNDS, "eval_every": 1, "checkpoint_every": 1, "progress": "none"},
    }


def config(name: str, **overrides: Any) -> Config:
    return load_config(raw_config(name), overrides)


# ------------------------------------------------------------------------------------------------ known failures

KNOWN_FAILURES: dict[tuple[str, str], str] = {}
"""(property, algorithm) -> the measured reason the case fails today; the case runs as xfail(strict=True)."""


def cases(prop: str) -> list[Any]:
    """Every registered algorithm as a test case of property ``prop`` (known failures marked)."""
    return [
        pytest.param(name, id=name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[(prop, name)]))
        if (prop, name) in KNOWN_FAILURES
        else pytest.param(name, id=name)
        for name in NAMES
    ]


# ------------------------------------------------------------------------------------------------ running


@dataclass
class Run:
    """A finished run: its metrics rows and a snapshot of every round's checkpoint."""

    rows: list[dict[str, Any]]
    checkpoints: dict[int, dict[str, Any]]

    @property
    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows).drop(columns="wall_time")

    @property
    def final(self) -> dict[str, Any]:
        return self.checkpoints[ROUNDS]["server"]


def run(cfg: Config, server: Any, start: dict[str, Any] | None = None) -> Run:
    """Drive ``server`` to the end (from ``start``, a checkpoint, if given), snapshotting each checkpoint as it
    is handed out (its ``rows`` list is the live one, appended to by later rounds)."""
    checkpoints: dict[int, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for step in drive(cfg, server, start):
        if step.checkpoint is not None:
            checkpoints[step.round] = checkpoint_from_bytes(step.checkpoint)
        rows = [dict(row) for row in step.rows]
    return Run(rows, checkpoints)


def run_local(cfg: Config, start: dict[str, Any] | None = None) -> Run:
    server = make_server(cfg)
    try:
        return run(cfg, server, start)
    finally:
        server.close()


_REFERENCE: dict[str, Run] = {}


def reference(name: str) -> Run:
    """The uninterrupted local run of ``name`` (computed once per session)."""
    if name not in _REFERENCE:
        _REFERENCE[name] = run_local(config(name))
    return _REFERENCE[name]


def ray_server(cfg: Config) -> Any:
    """A server whose clients run on Ray actors.

    By default the server itself runs in this process -- the composition the Ray server actor wraps
    (``Server(config, RayFederation)``) -- which saves one process start (about 2.5 s of importing torch on
    this machine) per algorithm; ``FEDCOMP_CONFORMANCE_RAY_PROXY=1`` goes through :func:`make_server` and the
    server actor instead.
    """
    if os.environ.get("FEDCOMP_CONFORMANCE_RAY_PROXY"):
        return make_server(cfg)
    from fedcomp.actors.federation import RayFederation
    from fedcomp.platform.server import Server

    return Server(cfg, RayFederation)


# ------------------------------------------------------------------------------------------------ comparisons


def assert_same(a: Any, b: Any, where: str = "checkpoint") -> None:
    """Exact equality of nested checkpoints: same structure, same tensor dtypes, shapes and bits (NaN equal
    to NaN in the same place), same numbers."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: tensor vs {type(b).__name__}"
        a, b = a.cpu(), b.cpu()
        kinds = f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{where}: {kinds}"
        same = (a == b) | (a.isnan() & b.isnan())
        assert bool(same.all()), f"{where}: {int((~same).sum())} of {a.numel()} entries differ"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, f"{where}: array vs {b!r}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f"{where}: arrays differ"
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), f"{where}: mapping vs {type(b).__name__}"
        keys = sorted(map(str, a)), sorted(map(str, b))
        assert keys[0] == keys[1], f"{where}: keys {keys[0]} vs {keys[1]}"
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {type(a).__name__}[{len(a)}] vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, float):
        assert isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b))), f"{where}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_same_metrics(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Every metric and counter column bit for bit (NaN only where both are NaN)."""
    pd.testing.assert_frame_equal(actual, expected, check_exact=True)


# ------------------------------------------------------------------------------------------------ 1. Ray = local


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("name", cases("ray"))
def test_ray_backend_matches_local_with_one_and_two_clients_per_actor(ray_session, keeping, name, tmp_path):
    cfg = config(name, **{"federation.backend": "ray", "federation.clients_per_actor": 2, "run.out": str(tmp_path)})
    local = reference(name)
    server = ray_server(cfg)
    calls = record_routing(server)
    try:
        assert server.describe()["client_actors"] == 2  # clients {0, 1} on one actor, {2} alone on another
        on_ray = run(cfg, server)
        assert_same_metrics(on_ray.metrics, local.metrics)
        assert_same(on_ray.final, local.final)
        router = router_of(server)
        if router is not None and router.free:  # a program leaving no private state: its clients went round
            moved = [c for members in calls for i, clients in members.items() for c in clients if router.home[c] != i]
            assert moved, f"{name}: programs {sorted(router.free)} leave no private state, yet no client moved"
        # the same actors, rewound to the local run's mid-run checkpoint, repeat the rest of the run -- through a
        # compiled graph over them (federation.transport: graph; every payload here is small enough for it)
        if router is not None:
            server.federation.transport = "graph"
        resumed = run(cfg, server, copy.deepcopy(local.checkpoints[RESUME_AT]))
        if router is not None:
            assert server.federation.graph_calls > 0
        assert_same_metrics(resumed.metrics, local.metrics)
        assert_same(resumed.final, local.final)
    finally:
        server.close()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("name", cases("replicated"))
def test_a_server_replicated_on_the_client_actors_matches_local(ray_session, keeping, name, tmp_path):
    """``federation.server: replicated``: every client actor runs the round program and the actors average among
    themselves; the same metrics and final checkpoint as the local run, bit for bit (clients packed 2 + 1), and again
    after the replicas are restored to the local run's mid-run checkpoint."""
    cfg = config(name, **{"federation.backend": "ray", "federation.server": "replicated",
                          "federation.clients_per_actor": 2, "run.out": str(tmp_path)})
    local = reference(name)
    server = make_server(cfg)
    try:
        described = server.describe()
        assert (described["server"], described["client_actors"]) == ("replicated", 2)
        on_ray = run(cfg, server)
        assert_same_metrics(on_ray.metrics, local.metrics)
        assert_same(on_ray.final, local.final)
        resumed = run(cfg, server, copy.deepcopy(local.checkpoints[RESUME_AT]))
        assert_same_metrics(resumed.metrics, local.metrics)
        assert_same(resumed.final, local.final)
    finally:
        server.close()


# ------------------------------------------------------------------------------------------------ 2. resume


@pytest.mark.parametrize("name", cases("resume"))
def test_resume_from_a_mid_run_checkpoint_equals_the_uninterrupted_run(name):
    local = reference(name)
    stored = io.BytesIO()
    torch.save(local.checkpoints[RESUME_AT], stored)  # as the runner stores it
    stored.seek(0)
    resumed = run_local(config(name), torch.load(stored, weights_only=False))
    assert sorted(resumed.checkpoints) == list(range(RESUME_AT + 1, ROUNDS + 1))
    assert_same_metrics(resumed.metrics, local.metrics)
    for r, checkpoint in resumed.checkpoints.items():
        assert_same(checkpoint["server"], local.checkpoints[r]["server"], f"round {r} checkpoint")


# ------------------------------------------------------------------------------------- 3. pickling, determinism


@pytest.mark.parametrize("name", cases("pickle"))
def test_checkpoints_pickle_and_the_same_seed_gives_the_same_numbers(name):
    local = reference(name)
    for r in (RESUME_AT, ROUNDS):
        checkpoint = local.checkpoints[r]
        assert_same(pickle.loads(pickle.dumps(checkpoint)), checkpoint, f"pickled round {r} checkpoint")
        stored = io.BytesIO()
        torch.save(checkpoint, stored)
        stored.seek(0)
        assert_same(torch.load(stored, weights_only=False), checkpoint, f"torch.save'd round {r} checkpoint")
    again = run_local(config(name))
    assert_same_metrics(again.metrics, local.metrics)
    for r, checkpoint in again.checkpoints.items():
        assert_same(checkpoint["server"], local.checkpoints[r]["server"], f"round {r} checkpoint")


# ------------------------------------------------------------------------------------------------ 4. counters

ROUND_COUNTERS = ("comm_rounds", "local_steps", "embedding_exchanges")
FLOAT_COUNTERS = ("floats_up", "floats_down", "embedding_floats_up", "embedding_floats_down")


@dataclass(frozen=True)
class Dims:
    """Sizes the counters are computed from (read off the task, not the algorithm)."""

    d: int
    """Size of x (the model)."""
    d_y: int
    """Size of y (the inner / dual variable; 0 without one)."""
    d_g: int
    """Size of the inner value g(x) (compositional kinds; 0 otherwise)."""
    minimax: bool
    """Bilevel kind: whether g = -f (then FedNest skips FedIHGP)."""
    classes: int
    """Classes of a plain classification task's Ratio Loss monitor (0 when it has none)."""


def dims(cfg: Config) -> Dims:
    kind = ALGORITHMS[cfg.algorithm_name].kind
    task = TASKS[cfg.task_name](cfg.task, cfg.run.seed, cfg.federation.clients)
    gen = torch.Generator().manual_seed(0)
    params = task.init_params(gen)
    x = params["x"]
    problem = task.problem(kind)
    d_g = 0
    if kind == "compositional-global":
        d_g = int(problem.inner_dim)
    elif kind in ("compositional", "compositional-minimax"):
        d_g = problem.inner(x.clone().requires_grad_(True), problem.sample_inner(0, 1, gen)).numel()
    monitor = getattr(task, "monitor_batches", None)
    return Dims(
        d=x.numel(), d_y=params["y"].numel() if "y" in params else 0, d_g=d_g,
        minimax=bool(getattr(problem, "minimax", False)), classes=len(monitor()) if monitor else 0,
    )


Counts = dict[str, int]


def per_round(
    comm: int, steps: int, up: int, down: int, exchanges: int = 0, ex_up: int = 0, ex_down: int = 0
) -> Counts:
    """What one round adds: model rounds, local steps, floats up/down per participating client, and the
    low-dimensional exchanges between model rounds with their floats up/down per participating client."""
    return {
        "comm_rounds": comm, "local_steps": steps, "floats_up": up, "floats_down": down,
        "embedding_exchanges": exchanges, "embedding_floats_up": ex_up, "embedding_floats_down": ex_down,
    }


Expected = Callable[[Any, Dims, int], "Counts | list[Counts]"]
"""(hyperparameters, dims, round index) -> the round's increments, or every possibility when they are random."""


def _local_steps(*synced: Callable[[Dims], int], unsent_first: tuple[Callable[[Dims], int], ...] = ()) -> Expected:
    """q local steps, then one model round averaging the named quantities (uploaded and broadcast back); those in
    ``unsent_first`` are not broadcast in round 0 (the clients' first step makes them: Local-SCGD's u,
    LocalSCGDAM's h, u and v)."""

    def expected(hp: Any, n: Dims, r: int) -> Counts:
        floats = sum(size(n) for size in synced)
        return per_round(1, hp.local_steps, floats, floats - (sum(size(n) for size in unsent_first) if r == 0 else 0))

    return expected


def X(n: Dims) -> int:
    return n.d


def Y(n: Dims) -> int:
    return n.d_y


def G(n: Dims) -> int:
    return n.d_g


def _local_sgdm(hp: Any, n: Dims, r: int) -> Counts:
    floats = 2 * n.d if hp.average == "all" else n.d  # x and the momentum buffer, or x alone
    return per_round(1, hp.local_steps, floats, floats)


def _local_sgdm_rl(hp: Any, n: Dims, r: int) -> Counts:
    counts = _local_sgdm(hp, n, r)
    counts["floats_down"] += n.classes  # the server's class weights w_c travel with the model
    return counts


def _local_sgdam(hp: Any, n: Dims, r: int) -> Counts:
    """x, y, u, v or x, y; u and v are not broadcast in round 0 (step 0 estimates them)."""
    floats = 2 * (n.d + n.d_y) if hp.average == "all" else n.d + n.d_y
    return per_round(1, hp.local_steps, floats, n.d + n.d_y if r == 0 else floats)


def _feddro(hp: Any, n: Dims, r: int) -> Counts:
    """y averaged after every local step (d_g floats each way), x every I steps; round 0 also averages the
    clients' estimates of g at x_0 (the initial y_bar, which the paper leaves open)."""
    exchanges = hp.local_steps + (r == 0)
    return per_round(1, hp.local_steps, n.d, n.d, exchanges, exchanges * n.d_g, exchanges * n.d_g)


def _fedavg_co(case: int) -> Expected:
    """Vanilla FedAvg for CO: x every I steps; case II also averages g_k(x_bar) once per model round."""

    def expected(hp: Any, n: Dims, r: int) -> Counts:
        exchanges = int(case == 2)
        return per_round(1, hp.local_steps, n.d, n.d, exchanges, exchanges * n.d_g, exchanges * n.d_g)

    return expected


def _gcivr(hp: Any, n: Dims, r: int) -> Counts:
    """One round per step: clients upload g_k's value (d_g), its Jacobian (d_g x d) and grad h_k (d)."""
    return per_round(1, 1, n.d_g + n.d_g * n.d + n.d, n.d)


def _parallel(up_per_example: int) -> Expected:
    """One model round per step plus one low-dimensional exchange: MBSGD's y (d_g each way); FastDRO's b losses
    up and b weights down; PDSGD's b positions and b losses up and b weights down."""

    def expected(hp: Any, n: Dims, r: int) -> Counts:
        if up_per_example == 0:
            return per_round(1, 1, n.d, n.d, 1, n.d_g, n.d_g)
        b = hp.outer_batch
        return per_round(1, 1, n.d, n.d, 1, up_per_example * b, b)

    return expected


def _stage(name: str, hp: Any, r: int) -> tuple[bool, int]:
    """(whether round r opens a stage, its period I_s) from the stagewise schedule: stage s has T_s local steps
    in rounds of I_s steps, rounded up to whole rounds; CoDA: T_s = T0 3^(s-1), I_s = I; CODA+: T_s = T0,
    I_s = min(I g^(s-1), T0)."""
    if name == "coda" and hp.coda_mode != "stagewise":
        return r == 0, hp.local_steps
    stage, first = 1, 0
    while True:
        if name == "coda":
            length, period = hp.stage_steps * 3 ** (stage - 1), hp.local_steps
        else:
            period = min(hp.local_steps * hp.period_growth ** (stage - 1), hp.stage_steps)
            length = hp.stage_steps
        rounds = -(-length // period)
        if r < first + rounds:
            return r == first, period
        stage, first = stage + 1, first + rounds


def _stagewise(name: str) -> Expected:
    """x = (w, a, b) and alpha averaged every I_s steps; CoDA's dual restart at a stage's first round is one
    low-dimensional exchange: class-wise score sums and counts (4 floats) all-reduced (ALGORITHMS.md 9.4).

    The stage's output (``stage_average: global``, the papers' (1/K) sum_k (1/T) sum_t v_t^k): the stage's last
    round also uploads each client's time average of its iterates (d floats); v_ref goes down only where the
    next stage does not start from it (``restart_from: last``: at the stage's first round). ``local`` (the
    reference code) communicates nothing more; ``per-round`` uploads the round's iterate sum and sends v_ref
    every round."""

    def expected(hp: Any, n: Dims, r: int) -> Counts:
        first, period = _stage(name, hp, r)
        plain = name == "coda" and hp.coda_mode != "stagewise"
        restart = int(name == "coda" and not plain and first)
        up = down = n.d + n.d_y
        if plain:
            pass
        elif hp.stage_average == "per-round":
            up, down = up + n.d, down + n.d
        elif hp.stage_average == "global":
            up += n.d * _stage(name, hp, r + 1)[0]  # the next round opens a stage: this one ends it
            down += n.d * int(first and r > 0 and hp.restart_from == "last")
        return per_round(1, period, up, down, restart, 4 * restart, 4 * restart)

    return expected


def _fednest(inner: str, outer: str) -> Expected:
    """One FedNest epoch (ALGORITHMS.md 7.2, 7.3, 7.6), every sub-round on a fresh cohort.

    FedInn: SVRG (2 rounds: q_i up, q down; then y_i up) or local SGD (1 round: y_i up); a fresh cohort first
    receives x and y. FedIHGP (1 + N' rounds, skipped for minimax problems): grad_y f_i up; then per Neumann
    round x, y and p down, p_i up. FedOut: h_i up (x, y, p down to its fresh cohort), then the same cohort
    receives h and uploads x_i. LFedNest: one round of purely local outer steps (x, y down, x_i up);
    LFedNest_SVRG: averaged local hypergradients (x, y down, h_i up), then SVRG outer steps (h down, x_i up).
    Rounds: FedNest 2T + N' + 3, FedNest_SGD T + N' + 3, LFedNest T + 1, LFedNest_SVRG 2T + 2 per epoch.
    """

    def epoch(hp: Any, n: Dims, neumann: int) -> Counts:
        dx, dy, T = n.d, n.d_y, hp.inner_rounds
        comm = up = down = 0
        if inner == "svrg":
            comm, up, down = 2 * T, T * 2 * dy, T * ((dx + dy) + dy)
        else:
            comm, up, down = T, T * dy, T * (dx + dy)
        if outer == "local":
            comm, up, down = comm + 1, up + dx, down + dx + dy
        elif outer == "local-svrg":
            comm, up, down = comm + 2, up + 2 * dx, down + (dx + dy) + dx
        else:
            p = 0 if n.minimax else dy
            if not n.minimax:  # FedIHGP
                comm, up, down = comm + 1 + neumann, up + dy * (1 + neumann), down + (dx + dy) + neumann * (dx + 2 * dy)
            comm, up, down = comm + 2, up + 2 * dx, down + (dx + dy + p) + dx
        steps = T * hp.inner_steps + hp.local_steps
        return per_round(comm, steps, up, down)

    def expected(hp: Any, n: Dims, r: int) -> Counts | list[Counts]:
        if outer == "svrg" and not n.minimax and hp.ihgp == "paper":  # N' ~ U{0, ..., N-1}
            return [epoch(hp, n, k) for k in range(hp.neumann_terms)]
        return epoch(hp, n, hp.neumann_terms)

    return expected


EXPECTED_COUNTERS: dict[str, Expected] = {
    # plain (ALGORITHMS.md 2.3: one round per q local steps)
    "fedavg": _local_steps(X),
    "fedprox": _local_steps(X),  # the proximal anchor is the broadcast model
    "scaffold": _local_steps(X, X),  # y_i - x and c_i+ - c_i up; x and c down
    "local-sgdm": _local_sgdm,
    "local-sgdm-rl": _local_sgdm_rl,
    "fedavgm": _local_steps(X),  # server momentum stays on the server
    "fedadam": _local_steps(X),  # so do Adam's moments
    # conditional (ALGORITHMS.md 4.4: FCSG averages x, u being recomputed at once; the others x and u)
    "fcsg": _local_steps(X),
    "fcsg-m": _local_steps(X, X),
    "acc-fcsg-m": _local_steps(X, X),  # x_prev stays on the client
    # compositional, local inner (5.2, 5.3): x and u (Local-SCGD), x, u and m (Local-SCGDM)
    "local-scgd": _local_steps(X, G, unsent_first=(G,)),
    "local-scgdm": _local_steps(X, G, X, unsent_first=(G,)),
    # compositional minimax (9.2): x, y, h, u, v; minimax (9.3, 7.3): x, y, u, v / x, y
    "local-scgdam": _local_steps(X, Y, G, X, Y, unsent_first=(G, X, Y)),  # h, u, v: step 0 estimates them
    "local-sgdam": _local_sgdam,
    "fedavg-s": _local_steps(X, Y),
    "coda": _stagewise("coda"),
    "coda-plus": _stagewise("coda-plus"),
    # compositional, global inner (8.2, 8.3, 8.4, 8.6)
    "feddro": _feddro,
    "fedavg-co-shared-y": _feddro,
    "fedavg-co-1": _fedavg_co(1),
    "fedavg-co-2": _fedavg_co(2),
    "gcivr": _gcivr,
    "parallel-mbsgd": _parallel(0),
    "parallel-fastdro": _parallel(1),
    "parallel-pdsgd": _parallel(2),
    # bilevel (7.3, 7.6)
    "fednest": _fednest("svrg", "svrg"),
    "fednest-sgd": _fednest("sgd", "svrg"),
    "lfednest": _fednest("sgd", "local"),
    "lfednest-svrg": _fednest("svrg", "local-svrg"),
}
"""algorithm -> what each round adds to the counters, from the hyperparameters and the task's sizes, as the
papers' protocols count it (``reference/ALGORITHMS.md``). Floats are per participating client."""


def increments(name: str) -> list[Counts]:
    metrics = reference(name).metrics
    cols = list(ROUND_COUNTERS + FLOAT_COUNTERS)
    steps = metrics[cols].diff().iloc[1:].astype(int)
    return [{c: int(v) for c, v in row.items()} for _, row in steps.iterrows()]


def check_counters(name: str, columns: tuple[str, ...]) -> None:
    entry = EXPECTED_COUNTERS.get(name)
    if entry is None:
        pytest.fail(
            f"algorithm {name!r} has no EXPECTED_COUNTERS entry in {__file__}: add one saying what each round adds "
            f"to comm_rounds, local_steps, floats_up/down and embedding_exchanges/floats_up/down"
        )
    cfg = config(name)
    sizes = dims(cfg)
    for r, observed in enumerate(increments(name)):
        expected = entry(cfg.algorithm, sizes, r)
        options = [{c: e[c] for c in columns} for e in (expected if isinstance(expected, list) else [expected])]
        seen = {c: observed[c] for c in columns}
        assert seen in options, f"round {r}: {seen}; expected {' or '.join(map(str, options))} ({sizes})"


@pytest.mark.parametrize("name", cases("round counters"))
def test_round_counters_follow_the_communication_pattern(name):
    check_counters(name, ROUND_COUNTERS)


@pytest.mark.parametrize("name", cases("float counters"))
def test_float_counters_follow_the_communication_pattern(name):
    check_counters(name, FLOAT_COUNTERS)


# ------------------------------------------------------------------------------------------------ 5. bad input


def out_of_range(name: str) -> tuple[str, float]:
    """A hyperparameter of ``name`` with a lower bound (``lr`` where there is one) and a value just below it."""
    fields = ALGORITHMS[name].HParams.model_fields
    for key in ("lr", *fields):
        for bound in getattr(fields.get(key), "metadata", ()):
            for attr in ("gt", "ge"):
                if isinstance(getattr(bound, attr, None), (int, float)):
                    return f"algorithm.{key}", getattr(bound, attr) - 1
    raise AssertionError(f"algorithm {name!r} has no hyperparameter with a lower bound to violate")


@pytest.mark.parametrize("name", cases("bad input"))
def test_a_bad_hyperparameter_is_rejected_in_one_line_and_nothing_is_written(name, tmp_path):
    out = tmp_path / "results"
    bad_key, bad_value = out_of_range(name)
    for key, value, allowed in ((bad_key, bad_value, "greater than"), ("algorithm.bogus", 1, "allowed keys: name")):
        with pytest.raises(ConfigError) as error:
            load_config(raw_config(name), {key: value})
        message = str(error.value)
        assert "\n" not in message and message.startswith(key), message
        assert allowed in message and (key.endswith("bogus") or f" = {value!r}" in message), message
        with pytest.raises(ConfigError, match=f"^{key}"):
            fedcomp.run(raw_config(name), {key: value, "run.out": str(out)})
        assert not out.exists()
