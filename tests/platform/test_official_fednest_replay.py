"""The FedNest authors' code, replayed beside our corresponding variants: the minimax notebook (FedAvg-S alternating,
FedNest, LFedNest; the paper's Fig. 4) and the code's bilevel FedNest epoch with one cohort for FedIHGP, the
hypergradient and FedOut.

Source read: github.com/ucr-optml/FedNest at commit 13b5e2010a7db13dc3f4cc5fd3ba914d94cac013.

* ``minmax_synthetic.ipynb``, per client i: A_i = t_i I, t_i ~ U(0, 0.1), b_i ~ N(0, s^2 I); the gradients it
  steps along are grad_y = -y + b_i / 2 - A_i x / 2 and grad_x = -A_i y / 2 + lambda x, with every step scaled by
  1/d (LFedNest writes 0.1, d = 10). Its "joint" run (FedAvg-S): every cohort client takes T * inner_tau steps,
  y first, then x at the new y; x and y averaged. FedNest: T times, a fresh cohort, every client inner_tau steps
  y_i += lr/d (-y_i - t_avg x / 2), t_avg the cohort's mean t (b dropped), y averaged; then a fresh cohort, t_avg
  over it, every client tau steps x_i -= hlr/d (lambda x_i - t_avg y / 2), x averaged. LFedNest: T times a fresh
  cohort, every client inner_tau steps on its own y-gradient, y averaged; then a fresh cohort, every client tau
  steps on its own x-gradient at the server's y, x averaged.
* ``main_hr.py`` with ``core/ClientManage_hr.py``, ``core/Client_hr.py``, ``core/SVRGClient_hr.py``,
  ``utils/svrg.py``, ``utils/Fed.py``: an epoch is ``inner_ep`` FedInn calls, each on a fresh cohort
  (q = <grad_y g_i(x, y)>, then local steps y_i -= lr (grad_y g_i(y_i) - grad_y g_i(y) + q), y averaged), then
  ``fed_out`` on ONE fresh cohort: p = <grad_y f_i>; ``neumann`` rounds in which every client multiplies its own
  counter (started at p by its first call) by (I - hlr H_i) and returns p + counter, the server averaging every
  reply received so far (the list is never cleared); h_i = grad_x f_i - hlr grad^2_xy g_i p; h = <h_i>; every
  client ``outer_tau`` steps x_i -= hlr (grad_x f_i(x_i) - grad_x f_i(x) + h); x = <x_i>.

Our minimax task writes f_i = -(||y||^2 / 2 - b_i.y + t_i y.x) + lambda ||x||^2 / 2, whose gradients are the
notebook's with A_i = 2 t_i I and b_i doubled; the replays build the notebook's A and b so from our task, and our
step sizes are the notebook's divided by d. Randomness is not aligned (the notebook calls ``np.random.choice``
unseeded; the code's loaders shuffle), so the replays take the cohorts our runs sample
(:func:`fedcomp.platform.server.sample_cohort`) and exact oracles (the quadratic tasks have no sampling; the code's
mean of full-data batch gradients is then the exact gradient). Scaled down for speed: 10 clients (the notebook has
1,000, 50 per round), T = 2, inner_tau = 10, tau = 20 (its 10, 50, 500), 3 epochs (of 200), and step sizes 0.5
(its 0.01: before the 1/d scaling) so that x and y move visibly in so few steps; lambda = 0.1 as the notebook.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedcomp.platform.config import Config, load_config
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.server import Server, sample_cohort
from fedcomp.platform.tasks.minimax_quadratic import MinimaxQuadratic
from tests.platform.test_fednest import QuadraticBilevel

CLIENTS, EPOCHS, T, INNER_TAU, TAU = 10, 3, 2, 10, 20
NB_LR = NB_HLR = 0.5
"""The notebook's lr and hlr, before its 1/d scaling."""
LAMBDA, D = 0.1, 10
TOL = 1e-5
"""Our float32 run against a float64 replay."""

