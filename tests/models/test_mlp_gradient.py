"""A perceptron's cross-entropy gradient without autograd's tape: autograd's bits, on every shape it covers."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedcomp.models.functional import FlatModel
from fedcomp.models.mlp_gradient import MlpPlan, plan_of

ACTIVATIONS = {
    "relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU,
    "gelu-tanh": lambda: nn.GELU(approximate="tanh"), "leaky-relu": lambda: nn.LeakyReLU(0.2), "silu": nn.SiLU,
}


def perceptron(widths: list[int], activation: Any = nn.ReLU, bias: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(pairwise(widths)):
        layers.append(nn.Linear(fan_in, fan_out, bias=bias))
        if i < len(widths) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


def autograd_answer(module: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    loss = F.cross_entropy(module(features), labels)
    return list(torch.autograd.grad(loss, list(module.parameters()))), loss.detach()


def assert_same_bits(module: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> None:
    plan = plan_of(module)
    assert plan is not None
    expected, expected_loss = autograd_answer(module, features, labels)
    done = plan.cross_entropy([p.detach() for p in module.parameters()], features, labels)
    assert done is not None
    grads, loss = done
    assert torch.equal(loss, expected_loss)
    assert len(grads) == len(expected)
    for got, want in zip(grads, expected):
        assert got.shape == want.shape and torch.equal(got, want)


@pytest.mark.parametrize("widths", [[32, 64, 10], [1, 1, 2], [3, 1, 2], [5, 2], [2, 3, 4, 5, 6], [784, 200, 200, 10]])
@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("activation", list(ACTIVATIONS.values()), ids=list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_the_gradient_and_loss_are_autograds_bit_for_bit(widths, batch, activation, bias):
    torch.manual_seed(len(widths) * 100 + batch)
    module = perceptron(widths, activation, bias)
    features = torch.randn(batch, widths[0]) * 3  # large logits too: the softmax's saturation rounds
    labels = torch.randint(0, widths[-1], (batch,))
    assert_same_bits(module, features, labels)


def test_a_leading_flatten_nested_sequentials_identities_and_an_in_place_relu():
    torch.manual_seed(1)
    module = nn.Sequential(
        nn.Flatten(), nn.Sequential(nn.Linear(12, 8), nn.ReLU(inplace=True)), nn.Identity(), nn.Linear(8, 3),
    )
    assert_same_bits(module, torch.randn(5, 3, 2, 2), torch.randint(0, 3, (5,)))


def test_a_weight_stored_transposed_takes_autograds_other_product():
    torch.manual_seed(2)
    module = perceptron([6, 5, 3])
    module[0].weight = nn.Parameter(torch.randn(6, 5).t())  # not contiguous: autograd multiplies the other way
    assert_same_bits(module, torch.randn(4, 6), torch.randint(0, 3, (4,)))


@pytest.mark.parametrize(
    "module",
    [
        nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)),
        nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5), nn.Linear(3, 2)),
        nn.Sequential(nn.Linear(4, 3), nn.ELU(), nn.Linear(3, 2)),
        nn.Sequential(nn.Linear(4, 3), nn.LeakyReLU(inplace=True), nn.Linear(3, 2)),
        nn.Sequential(nn.Linear(4, 3), nn.Flatten(), nn.Linear(3, 2)),  # a flatten not first
        nn.Sequential(nn.ReLU(), nn.Identity()),  # no linear layer
        nn.Linear(4, 2),  # not a sequential
    ],
    ids=["batchnorm", "dropout", "elu", "in-place-leaky-relu", "flatten-inside", "no-linear", "bare-linear"],
)
def test_modules_it_does_not_cover_get_no_plan(module):
    assert plan_of(module) is None


def test_a_subclassed_layer_or_tied_weights_get_no_plan():
    class Scaled(nn.Linear):
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(input)

    assert plan_of(nn.Sequential(Scaled(4, 3), nn.ReLU(), nn.Linear(3, 2))) is None
    tied = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    tied[2].weight = tied[0].weight
    assert plan_of(tied) is None


def test_inputs_it_does_not_cover_are_left_to_autograd():
    plan = plan_of(perceptron([4, 3, 2]))
    assert plan is not None
    params = [p.detach() for p in perceptron([4, 3, 2]).parameters()]
    features = torch.randn(5, 4)
    assert plan.cross_entropy(params, features, torch.rand(5, 2)) is None  # probabilities, not class indices
    assert plan.cross_entropy(params, features.unsqueeze(0), torch.zeros(5, dtype=torch.long)) is None  # 3-D batch


def test_the_flat_model_differentiates_its_flat_vector_with_autograds_bits():
    torch.manual_seed(3)
    flat = FlatModel(perceptron([6, 7, 3]))
    x = torch.randn(flat.dim)
    features, labels = torch.randn(9, 6), torch.randint(0, 3, (9,))
    done = flat.cross_entropy_grad(x, features, labels)
    assert done is not None
    grads, loss = done
    leaf = x.clone().requires_grad_(True)
    value = F.cross_entropy(flat(leaf, features), labels)
    (expected,) = torch.autograd.grad(value, leaf)
    assert torch.equal(torch.cat([g.reshape(-1) for g in grads]), expected) and torch.equal(loss, value.detach())
    assert [g.shape for g in grads] == [p.shape for p in flat.pieces(x)]


@pytest.mark.parametrize("widths", [[32, 64, 10], [1, 1, 2], [3, 1, 2], [2, 3, 4, 5, 6]])
@pytest.mark.parametrize("batch", [1, 3])
def test_factored_gradients_taped_or_not_give_autograds_bits_beside_their_factors(widths, batch):
    """Fused steps' gradients (the weights' as factors): by autograd's tape (``factored_grad_pieces``) and without
    it (``cross_entropy_factors``), the biases' gradients and the loss are autograd's bits, the factors the same
    tensors (their products the weights' gradients up to rounding) -- a single example's one hidden feature included, whose input gradient autograd multiplies the other way."""
    torch.manual_seed(len(widths) * 10 + batch)
    for _ in range(16):  # whether the two orders round otherwise depends on the numbers (and the CPU's kernels)
        module = perceptron(widths)
        flat = FlatModel(module)
        features, labels = torch.randn(batch, widths[0]) * 3, torch.randint(0, widths[-1], (batch,))
        assert_factors_have_autograds_bits(module, flat, flat.flatten(), features, labels)


def assert_factors_have_autograds_bits(
    module: nn.Module, flat: FlatModel, x: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
) -> None:
    expected, expected_loss = autograd_answer(module, features, labels)
    taped = flat.factored_grad_pieces(lambda z: F.cross_entropy(flat(z, features), labels), x)
    untaped = flat.cross_entropy_factors(x, features, labels)
    assert taped is not None and untaped is not None
    for grads, factors, loss in (taped, untaped):
        assert torch.equal(loss, expected_loss)
        for i, (got, want) in enumerate(zip(grads, expected)):
            if i in factors:
                assert got is None
                torch.testing.assert_close(sum(rows.t().mm(inputs) for rows, inputs in factors[i]), want)
            else:
                assert got is not None and torch.equal(got, want), flat.names[i]
    assert taped[1].keys() == untaped[1].keys()
    for i, pairs in taped[1].items():
        assert all(torch.equal(a, b) for pair, other in zip(pairs, untaped[1][i]) for a, b in zip(pair, other))


def test_the_flat_model_declines_inside_transforms_other_than_vmap_and_without_a_plan():
    torch.manual_seed(4)
    flat = FlatModel(perceptron([6, 7, 3]))
    features, labels = torch.randn(9, 6), torch.randint(0, 3, (9,))
    seen = []

    def loss(z: torch.Tensor) -> torch.Tensor:
        seen.append(flat.cross_entropy_grad(z, features, labels))
        return F.cross_entropy(flat(z, features), labels)

    torch.func.vmap(torch.func.grad(loss))(torch.randn(2, flat.dim))  # lockstep clients' taped path
    assert seen == [None]
    def loss_of_inputs(inputs: torch.Tensor) -> torch.Tensor:  # differentiated in the inputs, the weights fixed
        seen.append(flat.cross_entropy_grad(torch.zeros(flat.dim), inputs, labels))
        return F.cross_entropy(flat(torch.zeros(flat.dim), inputs), labels)

    torch.func.grad(loss_of_inputs)(features)
    assert seen == [None, None]  # an untaped gradient would be a constant to the transform
    with_batchnorm = FlatModel(nn.Sequential(nn.Linear(6, 2), nn.BatchNorm1d(2)))
    assert with_batchnorm.cross_entropy_grad(torch.zeros(with_batchnorm.dim), features, labels) is None


def taped_and_untaped_under_vmap(
    flat: FlatModel, states: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
    in_dims: tuple[int | None, ...] = (0, 0, 0),
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Lockstep clients' gradients and losses, by ``vmap`` over ``torch.func.grad_and_value`` and untaped."""

    def taped(x: torch.Tensor, inputs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.func.grad_and_value(lambda z: F.cross_entropy(flat(z, inputs), y))(x)

    def untaped(x: torch.Tensor, inputs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        done = flat.cross_entropy_grad(x, inputs, y)
        assert done is not None
        return torch.cat([g.reshape(-1) for g in done[0]]), done[1]

    return (torch.func.vmap(taped, in_dims)(states, features, labels),
            torch.func.vmap(untaped, in_dims)(states, features, labels))


@pytest.mark.parametrize("widths", [[32, 64, 10], [1, 1, 2], [3, 1, 2], [2, 3, 4, 5, 6], [784, 200, 200, 10]])
@pytest.mark.parametrize("activation", list(ACTIVATIONS.values()), ids=list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_under_vmap_the_untaped_gradient_has_the_bits_of_torch_func(widths, activation, bias):
    """Lockstep clients' batched untaped gradients are those of ``vmap`` over ``torch.func.grad_and_value`` for every
    batch size and number of clients, and under nested ``vmap`` (a sweep's configurations), where ``torch.func``
    differentiates with autograd's kernels; with SiLU, whose derivative it decomposes, the flat model declines under
    ``vmap`` (and still answers eagerly)."""
    torch.manual_seed(len(widths) * 10 + bias)
    flat = FlatModel(perceptron(widths, activation, bias))
    cases = [(torch.randn(clients, flat.dim) * 0.5, torch.randn(clients, batch, widths[0]) * 3,
              torch.randint(0, widths[-1], (clients, batch))) for batch, clients in [(1, 1), (3, 2), (16, 5), (100, 3)]]
    if activation is nn.SiLU:
        states, features, labels = cases[-1]
        assert flat.cross_entropy_grad(states[0], features[0], labels[0]) is not None
        seen = []
        torch.func.vmap(lambda x, inputs, y: seen.append(flat.cross_entropy_grad(x, inputs, y)) or x)(states, features, labels)
        assert seen == [None]
        return
    for states, features, labels in cases:
        (grads, losses), (untaped_grads, untaped_losses) = taped_and_untaped_under_vmap(flat, states, features, labels)
        assert torch.equal(grads, untaped_grads) and torch.equal(losses, untaped_losses)
    states, features, labels = cases[2]
    configurations = torch.randn(2, *states.shape) * 0.5  # nested: a sweep's configurations, the inputs shared
    (grads, losses), (untaped_grads, untaped_losses) = torch.func.vmap(
        lambda s: taped_and_untaped_under_vmap(flat, s, features, labels))(configurations)
    assert torch.equal(grads, untaped_grads) and torch.equal(losses, untaped_losses)


def test_lockstep_clients_gradients_come_from_one_batched_pass_with_vmaps_bits(monkeypatch):
    """Under ``vmap`` on a CPU, with the state, inputs and labels stacked batch-first (as lockstep stacks clients, and a
    sweep configurations around them), the flat model answers every client by one batched pass
    (``MlpPlan.batched_cross_entropy``), inputs shared by the clients or configurations included; other layouts and
    negative labels (cross-entropy's ignored index) take the plan under ``vmap``. The bits are those of ``vmap`` over
    ``torch.func.grad_and_value`` every way."""
    torch.manual_seed(5)
    flat = FlatModel(perceptron([12, 9, 4]))
    calls: list[str] = []
    for name in ("cross_entropy", "batched_cross_entropy"):
        original = getattr(MlpPlan, name)
        monkeypatch.setattr(MlpPlan, name, lambda self, *args, _f=original, _n=name: calls.append(_n) or _f(self, *args))
    states, features, labels = torch.randn(3, flat.dim) * 0.5, torch.randn(3, 7, 12), torch.randint(0, 4, (3, 7))

    def both(in_dims: tuple[int | None, ...], *args: torch.Tensor) -> list[str]:
        calls.clear()
        (taped, taped_loss), (untaped, untaped_loss) = taped_and_untaped_under_vmap(flat, *args, in_dims=in_dims)
        assert torch.equal(taped, untaped) and torch.equal(taped_loss, untaped_loss)
        return list(calls)

    assert both((0, 0, 0), states, features, labels) == ["batched_cross_entropy"]
    assert both((0, None, None), states, features[0], labels[0]) == ["batched_cross_entropy"]  # shared inputs
    assert both((1, 0, 0), states.t().contiguous(), features, labels) == ["cross_entropy"]  # other kernels there
    ignored = labels.clone()
    ignored[1, 2] = -100
    assert both((0, 0, 0), states, features, ignored) == ["cross_entropy"]

    configurations = torch.randn(2, 3, flat.dim) * 0.5  # a sweep's: configurations around the clients
    for shared in (True, False):
        inputs = (features, labels) if shared else (torch.randn(2, 3, 7, 12), torch.randint(0, 4, (2, 3, 7)))
        calls.clear()
        (taped, taped_loss), (untaped, untaped_loss) = torch.func.vmap(
            lambda s, f, y: taped_and_untaped_under_vmap(flat, s, f, y), in_dims=(0, None, None) if shared else 0,
        )(configurations, *inputs)
        assert torch.equal(taped, untaped) and torch.equal(taped_loss, untaped_loss)
        assert calls == ["batched_cross_entropy"]
