"""Federated MAML: meta-gradients against finite differences, the conditional and compositional views against
each other where they must agree, Local-SCGD(M) against the slides' rules with exactly the documented state
averaged, sinewave training, and bad config input."""

from __future__ import annotations

import pytest
import torch

import fedcomp
from fedcomp.models.functional import FlatModel
from fedcomp.models.mlp import mlp
from fedcomp.platform import catalog
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import LocalFederation, build_algorithm, build_task
from fedcomp.platform.kinds import COMPOSITIONAL, CONDITIONAL
from fedcomp.platform.oracles import inner_value_vjp, outer_grad
from fedcomp.platform.problems import CompositionalProblem, ConditionalProblem
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server
from fedcomp.platform.tasks.meta import Conv4, Episodes

torch.set_num_threads(1)


def meta_config(task: str, local_steps: int, **overrides):
    """A one-round local-backend LocalSCGDM config on the meta-learning task ``task``: 2 clients, 2 tasks a step."""
    base = {"task.name": task, "algorithm.name": "local-scgdm", "federation.backend": "local",
            "federation.clients": 2, "algorithm.local_steps": local_steps, "algorithm.outer_batch": 2,
            "task.eval_tasks": 5, "run.rounds": 1, "run.progress": "none"}
    base.update(overrides)
    return load_config("quickstart", base)


def fewshot(**overrides):
    return meta_config("fewshot-mnist", 2, **overrides)


def sinewave(**overrides):
    return meta_config("sinewave", 3, **overrides)


def to_double(task, episodes: Episodes) -> Episodes:
    task.model = FlatModel(task.model.module.double())
    return Episodes(episodes.support_x.double(), episodes.support_y.double() if episodes.support_y.is_floating_point()
                    else episodes.support_y, episodes.query_x.double(), episodes.query_y.double()
                    if episodes.query_y.is_floating_point() else episodes.query_y)


def central_difference(f, x, v, eps=1e-6):
    return (f(x + eps * v) - f(x - eps * v)) / (2 * eps)


# -- meta-gradients ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sinewave", "fewshot-mnist"])
def test_second_order_meta_gradient_matches_finite_differences(name):
    """Tiny models in float64: the MLP, and the conv net with BatchNorm in training mode (3 ways, 8 filters)."""
    overrides = {"task.hidden": 5} if name == "sinewave" else {"task.ways": 3, "task.channels": 8, "task.shots": 2,
                                                                "task.queries": 3}
    config = (sinewave if name == "sinewave" else fewshot)(**{"task.name": name, "task.adapt_steps": 2, **overrides})
    task = build_task(config)
    view = task.problem(CONDITIONAL)
    outer = to_double(task, view.sample_outer(0, 2, generator(0, "t")))
    # A generic point: at the initialisation (zero biases) the black background of the images puts ReLU inputs
    # exactly at their kink, where the support gradient -- and so the adapted point -- jumps.
    x = task.init_params(generator(0, "init"))["x"].double()
    x = x + 0.01 * torch.randn(x.shape, generator=generator(0, "jitter"), dtype=torch.float64)
    x_leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(view.loss(x_leaf, outer, None), x_leaf)
    for k in range(3):
        v = torch.randn(x.shape, generator=generator(1, "dir", k), dtype=torch.float64)
        fd = central_difference(lambda z: float(view.loss(z, outer, None)), x, v, eps=1e-7)
        assert float(grad @ v) == pytest.approx(fd, rel=1e-5, abs=1e-8)


def test_first_order_maml_is_the_query_gradient_at_the_adapted_point():
    config = sinewave(**{"task.maml": "first-order", "task.hidden": 5})
    task = build_task(config)
    view = task.problem(CONDITIONAL)
    outer = to_double(task, view.sample_outer(0, 1, generator(0, "t")))
    x = task.init_params(generator(0, "init"))["x"].double().requires_grad_(True)
    (grad,) = torch.autograd.grad(view.loss(x, outer, None), x)
    support = lambda z: task.loss_fn(task.model(z, outer.support_x[0]), outer.support_y[0])  # noqa: E731
    fast = (x - task.params.adapt_lr * torch.func.grad(support)(x)).detach().requires_grad_(True)
    (query_grad,) = torch.autograd.grad(task.loss_fn(task.model(fast, outer.query_x[0]), outer.query_y[0]), fast)
    torch.testing.assert_close(grad, query_grad)
    second = build_task(sinewave(**{"task.hidden": 5}))
    second.model = task.model
    x2 = x.detach().clone().requires_grad_(True)
    (full,) = torch.autograd.grad(second.problem(CONDITIONAL).loss(x2, outer, None), x2)
    assert not torch.allclose(full, grad)  # the second-order term is there and not negligible here