Cohort = Callable[[int, int], list[int]]
"""(epoch, sub-round) -> the clients our run samples there."""


def run_epochs(config: Config) -> tuple[Server, list[tuple[Tensor, Tensor]]]:
    """A local-backend server after EPOCHS rounds, and its (x, y) after each."""
    server = Server(config, LocalFederation)
    states = []
    for _ in range(EPOCHS):
        server.run_round()
        states.append((server.state.x.clone(), server.state.y.clone()))
    return server, states


def minimax_run(algorithm: str, per_round: int, **algo: object) -> tuple[Server, list[tuple[Tensor, Tensor]], Cohort]:
    """Our local-backend run on the minimax task at the replay's settings: the server, (x, y) after every epoch,
    and the cohorts it sampled."""
    config = load_config("fednest-minimax", {
        "task.lam": LAMBDA, "task.dim": D, "algorithm.name": algorithm, "federation.clients": CLIENTS,
        "federation.clients_per_round": per_round, "federation.backend": "local", "run.rounds": EPOCHS,
        "run.progress": "none", **{f"algorithm.{k}": v for k, v in algo.items()},
    })  # fmt: skip
    server, states = run_epochs(config)
    return server, states, lambda epoch, sub: sample_cohort(config.run.seed, epoch, CLIENTS, per_round, sub)


def notebook_data(server: Server) -> tuple[Tensor, Tensor]:
    """The notebook's t_i (A_i = t_i I) and b_i for our task: both doubled (its gradients halve them)."""
    task = build_task(server.config)
    assert isinstance(task, MinimaxQuadratic)
    return 2 * task.t.double(), 2 * task.b.double()


def start() -> tuple[Tensor, Tensor]:
    """The notebook's start: x = y = 10 * 1."""
    return torch.full((D,), 10.0, dtype=torch.float64), torch.full((D,), 10.0, dtype=torch.float64)


def notebook_fedavg_s(t: Tensor, b: Tensor, cohort: Cohort) -> list[tuple[Tensor, Tensor]]:
    """The notebook's "joint" run (FedAvg-S): T * inner_tau alternating local steps, y then x at the new y."""
    x, y = start()
    states = []
    for epoch in range(EPOCHS):
        xs, ys = [], []
        for i in cohort(epoch, 0):
            xi, yi = x.clone(), y.clone()
            for _ in range(T * INNER_TAU):
                yi = yi + NB_LR / D * (-yi + 0.5 * b[i] - 0.5 * t[i] * xi)
                xi = xi - NB_HLR / D * (-0.5 * t[i] * yi + LAMBDA * xi)
            xs.append(xi), ys.append(yi)
        x, y = torch.stack(xs).mean(0), torch.stack(ys).mean(0)
        states.append((x, y))
    return states


def notebook_fednest(t: Tensor, b: Tensor, cohort: Cohort) -> list[tuple[Tensor, Tensor]]:
    """The notebook's FedNest: T y-rounds and one x-round, each on its own cohort, with the cohort's mean t and
    no b in the y-steps."""
    x, y = start()
    states = []
    for epoch in range(EPOCHS):
        for k in range(T):
            clients = cohort(epoch, k)
            t_avg, ys = t[clients].mean(), []
            for _ in clients:
                yi = y.clone()
                for _ in range(INNER_TAU):
                    yi = yi + NB_LR / D * (-yi - 0.5 * t_avg * x)
                ys.append(yi)
            y = torch.stack(ys).mean(0)
        clients = cohort(epoch, T)
        t_avg, xs = t[clients].mean(), []
        for _ in clients:
            xi = x.clone()
            for _ in range(TAU):
                xi = xi - NB_HLR / D * (LAMBDA * xi - 0.5 * y * t_avg)
            xs.append(xi)
        x = torch.stack(xs).mean(0)
        states.append((x, y))
    return states


