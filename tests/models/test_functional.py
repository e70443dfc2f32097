"""FlatModel: parameters from a flat vector, BatchNorm running statistics as explicit state."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad

from fedcomp.models.functional import FlatModel
from fedcomp.models.resnet import init_flat, resnet20


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
    torch.testing.assert_close(flat.running, expected, rtol=1e-6, atol=1e-7)
    assert all(torch.equal(untouched[n], b) for n, b in module.named_buffers())  # the module's own: never written


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
