"""The FedNest family: FedIHGP against the exact inverse-Hessian product, round counts per epoch, and the
paper's Figure 4 claim on the quadratic minimax problem."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import Field

import fedcomp
from fedcomp.platform.algorithms.fednest import fresh_cohorts
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.kinds import BILEVEL
from fedcomp.platform.params import Params
from fedcomp.platform.registry import TASKS, register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.rounds import Round
from fedcomp.platform.server import Server
from fedcomp.platform.tasks.base import Task
from tests.conftest import results_root


class QuadraticBilevelParams(Params):
    dim: int = Field(4, ge=1)


class QuadraticBilevel(Task):
    """g_i = 1/2 y^T H_i y - y^T B_i x, f_i = 1/2 ||y - c_i||^2 + 1/2 ||x||^2: every oracle is exact."""

    Params = QuadraticBilevelParams
    kinds = frozenset({BILEVEL})
    metrics = ("f",)
    minimax = False

    def __init__(self, params, seed, clients, device="cpu"):
        super().__init__(params, seed, clients, device)
        gen = torch.Generator().manual_seed(3)
        d = params.dim
        m = [torch.randn(d, d, generator=gen, dtype=torch.float64) for _ in range(clients)]
        self.H = [0.5 * a @ a.T / d + torch.eye(d, dtype=torch.float64) for a in m]  # SPD, eigenvalues in [1, ~3]
        self.B = [torch.randn(d, d, generator=gen, dtype=torch.float64) for _ in range(clients)]
        self.c = [torch.randn(d, generator=gen, dtype=torch.float64) for _ in range(clients)]

    def init_params(self, gen):
        return {"x": torch.ones(self.params.dim), "y": torch.ones(self.params.dim)}

    def sample(self, client, split, size, gen):
        return client

    def inner_loss(self, x, y, i):
        x, y = x.double(), y.double()
        return 0.5 * y @ self.H[i] @ y - y @ self.B[i] @ x

    def outer_loss(self, x, y, i):
        x, y = x.double(), y.double()
        return 0.5 * ((y - self.c[i]) ** 2).sum() + 0.5 * (x @ x)

    def evaluator(self):
        return lambda state: {"f": 0.0}


if "quadratic-bilevel-test" not in TASKS:
    register_task("quadratic-bilevel-test")(QuadraticBilevel)


def bilevel_config(algorithm="fednest", **algo):
    return load_config(
        {"task": {"name": "quadratic-bilevel-test"}, "algorithm": {"name": algorithm, **algo},
         "federation": {"clients": 5, "backend": "local"}, "run": {"progress": "none"}}
    )


def ihgp(config, x, y, round_=0):
    server = Server(config, LocalFederation)
    fed = Round(server.federation, round_, lambda k=0: list(range(5)), lambda *ids: generator(0, "server", round_, *ids),
                server.problem, 5)
    return server.algorithm.fedihgp(fed, fresh_cohorts(fed), x, y), fed.record.comm_rounds


def exact_ihgp(task, x, y):
    H = sum(task.H) / len(task.H)
    grad_f = sum(y.double() - c for c in task.c) / len(task.c)
    return torch.linalg.solve(H, grad_f)


def test_fedihgp_approaches_the_inverse_hessian_gradient_product_as_n_grows():
    config = bilevel_config(ihgp="deterministic", neumann_lr=0.25)
    task = TASKS["quadratic-bilevel-test"](config.task, 0, 5)
    x, y = torch.randn(4, generator=torch.Generator().manual_seed(1)), torch.randn(4, generator=torch.Generator().manual_seed(2))
    exact = exact_ihgp(task, x, y)
    errors = []
    for n in (2, 8, 32, 128):
        p, calls = ihgp(config.replace(**{"algorithm.neumann_terms": n}), x, y)
        assert calls == 1 + n
        errors.append(float((p.double() - exact).norm() / exact.norm()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-4, errors


def test_paper_fedihgp_is_unbiased_for_the_truncated_series():
    n = 6
    config = bilevel_config(ihgp="paper", neumann_lr=0.25, neumann_terms=n)
    x, y = torch.zeros(4), torch.ones(4)
    samples = [ihgp(config, x, y, round_=r) for r in range(300)]
    assert {calls for _, calls in samples} == set(range(1, n + 1))  # 1 + N' rounds, N' uniform on {0..N-1}
    mean = torch.stack([p for p, _ in samples]).double().mean(0)
    truncated, _ = ihgp(bilevel_config(ihgp="deterministic", neumann_lr=0.25, neumann_terms=n - 1), x, y)
    torch.testing.assert_close(mean, truncated.double(), rtol=0.1, atol=0.02)


def test_code_fedihgp_restarts_each_clients_counter_at_its_first_call_of_an_epoch():
    # ihgp: code -- each client multiplies its own counter by (I - H_i / l) per call, starting from p_0 at its first
    # call of the epoch, also when it kept a counter from an earlier epoch; the server adds (1/n) <c_i>.
    eta, n = 0.25, 3
    config = bilevel_config(ihgp="code", neumann_lr=eta, neumann_terms=n)
    task = TASKS["quadratic-bilevel-test"](config.task, 0, 5)
    server = Server(config, LocalFederation)
    x, y = torch.zeros(4), torch.ones(4)
    v = sum(y.double() - c for c in task.c) / 5
    factors = [torch.eye(4, dtype=torch.float64) - eta * h for h in task.H]
    for epoch, cohorts in enumerate([[[0, 1], [1, 2], [0, 2]], [[2, 3], [2, 4], [0, 2]]]):
        fed = Round(server.federation, epoch, lambda k, c=cohorts: list(range(5)) if k == 0 else c[k - 1],
                    lambda *ids: generator(0, "server", *ids), server.problem, 5)
        p = server.algorithm.fedihgp(fed, fresh_cohorts(fed), x, y)
        counters, expected = {}, v.clone()
        for i, cohort in enumerate(cohorts, 1):
            for c in cohort:
                counters[c] = factors[c] @ counters.get(c, v)
            expected += sum(counters[c] for c in cohort) / len(cohort) / i
        torch.testing.assert_close(p.double(), eta * expected, rtol=1e-5, atol=1e-6)
        assert fed.record.comm_rounds == 1 + n


@pytest.mark.parametrize(
    "algorithm, extra, per_epoch",
    [
        ("fednest", {"ihgp": "deterministic"}, lambda T, N: 2 * T + N + 3),
        ("fednest", {"ihgp": "code"}, lambda T, N: 2 * T + N + 3),
        ("fednest-sgd", {"ihgp": "deterministic"}, lambda T, N: T + N + 3),
        ("lfednest", {}, lambda T, N: T + 1),
        ("lfednest-svrg", {}, lambda T, N: 2 * T + 2),
    ],
)
def test_rounds_per_epoch(algorithm, extra, per_epoch):
    T, N, epochs = 3, 4, 2
    config = bilevel_config(algorithm, inner_rounds=T, neumann_terms=N, inner_steps=2, **extra)
    server = Server(config, LocalFederation)
    for _ in range(epochs):
        record = server.run_round()
    assert record["comm_rounds"] == epochs * per_epoch(T, N)
    assert record["round"] == epochs


@pytest.mark.slow
def test_fednest_reaches_the_bilevel_solution():
    # On the quadratic the hypergradient is exact up to the Neumann truncation: FedNest's x converges to x*.
    config = bilevel_config(ihgp="deterministic", neumann_lr=0.3, neumann_terms=60, inner_lr=0.3, inner_steps=20,
                            lr=0.1, local_steps=3, inner_rounds=2)
    server = Server(config, LocalFederation)
    task = TASKS["quadratic-bilevel-test"](config.task, 0, 5)
    H, B = sum(task.H) / 5, sum(task.B) / 5
    c = sum(task.c) / 5
    # y*(x) = H^-1 B x; Phi(x) = 1/2||H^-1 B x - c||^2 + 1/2||x||^2  =>  x* = (M^T M + I)^-1 M^T c, M = H^-1 B
    M = torch.linalg.solve(H, B)
    x_star = torch.linalg.solve(M.T @ M + torch.eye(4, dtype=torch.float64), M.T @ c)
    for _ in range(60):
        server.run_round()
    torch.testing.assert_close(server.tensors()["x"].double(), x_star, rtol=0, atol=1e-3)


def minimax(algorithm, rounds, **algo):
    return fedcomp.run(
        {"task": {"name": "minimax-quadratic", "noise_scale": 10.0}, "algorithm": {"name": algorithm, **algo},
         "federation": {"clients": 20, "backend": "local"},
         "run": {"rounds": rounds, "progress": "none", "checkpoint_every": 1000}},
        {"run.out": results_root()},
    ).metrics


def test_figure4_fednest_converges_geometrically_while_fedavg_s_stalls():
    # With every client in every sub-round (with client sampling both reach a sampling-noise floor)
    fednest = minimax("fednest", 30, lr=0.01, inner_lr=0.5, inner_steps=10, local_steps=5)
    fedavg_s = minimax("fedavg-s", 30, lr=0.01, inner_lr=0.5, local_steps=10)
    x = fednest.set_index("round")["x_dist_sq"]
    # geometric: a steady contraction factor well below 1 over the last 20 epochs, down to round-off
    ratios = (x.loc[11:30].to_numpy() / x.loc[10:29].to_numpy())
    assert np.all(ratios < 0.6) and x.loc[30] < 1e-9 * x.loc[0]
    s = fedavg_s.set_index("round")["x_dist_sq"]
    assert s.loc[30] > 1e-5 and abs(s.loc[30] / s.loc[20] - 1) < 0.05  # a floor, not convergence
    assert x.loc[30] < 1e-4 * s.loc[30]


@pytest.mark.parametrize("update", ["simultaneous", "alternating"])
def test_fedavg_s_step_by_hand(update):
    """Simultaneous: both gradients at (x, y); alternating (the authors' notebook): y's ascent step first, then
    x's descent step at the new y."""
    from fedcomp.platform.algorithms.fednest import Point
    from fedcomp.platform.federation import build_algorithm, build_task

    cfg = load_config({"task": {"name": "minimax-quadratic"}, "algorithm": {"name": "fedavg-s", "lr": 0.1,
                       "inner_lr": 0.3, "update": update}, "federation": {"clients": 4, "backend": "local"},
                       "run": {"out": results_root()}})  # fmt: skip
    algorithm, task = build_algorithm(cfg), build_task(cfg)
    problem = task.problem("minimax")
    start = Point(x=torch.linspace(-1, 1, task.params.dim), y=torch.linspace(2, -2, task.params.dim))
    batch, _ = algorithm.draw(problem, 2, 0, generator(0, "step"))
    new, _ = algorithm.update(problem, start, batch, 0)

    def grads(x, y):
        x, y = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        return torch.autograd.grad(problem.loss(x, y, batch), (x, y))

    gx, gy = grads(start.x, start.y)
    y = start.y + 0.3 * gy
    if update == "alternating":
        gx, _ = grads(start.x, y)
    torch.testing.assert_close(new.y, y)
    torch.testing.assert_close(new.x, start.x - 0.1 * gx)
    if update == "alternating":  # x moved by the gradient at the new y: not the simultaneous step
        assert not torch.allclose(new.x, start.x - 0.1 * grads(start.x, start.y)[0])


@pytest.mark.parametrize("cohorts", ["fresh", "shared"])
def test_the_code_cohort_policy_runs_fedihgp_the_hypergradient_and_fedout_on_one_cohort(cohorts):
    """``ihgp: code`` stamps each client's Neumann counter with the epoch of the FedIHGP sub-rounds it took part in:
    after epoch 0, one cohort's worth of clients under the code's shared policy, a fresh cohort per sub-round
    under the paper's."""
    cfg = load_config("fednest-hr-offline", {
        "algorithm.ihgp": "code", "algorithm.cohorts": cohorts, "algorithm.neumann_terms": 4,
        "algorithm.inner_steps": 1, "federation.clients": 8, "federation.clients_per_round": 2,
        "federation.backend": "local", "task.per_client": 20, "task.hidden": 8, "run.out": results_root(),
    })  # fmt: skip
    server = Server(cfg, LocalFederation)
    server.run_round()
    counted = {c for c, state in server.federation.private_states().items() if float(state["counter_epoch"]) == 0}
    if cohorts == "shared":
        assert len(counted) == 2
    else:
        assert len(counted) > 2
