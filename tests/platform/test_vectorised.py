"""Lockstep local steps under torch.func.vmap: when they apply, that they give the one-at-a-time numbers up
to float32 rounding (for every FCSG-family algorithm, both invariant-LR objectives), that a vectorised run is
bitwise reproducible, and that clients whose draws differ in shape fall back to one at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fedcomp
from fedcomp.platform import federation, oracles
from fedcomp.platform.algorithms.base import ClientContext
from fedcomp.platform.algorithms.fcsg import FCSG
from fedcomp.platform.config import load_config
from fedcomp.platform.environment import torch_release
from fedcomp.platform.federation import ClientHost, Layout, build_algorithm, build_task
from fedcomp.platform.rng import generator
from fedcomp.platform.state import unsent
from fedcomp.platform.vectorised import (
    LOCKSTEP_MAX_CPU_FLOATS,
    LOCKSTEP_MIN_CPU_CLIENTS,
    can_lockstep,
    lockstep_local_steps,
    lockstep_pays,
    why_not_lockstep,
)
from tests.conftest import small

ROUNDING = dict(rtol=1e-5, atol=1e-6)  # a few float32 ulps per step, accumulated over the steps


def config(**overrides):
    return load_config("quickstart", small(**{"federation.clients": 6, **overrides}))


def host_reply(cfg, vectorise: bool):
    cfg = cfg.replace(**{"federation.vectorise": vectorise})
    host = ClientHost(cfg, range(cfg.federation.clients))
    x0 = build_task(cfg).init_params(generator(0, "init"))
    state = host.algorithm.broadcast(host.algorithm.init(x0))
    layout = Layout.of(state)
    first = host.run("local_steps", 0, list(range(6)), layout.pack(state), layout)
    second = host.run("local_steps", 1, [0, 2, 3, 5], layout.pack(state), layout)
    return first, second


def assert_close_replies(fast, slow):
    """A lockstep reply equals the one-at-a-time reply up to rounding: sums, counts, loss and private states."""
    np.testing.assert_allclose(fast.sums, slow.sums, **ROUNDING)
    assert fast.samples == slow.samples and fast.clients == slow.clients
    assert fast.loss_sum == pytest.approx(slow.loss_sum, rel=1e-6)
    assert fast.private.keys() == slow.private.keys()
    for client in fast.private:
        for key in fast.private[client]:
            torch.testing.assert_close(fast.private[client][key], slow.private[client][key], **ROUNDING)


@pytest.mark.parametrize("algorithm", ["fcsg", "fcsg-m", "acc-fcsg-m"])
@pytest.mark.parametrize("objective", ["paper", "official-code"])
def test_lockstep_equals_one_at_a_time_up_to_rounding(algorithm, objective):
    cfg = config(**{"algorithm.name": algorithm, "task.objective": objective})
    for fast, slow in zip(host_reply(cfg, True), host_reply(cfg, False)):
        assert_close_replies(fast, slow)


def test_vectorised_run_is_close_to_sequential_and_bitwise_reproducible(tmp_path):
    overrides = small(**{"federation.vectorise": True, "run.out": str(tmp_path), "run.rounds": 4})
    first = fedcomp.run("quickstart", overrides).metrics.drop(columns="wall_time")
    again = fedcomp.run("quickstart", overrides).metrics.drop(columns="wall_time")
    sequential = fedcomp.run("quickstart", {**overrides, "federation.vectorise": False}).metrics.drop(columns="wall_time")
    assert first.equals(again)
    np.testing.assert_allclose(first.to_numpy(float), sequential.to_numpy(float), rtol=1e-5, atol=1e-6, equal_nan=True)


def test_when_lockstep_applies():
    cfg = config()
    algorithm, problem = build_algorithm(cfg), build_task(cfg).problem("conditional")
    assert can_lockstep(algorithm, problem, "local_steps", 2)
    assert not can_lockstep(algorithm, problem, "local_steps", 1)  # one client: nothing to batch
    assert not can_lockstep(algorithm, problem, "other_program", 2)
    plain = load_config({"task": {"name": "synthetic-classification"}, "algorithm": {"name": "fedavg"}})
    fedavg, mlp = build_algorithm(plain), build_task(plain).problem("plain")
    assert can_lockstep(fedavg, mlp, "local_steps", 2)
    mlp.vmappable = False  # a task whose oracles vmap cannot batch (e.g. BatchNorm in training mode)
    assert not can_lockstep(fedavg, mlp, "local_steps", 2)
    bilevel = load_config("fednest-minimax")
    assert not can_lockstep(build_algorithm(bilevel), build_task(bilevel).problem("bilevel"), "local_steps", 2)


def test_why_lockstep_cannot_apply_is_said():
    plain = load_config({"task": {"name": "synthetic-classification"}, "algorithm": {"name": "fedavg"}})
    fedavg, mlp = build_algorithm(plain), build_task(plain).problem("plain")
    assert why_not_lockstep(fedavg, mlp) is None
    mlp.vmappable = False
    assert why_not_lockstep(fedavg, mlp).startswith("the task's oracles are not pure tensor functions")
    bilevel = load_config("fednest-minimax")
    assert why_not_lockstep(build_algorithm(bilevel), build_task(bilevel).problem("bilevel")) == (
        "the algorithm runs a client program of its own, not LocalSteps' draw + update")
    mix = load_config("maml-sinewave", {"algorithm.name": "local-scgd", "algorithm.inner_state": "per-task-mix"})
    assert why_not_lockstep(build_algorithm(mix), build_task(mix).problem("compositional")).startswith(
        "the algorithm's update cannot be batched")


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_vectorise_where_no_call_can_step_in_lockstep_is_said_once_and_recorded(backend, request, tmp_path, capsys):
    """It was silently ignored (run.json said vectorise: true)."""
    if backend == "ray":
        request.getfixturevalue("keeping")
    result = fedcomp.run("fednest-minimax", {"federation.vectorise": True, "federation.backend": backend,
                                             "run.rounds": 1, "run.progress": "none", "run.out": str(tmp_path)})
    warnings = [line for line in capsys.readouterr().err.splitlines() if "federation.vectorise" in line]
    assert warnings == ["fedcomp: warning: federation.vectorise: algorithm 'fednest' on task 'minimax-quadratic': the "
                        "algorithm runs a client program of its own, not LocalSteps' draw + update; its clients step "
                        "one at a time (the numbers without it)"]
    backend_record = json.loads((result.run_dir / "run.json").read_text())["backend"]
    assert backend_record["lockstep_off"].startswith("the algorithm runs a client program of its own")


class RaggedFCSG(FCSG):
    """FCSG whose client c draws c + 1 outer samples per step: batches of different shapes."""

    def draw(self, problem, client, step, gen):
        outer = problem.sample_outer(client, client + 1, gen)
        return (outer, problem.sample_inner(client, outer, self.hp.inner_batch, gen)), client + 1


def test_clients_with_differently_shaped_draws_fall_back_to_one_at_a_time():
    cfg = config()
    algorithm, problem = RaggedFCSG(cfg.algorithm), build_task(cfg).problem("conditional")
    x0 = build_task(cfg).init_params(generator(0, "init"))
    states = [algorithm.join(algorithm.broadcast(algorithm.init(x0))).tensors() for _ in range(2)]
    contexts = [ClientContext(c, 0, 0, lambda *ids, c=c: generator(0, "client-step", c, *ids)) for c in range(2)]
    assert lockstep_local_steps(algorithm, problem, states, contexts) is None


def test_clients_whose_states_differ_in_shape_fall_back_to_one_at_a_time():
    """A first-timer holds an empty (unsent) private field where clients that took part before hold its value."""
    cfg = load_config("fig1-fcsg-m", {"federation.clients": 3})
    algorithm, problem = build_algorithm(cfg), build_task(cfg).problem("conditional")
    state = algorithm.join(algorithm.broadcast(algorithm.init(build_task(cfg).init_params(generator(0, "init")))))
    states = [state.tensors() for _ in range(3)]
    contexts = [ClientContext(c, 0, 0, lambda *ids, c=c: generator(0, "client-step", c, *ids)) for c in range(3)]
    assert lockstep_local_steps(algorithm, problem, states, contexts) is not None
    states[1] = {**states[1], "u": unsent()}
    assert lockstep_local_steps(algorithm, problem, states, contexts) is None


SINEWAVE = {"task": {"name": "sinewave", "eval_tasks": 5, "eval_queries": 10}, "algorithm": {"name": "local-scgdm", "local_steps": 3, "outer_batch": 2}}


@pytest.mark.parametrize("algorithm", ["local-scgd", "local-scgdm"])
def test_sinewave_local_scgd_lockstep_equals_one_at_a_time_up_to_rounding(algorithm):
    """Second-order MAML under vmap (a vjp through torch.func.grad steps) against the autograd path."""
    cfg = load_config(SINEWAVE, {"federation.backend": "local", "federation.clients": 6, "algorithm.name": algorithm})
    task = build_task(cfg)
    assert can_lockstep(build_algorithm(cfg), task.problem("compositional"), "local_steps", 2)
    for fast, slow in zip(host_reply(cfg, True), host_reply(cfg, False)):
        np.testing.assert_allclose(fast.sums, slow.sums, rtol=1e-4, atol=1e-5)
        assert fast.samples == slow.samples
        assert fast.loss_sum == pytest.approx(slow.loss_sum, rel=1e-5)


PLAIN_LOCAL_STEPS = ["fedavg", "fedavgm", "fedadam", "fedprox", "scaffold", "local-sgdm"]
"""The plain kind's local-steps algorithms that run on an unweighted task (local-sgdm-rl needs class weights)."""