def test_compositional_oracles_match_finite_differences():
    task = build_task(sinewave(**{"task.hidden": 5}))
    view = task.problem(COMPOSITIONAL)
    assert isinstance(view, CompositionalProblem)
    xi = to_double(task, view.sample_inner(0, 3, generator(0, "xi")))
    zeta = to_double(task, view.sample_outer(0, 3, generator(0, "zeta")))
    x = task.init_params(generator(0, "init"))["x"].double()
    g, vjp = inner_value_vjp(view, x, xi)
    v = torch.randn(x.shape, generator=generator(2, "v"), dtype=torch.float64)
    w = torch.randn(x.shape, generator=generator(3, "w"), dtype=torch.float64)
    # <w, J^T v> = <J w, v>, J w by central differences of g
    jw = central_difference(lambda z: view.inner(z.requires_grad_(True), xi).detach(), x, w)
    assert float(vjp(v) @ w) == pytest.approx(float(jw @ v), rel=1e-5)
    grad_f, value = outer_grad(view, g, zeta)
    assert float(grad_f @ w) == pytest.approx(central_difference(lambda y: float(view.outer(y, zeta)), g, w), rel=1e-5)
    assert float(value) == pytest.approx(float(view.outer(g, zeta)))


# -- the two views where they must agree -------------------------------------------------------------------------------


def test_views_agree_with_one_task_per_client_and_the_whole_support_set():
    """One fixed task: L(x - lambda grad L(x; S); Q) is both f(g(x)) and the conditional objective."""
    task = build_task(fewshot(**{"task.tasks_per_client": 1}))
    cond, comp = task.problem(CONDITIONAL), task.problem(COMPOSITIONAL)
    assert isinstance(cond, ConditionalProblem) and isinstance(comp, CompositionalProblem)
    x = task.init_params(generator(0, "init"))["x"]
    outer = cond.sample_outer(1, 1, generator(0, "a"))
    inner = cond.sample_inner(1, outer, task.params.ways * task.params.shots, generator(0, "b"))
    assert inner is None  # m = the whole support set
    x_leaf = x.clone().requires_grad_(True)
    (conditional,) = torch.autograd.grad(cond.loss(x_leaf, outer, inner), x_leaf)
    g, vjp = inner_value_vjp(comp, x, comp.sample_inner(1, 1, generator(1, "c")))
    grad_f, _ = outer_grad(comp, g, comp.sample_outer(1, 1, generator(2, "d")))
    torch.testing.assert_close(vjp(grad_f), conditional, rtol=1e-4, atol=1e-6)


def test_local_scgd_with_gamma_one_takes_fcsgs_steps_on_fixed_tasks():
    common = {"task.tasks_per_client": 1, "algorithm.outer_batch": 1, "algorithm.local_steps": 3, "algorithm.lr": 0.1}
    scgd = Server(fewshot(**{**common, "algorithm.name": "local-scgd", "algorithm.gamma": 1.0}), LocalFederation)
    fcsg = Server(fewshot(**{**common, "algorithm.name": "fcsg", "algorithm.first_batch": 1,
                             "algorithm.inner_batch": 5}), LocalFederation)
    for _ in range(2):
        scgd.run_round(), fcsg.run_round()
    torch.testing.assert_close(scgd.tensors()["x"], fcsg.tensors()["x"], rtol=1e-4, atol=1e-5)


def test_per_task_mix_with_gamma_one_is_the_exact_maml_gradient():
    """The FCSG code's variant evaluates each task's query loss at its own adapted point: with gamma = 1 its
    step is the conditional (FCSG) gradient on the same tasks."""
    config = fewshot(**{"algorithm.name": "local-scgd", "algorithm.gamma": 1.0, "algorithm.inner_state": "per-task-mix",
                        "algorithm.outer_batch": 2, "algorithm.lr": 1.0})
    task, algorithm = build_task(config), build_algorithm(config)
    x = task.init_params(generator(0, "init"))["x"]
    state = algorithm.join(algorithm.broadcast(algorithm.init({"x": x})))
    batch, _ = algorithm.draw(task.problem(COMPOSITIONAL), 0, 5, generator(0, "step"))
    new, _ = algorithm.update(task.problem(COMPOSITIONAL), state, batch, 5)
    episodes = task.episodes(0, 2, generator(0, "step"))  # what sample_pairs drew
    x_leaf = x.clone().requires_grad_(True)
    (exact,) = torch.autograd.grad(task.problem(CONDITIONAL).loss(x_leaf, episodes, None), x_leaf)
    torch.testing.assert_close(x - new.x, exact, rtol=1e-4, atol=1e-6)


