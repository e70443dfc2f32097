"""Second-order oracles against finite differences."""

from __future__ import annotations

import torch

from fedcomp.platform.oracles import grad_xy, hvp_yy, jvp_xy


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
