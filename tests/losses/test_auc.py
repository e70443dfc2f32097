"""AUC and AP losses: gradients vs finite differences, the AUC saddle point vs its closed form, and the
AP surrogate's gradient vs D-AUPRC's weighted form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedcomp.losses.auc import (
    ap_surrogate_loss,
    ap_weighted_surrogate,
    auc_optimum,
    auc_square_loss,
    class_weighted_bce,
)

D = torch.float64


def batch(n: int = 12, positives: int = 4, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, generator=gen, dtype=D)
    labels = torch.zeros(n, dtype=torch.long)
    labels[torch.randperm(n, generator=gen)[:positives]] = 1
    return scores, labels


def auc_grads(scores, labels, a, b, alpha, prior, **kw):
    a, b, alpha = (t.clone().requires_grad_(True) for t in (a, b, alpha))
    loss = auc_square_loss(scores, labels, a, b, alpha, prior, **kw)
    return torch.autograd.grad(loss, (a, b, alpha))


def test_paper_form_matches_its_formula_with_pm1_labels():
    scores, labels = batch()
    a, b, alpha, p = torch.tensor(0.3, dtype=D), torch.tensor(0.6, dtype=D), torch.tensor(-0.2, dtype=D), 0.25
    y = 2 * labels - 1  # the paper's +-1 labels
    by_hand = torch.stack([
        (1 - p) * (h - a) ** 2 * (yi == 1) + p * (h - b) ** 2 * (yi == -1)
        + 2 * (1 + alpha) * (p * h * (yi == -1) - (1 - p) * h * (yi == 1)) - p * (1 - p) * alpha**2
        for h, yi in zip(scores, y)
    ]).mean()
    torch.testing.assert_close(auc_square_loss(scores, labels, a, b, alpha, p), by_hand)


def test_margin_form_matches_libauc_v1_formula():
    scores, labels = batch(seed=1)
    a, b, alpha, p, m = torch.tensor(0.1, dtype=D), torch.tensor(0.4, dtype=D), torch.tensor(0.7, dtype=D), 0.3, 0.8
    pos, neg = labels == 1, labels == 0
    by_hand = ((1 - p) * ((scores - a) ** 2 * pos).mean() + p * ((scores - b) ** 2 * neg).mean()
               + 2 * alpha * (p * (1 - p) * m + (p * scores * neg - (1 - p) * scores * pos).mean())
               - p * (1 - p) * alpha**2)
    got = auc_square_loss(scores, labels, a, b, alpha, p, form="margin", margin=m)
    torch.testing.assert_close(got, by_hand)


@pytest.mark.parametrize("form", ["paper", "margin"])
def test_auc_loss_gradient_matches_finite_differences(form):
    scores, labels = batch(seed=2)
    params = (scores.clone().requires_grad_(True), *(torch.randn((), dtype=D, requires_grad=True) for _ in range(3)))

    def fn(h, a, b, alpha):
        return auc_square_loss(h, labels, a, b, alpha, 0.2, form=form, margin=0.7)

    assert torch.autograd.gradcheck(fn, params)


@pytest.mark.parametrize("form", ["paper", "margin"])
@pytest.mark.parametrize("prior", [None, 0.15])  # None: the batch's own positive fraction
def test_auc_optimum_is_a_stationary_saddle_point(form, prior):
    scores, labels = batch(n=20, positives=5, seed=3)
    p = float(labels.float().mean()) if prior is None else prior
    opt = auc_optimum(scores, labels, p, form=form, margin=0.5)
    # closed form
    torch.testing.assert_close(opt.a, scores[labels == 1].mean())
    torch.testing.assert_close(opt.b, scores[labels == 0].mean())
    if prior is None:  # p = batch fraction: alpha* = E[h | neg] - E[h | pos] (+ margin)
        expected = scores[labels == 0].mean() - scores[labels == 1].mean() + (0.5 if form == "margin" else 0.0)
        torch.testing.assert_close(opt.alpha, expected)
    # gradients vanish at the saddle
    for g in auc_grads(scores, labels, *opt, p, form=form, margin=0.5):
        assert abs(float(g)) < 1e-12
    # min in (a, b), max in alpha: F(a*, b*, alpha) <= F(a*, b*, alpha*) <= F(a, b, alpha*)
    gen = torch.Generator().manual_seed(4)
    value = auc_square_loss(scores, labels, *opt, p, form=form, margin=0.5)
    for _ in range(50):
        da, db, dal = torch.randn(3, generator=gen, dtype=D)
        lower = auc_square_loss(scores, labels, opt.a, opt.b, opt.alpha + dal, p, form=form, margin=0.5)
        upper = auc_square_loss(scores, labels, opt.a + da, opt.b + db, opt.alpha, p, form=form, margin=0.5)
        assert lower < value < upper


def test_auc_optimum_needs_both_classes_and_bad_arguments_are_one_line():
    scores = torch.rand(5, dtype=D)
    with pytest.raises(ValueError, match="needs both classes"):
        auc_optimum(scores, torch.ones(5, dtype=torch.long), 0.5)
    zero = torch.zeros((), dtype=D)
    with pytest.raises(ValueError, match=r"prior = 1\.5: must be a number strictly between 0 and 1"):
        auc_square_loss(scores, torch.ones(5), zero, zero, zero, 1.5)
    with pytest.raises(ValueError, match=r"form = 'hinge': allowed: 'paper', 'margin'"):
        auc_square_loss(scores, torch.ones(5), zero, zero, zero, 0.5, form="hinge")


def ap_by_hand(pos_scores, scores, labels, s):
    total = 0.0
    for hi in pos_scores:
        ell = [max(s - (hi - hj), 0.0) ** 2 for hj in scores]
        total += sum(l for l, y in zip(ell, labels) if y == 1) / sum(ell)
    return -total / len(pos_scores)


def test_ap_surrogate_matches_its_definition():
    scores, labels = batch(n=10, positives=3, seed=5)
    pos_scores = scores[labels == 1]
    got = ap_surrogate_loss(pos_scores, scores, labels, margin=0.3)
    assert abs(float(got) - ap_by_hand(pos_scores.tolist(), scores.tolist(), labels.tolist(), 0.3)) < 1e-12


def test_ap_surrogate_gradient_matches_finite_differences_and_weighted_form():
    scores, labels = batch(n=16, positives=5, seed=6)
    order = torch.argsort(-labels, stable=True)  # positives first, as in D-AUPRC's batches
    scores, labels = scores[order], labels[order]

    def via_batch(h):  # outer = the batch's first 5 (positives), inner = the whole batch
        return ap_surrogate_loss(h[:5], h, labels, margin=0.5)

    h = scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(via_batch, (h,))
    (g_loss,) = torch.autograd.grad(via_batch(h), h)
    (g_weighted,) = torch.autograd.grad(ap_weighted_surrogate(h[:5], h, labels, margin=0.5), h)
    torch.testing.assert_close(g_weighted, g_loss, rtol=1e-10, atol=1e-12)
    assert g_loss.abs().sum() > 0


def test_ap_surrogate_with_separate_inner_scores_and_an_isolated_positive():
    gen = torch.Generator().manual_seed(7)
    pos_scores = torch.tensor([0.9, 0.5, 0.2], dtype=D, requires_grad=True)
    inner = torch.rand(8, generator=gen, dtype=D) * 0.4
    inner.requires_grad_(True)
    labels = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0])
    assert torch.autograd.gradcheck(lambda p, s: ap_surrogate_loss(p, s, labels, margin=0.3), (pos_scores, inner))
    # the positive at 0.9 has no inner score within the margin: u_all = 0, precision 1, zero gradient
    loss = ap_surrogate_loss(pos_scores, inner, labels, margin=0.3)
    g_pos, g_inner = torch.autograd.grad(loss, (pos_scores, inner))
    assert g_pos[0] == 0 and torch.isfinite(g_inner).all()
    rest = ap_surrogate_loss(pos_scores[1:].detach(), inner.detach(), labels, margin=0.3)
    torch.testing.assert_close(loss.detach(), (-1 + 2 * rest) / 3)
    weighted = ap_weighted_surrogate(pos_scores, inner, labels, 0.3)
    g_w_pos, g_w_inner = torch.autograd.grad(weighted, (pos_scores, inner))
    torch.testing.assert_close(g_w_pos, g_pos)
    torch.testing.assert_close(g_w_inner, g_inner)


def test_class_weighted_bce_and_its_gradient():
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(9, generator=gen, dtype=D, requires_grad=True)
    labels = torch.tensor([1, 0, 0, 1, 0, 0, 0, 1, 0])
    weights = torch.tensor([0.5, 3.0], dtype=D)
    per_example = [weights[y] * F.binary_cross_entropy_with_logits(z, y.to(D)) for z, y in zip(logits, labels)]
    by_hand = torch.stack(per_example).mean()
    torch.testing.assert_close(class_weighted_bce(logits, labels, weights), by_hand)
    assert torch.autograd.gradcheck(lambda z: class_weighted_bce(z, labels, weights), (logits,))
    torch.testing.assert_close(class_weighted_bce(logits, labels, torch.ones(2, dtype=D)),
                               F.binary_cross_entropy_with_logits(logits, labels.to(D)))
    with pytest.raises(ValueError, match=r"weights of shape \(3,\): must have shape \[2\]"):
        class_weighted_bce(logits, labels, torch.ones(3))
