"""The FedDRO paper's parallel baselines: GCIVR's recursion and FastDRO's weighted step by hand, what each
step exchanges, and convergence on the deterministic heterogeneous problem (where GCIVR and MBSGD are exact)."""

from __future__ import annotations

import pytest
import torch
from pydantic import Field
from torch import Tensor

import fedcomp
import fedcomp.platform.algorithms.dro_baselines as dro_baselines  # registers the algorithms
from fedcomp.losses.dro import robust_weights
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.kinds import COMPOSITIONAL_GLOBAL
from fedcomp.platform.params import Params
from fedcomp.platform.registry import TASKS, register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server
from fedcomp.platform.tasks.base import Task
from tests.conftest import results_root
from tests.platform.helpers import check_resume

SEED, K, B = 0, 3, 4


class TinyRegressionParams(Params):
    dim: int = Field(3, ge=1)
    examples: int = Field(6, ge=1)


class TinyRegression(Task):
    """Per-example squared errors l_i = (a_i.x - b_i)^2 / 2 on K small clients; a nonlinear two-entry inner map
    g_k = [mean l, mean tanh(a.x)], f(z) = sqrt(1 + |z|^2) and a batch-dependent plain part, so every piece of
    GCIVR's recursion is exercised."""

    Params = TinyRegressionParams
    kinds = frozenset({COMPOSITIONAL_GLOBAL})
    metrics = ("objective",)
    mode = "min"
    inner_dim = 2

    def __init__(self, params: TinyRegressionParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(0, "tiny-dro-regression")
        self.a = torch.randn(clients, params.examples, params.dim, generator=gen)
        self.b = torch.randn(clients, params.examples, generator=gen)

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": 0.5 * torch.randn(self.params.dim, generator=gen)}

    def sample(self, client: int, size: int | None, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        n = self.params.examples
        idx = torch.arange(n) if size is None else torch.randint(n, (size,), generator=gen)
        return self.a[client][idx], self.b[client][idx]

    def example_losses(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        a, b = batch
        return 0.5 * (a @ x - b) ** 2

    def inner(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        return torch.stack([self.example_losses(x, batch).mean(), torch.tanh(batch[0] @ x).mean()])

    def outer(self, z: Tensor) -> Tensor:
        return torch.sqrt(1 + z @ z)

    def plain(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        a, b = batch
        return 0.05 * x @ x + 0.1 * (b * (a @ x)).mean()

    def evaluator(self):
        full = [self.sample(k, None, torch.Generator()) for k in range(self.clients)]

        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            x = state["x"]
            g = sum(self.inner(x, batch) for batch in full) / self.clients
            h = sum(self.plain(x, batch) for batch in full) / self.clients
            return {"objective": float(h + self.outer(g))}

        return evaluate


if "tiny-dro-regression" not in TASKS:  # a second import of this module must not register a second class
    register_task("tiny-dro-regression")(TinyRegression)


def config(algorithm, task="tiny-dro-regression", clients=K, federation=None, **algo):
    task_section = {"name": task} if task == "tiny-dro-regression" else {"name": task, "heterogeneity": 1.0}
    return load_config(
        {"task": task_section, "algorithm": {"name": algorithm, **algo},
         "federation": {"clients": clients, "backend": "local", **(federation or {})},
         "run": {"seed": SEED, "progress": "none", "out": results_root()}}
    )


def step_batch(task, k, step, *ids):
    return task.sample(k, B, generator(SEED, "client-step", k, step, *ids))


def grad_f(z):
    return z / torch.sqrt(1 + z @ z)


def jacobian(task, x, batch):
    return torch.autograd.functional.jacobian(lambda v: task.inner(v, batch), x)


def plain_grad(task, x, batch):
    return torch.autograd.functional.jacobian(lambda v: task.plain(v, batch), x)


# ------------------------------------------------------------------------------------------------ GCIVR


@pytest.mark.parametrize(
    "init, optimizer, refresh_every",
    [("estimate", "sgd", None), ("estimate", "adagrad", None), ("code", "sgd", None), ("estimate", "sgd", 2),
     ("code", "adagrad", 2)],
)
def test_gcivr_recursion_matches_a_hand_computation(init, optimizer, refresh_every):
    lr, rounds = 0.2, 4
    cfg = config("gcivr", lr=lr, outer_batch=B, init=init, optimizer=optimizer, refresh_every=refresh_every)
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    x = server.tensors()["x"].clone()
    param = torch.nn.Parameter(x.clone())
    adagrad = torch.optim.Adagrad([param], lr=lr)  # the reference for optimizer: adagrad
    G = J = x_prev = None
    for t in range(rounds):
        server.run_round()
        if (t == 0 and init == "estimate") or (refresh_every and t > 0 and t % refresh_every == 0):
            batches = [task.sample(k, None, torch.Generator()) for k in range(K)]  # fresh full estimates
            G = sum(task.inner(x, b) for b in batches) / K
            J = sum(jacobian(task, x, b) for b in batches) / K
        else:
            batches = [step_batch(task, k, t) for k in range(K)]
            if t == 0:  # the code's start: G ~ U(0, 1), J = 0, x_prev = x_0
                G, J = torch.rand(2, generator=generator(SEED, "server", 0, "gcivr-init")), torch.zeros(2, 3)
            else:  # SARAH: the same batch at x_t and x_{t-1}
                G = G + sum(task.inner(x, b) - task.inner(x_prev, b) for b in batches) / K
                J = J + sum(jacobian(task, x, b) - jacobian(task, x_prev, b) for b in batches) / K
        direction = sum(plain_grad(task, x, b) for b in batches) / K + J.T @ grad_f(G)
        x_prev = x
        if optimizer == "sgd":
            x = x - lr * direction
        else:
            param.grad = direction.clone()
            adagrad.step()
            x = param.detach().clone()
        torch.testing.assert_close(server.tensors()["G"], G, rtol=0, atol=1e-5)
        torch.testing.assert_close(server.tensors()["J"], J.reshape(-1), rtol=0, atol=1e-5)
        torch.testing.assert_close(server.tensors()["x"], x, rtol=0, atol=1e-5)


def test_gcivr_resumes_from_a_checkpoint_with_identical_numbers():
    # the checkpoint carries each client's last model, needed for the next difference
    check_resume(config("gcivr", lr=0.2, outer_batch=B), rounds=5, stop=3, keys=("x", "G", "J"))


def test_gcivr_needs_every_client_every_step():
    server = Server(config("gcivr", outer_batch=B, federation={"clients_per_round": 2}), LocalFederation)
    with pytest.raises(ConfigError, match="every client every step"):
        for _ in range(20):
            server.run_round()


# ------------------------------------------------------------------------------------------------ FastDRO


@pytest.mark.parametrize(
    "geometry, size, reg",
    [("cvar", 0.5, 0.0), ("cvar", 0.25, 0.1), ("chi2", 1.0, 0.0), ("chi2", None, 0.5), ("chi2", 0.5, 0.2)],
)
def test_fastdro_weights_and_step_match_a_hand_computation(monkeypatch, geometry, size, reg):
    calls = []

    def spy(losses, **kwargs):
        weights = robust_weights(losses, **kwargs)
        calls.append((losses.clone(), kwargs, weights))
        return weights

    monkeypatch.setattr(dro_baselines, "robust_weights", spy)
    lr, rounds = 0.1, 2
    cfg = config("parallel-fastdro", lr=lr, outer_batch=B, geometry=geometry, size=size, reg=reg)
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    x = server.tensors()["x"].clone()
    for t in range(rounds):
        server.run_round()
        batches = [step_batch(task, k, t) for k in range(K)]
        pooled = torch.cat([task.example_losses(x, b) for b in batches])  # K x b losses, client order
        losses, kwargs, used = calls[t]
        assert kwargs == {"geometry": geometry, "size": float("inf") if size is None else size, "reg": reg}
        torch.testing.assert_close(losses, pooled, rtol=1e-6, atol=1e-6)
        weights = robust_weights(pooled, **kwargs)
        torch.testing.assert_close(used, weights, rtol=1e-5, atol=1e-6)
        assert not used.requires_grad and float(used.sum()) == pytest.approx(1.0, abs=1e-6)
        xv = x.clone().requires_grad_(True)
        robust = weights @ torch.cat([task.example_losses(xv, b) for b in batches])
        (grad,) = torch.autograd.grad(robust, xv)
        x = x - lr * grad
        torch.testing.assert_close(server.tensors()["x"], x, rtol=0, atol=1e-6)


def test_fastdro_with_uniform_weights_is_parallel_sgd_on_the_mean_loss():
    # cvar with alpha = 1 puts 1/(K b) on every example
    lr = 0.1
    cfg = config("parallel-fastdro", lr=lr, outer_batch=B, geometry="cvar", size=1.0)
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    x = server.tensors()["x"].clone().requires_grad_(True)
    server.run_round()
    mean = torch.cat([task.example_losses(x, step_batch(task, k, 0)) for k in range(K)]).mean()
    (grad,) = torch.autograd.grad(mean, x)
    torch.testing.assert_close(server.tensors()["x"], (x - lr * grad).detach(), rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ MBSGD


def test_mbsgd_step_uses_independent_batches_for_the_inner_value_and_the_gradient():
    lr = 0.1
    cfg = config("parallel-mbsgd", lr=lr, outer_batch=B)
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    x = server.tensors()["x"].clone()
    for t in range(2):
        server.run_round()
        y = sum(task.inner(x, step_batch(task, k, t, "inner")) for k in range(K)) / K
        grads = []
        for k in range(K):
            b = step_batch(task, k, t)
            grads.append(plain_grad(task, x, b) + jacobian(task, x, b).T @ grad_f(y))
        x = x - lr * sum(grads) / K
        torch.testing.assert_close(server.tensors()["x"], x, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ all three


@pytest.mark.parametrize(
    "algorithm, task, d, up, down, emb",
    [
        # GCIVR: the d_g value difference, the d_g x d Jacobian difference and grad h in one model round
        ("gcivr", "heterogeneous-composition", 10, 2 + 2 * 10 + 10, 10, 0),
        ("parallel-mbsgd", "heterogeneous-composition", 10, 10, 10, 2),  # y: d_g = 2 floats each way
        ("parallel-fastdro", "tiny-dro-regression", 3, 3, 3, B),  # b losses up, b weights down
    ],
)
def test_one_model_round_per_step_and_the_low_dimensional_exchanges(algorithm, task, d, up, down, emb):
    T = 5
    extra = {"outer_batch": B} if algorithm == "parallel-fastdro" else {}
    server = Server(config(algorithm, task=task, **extra), LocalFederation)
    for _ in range(T):
        record = server.run_round()
    assert record["local_steps"] == T and record["comm_rounds"] == T
    assert record["floats_up"] == T * up and record["floats_down"] == T * down
    assert record["embedding_exchanges"] == (T if emb else 0)
    assert record["embedding_floats_up"] == T * emb and record["embedding_floats_down"] == T * emb
    assert record["samples"] > 0


def final_grad_norms(algorithm, rounds=400, **extra):
    # the FedDRO negative-result problem: 8 clients whose own problems have no common solution
    cfg = config(algorithm, task="heterogeneous-composition", clients=8, lr=0.5, **extra)
    metrics = fedcomp.run(cfg, {"run.rounds": rounds, "run.eval_every": 100}).metrics
    return metrics.set_index("round")["grad_norm_sq"]


@pytest.mark.parametrize("algorithm", ["gcivr", "parallel-mbsgd"])
def test_exact_parallel_methods_reach_a_stationary_point_of_the_global_objective(algorithm):
    g = final_grad_norms(algorithm)
    assert g.loc[400] < 1e-10 * g.loc[0], g.tolist()


@pytest.mark.slow
def test_gcivr_code_init_never_moves_on_a_linear_inner_map_without_refresh():
    # J starts at 0 and the Jacobian differences of a linear map vanish: the code's bias, in its purest form
    g = final_grad_norms("gcivr", rounds=100, init="code")
    assert g.loc[100] == pytest.approx(g.loc[0])
    assert final_grad_norms("gcivr", rounds=400, init="code", refresh_every=50).loc[400] < 1e-10 * g.loc[0]


# ------------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "algorithm, bad, match",
    [
        ("gcivr", {"local_steps": 2}, "local_steps"),
        ("parallel-mbsgd", {"local_steps": 4}, "local_steps"),
        ("gcivr", {"optimizer": "adam"}, "optimizer"),
        ("gcivr", {"refresh_every": 0}, "refresh_every"),
        ("parallel-fastdro", {"geometry": "cvar", "size": 2.0}, "size"),
        ("parallel-fastdro", {"geometry": "cvar", "size": None}, "size"),
        ("parallel-fastdro", {"geometry": "chi2", "size": None, "reg": 0.0}, "size"),
        ("parallel-fastdro", {"outer_batch": None}, "outer_batch"),
        ("parallel-fastdro", {"reg": -1.0}, "reg"),
    ],
)
def test_bad_hyperparameters_are_rejected_naming_the_field(algorithm, bad, match):
    with pytest.raises(ConfigError, match=match):
        config(algorithm, **bad)


def test_fastdro_needs_per_example_losses():
    server = Server(config("parallel-fastdro", task="heterogeneous-composition"), LocalFederation)
    with pytest.raises(ConfigError, match="example_losses"):
        server.run_round()
    assert isinstance(build_task(config("parallel-fastdro")), dro_baselines.ExampleLossProblem)


# ------------------------------------------------------------------------------------------------ matched objective


def test_fastdro_on_the_batch_kl_objective_computes_what_feddro_with_beta_one_computes(tmp_path):
    # FedDRO with beta = 1 (and modified FedAvg) with I = 1: y_bar = <g_k(x; b_k)>, the pooled batch's mean of
    # exp(l / lambda), and the step <grad g_k^T lambda / y_bar> = sum_i softmax(l / lambda)_i grad l_i over the
    # pooled batch -- FastDRO's step with the KL set and reg = lambda, on the same batches (both keyed by the step).
    lam, rounds = 5.0, 6
    common = {"task.lam": lam, "algorithm.lr": 0.1, "run.rounds": rounds, "run.eval_every": 2,
              "federation.backend": "local", "run.out": str(tmp_path), "run.progress": "none"}
    runs = {
        "fastdro": fedcomp.run("feddro-offline", {**common, "algorithm.name": "parallel-fastdro", "algorithm.geometry": "kl",
                                                  "algorithm.size": None, "algorithm.reg": lam}).metrics,
        "feddro": fedcomp.run("feddro-offline", {**common, "algorithm.beta": 1.0}).metrics,
        "shared-y": fedcomp.run("feddro-offline", {**common, "algorithm.name": "fedavg-co-shared-y"}).metrics,
    }
    for name in ("feddro", "shared-y"):
        for key in ("robust_loss", "train_accuracy", "test_accuracy"):
            torch.testing.assert_close(torch.tensor(runs[name][key].values), torch.tensor(runs["fastdro"][key].values),
                                       rtol=0, atol=2e-5, msg=f"{name} {key}")
    assert runs["feddro"]["robust_loss"].iloc[-1] < runs["feddro"]["robust_loss"].iloc[0] - 0.5  # it moved


def test_fastdro_kl_geometry_needs_null_size_and_a_positive_reg(tmp_path):
    base = {"task": {"name": "dro-classification"}, "federation": {"clients": 2, "backend": "local"}}
    with pytest.raises(ConfigError, match="size"):
        load_config({**base, "algorithm": {"name": "parallel-fastdro", "geometry": "kl", "reg": 5.0}})
    with pytest.raises(ConfigError, match="reg"):
        load_config({**base, "algorithm": {"name": "parallel-fastdro", "geometry": "kl", "size": None}})
    load_config({**base, "algorithm": {"name": "parallel-fastdro", "geometry": "kl", "size": None, "reg": 5.0}})
