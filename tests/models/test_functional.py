"""FlatModel: parameters from a flat vector, BatchNorm running statistics as explicit state."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

from fedcomp.models.functional import FlatModel
from fedcomp.models.resnet import init_flat, resnet20
from fedcomp.platform.algorithms.steps import sgd_step_
from fedcomp.platform.oracles import FUSED_SGD


def small_bn_net(**bn: object) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, **bn), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4),
        nn.BatchNorm1d(4, **bn), nn.Linear(4, 2),
    )  # fmt: skip


def loaded(module: nn.Module, flat: FlatModel, w: torch.Tensor, running: torch.Tensor) -> nn.Module:
    """A copy of ``module`` holding the flat parameters ``w`` and running statistics ``running``."""
    copy_ = copy.deepcopy(module)
    stats = dict(zip(flat.buffer_names, running.split(flat.buffer_sizes)))
    copy_.load_state_dict({**flat.unflatten(w), **stats}, strict=False)
    return copy_


def test_training_forwards_move_the_running_statistics_as_batchnorm_moves_its_buffers():
    torch.manual_seed(0)
    module = small_bn_net(momentum=0.3)
    flat = FlatModel(module)
    assert flat.buffer_dim == 2 * (3 + 4) and flat.buffer_names[:2] == ["1.running_mean", "1.running_var"]
    assert torch.equal(flat.running, torch.tensor([0.0] * 3 + [1.0] * 3 + [0.0] * 4 + [1.0] * 4))
    untouched = {n: b.clone() for n, b in module.named_buffers()}
    w = flat.flatten()
    reference = loaded(module, flat, w, flat.running)
    for scale in (1.0, 3.0):  # two batches: the momentum rule applied twice
        batch = torch.randn(5, 2, 6, 6) * scale + 1
        torch.testing.assert_close(flat(w, batch), reference(batch))
    expected = torch.cat([b.reshape(-1) for n, b in reference.named_buffers() if b.is_floating_point()])
    assert torch.equal(flat.running, expected)  # the kernel nn.BatchNorm moves its buffers with: the same bits
    assert all(torch.equal(untouched[n], b) for n, b in module.named_buffers())  # the module's own: never written


def test_running_statistics_handed_out_stay_as_they_were():
    """A host keeps each client's statistics as ``running`` gave them; later training forwards move a new copy."""
    torch.manual_seed(6)
    flat = FlatModel(small_bn_net())
    w = flat.flatten()
    kept = flat.running
    snapshot = kept.clone()
    flat(w, torch.randn(5, 2, 6, 6))
    assert torch.equal(kept, snapshot) and not torch.equal(flat.running, snapshot)
    flat.running = kept
    flat(w, torch.randn(5, 2, 6, 6))
    assert torch.equal(kept, snapshot)


def test_inside_torch_func_the_recorded_statistics_follow_the_same_rule():
    """Under ``torch.func`` the statistics come from hooks and the rule applied outside the kernel: the kernel's
    numbers to float32 rounding (the kernel sums in its own order), in the same order of forwards."""
    torch.manual_seed(7)
    module = small_bn_net(momentum=0.3)
    by_kernel, by_hooks = FlatModel(module), FlatModel(copy.deepcopy(module))
    w, labels = by_kernel.flatten(), torch.randint(0, 2, (5,))
    for scale in (1.0, 2.0):
        batch = torch.randn(5, 2, 6, 6) * scale + 1
        by_kernel(w, batch)
        grad(lambda z, b=batch: F.cross_entropy(by_hooks(z, b), labels))(w)
    torch.testing.assert_close(by_hooks.running, by_kernel.running, rtol=1e-6, atol=1e-7)


def test_evaluation_normalises_with_the_running_statistics_and_leaves_them():
    torch.manual_seed(1)
    module = small_bn_net()
    flat = FlatModel(module)
    w = flat.flatten()
    flat.running = torch.rand(flat.buffer_dim) + 0.5
    batch = torch.randn(4, 2, 6, 6)
    before = flat.running.clone()
    with flat.evaluation():
        out = flat(w, batch)
        one = flat(w, batch[:1])
    assert module.training  # mode restored
    assert torch.equal(flat.running, before)
    reference = loaded(module, flat, w, before).eval()
    torch.testing.assert_close(out, reference(batch))
    torch.testing.assert_close(one, out[:1])  # no batch statistics: an example's output is its own


