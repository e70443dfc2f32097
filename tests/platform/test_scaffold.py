"""SCAFFOLD against hand computations (control variates, |S|/N under client sampling, eta_g, options I and
II), its fixed point on heterogeneous quadratics (the global optimum, where FedAvg's is not), centralised SGD
for one client and period 1, exact resume, the same numbers on Ray, and one-line errors."""

from __future__ import annotations

import pytest
import torch

import fedcomp
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.server import Server, sample_cohort
from tests.platform.helpers import check_resume, run
from tests.platform.plain_tiny import SEED, centralised_sgd, config, x0


@pytest.mark.parametrize("clients, cohort, control, server_lr", [
    (2, None, "option2", 1.0),
    (2, None, "option1", 1.0),
    (3, 2, "option2", 0.5),
    (3, 2, "option1", 1.0),
])
def test_rounds_match_a_hand_computation(clients, cohort, control, server_lr):
    lr, q, rounds = 0.1, 2, 3
    cfg = config("scaffold", clients=clients, federation={"clients_per_round": cohort}, lr=lr, local_steps=q,
                 control=control, server_lr=server_lr)
    task = build_task(cfg)
    x, c = x0(task), torch.zeros(3)
    c_i: dict[int, torch.Tensor] = {}
    for r in range(rounds):
        members = sample_cohort(SEED, r, clients, cohort or clients)
        dys, dcs = [], []
        for k in members:
            old = c_i.get(k, torch.zeros(3))
            y = x.clone()
            for _ in range(q):
                y = y - lr * (task.grad(k, y) - old + c)
            new = task.grad(k, x) if control == "option1" else old - c + (x - y) / (q * lr)
            dys.append(y - x), dcs.append(new - old)
            c_i[k] = new
        x = x + server_lr * torch.stack(dys).mean(0)
        c = c + len(members) / clients * torch.stack(dcs).mean(0)
    server = run(cfg, rounds)
    assert set(server.tensors()) == {"x", "c"}
    torch.testing.assert_close(server.tensors()["x"], x, rtol=0, atol=1e-6)
    torch.testing.assert_close(server.tensors()["c"], c, rtol=0, atol=1e-6)
    private = server.federation.private_states()
    assert set(private) == set(c_i) and all(set(s) == {"c_i"} for s in private.values())
    for k, value in c_i.items():
        torch.testing.assert_close(private[k]["c_i"], value, rtol=0, atol=1e-6)


def test_reaches_the_global_optimum_of_heterogeneous_quadratics_where_fedavg_does_not():
    lr, q, rounds, clients = 0.1, 5, 150, 4
    scaffold = run(config("scaffold", clients=clients, lr=lr, local_steps=q), rounds)
    fedavg = run(config("fedavg", clients=clients, lr=lr, local_steps=q), rounds)
    task = build_task(config("fedavg", clients=clients))
    optimum = task.optimum()
    shrink = 1 - (1 - lr * task.h) ** q  # FedAvg: x -> mean_k m_k + (1 - lr h_k)^q (x - m_k)
    fedavg_point = (shrink * task.m).sum(0) / shrink.sum(0)
    torch.testing.assert_close(scaffold.tensors()["x"], optimum, rtol=0, atol=1e-5)
    torch.testing.assert_close(fedavg.tensors()["x"], fedavg_point, rtol=0, atol=1e-5)
    assert float((fedavg_point - optimum).norm()) > 0.05


def test_one_client_period_one_is_centralised_sgd():
    lr, steps, b = 0.05, 6, 4
    cfg = config("scaffold", clients=1, lr=lr, local_steps=1, outer_batch=b, task_params={"noise": 1.0})
    x = centralised_sgd(build_task(cfg), lr, steps, b)
    torch.testing.assert_close(run(cfg, steps).tensors()["x"], x, rtol=0, atol=1e-6)


def test_counters_count_both_vectors_each_way_and_the_option1_batch():
    b, extra, q = 4, 3, 2
    server = Server(config("scaffold", clients=3, local_steps=q, outer_batch=b, control="option1", control_batch=extra),
                    LocalFederation)
    record = server.run_round()
    assert (record["comm_rounds"], record["floats_up"], record["floats_down"]) == (1, 6, 6)
    assert record["samples"] == 3 * (q * b + extra)


def test_resumes_from_a_checkpoint_with_identical_numbers():
    cfg = config("scaffold", clients=3, federation={"clients_per_round": 2}, local_steps=3, outer_batch=2,
                 task_params={"noise": 0.5})
    # the checkpoint carries the clients' private c_i
    straight, resumed, _ = check_resume(cfg, rounds=5, stop=3, keys=("x", "c"))
    for k, state in straight.federation.private_states().items():
        assert torch.equal(resumed.federation.private_states()[k]["c_i"], state["c_i"])


@pytest.mark.parametrize("control", ["option2", "option1"])
def test_lockstep_clients_give_the_same_numbers(control):
    def cfg(vectorise):
        return config("scaffold", clients=3, federation={"vectorise": vectorise, "clients_per_round": 2}, local_steps=3,
                      outer_batch=2, control=control, task_params={"noise": 0.5})

    one, lock = run(cfg(False), 3), run(cfg(True), 3)
    for key in ("x", "c"):
        torch.testing.assert_close(lock.tensors()[key], one.tensors()[key], rtol=0, atol=1e-6)
    for k, state in one.federation.private_states().items():
        torch.testing.assert_close(lock.federation.private_states()[k]["c_i"], state["c_i"], rtol=0, atol=1e-6)


@pytest.mark.ray
def test_same_numbers_on_local_and_ray(keeping, tmp_path):
    from fedcomp.actors.server_actor import RayServer

    over = {"task": {"name": "synthetic-classification", "hidden": [8], "test_samples": 50},
            "algorithm": {"name": "scaffold", "lr": 0.1, "local_steps": 3, "outer_batch": 8},
            "federation": {"clients": 4, "clients_per_round": 3, "clients_per_actor": 2, "backend": "local"},
            "run": {"seed": SEED, "rounds": 3, "progress": "none", "out": str(tmp_path)}}
    local = fedcomp.api.make_server(load_config(over))
    ray_over = {**over, "federation": {**over["federation"], "backend": "ray"}}
    remote = RayServer(load_config(ray_over))
    try:
        for _ in range(3):
            local.run_round(), remote.run_round()
        got, expected = remote.checkpoint(), local.checkpoint()
    finally:
        remote.close()
    for key in ("x", "c"):
        assert torch.equal(got["state"][key], expected["state"][key]), key
    assert set(got["private"]) == set(expected["private"])
    for k, state in expected["private"].items():
        assert torch.equal(got["private"][k]["c_i"], state["c_i"]), k
    assert got["counters"] == expected["counters"]


@pytest.mark.parametrize("bad, field", [
    ({"server_lr": 0.0}, "server_lr"),
    ({"control": "option3"}, "control"),
    ({"control_batch": 4}, "control_batch"),
    ({"control": "option1", "control_batch": 0}, "control_batch"),
])
def test_bad_hyperparameters_are_one_line_naming_the_field(bad, field):
    with pytest.raises(ConfigError, match=field) as err:
        config("scaffold", **bad)
    assert "\n" not in str(err.value)
