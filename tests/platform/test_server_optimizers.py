"""FedAvgM and FedAdam (server optimisers as transforms of the averaged update) against hand computations on
heterogeneous quadratics, their typed server state in checkpoints, and one-line errors."""

from __future__ import annotations

import pytest
import torch

from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import build_task
from tests.platform.helpers import check_resume, run
from tests.platform.plain_tiny import config, x0


def client_mean(task, x, lr, q, clients=2):
    """<x_i> after q full-gradient steps of every client from x (noise 0: the tiny quadratics' exact gradients)."""
    ends = []
    for k in range(clients):
        w = x.clone()
        for _ in range(q):
            w = w - lr * task.grad(k, w)
        ends.append(w)
    return torch.stack(ends).mean(0)


def test_fedavgm_matches_a_hand_computation():
    lr, q, eta, beta = 0.1, 2, 0.7, 0.5
    cfg = config("fedavgm", lr=lr, local_steps=q, server_lr=eta, server_momentum=beta)
    task = build_task(cfg)
    x, m = x0(task), torch.zeros(3)
    for _ in range(3):
        m = beta * m + (x - client_mean(task, x, lr, q))
        x = x - eta * m
    server = run(cfg, 3)
    torch.testing.assert_close(server.state.x, x, rtol=0, atol=1e-6)
    torch.testing.assert_close(server.state.m, m, rtol=0, atol=1e-6)
    assert set(server.tensors()) == {"x", "m"} and server.federation.private_states() == {}


def test_fedadam_matches_a_hand_computation():
    lr, q, eta, b1, b2, tau = 0.1, 2, 0.05, 0.8, 0.9, 1e-2
    cfg = config("fedadam", lr=lr, local_steps=q, server_lr=eta, server_beta1=b1, server_beta2=b2, server_tau=tau)
    task = build_task(cfg)
    x, m, v = x0(task), torch.zeros(3), torch.zeros(3)
    for _ in range(3):
        delta = x - client_mean(task, x, lr, q)
        m = b1 * m + (1 - b1) * delta
        v = b2 * v + (1 - b2) * delta**2
        x = x - eta * m / (v.sqrt() + tau)
    server = run(cfg, 3)
    torch.testing.assert_close(server.state.x, x, rtol=0, atol=1e-6)
    torch.testing.assert_close(server.state.v, v, rtol=0, atol=1e-6)


def test_fedavgm_without_momentum_and_unit_step_is_fedavg():
    fedavg = run(config("fedavg", lr=0.1, local_steps=3), 4)
    fedavgm = run(config("fedavgm", lr=0.1, local_steps=3, server_lr=1.0, server_momentum=0.0), 4)
    torch.testing.assert_close(fedavgm.state.x, fedavg.state.x, rtol=0, atol=1e-6)
    assert fedavgm.counters == fedavg.counters  # the same messages: the server state never travels


def test_fedadam_reaches_the_global_optimum_with_one_local_step():
    # q = 1 and full gradients: <x_i> - x = -lr grad F(x), so the server's Adam minimises F = sum_k f_k.
    cfg = config("fedadam", lr=0.1, local_steps=1, server_lr=0.05, rounds=400)
    task = build_task(cfg)
    torch.testing.assert_close(run(cfg, 400).state.x, task.optimum(), rtol=0, atol=2e-2)


@pytest.mark.parametrize("name", ["fedavgm", "fedadam"])
def test_resume_restores_the_optimiser_state_exactly(name):
    cfg = config(name, lr=0.1, local_steps=2)
    check_resume(cfg, rounds=4, stop=2)


@pytest.mark.parametrize("key, value, field", [
    ("server_momentum", 1.0, "algorithm.server_momentum"),
    ("server_lr", 0.0, "algorithm.server_lr"),
])
def test_bad_server_hyperparameters_fail_in_one_line(key, value, field):
    with pytest.raises(ConfigError) as error:
        config("fedavgm", **{key: value})
    assert str(error.value).startswith(f"{field} = {value!r}") and "\n" not in str(error.value)


def test_fedadam_bad_tau_names_the_field():
    with pytest.raises(ConfigError, match=r"^algorithm.server_tau = 0.0"):
        config("fedadam", server_tau=0.0)