# -- Local-SCGD(M): the slides' rules and the averaged state ---------------------------------------------------------


def hand_round(config, clients, steps, lr, gamma, beta):
    """Every client runs the slides' Algorithm 1 for ``steps`` steps from the same x0; returns client states."""
    task = build_task(config)
    view = task.problem(COMPOSITIONAL)
    x0 = task.init_params(generator(config.run.seed, "init"))["x"]
    out = []
    for c in range(clients):
        x, u, m = x0.clone(), None, None
        for t in range(steps):
            gen = generator(config.run.seed, "client-step", c, t)
            xi = view.sample_inner(c, config.algorithm.outer_batch, gen)
            zeta = view.sample_outer(c, config.algorithm.outer_batch, gen)
            g, vjp = inner_value_vjp(view, x, xi)
            u = g if t == 0 else (1 - gamma) * u + gamma * g
            z = vjp(outer_grad(view, u, zeta)[0])
            if beta is None:  # Local-SCGD
                x = x - lr * z
            else:
                m = z if t == 0 else (1 - beta) * m + beta * z
                x = x - lr * m
        out.append({"x": x, "u": u, "m": m})
    return out


@pytest.mark.parametrize("name, synced", [("local-scgd", ("x", "u")), ("local-scgdm", ("x", "u", "m"))])
def test_local_scgd_family_averages_exactly_the_documented_state(name, synced):
    overrides = {"algorithm.name": name, "algorithm.lr": 0.05, "algorithm.gamma": 0.3}
    beta = None
    if name == "local-scgdm":
        overrides["algorithm.beta"] = beta = 0.4
    config = sinewave(**overrides)
    algorithm = build_algorithm(config)
    assert algorithm.averaged == synced
    server = Server(config, LocalFederation)
    assert set(server.tensors()) == set(synced)
    record = server.run_round()
    clients = hand_round(config, 2, 3, 0.05, 0.3, beta)
    for key in synced:
        torch.testing.assert_close(server.tensors()[key], (clients[0][key] + clients[1][key]) / 2, rtol=1e-5, atol=1e-6)
    assert server.federation.private_states() == {}  # nothing stays on the clients
    d = server.tensors()["x"].numel()
    assert record["floats_up"] == len(synced) * d and record["comm_rounds"] == 1


def test_fcsg_family_on_meta_tasks_averages_its_documented_state():
    for name, synced, private in [("fcsg", ("x",), set()), ("fcsg-m", ("x", "u"), set()),
                                  ("acc-fcsg-m", ("x", "u"), {"x_prev"})]:
        extra = {} if name == "fcsg" else {"algorithm.beta": 0.5}
        server = Server(sinewave(**{"algorithm.name": name, "algorithm.first_batch": 2, "algorithm.inner_batch": 5,
                                    **extra}), LocalFederation)
        server.run_round()
        assert set(server.tensors()) == set(synced)
        assert {k for s in server.federation.private_states().values() for k in s} == private


# local = Ray for every MAML algorithm: the conformance suite (tests/platform/test_conformance.py)


# -- training ------------------------------------------------------------------------------------------------------------


SINEWAVE_TRAINING = {"federation.clients": 2, "algorithm.local_steps": 10, "algorithm.outer_batch": 4,
                     "algorithm.lr": 0.03, "task.adapt_lr": 0.02, "task.eval_tasks": 20}
ROUNDS = {"fcsg": 30, "fcsg-m": 30, "acc-fcsg-m": 25, "local-scgd": 50, "local-scgdm": 50}  # the slower learners get more


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fcsg", "fcsg-m", "acc-fcsg-m", "local-scgd", "local-scgdm"])
def test_sinewave_adaptation_beats_the_unadapted_model_after_training(name, tmp_path):
    overrides = {**SINEWAVE_TRAINING, "algorithm.name": name, "run.out": str(tmp_path), "run.rounds": ROUNDS[name],
                 "run.eval_every": ROUNDS[name]}
    if name in ("fcsg-m", "acc-fcsg-m", "local-scgdm"):
        overrides["algorithm.beta"] = 0.5
    if name.startswith(("fcsg", "acc")):
        overrides.update({"algorithm.first_batch": 4, "algorithm.inner_batch": 10})
    metrics = fedcomp.run(sinewave(**overrides)).metrics
    before, after = metrics.iloc[0], metrics.iloc[-1]
    assert after["test_loss"] < 0.7 * after["test_loss_unadapted"]  # adaptation now removes 30 % of the error
    assert after["test_loss"] < 0.6 * before["test_loss"]


