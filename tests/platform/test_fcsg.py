"""The FCSG family against hand computations, its documented averaged state, and its counters."""

from __future__ import annotations

import torch

from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server
from tests.conftest import small


def server_for(**overrides) -> Server:
    return Server(load_config("quickstart", small(**overrides)), LocalFederation)


def run_rounds(server: Server, rounds: int) -> dict:
    record = {}
    for _ in range(rounds):
        record = server.run_round()
    return record


def grad(task, x, outer, inner):
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(task.loss(x, outer, inner), x)
    return g


def hand_run(name: str, steps: int, lr: float, beta: float, b0: int, m: int, seed: int = 0):
    """One client, one round of ``steps`` local steps, written out from the paper's update rules."""
    config = load_config("quickstart", small(**{"algorithm.name": name, "federation.clients": 1,
                                                 "algorithm.local_steps": steps, "algorithm.lr": lr,
                                                 "algorithm.first_batch": b0, "algorithm.inner_batch": m,
                                                 **({"algorithm.beta": beta} if name != "fcsg" else {}),
                                                 "run.seed": seed}))
    task = build_task(config)
    x = task.init_params(generator(seed, "init"))["x"]
    u = torch.zeros_like(x)
    x_prev = x.clone()
    for t in range(steps):
        gen = generator(seed, "client-step", 0, t)
        outer = task.sample_outer(0, b0 if t == 0 else 1, gen)
        inner = task.sample_inner(0, outer, m, gen)
        g = grad(task, x, outer, inner)
        if t == 0 or name == "fcsg":
            u = g
        elif name == "fcsg-m":
            u = (1 - beta) * u + beta * g
        else:  # acc-fcsg-m: both gradients on the same outer and inner samples
            u = g + (1 - beta) * (u - grad(task, x_prev, outer, inner))
        x_prev = x
        x = x - lr * u
    return config, x, u


def check_momentum_round(name: str) -> Server:
    """A server after one round of ``name`` (4 local steps), its x and u checked against :func:`hand_run`."""
    config, x, u = hand_run(name, steps=4, lr=0.05, beta=0.3, b0=8, m=5)
    server = Server(config, LocalFederation)
    server.run_round()
    torch.testing.assert_close(server.state.x, x, rtol=0, atol=1e-6)
    torch.testing.assert_close(server.state.u, u, rtol=0, atol=1e-6)
    return server


def test_fcsg_m_matches_hand_computation():
    check_momentum_round("fcsg-m")


def test_acc_fcsg_m_matches_hand_computation_and_keeps_x_prev_local():
    server = check_momentum_round("acc-fcsg-m")
    assert set(server.state.names()) == {"x", "u"}
    assert set(server.federation.private_states()[0]) == {"x_prev"}


def test_fcsg_one_client_one_step_is_centralised_sgd():
    config, x, _ = hand_run("fcsg", steps=3, lr=0.1, beta=1.0, b0=4, m=3)
    server = Server(config.replace(**{"algorithm.local_steps": 1, "run.rounds": 3}), LocalFederation)
    run_rounds(server, 3)
    torch.testing.assert_close(server.state.x, x, rtol=0, atol=1e-6)


def test_fcsg_m_with_beta_one_is_fcsg():
    a = server_for(**{"algorithm.name": "fcsg"})
    b = server_for(**{"algorithm.name": "fcsg-m", "algorithm.beta": 1.0})
    run_rounds(a, 3), run_rounds(b, 3)
    torch.testing.assert_close(a.state.x, b.state.x, rtol=0, atol=0)


def test_averaged_state_is_exactly_the_documented_one():
    expected = {"fcsg": ({"x"}, set()), "fcsg-m": ({"x", "u"}, set()), "acc-fcsg-m": ({"x", "u"}, {"x_prev"})}
    for name, (synced, private) in expected.items():
        server = server_for(**{"algorithm.name": name})
        server.run_round()
        assert set(server.state.names()) == synced, name
        states = server.federation.private_states()
        assert all(set(s) == private for s in states.values()), name
        assert len(states) == (4 if private else 0)


def test_clients_agree_after_averaging():
    # After a round every client restarts from the same averaged x and u; check by running two rounds and
    # comparing with the average of the per-client states computed by hand from the first round's outputs.
    server = server_for(**{"algorithm.name": "fcsg-m"})
    server.run_round()
    x1 = server.state.x.clone()
    host = server.federation.host
    outs = []
    for c in range(4):
        state = host.algorithm.join({"x": x1, "u": server.state.u.clone()})
        from fedcomp.platform.algorithms.base import ClientContext

        ctx = ClientContext(c, 1, 0, lambda step, c=c: generator(0, "client-step", c, step))
        outs.append(host.algorithm.local_steps(host.problem, state, ctx)[1])
    server.run_round()
    torch.testing.assert_close(server.state.x, torch.stack([o["x"] for o in outs]).mean(0), rtol=0, atol=1e-6)


def test_counters_match_hand_counts():
    d = 11  # 10 weights + bias
    q, rounds, clients, m, b0 = 5, 3, 4, 10, 4
    for name, floats, evals in (("fcsg", d, 1), ("fcsg-m", 2 * d, 1), ("acc-fcsg-m", 2 * d, 2)):
        record = run_rounds(server_for(**{"algorithm.name": name, "algorithm.inner_batch": m}), rounds)
        assert record["comm_rounds"] == rounds == record["local_steps"] / q
        assert record["floats_up"] == rounds * floats and record["floats_down"] == rounds * floats
        # step 0 draws B outer samples; every later step 1; Acc evaluates each later batch at two points
        per_client = b0 * m + (rounds * q - 1) * m * evals
        assert record["samples"] == clients * per_client, name


def test_partial_participation_samples_fixed_size_cohorts():
    from fedcomp.platform.server import sample_cohort

    cohorts = [sample_cohort(7, r, 100, 10) for r in range(5)]
    assert all(len(c) == 10 == len(set(c)) for c in cohorts)
    assert cohorts == [sample_cohort(7, r, 100, 10) for r in range(5)]
    assert len({tuple(c) for c in cohorts}) == 5
    server = server_for(**{"federation.clients": 8, "federation.clients_per_round": 3})
    record = server.run_round()
    assert record["samples"] == 3 * (4 * 10 + 4 * 10)  # 3 clients: B=4 outer x m=10, then 4 steps x m


def test_estimator_bias_shrinks_with_inner_batch():
    config = load_config("quickstart", small(**{"task.noise_ratio": 2.0}))
    task = build_task(config)
    gen = torch.Generator().manual_seed(1)
    x = 0.5 * torch.randn(11, generator=gen)
    outer = task.sample_outer(0, 20_000, gen)
    exact = grad(task, x, outer, outer[0].unsqueeze(1))  # E[eta | xi] = a: the unbiased conditional gradient
    bias = []
    for m in (1, 10, 100):
        estimates = torch.stack([grad(task, x, outer, task.sample_inner(0, outer, m, gen)) for _ in range(3)])
        bias.append(float((estimates.mean(0) - exact).norm()))
    assert bias[0] > bias[1] > bias[2]