def test_statistics_are_plain_values_under_torch_func_grad_and_double_backward():
    model = resnet20(3, running_stats=True, in_channels=1)
    flat = FlatModel(model)
    w = init_flat(model, torch.Generator().manual_seed(0))
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    loss = lambda v: F.cross_entropy(flat(v, x), y)  # noqa: E731
    g = grad(loss)(w)
    after_one = flat.running
    assert not torch._C._functorch.is_functorch_wrapped_tensor(after_one)
    w_ = w.clone().requires_grad_(True)
    (reference,) = torch.autograd.grad(loss(w_), w_, create_graph=True)
    torch.testing.assert_close(g, reference.detach())
    (hvp,) = torch.autograd.grad(reference.sum(), w_)  # double backward through batch statistics
    assert torch.isfinite(hvp).all()
    # two more training forwards (the autograd ones): the same batch moves the statistics by the same rule
    m = 0.1
    mean1 = after_one[:16]
    torch.testing.assert_close(flat.running[:16], (1 - m) * mean1 + m * (mean1 / m), rtol=1e-5, atol=1e-6)


def test_a_model_without_running_statistics_has_none():
    flat = FlatModel(small_bn_net(track_running_stats=False))
    assert flat.buffer_dim == 0 and flat.running.numel() == 0
    w, batch = flat.flatten(), torch.randn(4, 2, 6, 6)
    with flat.evaluation():
        evaluated = flat(w, batch)
    torch.testing.assert_close(evaluated, flat(w, batch))  # batch statistics in both modes


def test_cumulative_batchnorm_is_refused():
    with pytest.raises(ValueError, match="BatchNorm '1' has momentum=None"):
        FlatModel(small_bn_net(momentum=None))


# -- in-place steps: the parameters' gradients without a flat leaf -------------------------------------------


def flat_leaf_grad(flat: FlatModel, loss, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the flat-leaf path gives: d loss / dw by autograd on a flat leaf vector, and the loss."""
    leaf = w.detach().requires_grad_(True)
    value = loss(leaf)
    return torch.autograd.grad(value, leaf)[0], value.detach()


def as_flat(pieces: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for p in pieces])


@pytest.mark.parametrize("widths", [[5, 16, 16, 3], [4, 1, 2]])
def test_grad_pieces_are_the_flat_leaf_gradient_bit_for_bit(widths):
    from fedcomp.models.mlp import mlp

    torch.manual_seed(3)
    flat = FlatModel(mlp(widths))
    w = torch.randn(flat.dim)
    inputs, labels = torch.randn(7, widths[0]), torch.randint(0, widths[-1], (7,))

    def loss(z):
        return F.cross_entropy(flat(z, inputs), labels)

    expected, value = flat_leaf_grad(flat, loss, w)
    grads, got = flat.grad_pieces(loss, w)
    assert [g.shape for g in grads] == [p.shape for p in flat.pieces(w)] == list(flat.shapes)
    assert torch.equal(as_flat(grads), expected) and torch.equal(got, value)
    assert flat.direct_ok


def test_grad_pieces_move_batchnorm_statistics_as_the_flat_leaf_path_does():
    torch.manual_seed(4)
    module = small_bn_net(momentum=0.2)
    one, two = FlatModel(module), FlatModel(copy.deepcopy(module))
    w, batch, labels = one.flatten(), torch.randn(5, 2, 6, 6), torch.randint(0, 2, (5,))
    expected, _ = flat_leaf_grad(one, lambda z: F.cross_entropy(one(z, batch), labels), w)
    grads, _ = two.grad_pieces(lambda z: F.cross_entropy(two(z, batch), labels), w)
    assert torch.equal(as_flat(grads), expected)
    assert torch.equal(one.running, two.running) and not torch.equal(two.running, two.initial_buffers())


def test_grad_pieces_decline_a_loss_that_uses_the_vector_besides_one_model_call():
    from fedcomp.models.mlp import mlp

    torch.manual_seed(5)
    module = small_bn_net()
    flat = FlatModel(module)
    w, batch = flat.flatten(), torch.randn(3, 2, 6, 6)
    before = flat.running.clone()
    assert flat.grad_pieces(lambda z: flat(z, batch).sum() + z.pow(2).sum(), w) is None  # x used directly too
    assert not flat.direct_ok and torch.equal(flat.running, before)  # the declined call left no statistics
    assert flat.grad_pieces(lambda z: flat(z, batch).sum(), w) is None  # declines for good

    twice = FlatModel(mlp([3, 4, 2]))
    x = torch.randn(twice.dim)
    assert twice.grad_pieces(lambda z: twice(z, torch.ones(2, 3)).sum() + twice(z, torch.zeros(2, 3)).sum(), x) is None
    under_vmap = FlatModel(mlp([3, 4, 2]))
    torch.func.grad(lambda z: under_vmap(z, torch.ones(2, 3)).sum())(x)  # transforms keep the functional path
    assert under_vmap.direct_ok


def exact_step(flat: FlatModel, loss, w: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact in-place step (what ``federation.fused_sgd: false`` takes): parameters' gradients, then x - lr g."""
    w = w.clone()
    grads, value = flat.grad_pieces(loss, w)
    torch._foreach_add_(flat.pieces(w), grads, alpha=-lr)
    return w, value


class _Recording:
    """A model that counts whether each :meth:`FlatModel.factored_grad_pieces` call factored the gradient."""

    def __init__(self, flat: FlatModel) -> None:
        self.flat, self.taken = flat, []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.flat, name)

    def factored_grad_pieces(self, loss, x):  # type: ignore[no-untyped-def]
        done = self.flat.factored_grad_pieces(loss, x)
        self.taken.append(done is not None)
        return done


