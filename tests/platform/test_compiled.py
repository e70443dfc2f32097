"""``federation.torch_compile``: the loss gradient by ``torch.compile`` (:mod:`fedcomp.platform.compiled`).

Properties: the compiled oracles give the eager ones' answers up to float32 rounding and repeat bit for bit; every
registered algorithm runs compiled, close to its eager run, and repeats its numbers; a loss
that does not compile -- and a process that would need more graphs than it keeps -- runs eagerly with autograd's very
bits for the rest of the run, after one warning. (The Ray backend's equality with the local one: ``tests/actors/test_ray_backend.py``.)
"""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch

import fedcomp
from fedcomp.platform import compiled, oracles
from fedcomp.platform.catalog import algorithms, load_builtins
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_task
from fedcomp.platform.oracles import grad_and_loss, grad_xy_and_value
from fedcomp.platform.rng import generator
from tests.conftest import NEEDS_TORCH_COMPILE

pytestmark = NEEDS_TORCH_COMPILE

MLP_TASK = {"name": "synthetic-classification", "features": 8, "classes": 3, "hidden": [16], "test_samples": 100}
BREAST_CANCER = {"name": "imbalanced-binary", "dataset": "breast-cancer"}
TASK_FOR_KIND = {
    "plain": BREAST_CANCER,
    "conditional": {"name": "invariant-logreg", "dim": 5, "test_samples": 200},
    "minimax": BREAST_CANCER,
    "compositional-minimax": BREAST_CANCER,
    "bilevel": {"name": "hyper-representation", "hidden": 3, "per_client": 20},
    "compositional": {  # MAML sinewave: g = adapted weights (second order)
        "name": "sinewave", "hidden": 4, "shots": 3, "queries": 3, "eval_tasks": 3, "eval_queries": 5, "eval_steps": 1,
    },
    "compositional-global": {"name": "dro-classification", "dataset": "breast-cancer"},  # per-example losses too
}
"""Every problem kind, each with a tiny task (the conformance suite's; per-example losses for the DRO baselines)."""


def mlp_problem_and_batch():
    config = load_config({"task": MLP_TASK, "algorithm": {"name": "fedavg"}, "federation": {"clients": 2}})
    task = build_task(config)
    problem = task.problem("plain")
    x = task.init_params(generator(0, "init"))["x"]
    return problem, x, problem.sample_batch(0, 8, generator(0, "batch"))


