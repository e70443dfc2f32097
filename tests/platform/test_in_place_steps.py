"""In-place local steps (``LocalSteps.update_``; the local backend, so that the switch reaches the clients) give ``update``'s numbers bit for bit: the same run with the
in-place path switched off gives the same final state and metrics, on a network task (the parameters'
gradients applied piece by piece) and on a task without a network (the flat gradient)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedcomp.api import make_server
from fedcomp.platform.algorithms import base
from fedcomp.platform.algorithms.base import LocalSteps
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_algorithm, build_task

MLP = {"task": {"name": "synthetic-classification", "features": 6, "classes": 3, "hidden": [8, 5], "test_samples": 50},
       "federation": {"clients": 5, "clients_per_round": 3, "backend": "local"},
       "run": {"seed": 1, "rounds": 3, "progress": "none"}}
LOGREG = {"task.test_samples": 200, "federation.clients": 3, "federation.backend": "local", "run.rounds": 3, "algorithm.local_steps": 3,
          "algorithm.first_batch": 4, "run.progress": "none"}


def run(config: Any) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The run's final state and metrics, as its code path chooses."""
    server = make_server(config)
    try:
        for _ in range(config.run.rounds):
            server.run_round()
        return dict(server.checkpoint()["state"]), server.evaluate()
    finally:
        server.close()


