"""Local-SCGD(M)'s inner estimate u: averaged at each communication (the slides) or kept on each client
(``sync_inner: false``), on a compositional problem with a known optimum whose inner maps differ per client."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from pydantic import Field
from torch import Tensor

from fedcomp.platform.algorithms.base import ClientContext
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation, build_algorithm, build_task
from fedcomp.platform.kinds import COMPOSITIONAL
from fedcomp.platform.params import Params
from fedcomp.platform.registry import TASKS, register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server
from fedcomp.platform.tasks.base import Task
from tests.conftest import results_root


class TinyCompositionParams(Params):
    dim: int = Field(3, ge=1)


class TinyComposition(Task):
    """Client k: g_k(x) = a_k * x (elementwise), f_k(u) = |u - c_k|^2 / 2, exact oracles. The optimum of
    Phi(x) = (1/K) sum_k f_k(g_k(x)) is x* = sum_k a_k c_k / sum_k a_k^2 (per coordinate)."""

    Params = TinyCompositionParams
    kinds = frozenset({COMPOSITIONAL})
    metrics = ("distance", "grad_norm")
    mode = "min"
    vmappable = True

    def __init__(self, params: TinyCompositionParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        gen = generator(0, "tiny-composition")
        self.a = 0.5 + 1.5 * torch.rand(clients, params.dim, generator=gen)
        self.c = 2 * torch.randn(clients, params.dim, generator=gen)

    def optimum(self) -> Tensor:
        return (self.a * self.c).sum(0) / (self.a**2).sum(0)

    def gradient(self, x: Tensor) -> Tensor:
        return (self.a * (self.a * x - self.c)).mean(0)

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": torch.zeros(self.params.dim)}

    def sample_inner(self, client: int, n: int, gen: torch.Generator) -> Tensor:
        return self.a[client]

    def sample_outer(self, client: int, n: int, gen: torch.Generator) -> Tensor:
        return self.c[client]

    def inner(self, x: Tensor, a: Tensor) -> Tensor:
        return a * x

    def outer(self, u: Tensor, c: Tensor) -> Tensor:
        return 0.5 * ((u - c) ** 2).sum()

    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        def evaluate(state: dict[str, Tensor]) -> dict[str, float]:
            x = state["x"]
            return {"distance": float((x - self.optimum()).norm()), "grad_norm": float(self.gradient(x).norm())}

        return evaluate


if "tiny-composition" not in TASKS:
    register_task("tiny-composition")(TinyComposition)


class NarrowComposition(TinyComposition):
    """g_k of one coordinate fewer than x: u's size is g's, not x's."""

    def inner(self, x: Tensor, a: Tensor) -> Tensor:
        return (a * x)[1:] + (a * x)[:-1]

    def outer(self, u: Tensor, c: Tensor) -> Tensor:
        return 0.5 * ((u - c[1:]) ** 2).sum()


if "narrow-composition" not in TASKS:
    register_task("narrow-composition")(NarrowComposition)


@pytest.mark.parametrize("name", ["local-scgd", "local-scgdm"])
def test_u_takes_the_inner_functions_size_and_is_not_sent_before_the_first_averaging(name):
    """u was x-sized zeros at the start: round 0 counted d floats of it down, and clients stepping in lockstep failed
    where g's size differs from x's."""
    import fedcomp

    over = {"task.name": "narrow-composition", "task.dim": 5, "run.rounds": 3, "run.progress": "none",
            "run.out": results_root(), "algorithm.local_steps": 2}
    one = fedcomp.run(config(name, True), over).metrics
    down = one["floats_down"].diff().iloc[1:].tolist()
    d, m = 5, (5 if name == "local-scgdm" else 0)
    assert down == [d + m, d + 4 + m, d + 4 + m]  # x (and m) in round 0; then x, u (4 floats) and m
    lockstep = fedcomp.run(config(name, True, vectorise=True), over).metrics
    assert lockstep["distance"].tolist() == pytest.approx(one["distance"].tolist(), rel=1e-6)


def config(name: str, sync_inner: bool, **federation: object):
    return load_config({
        "task": {"name": "tiny-composition"},
        "algorithm": {"name": name, "lr": 0.2, "gamma": 0.5, "local_steps": 1, "sync_inner": sync_inner,
                      **({"beta": 0.5} if name == "local-scgdm" else {})},
        "federation": {"clients": 3, "backend": "local", **federation},
        "run": {"rounds": 300, "out": results_root()},
    })  # fmt: skip


