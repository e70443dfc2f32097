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
from fedcomp.platform.federation import build_algorithm

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


@pytest.mark.parametrize("algorithm", [
    {"name": "fedavg"},
    {"name": "fedavgm"},
    {"name": "local-sgdm", "momentum": 0.9},
    {"name": "local-sgdm", "momentum": 0.5, "average": "model"},
    {"name": "fedprox", "mu": 0.3},
], ids=lambda a: "-".join(str(v) for v in a.values()))
def test_in_place_steps_on_a_network_give_the_pure_updates_numbers(algorithm, monkeypatch):
    config = load_config({**MLP, "algorithm": {**algorithm, "lr": 0.1, "local_steps": 3, "outer_batch": 4}})
    assert build_algorithm(config).in_place()
    same(final(config, True, monkeypatch), final(config, False, monkeypatch))


@pytest.mark.parametrize("name", ["fcsg", "fcsg-m", "acc-fcsg-m"])
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



def test_fused_sgd_steps_every_client_by_its_linear_layers_factors_close_to_the_exact_run(monkeypatch):
    """``federation.fused_sgd``: every in-place step of FedAvg on a network is the model's fused step (none
    declined), and the run ends within float32 rounding of the exact run's numbers."""
    from fedcomp.models.functional import FlatModel

    taken = []
    fused_step = FlatModel.sgd_step_

    def recorded(self, *args):  # type: ignore[no-untyped-def]
        value = fused_step(self, *args)
        taken.append(value is not None)
        return value

    monkeypatch.setattr(FlatModel, "sgd_step_", recorded)
    algorithm = {"name": "fedavg", "lr": 0.1, "local_steps": 3, "outer_batch": 4}
    exact = final(load_config({**MLP, "algorithm": algorithm}), True, monkeypatch)
    assert taken == []
    config = load_config({**MLP, "algorithm": algorithm, "federation": {**MLP["federation"], "fused_sgd": True}})
    fused = final(config, True, monkeypatch)
    assert len(taken) == config.run.rounds * config.federation.cohort_size * config.algorithm.local_steps and all(taken)
    torch.testing.assert_close(fused[0]["x"], exact[0]["x"], rtol=1e-5, atol=1e-6)
    assert fused[1] == pytest.approx(exact[1], rel=1e-5, abs=1e-6)


def test_fused_sgd_leaves_small_states_to_the_pure_step():
    """Below ``IN_PLACE_MIN_FLOATS`` the step is the pure one, fused_sgd or not: the same bits as without it."""
    algorithm = {"name": "fedavg", "lr": 0.1, "local_steps": 2, "outer_batch": 4}
    same(*(run(load_config({**MLP, "algorithm": algorithm, "federation": {**MLP["federation"], "fused_sgd": fused}}))
           for fused in (True, False)))