def final(config: Any, in_place: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The run's final state and metrics with the in-place path forced on (whatever the model's size) or off;
    forced on, it asserts that every local step ran ``update_``."""
    cls = type(build_algorithm(config))
    calls = []
    with monkeypatch.context() as patch:
        if in_place:
            patch.setattr(base, "IN_PLACE_MIN_FLOATS", 0)
            step_in_place = cls.update_
            patch.setattr(cls, "update_", lambda self, *a: calls.append(1) or step_in_place(self, *a))
        else:
            patch.setattr(LocalSteps, "in_place", lambda self: False)
        result = run(config)
    if in_place:
        assert len(calls) == config.run.rounds * config.federation.cohort_size * config.algorithm.local_steps
    return result


def same(a: tuple[dict[str, Any], dict[str, float]], b: tuple[dict[str, Any], dict[str, float]]) -> None:
    assert a[0].keys() == b[0].keys() and a[1] == b[1]
    for name, value in a[0].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[0][name]), name


ON_A_NETWORK = [
    {"name": "fedavg"},
    {"name": "fedavgm"},
    {"name": "local-sgdm", "momentum": 0.9},
    {"name": "local-sgdm", "momentum": 0.5, "average": "model"},
    {"name": "fedprox", "mu": 0.3},
    {"name": "fedadam"},
    {"name": "scaffold"},
    {"name": "scaffold", "control": "option1"},
]
WITHOUT_A_NETWORK = ["fcsg", "fcsg-m", "acc-fcsg-m"]
ON_THEIR_OWN_TASK = {"local-sgdm-rl": {"task": {"name": "imbalanced-binary"}, "federation": {"clients": 4, "backend": "local"},
                                       "run": {"rounds": 2, "progress": "none"}}}
"""Algorithms that need a task of their own (the Ratio Loss's class-weighted loss), with it."""


def test_every_algorithm_with_an_in_place_step_is_held_to_its_pure_numbers_below():
    from fedcomp.platform.catalog import load_builtins
    from fedcomp.platform.registry import ALGORITHMS

    load_builtins()

    stepped = {name for name, cls in ALGORITHMS.items()  # fedcomp's own: other tests register users' algorithms
               if issubclass(cls, LocalSteps) and cls.mutates and cls.__module__.startswith("fedcomp.")}
    assert stepped == {a["name"] for a in ON_A_NETWORK} | set(WITHOUT_A_NETWORK) | set(ON_THEIR_OWN_TASK)


@pytest.mark.parametrize("name", list(ON_THEIR_OWN_TASK))
def test_in_place_steps_on_their_own_task_give_the_pure_updates_numbers(name, monkeypatch):
    config = load_config({**ON_THEIR_OWN_TASK[name], "algorithm": {"name": name, "lr": 0.1, "local_steps": 3,
                                                                   "outer_batch": 8}})
    assert build_algorithm(config).in_place()
    same(final(config, True, monkeypatch), final(config, False, monkeypatch))


@pytest.mark.parametrize("algorithm", ON_A_NETWORK, ids=lambda a: "-".join(str(v) for v in a.values()))
def test_in_place_steps_on_a_network_give_the_pure_updates_numbers(algorithm, monkeypatch):
    config = load_config({**MLP, "algorithm": {**algorithm, "lr": 0.1, "local_steps": 3, "outer_batch": 4}})
    assert build_algorithm(config).in_place()
    same(final(config, True, monkeypatch), final(config, False, monkeypatch))


@pytest.mark.parametrize("name", WITHOUT_A_NETWORK)
def test_in_place_steps_without_a_network_give_the_pure_updates_numbers(name, monkeypatch):
    config = load_config("quickstart", {**LOGREG, "algorithm.name": name})
    assert build_algorithm(config).in_place()
    same(final(config, True, monkeypatch), final(config, False, monkeypatch))


def test_a_subclass_that_changes_update_without_its_own_update_steps_purely():
    from fedcomp.platform.algorithms.fedavg import FedAvg

    class Changed(FedAvg):
        def update(self, problem, state, batch, step):  # type: ignore[no-untyped-def]
            return super().update(problem, state, batch, step)

    config = load_config({**MLP, "algorithm": {"name": "fedavg"}})
    assert build_algorithm(config).in_place() and not Changed(config.algorithm).in_place()


def test_small_models_step_purely_and_large_ones_in_place(monkeypatch):
    """In place only from ``IN_PLACE_MIN_FLOATS`` floats of stepped state up (below it the pure step is faster)."""
    config = load_config({**MLP, "algorithm": {"name": "fedavg", "lr": 0.1, "local_steps": 2, "outer_batch": 4}})
    calls = []
    step_in_place = type(build_algorithm(config)).update_
    monkeypatch.setattr(type(build_algorithm(config)), "update_", lambda self, *a: calls.append(1) or step_in_place(self, *a))
    dim = 6 * 8 + 8 + 8 * 5 + 5 + 5 * 3 + 3
    for threshold, expected in ((dim + 1, 0), (dim, 3 * 2)):
        monkeypatch.setattr(base, "IN_PLACE_MIN_FLOATS", threshold)
        calls.clear()
        server = make_server(config)
        try:
            server.run_round()
        finally:
            server.close()
        assert len(calls) == expected, threshold



FUSED_ALGORITHMS = [
    {"name": "fedavg"},
    {"name": "local-sgdm", "momentum": 0.9},
    {"name": "local-sgdm", "momentum": 0.5, "average": "model"},
    {"name": "fedprox", "mu": 0.3},
]


def fused(config: Any) -> Any:
    return config.replace(**{"federation.fused_sgd": True})


def factoring(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each gradient the model was asked for came as factors (recorded as the run goes), by autograd
    (``factored_grad_pieces``) or without its tape (``cross_entropy_factors``)."""
    from fedcomp.models.functional import FlatModel

    taken: list[bool] = []

    def recording(factored: Any) -> Any:
        def recorded(self, *args):  # type: ignore[no-untyped-def]
            done = factored(self, *args)
            taken.append(done is not None and bool(done[1]))
            return done

        return recorded

    for name in ("factored_grad_pieces", "cross_entropy_factors"):
        monkeypatch.setattr(FlatModel, name, recording(getattr(FlatModel, name)))
    return taken


@pytest.mark.parametrize("algorithm", FUSED_ALGORITHMS, ids=lambda a: "-".join(str(v) for v in a.values()))
def test_fused_sgd_steps_every_client_by_its_linear_layers_factors_close_to_the_exact_run(algorithm, monkeypatch):
    """``federation.fused_sgd``: every in-place step on a network (plain SGD, or into the momentum buffer) takes the
    linear weights' gradients as factors (none declined), and the run ends within float32 rounding of the exact
    run's numbers."""
    taken = factoring(monkeypatch)
    config = load_config({**MLP, "algorithm": {**algorithm, "lr": 0.1, "local_steps": 3, "outer_batch": 4}})
    exact = final(config, True, monkeypatch)
    assert taken == []
    got = final(fused(config), True, monkeypatch)
    assert len(taken) == config.run.rounds * config.federation.cohort_size * config.algorithm.local_steps and all(taken)
    assert got[0].keys() == exact[0].keys()
    for name, value in got[0].items():
        torch.testing.assert_close(value, exact[0][name], rtol=1e-5, atol=1e-6, msg=name)
    assert got[1] == pytest.approx(exact[1], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("algorithm", FUSED_ALGORITHMS, ids=lambda a: "-".join(str(v) for v in a.values()))
def test_after_one_fused_step_only_the_linear_weights_differ_from_the_exact_step(algorithm, monkeypatch):
    """One round, up to the first step that rounds otherwise (SGD's and FedProx's first; with momentum the second, as
    a buffer of zeros plus the product is the product's bits): the biases (and the buffer's) are bit for bit the exact step's;
    the linear weights -- stepped by their gradients' factors (``addmm_``), every step -- agree up to rounding. (Whether
    they differ at all is the CPU's BLAS's: on an AMD EPYC they did here; on an Intel Xeon with these small shapes
    ``addmm_`` rounded as the product then the step did, and the cohort's mean agreed bit for bit.)"""
    steps = 2 if algorithm["name"] == "local-sgdm" else 1
    config = load_config({**MLP, "run": {**MLP["run"], "rounds": 1},
                          "algorithm": {**algorithm, "lr": 0.1, "local_steps": steps, "outer_batch": 4}})
    exact = final(config, True, monkeypatch)[0]
    taken = factoring(monkeypatch)
    got = final(fused(config), True, monkeypatch)[0]
    assert len(taken) == config.federation.cohort_size * steps and all(taken)
    flat = build_task(config).model
    weights = [i for i, n in enumerate(flat.names) if n.endswith("weight")]
    for key in exact:
        pieces = zip(flat.pieces(got[key]), flat.pieces(exact[key]))
        for i, (a, b) in enumerate(pieces):
            if i in weights:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(a, b), (key, flat.names[i])


def test_fused_sgd_leaves_small_states_to_the_pure_step():
    """Below ``IN_PLACE_MIN_FLOATS`` the step is the pure one, fused_sgd or not: the same bits as without it."""
    algorithm = {"name": "fedavg", "lr": 0.1, "local_steps": 2, "outer_batch": 4}
    same(*(run(load_config({**MLP, "algorithm": algorithm, "federation": {**MLP["federation"], "fused_sgd": fused}}))
           for fused in (True, False)))