def test_the_compiled_gradient_is_autograds_up_to_float32_rounding_and_repeats_bit_for_bit():
    problem, x, batch = mlp_problem_and_batch()
    grad, value = grad_and_loss(problem, x, batch)
    eager_losses: set[object] = set()
    with compiled.enabled(eager_losses):
        first = compiled.grad_and_loss(problem, x, batch)
        again = grad_and_loss(problem, x, batch)
    assert first is not None and not eager_losses
    torch.testing.assert_close(first[0], grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(first[1], value, rtol=1e-6, atol=0)
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    assert not first[0].requires_grad and not first[1].requires_grad


def test_both_compiled_partial_gradients_are_autograds_up_to_float32_rounding_with_zeros_for_an_unused_variable():
    gen = torch.Generator().manual_seed(0)
    a, x, y = torch.randn(8, 5, generator=gen), torch.randn(5, generator=gen), torch.randn(3, generator=gen)
    saddle = lambda u, v: torch.tanh(a @ u).mean() * v.sum() - 0.5 * (v**2).sum()  # noqa: E731
    x_only = lambda u, v: torch.tanh(a @ u).pow(2).mean()  # noqa: E731
    for loss in (saddle, x_only):
        eager = grad_xy_and_value(loss, x, y)
        with compiled.enabled(set()):
            done = compiled.grad_xy_and_value(loss, x, y)
            again = grad_xy_and_value(loss, x, y)
        assert done is not None
        for got, want, repeat in zip(done, eager, again):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
            assert torch.equal(repeat, got) and not got.requires_grad
    assert torch.equal(done[1], torch.zeros(3))  # y unused by x_only


class _BrokenLoss:
    """A loss dynamo cannot capture in one graph."""

    def loss(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        squares = (batch @ x) ** 2
        torch._dynamo.graph_break()
        return squares.mean()


class _Composite:
    """A problem of every kind of oracle: a loss, per-example losses, h + f(g) and a two-variable loss."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1)
        self.a, self.b = torch.randn(6, 4, generator=gen), torch.randn(3, 4, generator=gen)

    def example_losses(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(batch @ x)

    def plain(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return 0.5 * (x**2).sum() + self.example_losses(x, batch).mean()

    def inner(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.b @ x) + batch.mean()

    def outer(self, z: torch.Tensor, *zeta: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(z * (zeta[0].mean() if zeta else 1.0), 0)

    def pair(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.a @ x).pow(2).mean() * y.sum() + (y**3).sum() / 3


def test_every_compiled_oracle_gives_the_eager_ones_answers_up_to_float32_rounding_and_repeats_bit_for_bit():
    """Each oracle compiled (counted: none falls back) against its eager self: the y-gradient, both second-order
    products, f's, h's and the weighted per-example losses' gradients, h + g.v's with h and g, g's Jacobian, and g with
    its vector-Jacobian product."""
    problem, gen = _Composite(), torch.Generator().manual_seed(2)
    x, y, v3, v4 = (torch.randn(n, generator=gen) for n in (4, 3, 3, 3))
    batch, weights = torch.randn(5, 4, generator=gen), torch.rand(5, generator=gen)

    def asked(vjp_v: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        value, vjp = oracles.inner_value_vjp(problem, x, batch)
        return [
            (oracles.grad_y(problem.pair, x, y),), (oracles.hvp_yy(problem.pair, x, y, v3),),
            (oracles.jvp_xy(problem.pair, x, y, v4),), oracles.outer_grad(problem, y, batch), oracles.outer_grad(problem, y),
            oracles.plain_grad(problem, x, batch), (oracles.weighted_example_grad(problem, x, batch, weights),),
            oracles.plain_inner_vjp(problem, x, batch, v3), oracles.inner_and_jacobian(problem, x, batch),
            (value, vjp(vjp_v)),
        ]

    eager = asked(v3)
    calls = []
    real = compiled._compiled

    def counted(oracle, *args):
        done = real(oracle, *args)
        calls.append((oracle.__name__, done is not None))
        return done

    not_compiled: set[object] = set()
    with compiled.enabled(not_compiled), pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled, "_compiled", counted)
        first, again = asked(v3), asked(v3)
    assert not not_compiled and all(done for _, done in calls) and len(calls) == 2 * 10, calls
    for got, want, repeat in zip(first, eager, again):
        for g, w, r in zip(got, want, repeat, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
            assert torch.equal(r, g) and not g.requires_grad


def test_a_loss_that_does_not_compile_runs_eagerly_with_autograds_bits_after_one_warning():
    problem, x, batch = _BrokenLoss(), torch.randn(3), torch.randn(6, 3)
    eager = grad_and_loss(problem, x, batch)
    with warnings.catch_warnings(record=True) as caught, compiled.enabled(set()):
        warnings.simplefilter("always")
        runs = [grad_and_loss(problem, x, batch) for _ in range(3)]
    said = [str(w.message) for w in caught if "torch_compile" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("federation.torch_compile: the loss of _BrokenLoss does not compile "
                                                 "into one graph"), said
    assert said[0].endswith("; it runs eagerly"), said
    for grad, value in runs:
        assert torch.equal(grad, eager[0]) and torch.equal(value, eager[1])


def test_a_process_needing_more_graphs_than_it_keeps_says_so_and_runs_those_steps_eagerly(monkeypatch):
    class Quadratic:
        def loss(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
            return ((batch @ x) ** 2).mean()

    torch._dynamo.reset()  # no graphs of earlier tests in this process
    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 1)
    problem, x = Quadratic(), torch.randn(3)
    batches = [torch.randn(rows, 3) for rows in (4, 5, 6)]  # a graph for each shape
    with warnings.catch_warnings(record=True) as caught, compiled.enabled(set()):
        warnings.simplefilter("always")
        assert compiled.grad_and_loss(problem, x, batches[0]) is not None  # the first shape compiles
        later = [grad_and_loss(problem, x, b) for b in batches[1:]]
    said = [str(w.message) for w in caught if "torch_compile" in str(w.message)]
    assert said == ["federation.torch_compile: the loss of Quadratic does not compile into one graph (this process "
                    "would hold more than 1 of its graphs); it runs eagerly"]
    for batch, (grad, value) in zip(batches[1:], later):
        eager = grad_and_loss(problem, x, batch)
        assert torch.equal(grad, eager[0]) and torch.equal(value, eager[1])


EVERY_ALGORITHM = sorted(algorithms())
COMPILED_ORACLE = {
    "compositional": {"_inner_value", "_outer_grad"}, "bilevel": {"_y_grad", "_both_grads", "_jvp_xy"}, "minimax": {"_both_grads"},
    "compositional-minimax": {"_inner_value", "_both_grads"},
}
"""Oracles each kind's every algorithm is seen to take compiled (others are checked by algorithm: SGD steps'
``_loss_grad``, the compositional-global kind's, FedNest's Hessian-vector products where its random number of Neumann
terms is not 0)."""


@pytest.mark.slow
def test_every_algorithm_runs_compiled_close_to_eager_and_repeats_its_numbers(tmp_path, monkeypatch):
    """Every registered algorithm, of every kind, takes its steps' gradients compiled (the local backend runs its clients
    in this process, so the compiled oracles' answers are counted here), its metrics within float32 rounding of the
    eager run's, and a second compiled run repeats the first bit for bit."""
    load_builtins()
    answered: set[str] = set()
    real = compiled._compiled

    def counted(oracle, *args):
        done = real(oracle, *args)
        if done is not None:
            answered.add(oracle.__name__)
        return done

    monkeypatch.setattr(compiled, "_compiled", counted)
    took = {}
    for name in EVERY_ALGORITHM:
        kind = algorithms()[name].kind
        raw = {"task": TASK_FOR_KIND[kind], "algorithm": {"name": name}, "federation": {"backend": "local", "clients": 3},
               "run": {"rounds": 2, "progress": "none", "track": "none", "out": str(tmp_path)}}
        eager = fedcomp.run(raw).metrics.drop(columns="wall_time")
        answered.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager would say so
            runs = [fedcomp.run(raw, {"federation.torch_compile": True}).metrics.drop(columns="wall_time") for _ in range(2)]
        took[name] = set(answered)
        assert answered >= COMPILED_ORACLE.get(kind, set()) and answered, (name, answered)
        pd.testing.assert_frame_equal(runs[1], runs[0], check_exact=True)
        pd.testing.assert_frame_equal(runs[0], eager, rtol=1e-5, atol=1e-6)
    assert {"_loss_grad"} <= took["fedavg"] and {"_inner_jacobian", "_plain_grad"} <= took["gcivr"], took
    for name in ("feddro", "fedavg-co-1", "fedavg-co-2", "fedavg-co-shared-y", "parallel-mbsgd"):
        assert {"_outer_grad", "_plain_inner_vjp"} <= took[name], (name, took)
    assert "_weighted_example_grad" in took["parallel-fastdro"] & took["parallel-pdsgd"], took
    assert "_hvp_yy" in took["lfednest"], took


@pytest.mark.slow
def test_a_network_with_batchnorm_statistics_runs_eagerly_with_the_eager_numbers(tmp_path):
    """ResNet20's training forward moves its running statistics (an attribute set on the model, which dynamo does not
    capture): the run warns and its numbers are the eager run's, bit for bit."""
    raw = {"task": {"name": "imbalanced-binary", "dataset": "digits", "model": "resnet20"},
           "algorithm": {"name": "fedavg", "local_steps": 1},
           "federation": {"backend": "local", "clients": 2},
           "run": {"rounds": 1, "progress": "none", "track": "none", "out": str(tmp_path)}}
    eager = fedcomp.run(raw).metrics.drop(columns="wall_time")
    with pytest.warns(RuntimeWarning, match="the loss of ImbalancedBinary does not compile"):
        compiled_run = fedcomp.run(raw, {"federation.torch_compile": True}).metrics.drop(columns="wall_time")
    pd.testing.assert_frame_equal(compiled_run, eager, check_exact=True)


def test_a_compiled_run_restored_from_its_checkpoint_finishes_with_the_uninterrupted_numbers():
    """SCAFFOLD (private control variates in the checkpoint) on the MLP: 2 rounds, a checkpoint, a fresh server
    restored from it for 2 more -- the same bits as 4 rounds in one go."""
    from fedcomp.platform.federation import LocalFederation
    from fedcomp.platform.server import Server

    config = load_config({"task": MLP_TASK, "algorithm": {"name": "scaffold", "local_steps": 2},
                          "federation": {"clients": 3, "torch_compile": True}, "run": {"rounds": 4}})
    whole = Server(config, LocalFederation)
    for _ in range(4):
        whole.run_round()
    first = Server(config, LocalFederation)
    for _ in range(2):
        first.run_round()
    resumed = Server(config, LocalFederation)
    resumed.restore(first.checkpoint())
    for _ in range(2):
        resumed.run_round()
    for name, value in whole.tensors().items():
        assert torch.equal(resumed.tensors()[name], value), name
    eager = Server(config.replace(**{"federation.torch_compile": False}), LocalFederation)
    for _ in range(4):
        eager.run_round()
    torch.testing.assert_close(eager.tensors()["x"], whole.tensors()["x"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("task, algorithm", [("minimax-quadratic", "fednest"), ("heterogeneous-composition", "feddro")])
def test_a_task_whose_batch_is_a_clients_function_compiles_the_same_graphs_for_every_client(
    tmp_path, monkeypatch, task, algorithm
):
    """The exact-oracle tasks hand each client's function over as tensors, not as the client's index (a constant
    of a graph): 8 clients compile no more graphs per oracle than a process keeps here (4), so nothing falls back."""
    torch._dynamo.reset()  # no graphs of earlier tests in this process
    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 4)
    raw = {"task": {"name": task}, "algorithm": {"name": algorithm},
           "federation": {"backend": "local", "clients": 8, "torch_compile": True},
           "run": {"rounds": 2, "progress": "none", "track": "none", "out": str(tmp_path)}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fedcomp.run(raw)
