"""Second-order oracles against finite differences."""

from __future__ import annotations

import torch

from fedcomp.platform.oracles import Pieces, grad_xy, hvp_yy, jvp_xy


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