def fused_sgd_(flat: FlatModel, loss, x: torch.Tensor, lr: float) -> torch.Tensor | None:
    """``steps.sgd_step_`` under ``federation.fused_sgd`` in place on x, on a problem with this model and loss: the
    loss before the step, or None where the model did not factor the gradient (the exact step was taken then)."""
    recording = _Recording(flat)
    token = FUSED_SGD.set(True)
    try:
        value = sgd_step_(SimpleNamespace(model=recording, loss=loss), x, (), lr)
    finally:
        FUSED_SGD.reset(token)
    return value if recording.taken == [True] else None


def assert_same_step(flat: FlatModel, fused: torch.Tensor, exact: torch.Tensor, linear_weights: set[str]) -> None:
    """Every parameter bit for bit but the plain linear layers' weights, which agree up to float32 rounding."""
    for name, a, b in zip(flat.names, flat.pieces(fused), flat.pieces(exact)):
        if name in linear_weights:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        else:
            assert torch.equal(a, b), name


@pytest.mark.parametrize("widths", [[5, 16, 16, 3], [32, 256, 256, 10]])
def test_fused_sgd_step_is_the_exact_step_up_to_rounding_in_the_linear_weights(widths):
    from fedcomp.models.mlp import mlp

    torch.manual_seed(6)
    flat = FlatModel(mlp(widths))
    w = flat.flatten()
    inputs, labels = torch.randn(16, widths[0]), torch.randint(0, widths[-1], (16,))

    def loss(z):
        return F.cross_entropy(flat(z, inputs), labels)

    fused = w.clone()
    value = fused_sgd_(flat, loss, fused, 0.1)
    exact, expected = exact_step(flat, loss, w, 0.1)
    assert value is not None and torch.equal(value, expected)  # the loss before the step: the same forward pass
    assert_same_step(flat, fused, exact, {n for n in flat.names if n.endswith("weight")})
    for _ in range(4):  # from the second step on, every parameter moves from slightly different weights
        assert fused_sgd_(flat, loss, fused, 0.1) is not None
        exact, _ = exact_step(flat, loss, exact, 0.1)
    torch.testing.assert_close(fused, exact, rtol=1e-5, atol=1e-6)
    assert not torch.equal(fused, w) and flat.direct_ok


