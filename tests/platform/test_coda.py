"""CoDA and CODA+: the stage schedule as a pure function of the round, the dual restart against its closed form on
fixed scores, rounds written out by hand (exactly the documented state averaged, v_ref the exact time average),
counters, convergence to the known saddle point, exact resume across stage boundaries, and bad input."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import torch

import fedcomp
from fedcomp.platform.algorithms.base import ClientContext
from fedcomp.platform.algorithms.coda import MarginAUCProblem, ScoredProblem, StagePlan, dual_restart_value
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import LocalFederation, build_algorithm, build_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server
from fedcomp.platform.state import Means
from tests.platform.helpers import check_breast_cancer_run, check_resume
from tests.platform.minimax_tiny import config

torch.set_num_threads(1)
SEED = 0


def grads_closed(task, k, x, y, batch):
    """grad_x and grad_y of the tiny task's f_k on ``batch`` (minimax_tiny's module doc)."""
    p, mean = task.params, batch[1].mean(0)
    gx = p.mu * (x - task.a[k]) + y[0] * task.c + mean[: p.dim]
    gy = task.c @ x - p.lam * (y - task.b[k]) + mean[p.dim]
    return gx, gy.reshape(1)


# -- schedule ----------------------------------------------------------------------------------------------------------


def test_coda_stages_triple_in_length_and_divide_the_step_by_three():
    algorithm = build_algorithm(config("coda", lr=0.3, local_steps=2, stage_steps=4))
    # T_1 = 4 (2 rounds), T_2 = 12 (6 rounds), T_3 = 36 (18 rounds)
    stages = [1] * 2 + [2] * 6 + [3] * 18 + [4]
    for r, stage in enumerate(stages):
        plan = algorithm.plan(r)
        assert plan == StagePlan(stage=stage, first=r in (0, 2, 8, 26), steps=2, first_step=2 * r,
                                 lr=0.3 / 3 ** (stage - 1), previous_length={1: 0, 2: 4, 3: 12, 4: 36}[stage])


def test_a_stage_ends_at_the_first_communication_after_its_nominal_length():
    algorithm = build_algorithm(config("coda", local_steps=2, stage_steps=5))
    # T_1 = 5 -> 3 rounds (6 steps), T_2 = 15 -> 8 rounds (16 steps), then T_3 = 45 -> 23 rounds
    stages = [1] * 3 + [2] * 8 + [3] * 23 + [4]
    firsts = {0: 0, 3: 6, 11: 16, 34: 46}
    for r, stage in enumerate(stages):
        plan = algorithm.plan(r)
        assert (plan.stage, plan.first, plan.first_step) == (stage, r in firsts, 2 * r)
        if plan.first:
            assert plan.previous_length == firsts[r]
    growing = build_algorithm(config("coda-plus", local_steps=4, stage_steps=10, period_growth=2))
    # periods 4, 8, 10, 10: 3 rounds (12 steps), 2 rounds (16 steps), then 1 round (10 steps) per stage
    plans = [growing.plan(r) for r in range(8)]
    assert [(p.stage, p.steps, p.first_step) for p in plans] == [
        (1, 4, 0), (1, 4, 4), (1, 4, 8), (2, 8, 12), (2, 8, 20), (3, 10, 28), (4, 10, 38), (5, 10, 48)]
    assert [p.previous_length for p in plans[3:]] == [12, 12, 16, 10, 10]


def test_plain_local_sgda_has_one_stage_and_a_constant_step():
    algorithm = build_algorithm(config("coda", lr=0.3, local_steps=3, stage_steps=3, coda_mode="plain_local_sgda"))
    for r in range(50):
        assert algorithm.plan(r) == StagePlan(1, r == 0, 3, 3 * r, 0.3, 0)


def test_coda_plus_restarts_every_t0_steps_with_a_constant_or_growing_period():
    constant = build_algorithm(config("coda-plus", lr=0.3, local_steps=2, stage_steps=6))
    for r in range(40):
        stage = r // 3 + 1
        lr, previous = 0.3 / 3 ** (stage - 1), 0 if stage == 1 else 6
        assert constant.plan(r) == StagePlan(stage, r % 3 == 0, 2, 2 * r, lr, previous)
    started = time.perf_counter()
    far = constant.plan(3_000_000)  # closed form once the lengths stop changing: no walk over a million stages
    assert time.perf_counter() - started < 0.01
    assert (far.stage, far.first, far.first_step) == (1_000_001, True, 6_000_000)

    growing = build_algorithm(config("coda-plus", local_steps=2, stage_steps=16, period_growth=2))
    periods = [2, 4, 8, 16, 16, 16]  # I_s = min(2 * 2^(s-1), T0): 8, 4, 2, 1, 1, 1 rounds
    expected, step = [], 0
    for s, period in enumerate(periods, start=1):
        for j in range(16 // period):
            expected.append((s, j == 0, period, step, 0 if s == 1 else 16))
            step += period
    got = [growing.plan(r) for r in range(len(expected))]
    assert [(p.stage, p.first, p.steps, p.first_step, p.previous_length) for p in got] == expected


# -- dual restart --------------------------------------------------------------------------------------------------


def test_dual_restart_is_mean_negative_minus_mean_positive_score_over_all_clients():
    cfg = config("coda", clients=3, task={"noise": 0.7, "margin": 0.25}, outer_batch=5, restart_batches=4)
    server, task = Server(cfg, LocalFederation), build_task(cfg)
    assert isinstance(server.problem, ScoredProblem)
    x, y = torch.tensor([0.3, -0.2, 0.5]), torch.tensor([7.0])
    for round_, stage in ((0, 1), (2_500, 2)):
        plan = server.algorithm.plan(round_)
        assert plan.stage == stage and plan.first
        # every client's restart, its class-wise sums all-reduced as the round's exchange does
        ctxs = [ClientContext(k, round_, 0, lambda *ids, k=k: generator(SEED, "client-step", k, *ids)) for k in range(3)]
        runs = [server.algorithm.restart(server.problem, x, y, plan, ctx) for ctx in ctxs]
        sums = [next(run) for run in runs]
        mean = Means(class_sums=sum(s["class_sums"] for s in sums) / 3)
        alphas, samples = [], 0
        for run in runs:
            with pytest.raises(StopIteration) as done:
                run.send(mean)
            alphas.append(done.value.value[0])
            samples += done.value.value[1].samples
        scores, labels = [], []
        for k in range(3):  # the same draws, by hand
            gen = generator(SEED, "client-step", k, -1, stage)
            for _ in range(4):
                batch = task.sample(k, "inner", 5, gen)
                labels.append(batch[2])
                scores.append(batch[1][:, -1] + (1 - batch[2]) * (float(task.b[k]) + float(task.c @ x)))
        scores, labels = torch.cat(scores).double(), torch.cat(labels).bool()
        closed = 0.25 + scores[~labels].mean() - scores[labels].mean()  # the margin form's best response
        for alpha in alphas:
            assert float(alpha) == pytest.approx(float(closed), rel=1e-5)
        assert samples == 3 * 4 * 5 and sums[0]["class_sums"].numel() == 4


def test_dual_restart_leaves_alpha_when_a_class_is_missing():
    assert dual_restart_value(3.0, 2.0, 5.0, 4.0) == pytest.approx(5 / 4 - 3 / 2)
    assert dual_restart_value(0.0, 0.0, 5.0, 4.0) is None
    assert dual_restart_value(3.0, 2.0, 0.0, 0.0, margin=1.0) is None
    assert dual_restart_value(3.0, 2.0, 5.0, 4.0, margin=1.0) == pytest.approx(1 + 5 / 4 - 3 / 2)


# -- rounds by hand --------------------------------------------------------------------------------------------------


def hand_rounds(cfg, plans, restart):
    """The stagewise algorithm written out: ``plans`` lists (stage, opens the stage, lr, T_{s-1}) per round."""
    task, hp, K = build_task(cfg), cfg.algorithm, cfg.federation.clients
    params = task.init_params(generator(SEED, "init"))
    x, y, v_ref, x_acc = params["x"], params["y"], None, None
    history = []
    for r, (stage, first, lr, previous) in enumerate(plans):
        if first:
            if stage == 1:
                v_ref = x.clone()
            else:
                v_ref = x_acc / previous
                if hp.restart_from == "average":
                    x = v_ref.clone()
            x_acc = torch.zeros_like(x)
            if restart:
                pos = neg = n_pos = n_neg = 0.0
                for k in range(K):
                    gen = generator(SEED, "client-step", k, -1, stage)
                    for _ in range(3**stage):
                        batch = task.sample(k, "inner", hp.outer_batch, gen)
                        s, lab = task.scores(x, batch).double(), batch[2].bool()
                        pos, n_pos = pos + float(s[lab].sum()), n_pos + float(lab.sum())
                        neg, n_neg = neg + float(s[~lab].sum()), n_neg + float((~lab).sum())
                y = torch.full((1,), task.params.margin + neg / n_neg - pos / n_pos)
        finals = []
        for k in range(K):
            xk, yk, total = x, y, torch.zeros_like(x)
            for i in range(hp.local_steps):
                gen = generator(SEED, "client-step", k, r * hp.local_steps + i)
                batch = task.sample(k, "inner", hp.outer_batch, gen)
                gx, gy = grads_closed(task, k, xk, yk, batch)
                if cfg.algorithm_name == "coda":
                    xk, yk = xk - lr * (gx + (xk - v_ref) / hp.gamma), yk + lr * gy
                else:
                    xk = xk - lr * (gx.clamp(-hp.clip, hp.clip) + (xk - v_ref) / hp.gamma + hp.weight_decay * xk)
                    if hp.dual_step == "closed-form":  # LibAUC: with the new (a, b) = x[0], x[1] and the margin
                        gy = 2 * (task.params.margin + xk[1] - xk[0]) - 2 * yk
                    yk = (yk + lr * gy).clamp(0, 999)
                total = total + xk
            finals.append((xk, yk, total))
        x = sum(f[0] for f in finals) / K
        y = sum(f[1] for f in finals) / K
        x_acc = x_acc + sum(f[2] for f in finals) / K
        history.append({"x": x, "y": y, "v_ref": v_ref, "x_acc": x_acc})
    return history


@pytest.mark.parametrize("restart_from", ["average", "last"])
def test_per_round_coda_rounds_match_a_hand_computation(restart_from):
    cfg = config("coda", task={"noise": 0.5, "margin": 0.5}, lr=0.2, local_steps=2, stage_steps=2, gamma=3.0,
                 outer_batch=4, restart_from=restart_from, stage_average="per-round")
    eta = 0.2
    plans = [(1, True, eta, 0), (2, True, eta / 3, 2), (2, False, eta / 3, 2), (2, False, eta / 3, 2),
             (3, True, eta / 9, 6)]
    expected = hand_rounds(cfg, plans, restart=True)
    server = Server(cfg, LocalFederation)
    assert server.algorithm.averaged == ("x", "y")
    for want in expected:
        record = server.run_round()
        assert set(server.tensors()) == {"x", "y", "v_ref", "x_acc"}
        for key in want:
            torch.testing.assert_close(server.tensors()[key], want[key], rtol=1e-5, atol=1e-5)
        assert server.federation.private_states() == {}
    d = cfg.task.dim
    assert record["comm_rounds"] == 5 and record["local_steps"] == 10
    assert record["floats_up"] == 5 * (2 * d + 1)  # x, y and the sum of the round's iterates
    assert record["embedding_exchanges"] == 3 and record["embedding_floats_up"] == 3 * 4  # restarts at stages 1-3
    restarts = (3 + 9 + 27) * 4
    assert record["samples"] == 2 * (10 * 4 + restarts)


def hand_stage_rounds(cfg, plans, restart):
    """``stage_average: global | local`` written out for full participation: each client keeps its v_ref and the
    sum of its own iterates over its stage; ``plans`` lists (stage, opens the stage, lr, closes the stage)."""
    task, hp, K = build_task(cfg), cfg.algorithm, cfg.federation.clients
    params = task.init_params(generator(SEED, "init"))
    x, y = params["x"], params["y"]
    v_ref = x.clone()  # the server's (global)
    own = [{"stage": 0, "anchor": None, "total": None, "count": 0} for _ in range(K)]
    history = []
    for r, (stage, first, lr, last) in enumerate(plans):
        starts = []
        for c in own:
            xk = x
            if c["stage"] != stage:
                anchor = v_ref if (hp.stage_average == "global" and hp.restart_from == "last" and stage > 1) else x
                if hp.stage_average == "local" and c["stage"] == stage - 1 and c["count"] > 0:
                    anchor = c["total"] / c["count"]  # the client's own time average
                    if hp.restart_from == "average":
                        xk = anchor.clone()
                c.update(stage=stage, anchor=anchor, total=torch.zeros_like(x), count=0)
            starts.append(xk)
        yk0 = y
        if restart and first:
            pos = neg = n_pos = n_neg = 0.0
            for k in range(K):
                gen = generator(SEED, "client-step", k, -1, stage)
                for _ in range(3**stage):
                    batch = task.sample(k, "inner", hp.outer_batch, gen)
                    sc, lab = task.scores(starts[k], batch).double(), batch[2].bool()
                    pos, n_pos = pos + float(sc[lab].sum()), n_pos + float(lab.sum())
                    neg, n_neg = neg + float(sc[~lab].sum()), n_neg + float((~lab).sum())
            yk0 = torch.full((1,), task.params.margin + neg / n_neg - pos / n_pos)
        finals = []
        for k, c in enumerate(own):
            xk, yk = starts[k], yk0
            for i in range(hp.local_steps):
                batch = task.sample(k, "inner", hp.outer_batch, generator(SEED, "client-step", k, r * hp.local_steps + i))
                gx, gy = grads_closed(task, k, xk, yk, batch)
                if cfg.algorithm_name == "coda":
                    xk, yk = xk - lr * (gx + (xk - c["anchor"]) / hp.gamma), yk + lr * gy
                else:
                    xk = xk - lr * (gx.clamp(-hp.clip, hp.clip) + (xk - c["anchor"]) / hp.gamma + hp.weight_decay * xk)
                    yk = (yk + lr * gy).clamp(0, 999)
                c["total"], c["count"] = c["total"] + xk, c["count"] + 1
            finals.append((xk, yk))
        x, y = sum(f[0] for f in finals) / K, sum(f[1] for f in finals) / K
        if hp.stage_average == "global" and last:  # DSG's output: (1/K) sum_k (1/T) sum_t v_t^k
            v_ref = sum(c["total"] / c["count"] for c in own) / K
            x = v_ref.clone() if hp.restart_from == "average" else x
        history.append({"x": x, "y": y, "v_ref": v_ref, "anchors": [c["anchor"] for c in own]})
    return history


@pytest.mark.parametrize("average", ["global", "local"])
@pytest.mark.parametrize("name, restart_from", [("coda", "average"), ("coda", "last"), ("coda-plus", "last"),
                                                ("coda-plus", "average")])
def test_stage_restarts_match_a_hand_computation(name, restart_from, average):
    """A new stage's v_ref and start point under each ``stage_average``, by hand: ``global`` averages every
    client's own time average at the stage's end (the server's v_ref, the clients' anchor); ``local`` makes each
    client's own time average its v_ref (and start point); and the counters say what each sent."""
    plans = {  # (stage, opens it, lr, closes it); CoDA: T_s = 2 * 3^(s-1), CODA+: T_s = 4, I = 2
        "coda": [(1, True, 0.2, True), (2, True, 0.2 / 3, False), (2, False, 0.2 / 3, False),
                 (2, False, 0.2 / 3, True), (3, True, 0.2 / 9, False)],
        "coda-plus": [(1, True, 0.2, False), (1, False, 0.2, True), (2, True, 0.2 / 3, False),
                      (2, False, 0.2 / 3, True), (3, True, 0.2 / 9, False)],
    }[name]
    extra = {"clip": 0.5, "weight_decay": 0.05} if name == "coda-plus" else {}
    cfg = config(name, clients=3, task={"noise": 0.5, "margin": 0.5}, lr=0.2, local_steps=2,
                 stage_steps=2 if name == "coda" else 4, gamma=3.0, outer_batch=4, restart_from=restart_from,
                 stage_average=average, **extra)
    expected = hand_stage_rounds(cfg, plans, restart=name == "coda")
    server = Server(cfg, LocalFederation)
    d, rows = cfg.task.dim, []
    for r, want in enumerate(expected):
        rows.append(server.run_round())
        state = server.tensors()
        assert set(state) == ({"x", "y", "v_ref"} if average == "global" else {"x", "y"})
        torch.testing.assert_close(state["x"], want["x"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(state["y"], want["y"], rtol=1e-5, atol=1e-6)
        if average == "global":
            torch.testing.assert_close(state["v_ref"], want["v_ref"], rtol=1e-5, atol=1e-6)
        private = server.federation.private_states()
        for k in range(3):
            torch.testing.assert_close(private[k]["anchor"], want["anchors"][k], rtol=1e-5, atol=1e-6)
            assert int(private[k]["stage"]) == plans[r][0]
    ups = [b["floats_up"] - a["floats_up"] for a, b in zip([{"floats_up": 0}] + rows, rows)]
    downs = [b["floats_down"] - a["floats_down"] for a, b in zip([{"floats_down": 0}] + rows, rows)]
    closes = [p[3] for p in plans]
    if average == "global":  # each client's stage average goes up with the stage's last round, once
        assert ups == [d + 1 + d * c for c in closes]
        assert downs == [d + 1 + d * (p[1] and p[0] > 1 and restart_from == "last") for p in plans]
    else:  # the code's reading: nothing but (x, y)
        assert ups == downs == [d + 1] * 5
    restarts = sum(p[1] for p in plans) if name == "coda" else 0
    assert rows[-1]["embedding_exchanges"] == restarts
    assert rows[-1]["embedding_floats_up"] == rows[-1]["embedding_floats_down"] == 4 * restarts


@pytest.mark.parametrize("dual_step", ["gradient", "closed-form"])
def test_per_round_coda_plus_rounds_match_a_hand_computation(dual_step):
    cfg = config("coda-plus", task={"noise": 0.5, "shift": 2.0, "margin": 1.0}, lr=0.2, local_steps=2, stage_steps=4,
                 gamma=3.0, clip=0.5, weight_decay=0.05, outer_batch=4, dual_step=dual_step, stage_average="per-round")
    assert isinstance(build_task(cfg), MarginAUCProblem)
    eta = 0.2
    plans = [(1, True, eta, 0), (1, False, eta, 0), (2, True, eta / 3, 4), (2, False, eta / 3, 4),
             (3, True, eta / 9, 4)]
    expected = hand_rounds(cfg, plans, restart=False)
    server = Server(cfg, LocalFederation)
    for want in expected:
        record = server.run_round()
        for key in want:
            torch.testing.assert_close(server.tensors()[key], want[key], rtol=1e-5, atol=1e-5)
    assert record["embedding_exchanges"] == 0 and record["samples"] == 2 * 10 * 4


def test_plain_local_sgda_is_local_gradient_descent_ascent_with_x_and_y_averaged():
    cfg = config("coda", task={"noise": 0.5}, lr=0.2, local_steps=3, outer_batch=4, coda_mode="plain_local_sgda")
    task = build_task(cfg)
    server = Server(cfg, LocalFederation)
    server.run_round()
    assert set(server.tensors()) == {"x", "y"}
    params = task.init_params(generator(SEED, "init"))
    finals = []
    for k in range(2):
        x, y = params["x"], params["y"]
        for t in range(3):
            gx, gy = grads_closed(task, k, x, y, task.sample(k, "inner", 4, generator(SEED, "client-step", k, t)))
            x, y = x - 0.2 * gx, y + 0.2 * gy
        finals.append((x, y))
    torch.testing.assert_close(server.tensors()["x"], (finals[0][0] + finals[1][0]) / 2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(server.tensors()["y"], (finals[0][1] + finals[1][1]) / 2, rtol=1e-5, atol=1e-6)


# -- convergence and resume ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, algo",
    [
        ("coda", {"stage_steps": 100, "gamma": 100.0}),
        ("coda", {"coda_mode": "plain_local_sgda"}),
        # clip 10: inactive near the saddle (clipping each client's gradient moves the fixed point when clients
        # differ); no weight decay, which would move it too
        ("coda-plus", {"stage_steps": 100, "gamma": 100.0, "clip": 10.0, "weight_decay": 0.0}),
    ],
)
def test_reaches_the_known_saddle_point(name, algo):
    cfg = config(name, clients=4, task={"rho": 0.0, "noise": 0.01, "shift": 1.0}, local_steps=4, lr=0.1, **algo)
    server = Server(cfg, LocalFederation)
    start = server.evaluate()
    assert float(build_task(cfg).saddle()[1]) > 0  # the clamp alpha >= 0 is inactive at the saddle
    for _ in range(60):
        server.run_round()
    final = server.evaluate()
    assert final["x_dist_sq"] < 1e-4 * start["x_dist_sq"] and final["y_dist_sq"] < 1e-4 * start["y_dist_sq"]


@pytest.mark.parametrize("name, algo", [("coda", {"stage_steps": 2}),
                                        ("coda-plus", {"stage_steps": 4, "period_growth": 2})])
def test_resume_across_stage_boundaries_gives_identical_numbers(name, algo):
    cfg = config(name, clients=3, federation={"clients_per_round": 2}, task={"noise": 0.3}, local_steps=2,
                 stage_average="per-round", **algo)
    _, _, checkpoint = check_resume(cfg, rounds=6, stop=3)
    assert set(checkpoint["state"]) == {"x", "y", "v_ref", "x_acc"}


@pytest.mark.parametrize("average, server_keys", [("global", {"x", "y", "v_ref"}), ("local", {"x", "y"})])
@pytest.mark.parametrize("name, algo", [("coda", {"stage_steps": 2}),
                                        ("coda-plus", {"stage_steps": 4, "period_growth": 2})])
@pytest.mark.parametrize("participation", [None, 2])
def test_resume_with_the_clients_private_stage_sums_gives_identical_numbers(name, algo, average, server_keys,
                                                                             participation):
    cfg = config(name, clients=3, federation={"clients_per_round": participation}, task={"noise": 0.3},
                 local_steps=2, stage_average=average, **algo)
    straight, resumed, checkpoint = check_resume(cfg, rounds=6, stop=3)
    assert set(checkpoint["state"]) == server_keys
    assert set(checkpoint["private"][0]) == {"stage", "anchor", "total", "count"}
    assert_same_private(resumed.federation.private_states(), straight.federation.private_states())


def assert_same_private(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        for key in a[k]:
            torch.testing.assert_close(a[k][key], b[k][key], rtol=0, atol=0)


# -- bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, bad, match",
    [
        ("coda", {"stage_steps": 0}, r"algorithm.stage_steps = 0"),
        ("coda", {"coda_mode": "sgda"}, r"algorithm.coda_mode = 'sgda'"),
        ("coda", {"gamma": 0.0}, r"algorithm.gamma = 0.0"),
        ("coda", {"restart_batches": 0}, r"algorithm.restart_batches = 0"),
        ("coda-plus", {"period_growth": 0}, r"algorithm.period_growth = 0"),
        ("coda-plus", {"clip": -1.0}, r"algorithm.clip = -1.0"),
        ("coda-plus", {"dual_step": "exact"}, r"algorithm.dual_step = 'exact'"),
        ("coda-plus", {"restart_batches": 3}, r"algorithm.restart_batches: unknown key"),
        ("coda", {"stage_average": "mean"}, r"algorithm.stage_average = 'mean'"),
        ("coda-plus", {"stage_average": 1}, r"algorithm.stage_average = 1"),
    ],
)
def test_bad_hyperparameters_are_one_line_naming_the_field(name, bad, match):
    with pytest.raises(ConfigError, match=match) as info:
        config(name, **bad)
    assert "\n" not in str(info.value)


def quadratic(algorithm, **algo):
    return load_config({"task": {"name": "minimax-quadratic", "dim": 3}, "algorithm": {"name": algorithm, **algo},
                        "federation": {"clients": 2, "backend": "local"}, "run": {"progress": "none"}})


def test_the_dual_restart_needs_scores_and_the_closed_form_dual_step_needs_a_margin():
    with pytest.raises(ConfigError, match=r"has no scores\(x, batch\) / labels\(batch\).*plain_local_sgda"):
        Server(quadratic("coda"), LocalFederation).run_round()
    with pytest.raises(ConfigError, match=r"algorithm.dual_step = 'closed-form' needs the task's margin"):
        Server(quadratic("coda-plus", dual_step="closed-form"), LocalFederation).run_round()
    server = Server(quadratic("coda", coda_mode="plain_local_sgda", local_steps=2), LocalFederation)
    before = server.evaluate()
    for _ in range(20):
        server.run_round()
    assert server.evaluate()["x_dist_sq"] < before["x_dist_sq"]


@pytest.mark.parametrize(
    "name, extra",
    [
        ("coda", {"stage_steps": 2, "restart_batches": 2}),
        ("coda", {"coda_mode": "plain_local_sgda"}),
        ("coda-plus", {"stage_steps": 2}),
        ("coda-plus", {"stage_steps": 2, "dual_step": "closed-form"}),
    ],
)
def test_runs_end_to_end_on_breast_cancer(tmp_path, name, extra):
    check_breast_cancer_run(tmp_path, name, 3, {"auc_form": "margin"} if name == "coda-plus" else None, **extra)


@pytest.mark.ray
@pytest.mark.slow
def test_stages_and_dual_restarts_give_the_same_numbers_on_ray(keeping, tmp_path):
    """Partial participation across two stage boundaries (three dual restarts, whose broadcast is the model alone,
    between rounds whose broadcast carries v_ref): every metric and counter of the Ray backend (2 clients per
    actor) equals the local backend's."""
    raw = {"task": {"name": "imbalanced-binary", "dataset": "breast-cancer", "model": "linear"},
           "algorithm": {"name": "coda", "local_steps": 2, "outer_batch": 16, "stage_steps": 2, "restart_batches": 2},
           "federation": {"clients": 4, "clients_per_round": 3, "backend": "local"},
           "run": {"rounds": 5, "progress": "none", "out": str(tmp_path)}}
    local = fedcomp.run(raw).metrics.drop(columns="wall_time")
    ray = fedcomp.run(raw, {"federation.backend": "ray", "federation.clients_per_actor": 2})
    pd.testing.assert_frame_equal(ray.metrics.drop(columns="wall_time"), local, check_exact=True)
    assert local["embedding_exchanges"].tolist() == [0, 1, 2, 2, 2, 3]  # stages open at rounds 0, 1 and 4