def notebook_lfednest(t: Tensor, b: Tensor, cohort: Cohort) -> list[tuple[Tensor, Tensor]]:
    """The notebook's LFedNest: T y-rounds of local steps on each client's own function, then tau local x-steps."""
    x, y = start()
    states = []
    for epoch in range(EPOCHS):
        for k in range(T):
            ys = []
            for i in cohort(epoch, k):
                yi = y.clone()
                for _ in range(INNER_TAU):
                    yi = yi + NB_LR * 0.1 * (-yi + 0.5 * b[i] - 0.5 * t[i] * x)
                ys.append(yi)
            y = torch.stack(ys).mean(0)
        xs = []
        for i in cohort(epoch, T):
            xi = x.clone()
            for _ in range(TAU):
                xi = xi - NB_HLR * 0.1 * (-0.5 * t[i] * y + LAMBDA * xi)
            xs.append(xi)
        x = torch.stack(xs).mean(0)
        states.append((x, y))
    return states


def assert_same_iterates(ours: list[tuple[Tensor, Tensor]], replay: list[tuple[Tensor, Tensor]]) -> None:
    for epoch, ((x, y), (rx, ry)) in enumerate(zip(ours, replay, strict=True)):
        torch.testing.assert_close(x.double(), rx, rtol=TOL, atol=TOL, msg=lambda m, e=epoch: f"x, epoch {e}: {m}")
        torch.testing.assert_close(y.double(), ry, rtol=TOL, atol=TOL, msg=lambda m, e=epoch: f"y, epoch {e}: {m}")


def gap(ours: list[tuple[Tensor, Tensor]], replay: list[tuple[Tensor, Tensor]]) -> float:
    """The largest difference of x or y at the last epoch."""
    (x, y), (rx, ry) = ours[-1], replay[-1]
    return max(float((x.double() - rx).abs().max()), float((y.double() - ry).abs().max()))


MINIMAX_STEPS = {"lr": NB_HLR / D, "inner_lr": NB_LR / D}


def test_fedavg_s_alternating_replays_the_notebooks_joint_run():
    """``update: alternating`` takes the notebook's FedAvg-S iterates with partial participation (4 of 10 clients a
    round); the paper's simultaneous step leaves them."""
    steps = {**MINIMAX_STEPS, "local_steps": T * INNER_TAU}
    server, ours, cohort = minimax_run("fedavg-s", 4, update="alternating", **steps)
    replay = notebook_fedavg_s(*notebook_data(server), cohort)
    assert_same_iterates(ours, replay)
    assert gap(minimax_run("fedavg-s", 4, update="simultaneous", **steps)[1], replay) > 100 * TOL


def test_lfednest_replays_the_notebook():
    """LFedNest takes the notebook's iterates with partial participation (a fresh cohort of 4 per sub-round)."""
    server, ours, cohort = minimax_run("lfednest", 4, inner_rounds=T, inner_steps=INNER_TAU, local_steps=TAU,
                                       **MINIMAX_STEPS)
    assert_same_iterates(ours, notebook_lfednest(*notebook_data(server), cohort))


def test_fednest_replays_the_notebook_with_full_participation_only():
    """FedNest takes the notebook's iterates when every client answers. With a cohort of 4 it does not: the
    notebook's y-steps drop the cohort's mean b, which is 0 only over all clients (our task centres b over the
    clients, as the paper does), while our FedInn's SVRG anchor keeps it."""
    algo = {"inner_rounds": T, "inner_steps": INNER_TAU, "local_steps": TAU, **MINIMAX_STEPS}
    server, ours, cohort = minimax_run("fednest", CLIENTS, **algo)
    assert_same_iterates(ours, notebook_fednest(*notebook_data(server), cohort))
    server, ours, cohort = minimax_run("fednest", 4, **algo)
    assert gap(ours, notebook_fednest(*notebook_data(server), cohort)) > 100 * TOL


# -- the code's bilevel FedNest epoch (main_hr.py / ClientManage_hr.py), one cohort after FedInn -------------------
BILEVEL_CLIENTS, BILEVEL_COHORT, NEUMANN, INNER_STEPS, OUTER_TAU = 5, 2, 3, 3, 3
LR = HLR = 0.1
"""The code's lr (FedInn) and hlr (Neumann step, indirect-term scale and outer step, all one flag)."""


