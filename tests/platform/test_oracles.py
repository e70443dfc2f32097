"""Second-order oracles against finite differences; the untaped gradient of a task that declares its loss a
perceptron's cross-entropy, against autograd's bits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedcomp.models.functional import FlatModel
from fedcomp.platform import oracles
from fedcomp.platform.algorithms.steps import sgd_step_
from fedcomp.platform.oracles import Pieces, grad_xy, hvp_yy, jvp_xy
from fedcomp.platform.tasks.builtins import SyntheticClassificationParams
from fedcomp.platform.tasks.synthetic_classification import SyntheticClassification


def loss(x, y):
    return torch.tanh(x @ y) * (y**2).sum() + torch.sin(x).sum() * torch.cos(y).sum()


def test_gradients_hvp_and_mixed_products_match_finite_differences():
    torch.manual_seed(0)
    x, y, v = (torch.randn(4, dtype=torch.float64) for _ in range(3))
    eps = 1e-6
    gx, gy = grad_xy(loss, x, y)
    fd_gy = torch.stack([(loss(x, y + eps * e) - loss(x, y - eps * e)) / (2 * eps) for e in torch.eye(4, dtype=torch.float64)])
    torch.testing.assert_close(gy, fd_gy, rtol=1e-6, atol=1e-8)
    # H_yy v ~ (grad_y(y + eps v) - grad_y(y - eps v)) / 2 eps
    fd_hvp = (grad_xy(loss, x, y + eps * v)[1] - grad_xy(loss, x, y - eps * v)[1]) / (2 * eps)
    torch.testing.assert_close(hvp_yy(loss, x, y, v), fd_hvp, rtol=1e-5, atol=1e-7)
    # H_xy v = d/dx <grad_y, v> ~ (grad_x(x, y + eps v) - grad_x(x, y - eps v)) / 2 eps
    fd_mixed = (grad_xy(loss, x, y + eps * v)[0] - grad_xy(loss, x, y - eps * v)[0]) / (2 * eps)
    torch.testing.assert_close(jvp_xy(loss, x, y, v), fd_mixed, rtol=1e-5, atol=1e-7)


def test_mixed_product_of_a_loss_without_x_is_zero():
    x, y, v = torch.ones(3), torch.ones(2), torch.ones(2)
    assert torch.equal(jvp_xy(lambda a, b: (b**2).sum(), x, y, v), torch.zeros(3))


def test_factors_go_into_their_pieces_scaling_only_those_without_a_dense_part():
    """``add_factors_``: p <- beta p + alpha sum(rows^T inputs) where the piece is factored only (beta on its first
    pair alone), p <- p + alpha sum(...) where the caller's step already scaled it with its dense part; beta 0
    ignores what the piece held, NaN included (a copy)."""
    torch.manual_seed(3)
    shapes = [(2, 3), (2,), (2, 3), (3, 2)]
    sizes = [2 * 3, 2, 2 * 3, 3 * 2]

    def cut(flat):
        return [v.view(s) for v, s in zip(flat.split(sizes), shapes)]

    pairs = {0: [(torch.randn(4, 2), torch.randn(4, 3)), (torch.randn(1, 2), torch.randn(1, 3))],
             2: [(torch.randn(4, 2), torch.randn(4, 3))], 3: [(torch.randn(5, 3), torch.randn(5, 2))]}
    # piece 1 (a bias) and piece 2 have dense parts; pieces 0 and 3 are factored only
    grad = Pieces([torch.randn(2), torch.randn(2, 3)], cut, pairs, dense=[1, 2])
    flat = torch.randn(sum(sizes), dtype=torch.float64).float()
    before = [p.clone().double() for p in cut(flat)]
    grad.add_factors_(flat, 0.5, 0.9)
    after = [p.double() for p in cut(flat)]

    def product(index):
        return sum(r.double().T @ a.double() for r, a in pairs[index])

    torch.testing.assert_close(after[0], 0.9 * before[0] + 0.5 * product(0), rtol=0, atol=1e-6)
    assert torch.equal(after[1], before[1])  # no factors: untouched
    torch.testing.assert_close(after[2], before[2] + 0.5 * product(2), rtol=0, atol=1e-6)
    torch.testing.assert_close(after[3], 0.9 * before[3] + 0.5 * product(3), rtol=0, atol=1e-6)
    assert [g.shape for g in grad.of(flat)] == [(2,), (2, 3)] and len(grad.whole(flat)) == 4

    cut(flat)[0].fill_(float("nan"))
    grad.add_factors_(flat, 1.0, 0.0)
    torch.testing.assert_close(cut(flat)[0].double(), product(0), rtol=0, atol=1e-6)


def test_pieces_without_factors_add_none():
    flat = torch.randn(5)
    grad = Pieces([torch.randn(5)])
    before = flat.clone()
    grad.add_factors_(flat, 1.0, 0.5)
    assert torch.equal(flat, before) and grad.of(flat) == grad.whole(flat) == [flat]


def small_task() -> tuple[SyntheticClassification, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    task = SyntheticClassification(SyntheticClassificationParams(hidden=[16]), seed=0, clients=4)
    x = task.init_params(torch.Generator().manual_seed(0))["x"]
    return task, x, task.sample_batch(1, 16, torch.Generator().manual_seed(1))


def autograd_of(problem: object, x: torch.Tensor, batch: object) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.clone().requires_grad_(True)
    value = problem.loss(leaf, batch)  # type: ignore[attr-defined]
    return torch.autograd.grad(value, leaf)[0], value.detach()


def test_the_oracles_take_the_task_s_untaped_gradient_with_autograds_bits(monkeypatch):
    task, x, batch = small_task()
    expected, value = autograd_of(task, x, batch)
    assert oracles.untaped(task, x, (batch,)) is not None  # the first call checks the declaration by autograd

    def no_autograd(*args: object, **kwargs: object) -> None:
        raise AssertionError("the untaped gradient should have answered")

    monkeypatch.setattr(torch.autograd, "grad", no_autograd)
    grad, loss = oracles.grad_and_loss(task, x, batch)
    pieces, loss_pieces = oracles.grad_and_loss_pieces(task, x, batch)
    assert torch.equal(grad, expected) and torch.equal(loss, value) and torch.equal(loss_pieces, loss)
    assert torch.equal(torch.cat([p.reshape(-1) for p in pieces]), expected)
    assert [p.shape for p in pieces.of(x)] == [p.shape for p in pieces]  # cut as the state is, for in-place steps


class Smoothed(SyntheticClassification):
    """A task whose loss is not what it declares (``classifier_inputs``): label smoothing."""

    def loss(self, x: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        features, labels = batch
        return F.cross_entropy(self.model(x, features), labels, label_smoothing=0.1)


def test_a_loss_that_is_not_what_it_declares_is_left_to_autograd():
    task = Smoothed(SyntheticClassificationParams(hidden=[16]), seed=0, clients=4)
    x = task.init_params(torch.Generator().manual_seed(0))["x"]
    batch = task.sample_batch(1, 16, torch.Generator().manual_seed(1))
    for _ in range(2):  # the first call finds the difference; later ones do not look again
        assert oracles.untaped(task, x, (batch,)) is None
        grad, loss = oracles.grad_and_loss(task, x, batch)
        expected, value = autograd_of(task, x, batch)
        assert torch.equal(grad, expected) and torch.equal(loss, value)


def test_fused_steps_take_the_untaped_factors_with_the_taped_ones_bits():
    task, x, batch = small_task()
    taped = task.model.factored_grad_pieces(lambda z: task.loss(z, batch), x)
    assert taped is not None and oracles.untaped(task, x, (batch,)) is not None
    done = oracles.untaped(task, x, (batch,), factored=True)
    assert done is not None
    grads, factors, loss = done
    assert torch.equal(loss, taped[2]) and factors.keys() == taped[1].keys()
    for index, pairs in factors.items():
        assert grads[index] is None and taped[0][index] is None
        assert all(torch.equal(a, b) for pair, other in zip(pairs, taped[1][index]) for a, b in zip(pair, other))
    assert all(torch.equal(a, b) for a, b in zip(grads, taped[0]) if a is not None)
    token = oracles.FUSED_SGD.set(True)
    try:
        stepped, reference = x.clone(), x.clone()
        sgd_step_(task, stepped, (batch,), 0.1)
        pieces = Pieces([taped[0][i] for i in (1, 3)], task.model.pieces, taped[1], [1, 3])
        torch._foreach_add_(pieces.of(reference), list(pieces), alpha=-0.1)
        pieces.add_factors_(reference, -0.1)
        assert torch.equal(stepped, reference)
    finally:
        oracles.FUSED_SGD.reset(token)
    no_bias = FlatModel(nn.Sequential(nn.Linear(4, 3, bias=False), nn.ReLU(), nn.Linear(3, 2, bias=False)))
    assert no_bias.cross_entropy_factors(torch.zeros(no_bias.dim), torch.randn(2, 4), torch.zeros(2, dtype=torch.long)) is None


def test_an_unhashable_problem_is_left_to_autograd():
    class Unhashable(SyntheticClassification):
        __hash__ = None  # type: ignore[assignment]

    task = Unhashable(SyntheticClassificationParams(hidden=[16]), seed=0, clients=4)
    x = task.init_params(torch.Generator().manual_seed(0))["x"]
    batch = task.sample_batch(1, 16, torch.Generator().manual_seed(1))
    assert oracles.untaped(task, x, (batch,)) is None
    grad, loss = oracles.grad_and_loss(task, x, batch)
    expected, value = autograd_of(task, x, batch)
    assert torch.equal(grad, expected) and torch.equal(loss, value)


def test_a_fedavg_run_on_the_mlp_task_steps_untaped(monkeypatch):
    """The local backend's FedAvg steps on ``synthetic-classification`` take the untaped gradient (one check by
    autograd at the task's first step, then none), and end on the same weights as with autograd."""
    from fedcomp.bench import bench_config, run_fedcomp

    config = bench_config(20, 4, 2, 3, [8], "local")
    calls: list[str] = []
    untaped_grad, autograd_grad = FlatModel.cross_entropy_grad, torch.autograd.grad

    def counted_untaped(self, *args):  # type: ignore[no-untyped-def]
        calls.append("untaped")
        return untaped_grad(self, *args)

    def counted_autograd(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("autograd")
        return autograd_grad(*args, **kwargs)

    monkeypatch.setattr(FlatModel, "cross_entropy_grad", counted_untaped)
    monkeypatch.setattr(torch.autograd, "grad", counted_autograd)
    untaped = run_fedcomp(config, "local", 0).final
    steps = config.run.rounds * config.federation.cohort_size * config.algorithm.local_steps  # type: ignore[attr-defined]
    assert calls.count("autograd") == 1 and calls.count("untaped") == steps + 1  # the check's pair, then each step
    monkeypatch.setattr(oracles, "untaped", lambda *args, **kwargs: None)
    taped = run_fedcomp(config, "local", 0).final
    assert untaped is not None and taped is not None and torch.equal(untaped, taped)


def lockstep_gradients(task: object, states: torch.Tensor, batches: object) -> tuple[torch.Tensor, torch.Tensor]:
    """``grad_and_loss`` of lockstep clients: batched under ``vmap`` with :data:`oracles.LOCKSTEP` set."""
    token = oracles.LOCKSTEP.set(True)
    try:
        return torch.func.vmap(lambda x, batch: oracles.grad_and_loss(task, x, batch))(states, batches)
    finally:
        oracles.LOCKSTEP.reset(token)


def stacked_clients(task: SyntheticClassification, x: torch.Tensor) -> tuple[torch.Tensor, object]:
    states = torch.stack([x + 0.1 * i * torch.randn(x.shape, generator=torch.Generator().manual_seed(i)) for i in range(3)])
    batches = [task.sample_batch(i, 16, torch.Generator().manual_seed(i)) for i in range(3)]
    return states, tuple(torch.stack(items) for items in zip(*batches))


def torch_func_answer(task: object, states: torch.Tensor, batches: object) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.func.vmap(torch.func.grad_and_value(lambda z, batch: task.loss(z, batch)))(states, batches)  # type: ignore[attr-defined]


def test_lockstep_clients_take_the_untaped_gradient_with_torch_funcs_bits(monkeypatch):
    """Under ``vmap`` the first call checks the declaration on the first client (by autograd, the transform set
    aside); then the batched untaped gradient answers, with the bits of lockstep's taped path."""
    task, x, _ = small_task()
    states, batches = stacked_clients(task, x)
    expected, values = torch_func_answer(task, states, batches)
    grads, losses = lockstep_gradients(task, states, batches)
    assert oracles._AGREES[task] is True
    assert torch.equal(grads, expected) and torch.equal(losses, values)

    def no_torch_func(*args: object, **kwargs: object) -> None:
        raise AssertionError("the untaped gradient should have answered")

    monkeypatch.setattr(torch.func, "grad_and_value", no_torch_func)
    grads, losses = lockstep_gradients(task, states, batches)
    assert torch.equal(grads, expected) and torch.equal(losses, values)


def test_under_lockstep_a_loss_that_is_not_what_it_declares_is_left_to_torch_func():
    task = Smoothed(SyntheticClassificationParams(hidden=[16]), seed=0, clients=4)
    states, batches = stacked_clients(task, task.init_params(torch.Generator().manual_seed(0))["x"])
    expected, values = torch_func_answer(task, states, batches)
    for _ in range(2):
        grads, losses = lockstep_gradients(task, states, batches)
        assert oracles._AGREES[task] is False
        assert torch.equal(grads, expected) and torch.equal(losses, values)


def test_under_lockstep_a_silu_perceptron_is_left_to_torch_func_and_still_untaped_eagerly():
    """``torch.func`` rounds SiLU's derivative otherwise than autograd: the model declines under ``vmap``, so lockstep
    clients take ``torch.func``'s gradient, though the declaration was checked there (by autograd) and eager steps
    take the untaped one."""
    task, x, batch = small_task()
    task.model = FlatModel(nn.Sequential(nn.Linear(32, 16), nn.SiLU(), nn.Linear(16, 10)))  # type: ignore[misc]
    x = torch.randn(task.model.dim, generator=torch.Generator().manual_seed(2)) * 0.3
    states, batches = stacked_clients(task, x)
    expected, values = torch_func_answer(task, states, batches)
    grads, losses = lockstep_gradients(task, states, batches)
    assert oracles._AGREES[task] is True
    assert torch.equal(grads, expected) and torch.equal(losses, values)
    assert oracles.untaped(task, x, (batch,)) is not None
