"""FedProx against hand computations and closed forms: the averaged model, FedAvg at mu = 0 bit for bit, the
proximal minimiser after many local steps, centralised SGD for one client and period 1, one-line errors."""

from __future__ import annotations

import pytest
import torch

from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import build_task
from tests.platform.helpers import run
from tests.platform.plain_tiny import centralised_sgd, config, synthetic_config, x0


def test_two_clients_two_steps_two_rounds_match_a_hand_computation():
    lr, mu, q = 0.1, 0.3, 2
    cfg = config("fedprox", lr=lr, mu=mu, local_steps=q)
    task = build_task(cfg)
    x = x0(task)
    for _ in range(2):
        ws = []
        for k in range(2):
            w = x.clone()
            for _ in range(q):
                w = w - lr * (task.grad(k, w) + mu * (w - x))
            ws.append(w)
        x = torch.stack(ws).mean(0)
    server = run(cfg, 2)
    assert set(server.tensors()) == {"x"} and server.federation.private_states() == {}
    torch.testing.assert_close(server.tensors()["x"], x, rtol=0, atol=1e-6)


def test_mu_zero_is_fedavg_bit_for_bit_on_synthetic_classification():
    fedavg, fedprox = run(synthetic_config("fedavg"), 3), run(synthetic_config("fedprox", mu=0.0), 3)
    assert torch.equal(fedprox.tensors()["x"], fedavg.tensors()["x"])


def test_many_local_steps_reach_each_clients_proximal_minimiser():
    # argmin_w f_k(w) + mu/2 |w - x|^2 = (h_k m_k + mu x) / (h_k + mu) for the diagonal quadratics
    mu = 2.0
    cfg = config("fedprox", clients=3, lr=0.1, mu=mu, local_steps=300)
    task = build_task(cfg)
    x = x0(task)
    expected = ((task.h * task.m + mu * x) / (task.h + mu)).mean(0)
    torch.testing.assert_close(run(cfg, 1).tensors()["x"], expected, rtol=0, atol=1e-5)


def test_one_client_period_one_is_centralised_sgd():
    lr, steps, b = 0.05, 6, 4
    cfg = config("fedprox", clients=1, lr=lr, mu=5.0, local_steps=1, outer_batch=b, task_params={"noise": 1.0})
    x = centralised_sgd(build_task(cfg), lr, steps, b)
    torch.testing.assert_close(run(cfg, steps).tensors()["x"], x, rtol=0, atol=1e-6)


def test_lockstep_clients_give_the_same_numbers():
    def cfg(vectorise):
        return config("fedprox", clients=3, federation={"vectorise": vectorise}, local_steps=3, outer_batch=2, mu=0.5,
                      task_params={"noise": 0.5})

    one, lock = run(cfg(False), 3), run(cfg(True), 3)
    torch.testing.assert_close(lock.tensors()["x"], one.tensors()["x"], rtol=0, atol=1e-6)
    assert lock.federation.private_states() == {}


@pytest.mark.parametrize("bad, field", [({"mu": -0.1}, "mu"), ({"mu": "big"}, "mu")])
def test_bad_hyperparameters_are_one_line_naming_the_field(bad, field):
    with pytest.raises(ConfigError, match=field) as err:
        config("fedprox", **bad)
    assert "\n" not in str(err.value)