def train(cfg) -> Server:
    server = Server(cfg, LocalFederation)
    for _ in range(cfg.run.rounds):
        server.run_round()
    return server


@pytest.mark.parametrize("name", ["local-scgd", "local-scgdm"])
def test_u_kept_on_the_clients_reaches_the_optimum_where_averaging_u_biases_the_fixed_point(name):
    own = train(config(name, sync_inner=False))
    averaged = train(config(name, sync_inner=True))
    assert set(own.tensors()) == ({"x"} if name == "local-scgd" else {"x", "m"})  # u is not the server's
    assert set(averaged.tensors()) == ({"x", "u"} if name == "local-scgd" else {"x", "u", "m"})
    assert own.evaluate()["distance"] < 1e-5
    assert averaged.evaluate()["grad_norm"] > 0.05  # the slides' scheme stops at a biased point
    private = own.federation.private_states()
    task = build_task(own.config)
    for k in range(3):  # each client's u is its own inner value g_k(x) at the end
        torch.testing.assert_close(private[k]["u"], task.a[k] * own.tensors()["x"], rtol=1e-4, atol=1e-5)
        assert set(private[k]) == {"u"}


def test_a_client_without_u_starts_it_at_g_then_moves_it_by_gamma():
    cfg = config("local-scgd", sync_inner=False, clients_per_round=1)
    algorithm, task = build_algorithm(cfg), build_task(cfg)
    x = torch.tensor([1.0, -2.0, 0.5])
    state = algorithm.join({"x": x})
    assert state.u.numel() == 0  # no u yet: not a placeholder of x's size (g's may differ)
    ctx = ClientContext(1, 7, 0, lambda *ids: generator(0, "client-step", 1, *ids))  # a late joiner: round 7
    first, outputs, _ = algorithm.local_steps(task, state, ctx)
    torch.testing.assert_close(first.u, task.a[1] * x)  # u = g(x), not a mixture with the zeros it held
    assert set(outputs) == {"x"}
    second, _, _ = algorithm.local_steps(task, first, ClientContext(1, 8, 0, ctx.rng))
    torch.testing.assert_close(second.u, 0.5 * first.u + 0.5 * task.a[1] * first.x)


@pytest.mark.parametrize("name", ["local-scgd", "local-scgdm"])
def test_clients_in_lockstep_give_the_one_at_a_time_numbers(name):
    rounds = {"run": {"rounds": 5}}
    one = Server(config(name, sync_inner=False, vectorise=False).replace(**{"run.rounds": 5}), LocalFederation)
    lock = Server(config(name, sync_inner=False, vectorise=True).replace(**{"run.rounds": 5}), LocalFederation)
    for _ in range(rounds["run"]["rounds"]):
        one.run_round(), lock.run_round()
    for key, value in one.tensors().items():
        torch.testing.assert_close(lock.tensors()[key], value, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["local-scgd", "local-scgdm"])
def test_a_clients_own_u_takes_the_inner_functions_size_and_late_joiners_step_in_lockstep_or_alone(name):
    """With u kept on each client, a client's u is empty until its first step (it was x-sized zeros, which failed
    and, with a late joiner, also one at a time where g's size differs from x's). With 3 of 8 clients a round,
    cohorts mix clients that have a u with first-timers: such a round steps them one at a time, the first round
    in lockstep, to the same numbers."""
    over = {"task.name": "narrow-composition", "task.dim": 5, "run.rounds": 8, "federation.clients": 8,
            "federation.clients_per_round": 3, "algorithm.local_steps": 2}  # fmt: skip
    one = Server(config(name, False, vectorise=False).replace(**over), LocalFederation)
    lock = Server(config(name, False, vectorise=True).replace(**over), LocalFederation)
    for _ in range(8):
        one.run_round(), lock.run_round()
    for key, value in one.tensors().items():
        torch.testing.assert_close(lock.tensors()[key], value, rtol=1e-6, atol=1e-7)
    private = lock.federation.private_states()
    assert 3 < len(private) <= 8  # later cohorts held first-timers beside clients with a u
    assert all(state["u"].shape == (4,) for state in private.values())  # g's size, not x's (5)
