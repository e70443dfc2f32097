"""FedDRO and vanilla FedAvg for compositional problems: the y recursion by hand, what is exchanged when,
and the paper's negative result (Theorems 4.1 and 4.2) on a deterministic heterogeneous problem."""

from __future__ import annotations

import math

import pytest
import torch

import fedcomp
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.server import Server
from tests.conftest import results_root


def config(algorithm, clients=3, **algo):
    return load_config(
        {"task": {"name": "heterogeneous-composition", "heterogeneity": 1.0},
         "algorithm": {"name": algorithm, **algo}, "federation": {"clients": clients, "backend": "local"},
         "run": {"progress": "none", "out": results_root()}}
    )


def test_feddro_recursion_matches_a_hand_computation():
    lr, beta, steps = 0.3, 0.4, 3
    cfg = config("feddro", lr=lr, beta=beta, local_steps=steps)
    task = build_task(cfg)
    server = Server(cfg, LocalFederation)
    for _ in range(2):
        server.run_round()

    def grad_f(z):
        return z / torch.sqrt(1 + z @ z)

    def g(x, k):  # client k's inner map
        return task.A[k] @ x + task.c[k]

    K = 3
    x = [torch.zeros(10) for _ in range(K)]
    x_prev = [xi.clone() for xi in x]
    y_bar = sum(g(x[k], k) for k in range(K)) / K  # initial estimate at x_0
    for _ in range(2):
        for _ in range(steps):
            y = [(1 - beta) * (y_bar - g(x_prev[k], k)) + g(x[k], k) for k in range(K)]
            y_bar = sum(y) / K  # the per-step exchange
            new = [x[k] - lr * task.A[k].T @ grad_f(y_bar) for k in range(K)]
            x_prev, x = x, new
        x_bar = sum(x) / K
        x = [x_bar.clone() for _ in range(K)]  # model round; x_prev stays each client's own iterate
    torch.testing.assert_close(server.tensors()["x"], x_bar, rtol=0, atol=1e-5)
    torch.testing.assert_close(server.tensors()["y"], y_bar, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "algorithm, extra, exchanges, model_rounds",
    [
        ("feddro", {"beta": 0.5}, lambda T, I: T + 1, lambda T, I: T // I),
        ("fedavg-co-shared-y", {}, lambda T, I: T + 1, lambda T, I: T // I),
        ("fedavg-co-1", {}, lambda T, I: 0, lambda T, I: T // I),
        ("fedavg-co-2", {}, lambda T, I: T // I, lambda T, I: T // I),
    ],
)
def test_y_every_step_and_x_every_I_steps(algorithm, extra, exchanges, model_rounds):
    I, rounds = 4, 5
    server = Server(config(algorithm, local_steps=I, **extra), LocalFederation)
    for _ in range(rounds):
        record = server.run_round()
    T = I * rounds
    assert record["local_steps"] == T
    assert record["comm_rounds"] == model_rounds(T, I)
    assert record["embedding_exchanges"] == exchanges(T, I)  # T per-step exchanges + the initial estimate
    assert record["embedding_floats_up"] == 2 * exchanges(T, I)  # d_g = 2 floats each
    assert record["floats_up"] == 10 * model_rounds(T, I)  # the model (d = 10) only at model rounds


def final_grad_norms(algorithm, I, rounds=150, **extra):
    # 8 clients x d_g = 2 equations > d = 10 unknowns: the clients' own problems have no common solution
    metrics = fedcomp.run(config(algorithm, clients=8, lr=0.5, local_steps=I, **extra), {"run.rounds": rounds, "run.eval_every": 50}).metrics
    return metrics.set_index("round")["grad_norm_sq"]


@pytest.mark.slow
def test_negative_result_vanilla_fedavg_stalls_while_sharing_y_every_step_converges():
    for algorithm in ("fedavg-co-1", "fedavg-co-2"):
        g = final_grad_norms(algorithm, I=8)
        assert g.loc[150] > 1e-3 and g.loc[150] > 0.5 * g.loc[100], (algorithm, g.tolist())  # stuck
    for algorithm, extra in (("feddro", {"beta": 0.5}), ("fedavg-co-shared-y", {})):
        g = final_grad_norms(algorithm, I=8, **extra)
        assert g.loc[150] < 1e-10 * g.loc[0], (algorithm, g.tolist())
    # with I = 1 case II shares g_k(x_bar) every step too, and converges
    assert final_grad_norms("fedavg-co-2", I=1).loc[150] < 1e-8


def test_lr_schedule_is_a_function_of_the_round():
    hp = config("feddro", lr=0.1, lr_milestones=[90, 120], lr_factor=0.1).algorithm
    assert [hp.lr_at(r) for r in (0, 89, 90, 119, 120)] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001])


def test_y_bar_0_is_server_state_from_the_start_and_a_resumed_run_is_identical():
    cfg = config("feddro", lr=0.3, beta=0.4, local_steps=3)
    straight = Server(cfg, LocalFederation)
    assert set(straight.tensors()) == {"x"}  # before round 0: init's state; start adds y_bar_0
    rows = [straight.run_round() for _ in range(4)]
    assert set(straight.tensors()) == {"x", "y", "log_scale"}  # y_bar and its running-shift scale
    for before_round_0 in (True, False):
        first = Server(cfg, LocalFederation)
        if not before_round_0:
            for _ in range(2):
                first.run_round()
        resumed = Server(cfg, LocalFederation)
        resumed.restore(first.checkpoint())  # carries each client's x_prev
        done = first.counters.round
        resumed_rows = [resumed.run_round() for _ in range(4 - done)]
        assert resumed_rows == rows[done:]  # counters (the initial exchange in round 0 included) and losses
        for key in ("x", "y"):
            torch.testing.assert_close(resumed.tensors()[key], straight.tensors()[key], rtol=0, atol=0)


def test_feddro_with_a_partial_cohort_matches_a_hand_computation():
    # Clients outside the first cohort join later with x_prev = the model they first receive.
    from fedcomp.platform.server import sample_cohort

    lr, beta, steps, K, per_round, rounds = 0.3, 0.4, 2, 6, 3, 4
    cfg = load_config(
        {"task": {"name": "heterogeneous-composition", "heterogeneity": 1.0},
         "algorithm": {"name": "feddro", "lr": lr, "beta": beta, "local_steps": steps},
         "federation": {"clients": K, "clients_per_round": per_round, "backend": "local"},
         "run": {"progress": "none", "out": results_root()}}
    )
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    for _ in range(rounds):
        record = server.run_round()

    def grad_f(z):
        return z / torch.sqrt(1 + z @ z)

    def g(x, k):  # client k's inner map
        return task.A[k] @ x + task.c[k]

    x_bar = torch.zeros(10)
    cohorts = [sample_cohort(cfg.run.seed, r, K, per_round) for r in range(rounds)]
    y_bar = sum(g(x_bar, k) for k in cohorts[0]) / per_round
    x_prev = {k: x_bar.clone() for k in cohorts[0]}
    for cohort in cohorts:
        x = {k: x_bar.clone() for k in cohort}
        prev = {k: x_prev.get(k, x_bar.clone()) for k in cohort}
        for _ in range(steps):
            y = {k: (1 - beta) * (y_bar - g(prev[k], k)) + g(x[k], k) for k in cohort}
            y_bar = sum(y.values()) / per_round
            prev, x = x, {k: x[k] - lr * task.A[k].T @ grad_f(y_bar) for k in cohort}
        x_prev.update(prev)
        x_bar = sum(x.values()) / per_round
    assert len({k for c in cohorts for k in c}) > per_round  # some clients joined after round 0
    torch.testing.assert_close(server.tensors()["x"], x_bar, rtol=0, atol=1e-5)
    torch.testing.assert_close(server.tensors()["y"], y_bar, rtol=0, atol=1e-5)
    assert record["embedding_exchanges"] == rounds * steps + 1 and record["comm_rounds"] == rounds


# ------------------------------------------------------------------------------------------------ running shift


def offline_kl(out, **overrides):
    base = {"run.rounds": 10, "run.eval_every": 5, "federation.backend": "local", "run.out": str(out),
            "run.progress": "none", "run.on_divergence": "continue"}
    return fedcomp.run("feddro-offline", {**base, **overrides}).metrics


def test_running_shift_makes_feddro_independent_of_the_constant_kl_shift(tmp_path):
    # c = 450 with lambda = 5 puts every exp((l - c) / lambda) near e^-90, in float32's subnormal range: the
    # plain form loses the digits and goes to nan; the running shift moves s to log y_bar_0 ~ -90 at the start
    # and reproduces the c = 0 run (the same objective and gradients in exact arithmetic) up to rounding.
    reference = offline_kl(tmp_path, **{"algorithm.kl": "plain"})
    plain = offline_kl(tmp_path, **{"algorithm.kl": "plain", "task.shift": 450.0})
    shifted = offline_kl(tmp_path, **{"algorithm.kl": "shifted", "task.shift": 450.0})
    assert plain["robust_loss"].iloc[1:].isna().all()
    assert shifted["train_accuracy"].tolist() == reference["train_accuracy"].tolist()
    # robust_loss evaluates lambda log z + 450 in float32: its own rounding is ~1e-5 at that magnitude
    torch.testing.assert_close(torch.tensor(shifted["robust_loss"].values), torch.tensor(reference["robust_loss"].values),
                               rtol=0, atol=1e-4)


def test_running_shift_is_the_plain_run_bit_for_bit_while_y_bar_stays_in_range(tmp_path):
    plain = offline_kl(tmp_path, **{"algorithm.kl": "plain", "run.rounds": 4, "run.eval_every": 2})
    shifted = offline_kl(tmp_path, **{"algorithm.kl": "shifted", "run.rounds": 4, "run.eval_every": 2})
    columns = ["robust_loss", "train_accuracy", "test_accuracy", "train_loss", "floats_up", "floats_down",
               "embedding_floats_up", "embedding_floats_down"]
    assert shifted[columns].equals(plain[columns])  # counters too: the scale rides along as y_bar does


def test_renormalise_moves_the_shift_only_beyond_the_threshold():
    from fedcomp.platform.algorithms.feddro import RESCALE_AT, at_scale, renormalise

    class Scalable:
        log_scalable = True

        def inner_scaled(self, x, batch, log_scale):
            return torch.exp(x - log_scale).reshape(1)

    problem, zero = Scalable(), torch.zeros(1)
    inside = torch.tensor([math.exp(RESCALE_AT - 1)])
    assert renormalise(problem, inside, zero) == (inside, zero)
    for y in (torch.tensor([math.exp(RESCALE_AT + 1)]), torch.tensor([math.exp(-RESCALE_AT - 1)])):
        y_new, s = renormalise(problem, y, zero)
        assert float(y_new) == 1.0 and float(s) == pytest.approx(math.log(float(y)))
        # the value it stands for, y e^s, is unchanged, and g_k at the new scale is g_k e^-s
        assert float(y_new) * math.exp(float(s)) == pytest.approx(float(y), rel=1e-6)
        assert float(at_scale(problem, s).inner(torch.tensor(3.0), None)) == pytest.approx(math.exp(3.0 - float(s)), rel=1e-5)
    for y in (torch.tensor([-1e30]), torch.tensor([float("inf")])):  # no log: left as it is
        assert renormalise(problem, y, zero)[1] is zero
    assert renormalise(object(), torch.tensor([1e30]), zero)[1] is zero  # a problem that is not log-scalable
    assert at_scale(problem, zero) is problem  # s = 0: the problem itself (the plain run's numbers)


# ------------------------------------------------------------------------------------------------ Theorem 5.1


def drift_grad_norms(I, rounds=40, **extra):
    overrides = {"algorithm.local_steps": I, "federation.backend": "local", "run.rounds": rounds,
                 "run.eval_every": rounds // 2, "run.progress": "none", "run.out": results_root(), **extra}
    return fedcomp.run("feddro-drift", overrides).metrics.set_index("round")["grad_norm_sq"]


def test_theorem_5_1_heterogeneous_plain_part_makes_feddro_with_local_steps_stall():
    one, eight = drift_grad_norms(1), drift_grad_norms(8)
    assert one.loc[40] < 1e-10 * one.loc[0]  # I = 1: gradient descent on Phi
    assert eight.loc[40] > 1e-2 and eight.loc[40] > 0.9 * eight.loc[20]  # I = 8: stalled by the drift on h
    smaller = drift_grad_norms(8, **{"algorithm.lr": 0.125})
    assert 1e-4 < smaller.loc[40] < 0.5 * eight.loc[40]  # the drift term shrinks with the step size


def test_plain_weight_zero_is_the_theorem_4_1_problem():
    base = build_task(config("feddro"))
    drift = build_task(load_config({"task": {"name": "heterogeneous-composition", "heterogeneity": 1.0, "plain_weight": 1.0},
                                    "algorithm": {"name": "feddro"}, "federation": {"clients": 3, "backend": "local"}}))
    torch.testing.assert_close(drift.A, base.A, rtol=0, atol=0)
    torch.testing.assert_close(drift.c, base.c, rtol=0, atol=0)
    x = torch.randn(10)
    assert float(base.plain(x, base.sample(0, None, None))) == 0.0 and float(drift.plain(x, drift.sample(0, None, None))) > 0
    # the evaluator's exact gradient of h + f(g) against autograd of the clients' mean
    xr = x.double().requires_grad_(True)
    phi = sum(drift.plain(xr.float(), drift.sample(k, None, None)).double() for k in range(3)) / 3
    z = drift.A.mean(0).double() @ xr + drift.c.mean(0).double()
    phi = phi + torch.sqrt(1 + z @ z) - 1
    (grad,) = torch.autograd.grad(phi, xr)
    assert drift.evaluator()({"x": x})["grad_norm_sq"] == pytest.approx(float(grad @ grad), rel=1e-5)
