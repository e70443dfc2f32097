"""The parallel primal-dual SGD baseline (``parallel-pdsgd``): one step by hand for both games, a partial cohort,
that it lowers the robust objective and that its dual weights track the best response, what each step
exchanges, checkpoints carrying the dual weights, and one-line errors for bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import Field
from torch import Tensor

from fedcomp.losses.dro import DualPenalty, project_simplex, robust_loss
from fedcomp.platform.algorithms.dro_baselines import IndexedExampleProblem
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.kinds import COMPOSITIONAL_GLOBAL
from fedcomp.platform.params import Params
from fedcomp.platform.registry import TASKS, register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server, sample_cohort
from fedcomp.platform.tasks.base import Task
from tests.conftest import results_root
from tests.platform.helpers import check_resume

SEED, K, B = 0, 3, 4
SIZES = (5, 6, 7)  # unequal client sizes exercise the n_k / b weights


class TinyGameParams(Params):
    divergence: str = "kl"
    lam: float = Field(0.5, gt=0)
    scale: float = Field(1.0, gt=0)
    dim: int = Field(3, ge=1)


class TinyGame(Task):
    """Per-example squared errors l_i = (a_i.x - b_i)^2 / 2 over clients of 5, 6 and 7 examples; the metric is the
    exact value of the DRO game over all 18 examples (KL: lam log mean exp(l/lam); chi^2: the simplex-constrained
    maximum, which :func:`robust_loss` computes exactly), times ``scale``."""

    Params = TinyGameParams
    kinds = frozenset({COMPOSITIONAL_GLOBAL})
    metrics = ("robust",)
    mode = "min"
    inner_dim = 1

    def __init__(self, params: TinyGameParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(0, "tiny-pdsgd")
        self.a = [torch.randn(n, params.dim, generator=gen) for n in SIZES[:clients]]
        self.b = [2 * torch.randn(n, generator=gen) for n in SIZES[:clients]]

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": 0.5 * torch.randn(self.params.dim, generator=gen)}

    def examples(self, client: int) -> int:
        return SIZES[client]

    def sample_positions(self, client: int, size: int | None, gen: torch.Generator) -> Tensor:
        n = SIZES[client]
        return torch.arange(n) if size is None else torch.randint(n, (size,), generator=gen)

    def batch_at(self, client: int, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.a[client][positions], self.b[client][positions]

    def sample(self, client: int, size: int | None, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.batch_at(client, self.sample_positions(client, size, gen))

    def example_losses(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        a, b = batch
        return 0.5 * (a @ x - b) ** 2

    # the compositional oracles (unused by PDSGD): KL-DRO per client
    def inner(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        return torch.exp(self.example_losses(x, batch) / self.params.lam).mean().reshape(1)

    def outer(self, z: Tensor) -> Tensor:
        return self.params.lam * torch.log(z).sum()

    def plain(self, x: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        return x.new_zeros(())

    @property
    def dual_penalty(self) -> DualPenalty:
        return DualPenalty(self.params.divergence, self.params.lam, self.params.scale)  # type: ignore[arg-type]

    def all_losses(self, x: Tensor) -> Tensor:
        return torch.cat([self.example_losses(x, (a, b)) for a, b in zip(self.a, self.b)])

    def evaluator(self):
        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            return {"robust": robust_value(self, state["x"])}

        return evaluate


def robust_value(task: TinyGame, x: Tensor) -> float:
    losses, lam = task.all_losses(x), task.params.lam
    if task.params.divergence == "kl":
        value = lam * (torch.logsumexp(losses / lam, 0) - math.log(losses.numel()))
    else:
        value = robust_loss(losses, geometry="chi2", size=float("inf"), reg=lam)
    return task.params.scale * float(value)


if "tiny-pdsgd" not in TASKS:  # a second import of this module must not register a second class
    register_task("tiny-pdsgd")(TinyGame)


def config(task=None, clients=K, federation=None, **algo):
    return load_config(
        {"task": {"name": "tiny-pdsgd", **(task or {})}, "algorithm": {"name": "parallel-pdsgd", **algo},
         "federation": {"clients": clients, "backend": "local", **(federation or {})},
         "run": {"seed": SEED, "progress": "none", "out": results_root()}}
    )


# ------------------------------------------------------------------------------------------------ by hand


@pytest.mark.parametrize(
    "divergence, scale, per_round",
    [("kl", 1.0, None), ("kl", 2.0, None), ("chi2", 1.0, None), ("kl", 1.0, 2), ("chi2", 1.0, 2)],
)
def test_two_steps_match_a_hand_computation(divergence, scale, per_round):
    lr, tau, lam, rounds = 0.1, 0.3, 0.5, 2
    cfg = config({"divergence": divergence, "scale": scale, "lam": lam}, federation={"clients_per_round": per_round},
                 lr=lr, outer_batch=B, dual_step=tau)
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    assert isinstance(task, IndexedExampleProblem)
    m = sum(SIZES)
    offsets = [0, SIZES[0], SIZES[0] + SIZES[1]]
    x, p = server.tensors()["x"].clone(), torch.full((m,), 1.0 / m)
    for t in range(rounds):
        record = server.run_round()
        cohort = sample_cohort(SEED, t, K, per_round or K)
        xv = x.clone().requires_grad_(True)
        primal, ghat = 0.0, torch.zeros(m)
        for k in cohort:
            positions = torch.randint(SIZES[k], (B,), generator=generator(SEED, "client-step", k, t))
            c = (K / len(cohort)) * SIZES[k] / B  # unbiased pooled sums over all m examples
            losses = task.example_losses(xv, task.batch_at(k, positions))
            for j in range(B):
                i = offsets[k] + int(positions[j])
                primal = primal + c * p[i] * losses[j]
                ghat[i] += c * float(losses[j].detach())
        (grad,) = torch.autograd.grad(primal, xv)
        if divergence == "kl":
            penalty = float((p * torch.log(m * p)).sum())
            log_p = (1 - tau) * torch.log(p) + tau / lam * ghat
            new_p = torch.softmax(log_p, 0)
        else:
            penalty = float(m / 2 * ((p - 1 / m) ** 2).sum())
            new_p = project_simplex((1 - tau) * p + tau / m * (1 + ghat / lam))
        assert record["train_loss"] == pytest.approx(scale * (float(primal.detach()) - lam * penalty), rel=1e-5, abs=1e-6)
        x, p = x - lr * scale * grad, new_p
        torch.testing.assert_close(server.tensors()["x"], x, rtol=0, atol=1e-6)
        stored = server.tensors()["log_p"].exp() if divergence == "kl" else server.tensors()["p"]
        torch.testing.assert_close(stored, p, rtol=0, atol=1e-6)
        assert float(stored.sum()) == pytest.approx(1.0, abs=1e-5) and bool((stored >= 0).all())


def test_project_simplex_is_the_euclidean_projection():
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        v = 2 * torch.randn(9, generator=gen, dtype=torch.float64)
        q = project_simplex(v)
        assert float(q.sum()) == pytest.approx(1.0, abs=1e-12) and bool((q >= 0).all())
        # optimality: q = relu(v - tau) with one threshold tau for all entries in the support
        tau = (v - q)[q > 0]
        torch.testing.assert_close(tau, tau.mean().expand_as(tau), rtol=0, atol=1e-12)
        assert bool((v[q == 0] <= tau.mean() + 1e-12).all())


# ------------------------------------------------------------------------------------------------ behaviour


def minimum(task: TinyGame, x0: Tensor) -> float:
    """min_x of the exact robust objective (L-BFGS; the game is smooth and small)."""
    x = x0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([x], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        losses, lam = task.all_losses(x), task.params.lam
        if task.params.divergence == "kl":
            value = lam * (torch.logsumexp(losses / lam, 0) - math.log(losses.numel()))
        else:
            value = robust_loss(losses, geometry="chi2", size=float("inf"), reg=lam)
        value.backward()
        return value

    opt.step(closure)
    return float(closure().detach())


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_it_closes_most_of_the_gap_to_the_minimum_of_the_robust_objective(divergence):
    cfg = config({"divergence": divergence, "lam": 1.0}, lr=0.01, outer_batch=B, dual_step=0.05, lr_milestones=[200])
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    best, start = minimum(task, server.tensors()["x"]), robust_value(task, server.tensors()["x"])
    for _ in range(400):
        server.run_round()
    end = robust_value(task, server.tensors()["x"])
    assert end - best < 0.3 * (start - best), (best, start, end)


def test_with_the_model_frozen_the_dual_weights_approach_the_best_response():
    # lr tiny: x stays put, and log p_t is an average of the unbiased estimates ghat / lam -> p* = softmax(l / lam)
    lam = 2.0
    cfg = config({"divergence": "kl", "lam": lam}, lr=1e-9, outer_batch=8, dual_step=0.01)
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    for _ in range(600):
        server.run_round()
    best = torch.softmax(task.all_losses(server.tensors()["x"]) / lam, 0)
    uniform = torch.full_like(best, 1 / best.numel())
    tv = 0.5 * float((server.tensors()["log_p"].exp() - best).abs().sum())
    assert tv < 0.25 * 0.5 * float((uniform - best).abs().sum()), tv


def test_one_model_round_and_one_low_dimensional_exchange_per_step():
    T, d = 5, 3
    server = Server(config(outer_batch=B), LocalFederation)
    for _ in range(T):
        record = server.run_round()
    assert record["local_steps"] == T and record["comm_rounds"] == T
    assert record["floats_up"] == T * d and record["floats_down"] == T * d
    assert record["embedding_exchanges"] == T
    assert record["embedding_floats_up"] == T * 2 * B and record["embedding_floats_down"] == T * B
    assert server.tensors()["log_p"].numel() == sum(SIZES)  # one dual weight per training example, on the server


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_resumes_from_a_checkpoint_with_identical_numbers(divergence):
    # the dual weights are part of the server state, so the checkpoint carries them
    check_resume(config({"divergence": divergence}, lr=0.05, outer_batch=B), rounds=5, stop=3)


def test_explicit_game_overrides_the_task():
    server = Server(config({"divergence": "kl"}, divergence="chi2", lam=1.0, outer_batch=B), LocalFederation)
    server.run_round()
    assert set(server.tensors()) == {"x", "p"}


def test_runs_on_the_dro_classification_task():
    cfg = load_config(
        {"task": {"name": "dro-classification", "dataset": "breast-cancer", "objective": "chi2", "lam": 2.0},
         "algorithm": {"name": "parallel-pdsgd", "lr": 0.05, "outer_batch": 8},
         "federation": {"clients": 4, "backend": "local"},
         "run": {"seed": SEED, "progress": "none", "out": results_root()}}
    )
    task, server = build_task(cfg), Server(cfg, LocalFederation)
    assert server.problem.dual_penalty == DualPenalty("chi2", 2.0)
    before = server.evaluate()["robust_loss"]
    for _ in range(30):
        server.run_round()
    assert server.evaluate()["robust_loss"] < before
    assert server.tensors()["p"].numel() == sum(task.examples(k) for k in range(4))


# ------------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"dual_step": 0.0}, "dual_step"),
        ({"dual_step": 1.5}, "dual_step"),
        ({"divergence": "tv"}, "divergence"),
        ({"divergence": "kl", "lam": -1.0}, "lam"),
        ({"divergence": "kl"}, "lam = None"),
        ({"lam": 2.0}, "lam = 2.0"),
        ({"local_steps": 2}, "local_steps"),
        ({"outer_batch": None}, "outer_batch"),
        ({"outer_batch": 0}, "outer_batch"),
    ],
)
def test_bad_hyperparameters_are_rejected_in_one_line_naming_the_field(bad, match):
    with pytest.raises(ConfigError, match=match) as error:
        config(**bad)
    assert "\n" not in str(error.value)


def test_a_task_without_per_example_positions_is_rejected():
    cfg = load_config(
        {"task": {"name": "heterogeneous-composition"}, "algorithm": {"name": "parallel-pdsgd"},
         "federation": {"clients": 2, "backend": "local"}, "run": {"progress": "none", "out": results_root()}}
    )
    with pytest.raises(ConfigError, match="sample_positions") as error:
        Server(cfg, LocalFederation).run_round()
    assert "\n" not in str(error.value)


def test_a_task_without_a_dro_game_needs_an_explicit_one():
    raw = {"task": {"name": "dro-classification", "dataset": "breast-cancer", "objective": "erm"},
           "algorithm": {"name": "parallel-pdsgd", "outer_batch": 8}, "federation": {"clients": 2, "backend": "local"},
           "run": {"progress": "none", "out": results_root()}}
    with pytest.raises(ConfigError, match="dual_penalty") as error:
        Server(load_config(raw), LocalFederation).run_round()
    assert "\n" not in str(error.value)
    raw["algorithm"] |= {"divergence": "kl", "lam": 1.0}
    Server(load_config(raw), LocalFederation).run_round()