@pytest.mark.parametrize("algorithm", PLAIN_LOCAL_STEPS)
def test_mlp_classification_lockstep_equals_one_at_a_time_up_to_rounding(algorithm):
    """Every local-steps algorithm of the plain kind on the synthetic MLP task (the peers benchmark's workload):
    the cohort's steps batched under vmap give the one-at-a-time sums, counts and private states up to rounding."""
    cfg = load_config(
        {"task": {"name": "synthetic-classification", "hidden": [16], "test_samples": 10},
         "algorithm": {"name": algorithm, "local_steps": 3}},
        {"federation.backend": "local", "federation.clients": 6},
    )
    assert can_lockstep(build_algorithm(cfg), build_task(cfg).problem("plain"), "local_steps", 2)
    for fast, slow in zip(host_reply(cfg, True), host_reply(cfg, False)):
        assert not np.array_equal(fast.sums, np.zeros_like(fast.sums))
        assert_close_replies(fast, slow)


def test_lockstep_clients_of_the_mlp_task_step_untaped_with_the_taped_lockstep_bits(monkeypatch, batched_passes):
    """The MLP task declares its loss a perceptron's cross-entropy: each lockstep step takes the untaped gradient of all
    the call's clients in one batched pass (``oracles.untaped``, ``MlpPlan.batched_cross_entropy``) and the replies
    have the bits of lockstep by ``torch.func`` alone."""
    cfg = load_config(
        {"task": {"name": "synthetic-classification", "hidden": [16], "test_samples": 10},
         "algorithm": {"name": "fedavg", "local_steps": 3}},
        {"federation.backend": "local", "federation.clients": 6},
    )
    untaped = host_reply(cfg, True)
    assert batched_passes == [6, 6, 6, 4, 4, 4]  # each step one batched pass for all the call's clients
    monkeypatch.setattr(oracles, "untaped", lambda *args, **kwargs: None)
    taped = host_reply(cfg, True)
    for fast, slow in zip(untaped, taped):
        assert np.array_equal(fast.sums, slow.sums) and fast.loss_sum == slow.loss_sum
        assert all(torch.equal(fast.private[c][k], slow.private[c][k]) for c in fast.private for k in fast.private[c])