# -- tasks and config ---------------------------------------------------------------------------------------------------


def test_fewshot_episodes_and_client_shares_are_disjoint():
    task = build_task(fewshot(**{"federation.clients": 4, "task.shots": 5}))
    episodes = task.episodes(0, 3, generator(0, "e"))
    assert episodes.support_x.shape == (3, 25, 1, 28, 28) and episodes.query_x.shape == (3, 75, 1, 28, 28)
    assert episodes.support_y[0].tolist() == [c for c in range(5) for _ in range(5)]
    shares = [set(images.flatten().tolist()) for _, images in
              [(c, imgs[0]) for c, imgs in task._shares]]  # client k's images of class 0
    assert all(not (a & b) for i, a in enumerate(shares) for b in shares[i + 1:])
    assert len(task.train_classes) == 20 and len(task.eval_classes) == 20
    assert not set(task.train_classes) & set(task.eval_classes)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"task.maml": "third-order"}, "task.maml = 'third-order'"),
        ({"algorithm.gamma": 0.0}, "algorithm.gamma = 0.0"),
        ({"algorithm.inner_state": "mixed"}, "algorithm.inner_state = 'mixed'"),
        ({"task.train_digits": [1, 1]}, "task.train_digits = [1, 1]"),
        ({"algorithm.name": "fedavg"}, "algorithm.name = 'fedavg' needs a 'plain' problem"),
    ],
)
def test_bad_config_is_one_clear_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        fewshot(**overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_too_few_classes_per_client_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"task\.client_split = 'classes'.*fewer than ways = 5; use federation.clients "
                                          r"= 4 or fewer, or task.client_split = 'images'$"):
        fedcomp.run(fewshot(**{"task.client_split": "classes", "federation.clients": 16, "run.out": str(tmp_path)}))


@pytest.mark.parametrize(("split", "most", "advice"), [
    ("classes", 4, "use federation.clients = 4 or fewer, or task.client_split = 'images' with 31 clients or fewer"),
    ("images", 31, "use federation.clients = 31 or fewer, or task.client_split = 'classes' with 4 clients or fewer"),
])
def test_a_split_that_does_not_fit_names_the_client_counts_that_do(split, most, advice):
    """20 meta-training classes (5 digits, 4 rotations) of 500 images: 5 ways, 1 shot + 15 queries."""
    cls = catalog.task_class("fewshot-mnist")
    params = cls.Params(client_split=split)
    with pytest.raises(ConfigError) as error:
        cls(params, seed=0, clients=40)
    assert str(error.value).endswith(advice)
    cls(params, seed=0, clients=most)  # the advice, followed
    with pytest.raises(ConfigError):
        cls(params, seed=0, clients=most + 1)


def test_conv4_has_the_code_architecture():
    net = Conv4(5)
    assert sum(p.numel() for p in net.parameters()) == 91781
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 5)
    assert sum(p.numel() for p in mlp([1, 40, 40, 1]).parameters()) == 1761


@pytest.mark.parametrize("shots", [1, 5])
def test_omniglot_sweep_presets_are_the_papers_maml_grid(shots):
    from fedcomp.sweeps.spec import load_spec

    spec = load_spec(f"maml-omniglot-{shots}shot")
    points = spec.points()
    assert len(points) == 3 + 2 * 9 + 9 + 27
    assert {p["algorithm.lr"] for p in points} == {0.1, 0.05, 0.01}
    assert {p["algorithm.name"] for p in points} == {"fcsg", "fcsg-m", "acc-fcsg-m", "local-scgd", "local-scgdm"}
    assert {p.get("algorithm.gamma") for p in points if p["algorithm.name"].startswith("local")} == {0.1, 0.5, 0.9}
    assert {p.get("algorithm.beta") for p in points if p["algorithm.name"] != "fcsg"} - {None} == {0.1, 0.5, 0.9}
    base = spec.base_config()
    assert (base.task.shots, base.task.ways, base.task.queries, base.task.adapt_lr) == (shots, 5, 15, 0.4)
    assert (base.task.adapt_steps, base.task.eval_steps, base.federation.clients) == (1, 3, 16)
    assert base.algorithm.inner_batch == 5 * shots  # m = the whole support set