def test_fused_sgd_step_of_one_linear_layer_is_the_hand_computed_step():
    """W <- W - lr g^T a, b <- b - lr sum(g), with g the loss's gradient at the layer's outputs: for
    0.5 * mean over rows of ||W a + b - t||^2, g = (W a + b - t) / rows."""
    torch.manual_seed(7)
    layer = nn.Linear(3, 2)
    flat = FlatModel(layer)
    w = flat.flatten()
    a, t = torch.randn(5, 3), torch.randn(5, 2)
    weight, bias = (v.double() for v in flat.pieces(w))
    g = (a.double() @ weight.T + bias - t.double()) / 5
    expected_weight, expected_bias = weight - 0.2 * g.T @ a.double(), bias - 0.2 * g.sum(0)
    assert fused_sgd_(flat, lambda z: 0.5 * (flat(z, a) - t).pow(2).sum(1).mean(), w, 0.2) is not None
    got_weight, got_bias = flat.pieces(w)
    torch.testing.assert_close(got_weight.double(), expected_weight, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_bias.double(), expected_bias, rtol=0, atol=1e-6)


def test_fused_sgd_step_of_a_network_with_batchnorm_steps_the_rest_exactly_and_moves_the_same_statistics():
    torch.manual_seed(8)
    module = small_bn_net(momentum=0.2)
    one, two = FlatModel(module), FlatModel(copy.deepcopy(module))
    w, batch, labels = one.flatten(), torch.randn(5, 2, 6, 6), torch.randint(0, 2, (5,))
    exact, _ = exact_step(one, lambda z: F.cross_entropy(one(z, batch), labels), w, 0.3)
    fused = w.clone()
    assert fused_sgd_(two, lambda z: F.cross_entropy(two(z, batch), labels), fused, 0.3) is not None
    assert_same_step(two, fused, exact, {"4.weight", "6.weight"})
    assert torch.equal(one.running, two.running) and not torch.equal(two.running, two.initial_buffers())


class _SameLayerTwice(nn.Module):
    """One linear layer applied twice, on inputs with two leading dimensions."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(torch.tanh(self.layer(x)))


def test_fused_sgd_step_of_a_layer_called_twice_on_batched_sequences_takes_both_calls_factors():
    torch.manual_seed(9)
    flat = FlatModel(_SameLayerTwice())
    w, inputs = flat.flatten(), torch.randn(2, 3, 4)

    def loss(z):
        return flat(z, inputs).pow(2).mean()

    exact, _ = exact_step(flat, loss, w, 0.5)
    fused = w.clone()
    assert fused_sgd_(flat, loss, fused, 0.5) is not None
    assert_same_step(flat, fused, exact, {"layer.weight"})
    assert not torch.equal(fused, w)


class _WeightAlsoPenalised(nn.Module):
    """A layer without a bias, then one whose weight the forward pass also uses directly (a penalty on it)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(3, 4, bias=False), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x))) + self.second.weight.pow(2).sum()


def test_fused_sgd_step_adds_a_weights_own_gradient_to_its_factors_and_skips_a_missing_bias():
    torch.manual_seed(12)
    flat = FlatModel(_WeightAlsoPenalised())
    w, inputs = flat.flatten(), torch.randn(5, 3)

    def loss(z):
        return flat(z, inputs).pow(2).mean()

    exact, _ = exact_step(flat, loss, w, 0.5)
    fused = w.clone()
    assert fused_sgd_(flat, loss, fused, 0.5) is not None
    assert_same_step(flat, fused, exact, {"first.weight", "second.weight"})
    assert not torch.equal(fused, w)


def test_fused_sgd_step_declines_as_grad_pieces_does_and_leaves_everything_as_it_was():
    torch.manual_seed(10)
    flat = FlatModel(small_bn_net())
    w, batch = flat.flatten(), torch.randn(3, 2, 6, 6)
    x, before = w.clone(), flat.running.clone()
    assert flat.factored_grad_pieces(lambda z: flat(z, batch).sum() + z.pow(2).sum(), x) is None  # x used directly too
    assert torch.equal(x, w) and torch.equal(flat.running, before) and not flat.direct_ok
    assert all("forward" not in vars(m) for m in flat.module.modules())  # the layers have their own forward back


def test_a_model_of_linear_weights_only_is_not_factored_and_takes_the_exact_step():
    """Every parameter a plain linear weight: nothing would be left to step as it is, so the model declines at once
    (and keeps taking its pieces' path)."""
    torch.manual_seed(13)
    flat = FlatModel(nn.Sequential(nn.Linear(3, 4, bias=False), nn.Tanh(), nn.Linear(4, 2, bias=False)))
    w, inputs = flat.flatten(), torch.randn(5, 3)

    def loss(z):
        return flat(z, inputs).pow(2).mean()

    assert flat.factored_grad_pieces(loss, w.clone()) is None and flat.direct_ok
    exact, _ = exact_step(flat, loss, w, 0.5)
    fused = w.clone()
    assert fused_sgd_(flat, loss, fused, 0.5) is None and torch.equal(fused, exact)