def bilevel_run(cohorts: str) -> tuple[Server, list[tuple[Tensor, Tensor]], Cohort]:
    """Our FedNest (``ihgp: code``, one step size for the Neumann series and x, as the code) on the exact quadratic
    bilevel test task: the server, (x, y) after every epoch and the cohorts it sampled."""
    config = load_config({
        "task": {"name": "quadratic-bilevel-test"},
        "algorithm": {"name": "fednest", "ihgp": "code", "cohorts": cohorts, "lr": HLR, "neumann_lr": HLR,
                      "inner_lr": LR, "inner_rounds": T, "inner_steps": INNER_STEPS, "local_steps": OUTER_TAU,
                      "neumann_terms": NEUMANN},
        "federation": {"clients": BILEVEL_CLIENTS, "clients_per_round": BILEVEL_COHORT, "backend": "local"},
        "run": {"rounds": EPOCHS, "progress": "none"},
    })  # fmt: skip
    server, states = run_epochs(config)
    seed = config.run.seed
    return server, states, lambda epoch, sub: sample_cohort(seed, epoch, BILEVEL_CLIENTS, BILEVEL_COHORT, sub)


def code_fednest(task: QuadraticBilevel, cohort: Cohort) -> list[tuple[Tensor, Tensor]]:
    """The code's epochs on g_i = y^T H_i y / 2 - y^T B_i x, f_i = ||y - c_i||^2 / 2 + ||x||^2 / 2 (exact oracles:
    grad_y g_i = H_i y - B_i x, grad^2_xy g_i p = -B_i^T p, grad_y f_i = y - c_i, grad_x f_i = x)."""
    H, B, c = task.H, task.B, task.c
    d = len(c[0])
    x, y = torch.ones(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64)
    mean = lambda vectors: torch.stack(list(vectors)).mean(0)  # noqa: E731 (FedAvgP)
    states = []
    for epoch in range(EPOCHS):
        for k in range(T):  # fed_in, a fresh cohort each
            clients = cohort(epoch, k)
            q = mean(H[i] @ y - B[i] @ x for i in clients)
            ys = []
            for i in clients:
                yi = y.clone()
                for _ in range(INNER_STEPS):
                    yi = yi - LR * ((H[i] @ yi - B[i] @ x) - (H[i] @ y - B[i] @ x) + q)
                ys.append(yi)
            y = mean(ys)
        clients = cohort(epoch, T)  # fed_out: one cohort for FedIHGP, the hypergradient and the outer steps
        p = mean(y - c[i] for i in clients)
        counters = {i: p.clone() for i in clients}
        replies: list[Tensor] = []  # never cleared: each round averages every reply so far
        for _ in range(NEUMANN):
            for i in clients:
                counters[i] = counters[i] - HLR * H[i] @ counters[i]
                replies.append(p + counters[i])
            p = mean(replies)
        h = mean(x - HLR * (-B[i].T @ p) for i in clients)
        xs = []
        for _ in clients:
            xi = x.clone()
            for _ in range(OUTER_TAU):
                xi = xi - HLR * (xi - x + h)
            xs.append(xi)
        x = x - mean(x - xi for xi in xs)  # the server steps by the mean displacement with lr 1
        states.append((x, y))
    return states


def test_fednest_with_the_code_cohort_policy_replays_the_codes_bilevel_epoch():
    """``ihgp: code`` with ``cohorts: shared`` takes the code's iterates (2 of 5 clients a sub-round); with a fresh
    cohort per sub-round (the paper's policy) the Neumann rounds see other clients and the iterates leave it."""
    server, ours, cohort = bilevel_run("shared")
    task = build_task(server.config)
    assert isinstance(task, QuadraticBilevel)
    replay = code_fednest(task, cohort)
    assert_same_iterates(ours, replay)
    assert gap(bilevel_run("fresh")[1], replay) > 100 * TOL