LOCKSTEP_IMPORTS = """
import sys
import torch
COMPILER = ("torch._dynamo", "sympy")
torch.func.vmap(torch.neg)(torch.ones(2, 3))
print(sorted(m for m in COMPILER if m in sys.modules))
from fedcomp.platform.catalog import load_builtins
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import ClientHost, Layout, build_task
from fedcomp.platform.rng import generator
load_builtins()
cfg = load_config({"task": {"name": "synthetic-classification", "hidden": [16], "test_samples": 10},
                   "algorithm": {"name": "fedavg", "local_steps": 3}},
                  {"federation.backend": "local", "federation.clients": 6, "federation.vectorise": True})
host = ClientHost(cfg, range(6))
state = host.algorithm.broadcast(host.algorithm.init(build_task(cfg).init_params(generator(0, "init"))))
layout = Layout.of(state)
host.run("local_steps", 0, list(range(6)), layout.pack(state), layout)
print(sorted(m for m in COMPILER if m in sys.modules))
"""


def test_lockstep_clients_of_the_mlp_task_import_no_compiler():
    """``torch.func.grad`` imports ``torch._dynamo`` and sympy (about 150 MiB a process); lockstep clients whose steps
    are untaped, their declaration checked by autograd, never call it (a process of its own: the suite imports it).
    They import no more of the compiler than ``vmap`` itself does: none since torch 2.8, all of it before."""
    done = subprocess.run([sys.executable, "-c", LOCKSTEP_IMPORTS], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(fedcomp.__file__).parents[1])})
    assert done.returncode == 0, done.stderr[-2000:]
    by_vmap, by_lockstep = done.stdout.strip().splitlines()[-2:]
    assert by_lockstep == by_vmap
    if torch_release() >= (2, 8):
        assert by_lockstep == "[]"