class _OneLayerUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_a_linear_layer_the_loss_does_not_call_gets_zeros_not_factors():
    """As :meth:`FlatModel.grad_pieces` gives it (a momentum step then still scales that weight's buffer)."""
    torch.manual_seed(14)
    flat = FlatModel(_OneLayerUnused())
    w, inputs = flat.flatten(), torch.randn(4, 3)
    grads, factors, _ = flat.factored_grad_pieces(lambda z: flat(z, inputs).pow(2).mean(), w)
    unused = flat.names.index("unused.weight")
    assert list(factors) == [flat.names.index("used.weight")] and len(factors[flat.names.index("used.weight")]) == 1
    assert torch.equal(grads[unused], torch.zeros(2, 3)) and grads[flat.names.index("used.weight")] is None


def test_fused_sgd_step_of_a_model_with_tied_weights_is_the_exact_step():
    torch.manual_seed(11)
    module = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))
    module[2].weight = module[0].weight
    flat = FlatModel(module)
    w, inputs = flat.flatten(), torch.randn(4, 3)

    def loss(z):
        return flat(z, inputs).pow(2).mean()

    exact, _ = exact_step(flat, loss, w, 0.5)
    fused = w.clone()
    assert fused_sgd_(flat, loss, fused, 0.5) is not None and torch.equal(fused, exact)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def test_calls_equal_functional_call_bit_for_bit_under_grad_and_vmap_and_leave_the_module_as_it_was():
    model = FlatModel(_mlp())
    own = [p.detach().clone() for p in model.module.parameters()]
    x = torch.randn(model.dim, generator=torch.Generator().manual_seed(1))
    batch = torch.randn(5, 6, generator=torch.Generator().manual_seed(2))

    def reference(v: torch.Tensor) -> torch.Tensor:
        return functional_call(model.module, model.unflatten(v), (batch,)).square().sum()

    def ours(v: torch.Tensor) -> torch.Tensor:
        return model(v, batch).square().sum()

    assert torch.equal(ours(x), reference(x))
    assert torch.equal(grad(ours)(x), grad(reference)(x))
    xs = torch.stack([x, 2 * x])
    assert torch.equal(torch.func.vmap(grad(ours))(xs), torch.func.vmap(grad(reference))(xs))
    assert all(isinstance(p, nn.Parameter) and torch.equal(p, o) for p, o in zip(model.module.parameters(), own))


def test_a_forward_that_raises_still_puts_the_modules_parameters_back():
    model = FlatModel(_mlp())
    own = list(model.module.parameters())
    with pytest.raises(RuntimeError):
        model(torch.zeros(model.dim), torch.zeros(5, 7))  # 7 features where the first layer takes 6
    assert all(p is o for p, o in zip(model.module.parameters(), own))


def test_tied_parameters_go_through_functional_call():
    module = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    module[1].weight = module[0].weight
    model = FlatModel(module)
    assert model.dim == 16 and model._slots is None
    x = torch.randn(16)
    inputs = torch.randn(2, 4)
    w = x.view(4, 4)
    assert torch.allclose(model(x, inputs), inputs @ w.T @ w.T)


@pytest.mark.parametrize("training", [True, False])
def test_the_direct_swap_gives_functional_calls_outputs_and_statistics_for_a_batchnorm_net(training):
    torch.manual_seed(0)
    direct, through = FlatModel(small_bn_net()), FlatModel(small_bn_net())
    through._slots = None  # every call through functional_call, the reference
    assert direct._slots is not None and any("running_mean" in name for name in direct._slots)
    x = direct.flatten()
    own = list(direct.module.buffers())
    inputs = torch.randn(4, 2, 6, 6, generator=torch.Generator().manual_seed(3))
    for model in (direct, through):
        model.module.train(training)
    for _ in range(2):
        assert torch.equal(direct(x, inputs), through(x, inputs))
    assert torch.equal(direct.running, through.running)
    assert all(b is o for b, o in zip(direct.module.buffers(), own, strict=True))  # the module's own, put back
