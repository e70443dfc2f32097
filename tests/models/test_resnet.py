"""ResNet20: parameter count, pickling, forward shapes, flat views, explicit BatchNorm statistics."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

from fedcomp.models.functional import FlatModel
from fedcomp.models.resnet import ShortcutA, init_flat, resnet20


@pytest.mark.parametrize(("outputs", "count"), [(10, 269_722), (1, 269_137), (100, 275_572)])
def test_parameter_count_is_the_standard_resnet20(outputs, count):
    assert sum(p.numel() for p in resnet20(outputs).parameters()) == count
    assert sum(p.numel() for p in resnet20(outputs, running_stats=True).parameters()) == count


def test_pickles_and_runs_forward():
    torch.manual_seed(0)
    model = resnet20(10)
    clone = pickle.loads(pickle.dumps(model))
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    torch.testing.assert_close(clone(x), out)
    assert not any(name for name, _ in model.named_buffers())  # batch statistics only by default
    assert sum(isinstance(m, ShortcutA) for m in model.modules()) == 2


def test_option_a_shortcut_subsamples_and_pads_channels():
    x = torch.arange(2 * 16 * 4 * 4, dtype=torch.float32).view(2, 16, 4, 4)
    y = ShortcutA(8)(x)
    assert y.shape == (2, 32, 2, 2)
    assert torch.equal(y[:, 8:24], x[:, :, ::2, ::2]) and not y[:, :8].any() and not y[:, 24:].any()


def test_flat_model_gradient_flows_and_init_is_seeded():
    model = resnet20(10)
    flat = FlatModel(model)
    w1 = init_flat(model, torch.Generator().manual_seed(1))
    w2 = init_flat(model, torch.Generator().manual_seed(1))
    assert w1.shape == (flat.dim,) and torch.equal(w1, w2)
    assert not torch.equal(w1, init_flat(model, torch.Generator().manual_seed(2), "xavier"))
    conv = flat.unflatten(w1)["layer2.0.conv1.weight"]
    assert abs(float(conv.std()) - (2 / (16 * 9)) ** 0.5) < 0.01  # He-normal, fan-in 16 * 3 * 3
    assert torch.equal(flat.unflatten(w1)["bn1.weight"], torch.ones(16))
    w = w1.clone().requires_grad_(True)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    loss = F.cross_entropy(flat(w, x), y)
    (grad,) = torch.autograd.grad(loss, w)
    assert grad.shape == w.shape and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_batch_statistics_model_ignores_eval_mode():
    model = resnet20(3)
    x = torch.randn(6, 3, 32, 32)
    train_out = model(x)
    model.eval()
    torch.testing.assert_close(model(x), train_out)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_outputs = 0"):
        resnet20(0)
    with pytest.raises(ValueError, match="scheme = 'orthogonal'"):
        init_flat(resnet20(), torch.Generator(), "orthogonal")
    flat = FlatModel(resnet20(running_stats=True))
    with pytest.raises(ValueError, match=r"running statistics of shape \(3,\): the model needs \(1376,\)"):
        flat.running = torch.zeros(3)


@pytest.mark.parametrize("running_stats", [False, True])
def test_torch_func_grad_works_through_the_flat_views(running_stats):
    from torch.func import grad

    model = resnet20(4, running_stats=running_stats)
    flat = FlatModel(model)
    w = init_flat(model, torch.Generator().manual_seed(3))
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 3])
    loss = lambda v: F.cross_entropy(flat(v, x), y)  # noqa: E731
    w_ = w.clone().requires_grad_(True)
    (reference,) = torch.autograd.grad(loss(w_), w_)
    torch.testing.assert_close(grad(loss)(w), reference)