def test_lockstep_pays_on_a_cpu_for_small_states_and_enough_clients_and_on_a_gpu_always():
    small_state, large_state = {"x": torch.zeros(10), "m": torch.zeros(10)}, {"x": torch.zeros(LOCKSTEP_MAX_CPU_FLOATS + 1)}
    enough = LOCKSTEP_MIN_CPU_CLIENTS
    assert lockstep_pays([small_state] * enough, "cpu")
    assert not lockstep_pays([large_state] * enough, "cpu")
    assert not lockstep_pays([small_state] * (enough - 1), "cpu")
    assert lockstep_pays([small_state] * (enough - 1), "cpu", configurations=2)  # a sweep's runs step together
    assert lockstep_pays([large_state], "cuda:0")  # the device's name only: no GPU needed
    assert lockstep_pays([{"x": torch.zeros(LOCKSTEP_MAX_CPU_FLOATS)}] * enough, "cpu")  # the limit itself still does


def test_too_few_clients_in_a_call_on_a_cpu_step_one_at_a_time_even_when_vectorised(monkeypatch):
    """Two clients on a CPU host go one at a time, with the bits of vectorise off; three go in lockstep."""
    calls = []

    def counting(*args):
        calls.append(len(args[2]))
        return lockstep_local_steps(*args)

    monkeypatch.setattr(federation, "lockstep_local_steps", counting)
    cfg = config()
    replies = {}
    for vectorise in (True, False):
        host = ClientHost(cfg.replace(**{"federation.vectorise": vectorise}), range(cfg.federation.clients))
        state = host.algorithm.broadcast(host.algorithm.init(build_task(cfg).init_params(generator(0, "init"))))
        layout = Layout.of(state)
        replies[vectorise] = [host.run("local_steps", r, cohort, layout.pack(state), layout)
                              for r, cohort in enumerate([[1, 4], [0, 2, 5]])]
    assert calls == [3]
    assert np.array_equal(replies[True][0].sums, replies[False][0].sums)
    assert replies[True][0].loss_sum == replies[False][0].loss_sum
    assert_close_replies(replies[True][1], replies[False][1])


def test_a_large_model_on_a_cpu_steps_one_at_a_time_even_when_vectorised(monkeypatch):
    """Lockstep costs more than it saves for a large model on a CPU: the host runs it one at a time (the same
    bits as with vectorise off), and a small one on the same task still in lockstep."""
    calls = []

    def counting(*args):
        calls.append(len(args[2]))
        return lockstep_local_steps(*args)

    monkeypatch.setattr(federation, "lockstep_local_steps", counting)
    task = {"name": "synthetic-classification", "test_samples": 10}
    large = load_config({"task": {**task, "hidden": [1024, 128]}, "algorithm": {"name": "fedavg", "local_steps": 2}},
                        {"federation.backend": "local", "federation.clients": 6})
    assert build_task(large).model.dim > LOCKSTEP_MAX_CPU_FLOATS
    for fast, slow in zip(host_reply(large, True), host_reply(large, False)):
        assert np.array_equal(fast.sums, slow.sums) and fast.loss_sum == slow.loss_sum
    assert calls == []
    host_reply(large.replace(**{"task.hidden": [16]}), True)
    assert calls == [6, 4]  # both calls of the small model in lockstep


def test_per_task_mix_runs_one_at_a_time():
    cfg = load_config(SINEWAVE, {"algorithm.inner_state": "per-task-mix"})
    assert not can_lockstep(build_algorithm(cfg), build_task(cfg).problem("compositional"), "local_steps", 2)
