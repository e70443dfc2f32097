"""DRO objectives: composed values vs direct formulas and inner maximisations, gradients vs finite differences."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
import torch.nn.functional as F

from fedcomp.losses.dro import (
    chi2_dro,
    chi2_feasible,
    chi2_value,
    eo_constraints,
    eo_inner,
    eo_outer,
    eo_plain,
    eo_value,
    kl_dro,
    kl_inner,
    kl_rescale,
    kl_value,
    robust_loss,
    robust_weights,
)

D = torch.float64


def problem(seed: int = 0, m: int = 12, d: int = 5, classes: int = 4):
    """Per-example cross-entropy losses of a linear model as a function of flat parameters x."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, d, generator=gen, dtype=D)
    y = torch.randint(0, classes, (m,), generator=gen)
    x0 = torch.randn(d * classes, generator=gen, dtype=D) * 0.5

    def losses(x):
        return F.cross_entropy(a @ x.view(d, classes), y, reduction="none")

    return losses, x0


def fd_grad(fn, x, eps=1e-6):
    return torch.stack([(fn(x + eps * e) - fn(x - eps * e)) / (2 * eps) for e in torch.eye(x.numel(), dtype=x.dtype)])


def autograd(fn, x):
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(x), x)
    return g


# ---------------------------------------------------------------------------------------------- KL


@pytest.mark.parametrize("shift", [0.0, 1.5, -3.0, 40.0])
@pytest.mark.parametrize("lam", [0.2, 1.0, 5.0])
def test_kl_composed_equals_direct_and_the_inner_maximisation(lam, shift):
    losses = torch.rand(20, dtype=D, generator=torch.Generator().manual_seed(1)) * 4
    composed = kl_dro(lam, shift=shift).value(losses)
    direct = lam * torch.log(torch.exp(losses / lam).mean())
    torch.testing.assert_close(composed, direct)
    torch.testing.assert_close(kl_value(losses, lam), direct)
    p = torch.softmax(losses / lam, 0)  # the maximiser of sum p l - lam sum p log(m p)
    torch.testing.assert_close((p * losses).sum() - lam * (p * torch.log(20 * p)).sum(), direct)
    torch.testing.assert_close(kl_dro(lam, shift=shift, scale="paper").value(losses), direct / lam)
    assert kl_dro(lam).inner(losses).shape == (1,)


@pytest.mark.parametrize("scale", ["lambda", "paper"])
def test_kl_gradient_matches_finite_differences_and_shift_leaves_it_unchanged(scale):
    losses, x0 = problem()
    lam = 0.7
    grads = []
    for shift in (0.0, 2.0, 9.0):
        phi = kl_dro(lam, shift=shift, scale=scale)
        objective = lambda x: phi.value(losses(x))  # noqa: B023, E731
        g = autograd(objective, x0)
        torch.testing.assert_close(g, fd_grad(objective, x0), rtol=1e-6, atol=1e-8)
        grads.append(g)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grads[0], grads[2], rtol=1e-12, atol=1e-14)


def test_kl_chain_rule_grad_f_of_g_times_grad_g_is_shift_invariant():
    losses, x0 = problem(seed=3)
    lam = 0.5
    for shift in (0.0, 4.0):
        x = x0.clone().requires_grad_(True)
        g = kl_inner(losses(x), lam, shift)
        (jac,) = torch.autograd.grad(g.sum(), x)
        z = g.detach().requires_grad_(True)
        (df,) = torch.autograd.grad(kl_dro(lam, shift=shift).outer(z), z)
        if shift == 0.0:
            reference = df * jac
        else:
            torch.testing.assert_close(df * jac, reference)


def test_shift_prevents_overflow_in_float32():
    losses = torch.tensor([95.0, 100.0, 103.0])
    lam = 0.1
    assert not torch.isfinite(kl_inner(losses, lam)).all()  # exp(1030) overflows
    shifted = kl_dro(lam, shift=103.0).value(losses)
    torch.testing.assert_close(shifted, kl_value(losses, lam))
    assert torch.isfinite(shifted)


def test_kl_rescale_moves_an_inner_estimate_to_a_new_shift():
    losses = torch.rand(7, dtype=D) * 3
    y_old = kl_inner(losses, 0.4, shift=1.0)
    torch.testing.assert_close(kl_rescale(y_old, 0.4, 1.0, 2.5), kl_inner(losses, 0.4, shift=2.5))


def test_client_means_of_g_average_to_the_global_g():
    losses = torch.rand(24, dtype=D) * 2
    lam, shift = 0.3, 1.0
    per_client = torch.stack([kl_inner(part, lam, shift) for part in losses.view(4, 6)])
    torch.testing.assert_close(per_client.mean(0), kl_inner(losses, lam, shift))


# -------------------------------------------------------------------------------------------- chi^2


@pytest.mark.parametrize("lam", [3.0, 10.0])
def test_chi2_derived_form_is_the_inner_maximum(lam):
    losses = torch.rand(15, dtype=D, generator=torch.Generator().manual_seed(2)) * 2
    assert chi2_feasible(losses, lam)
    m = losses.numel()
    p = 1 / m + (losses - losses.mean()) / (lam * m)
    assert (p >= 0).all() and torch.isclose(p.sum(), torch.tensor(1.0, dtype=D))
    maximum = (p * losses).sum() - lam * (m / 2) * ((p - 1 / m) ** 2).sum()
    composed = chi2_dro(lam).value(losses)
    torch.testing.assert_close(composed, maximum)
    torch.testing.assert_close(chi2_value(losses, lam), losses.mean() + losses.var(unbiased=False) / (2 * lam))
    torch.testing.assert_close(composed, chi2_value(losses, lam))
    # the paper's printed eq. (5): the negated variance term, without the mean loss
    printed = chi2_dro(lam, variant="as_printed").value(losses)
    torch.testing.assert_close(printed, -losses.var(unbiased=False) / (2 * lam))
    torch.testing.assert_close(printed, chi2_value(losses, lam, "as_printed"))
    # the FastDRO penalised chi^2 best response agrees with the closed form when it is feasible
    torch.testing.assert_close(robust_loss(losses, geometry="chi2", size=math.inf, reg=lam), maximum)


@pytest.mark.parametrize("variant", ["derived", "as_printed"])
def test_chi2_gradient_matches_finite_differences(variant):
    losses, x0 = problem(seed=4)
    phi = chi2_dro(2.0, variant=variant)
    objective = lambda x: phi.value(losses(x))  # noqa: E731
    torch.testing.assert_close(autograd(objective, x0), fd_grad(objective, x0), rtol=1e-6, atol=1e-8)
    direct = lambda x: chi2_value(losses(x), 2.0, variant)  # noqa: E731
    torch.testing.assert_close(autograd(objective, x0), autograd(direct, x0))


def test_chi2_closed_form_overestimates_when_the_simplex_binds():
    losses = torch.tensor([0.0, 0.0, 0.0, 5.0], dtype=D)
    lam = 1.0
    assert not chi2_feasible(losses, lam)
    exact = robust_loss(losses, geometry="chi2", size=math.inf, reg=lam)
    assert exact < chi2_value(losses, lam)  # the closed form maximises over the affine hull


# ------------------------------------------------------------------------------------------ FastDRO


def test_cvar_without_regulariser_averages_the_top_losses():
    losses = torch.tensor([0.3, 2.0, 1.0, 4.0, 0.5, 3.0, 0.1, 0.2], dtype=D)
    torch.testing.assert_close(robust_loss(losses, geometry="cvar", size=0.25), torch.tensor(3.5, dtype=D))
    p = robust_weights(losses, geometry="cvar", size=0.3)  # alpha m = 2.4: 2 full weights and a remainder
    torch.testing.assert_close(p[[3, 5]], torch.full((2,), 1 / 2.4, dtype=D))
    torch.testing.assert_close(p[1], torch.tensor(1 - 2 / 2.4, dtype=D))
    torch.testing.assert_close(robust_loss(losses, geometry="cvar", size=1.0), losses.mean())


def test_kl_regularised_cvar_with_an_inactive_cap_is_kl_dro():
    losses = torch.rand(10, dtype=D, generator=torch.Generator().manual_seed(5)) * 3
    value = robust_loss(losses, geometry="cvar", size=0.1, reg=0.6)  # cap 1/(alpha m) = 1
    torch.testing.assert_close(value, kl_value(losses, 0.6))
    capped = robust_weights(losses, geometry="cvar", size=0.5, reg=0.6)
    assert capped.max() <= 1 / 5 + 1e-9 and torch.isclose(capped.sum(), torch.tensor(1.0, dtype=D))


@pytest.mark.parametrize(
    ("geometry", "size", "reg"),
    [("cvar", 0.3, 0.0), ("cvar", 0.4, 0.2), ("chi2", 0.8, 0.0), ("chi2", math.inf, 0.5), ("chi2", 0.8, 0.1)],
)
def test_best_response_beats_random_feasible_weights(geometry, size, reg):
    torch.manual_seed(0)
    losses = torch.rand(16, dtype=D) * 2
    m = losses.numel()
    p = robust_weights(losses, geometry=geometry, size=size, reg=reg)
    assert (p >= 0).all() and torch.isclose(p.sum(), torch.tensor(1.0, dtype=D))

    def objective(q):
        if geometry == "cvar":
            penalty = torch.where(q > 0, q * torch.log(m * q), torch.zeros_like(q)).sum()
        else:
            penalty = ((m * q - 1) ** 2).sum() / (2 * m)
        return (q * losses).sum() - reg * penalty

    def feasible(q):
        if geometry == "cvar":
            return bool((q <= 1 / (size * m) + 1e-9).all())  # bisection tolerance
        return math.isinf(size) or float(((m * q - 1) ** 2).sum() / (2 * m)) <= size + 1e-9

    assert feasible(p)
    torch.testing.assert_close(robust_loss(losses, geometry=geometry, size=size, reg=reg), objective(p))
    uniform = torch.full((m,), 1 / m, dtype=D)
    for q in torch.distributions.Dirichlet(torch.ones(m, dtype=D)).sample((300,)):
        for t in (1.0, 0.5, 0.2, 0.05):
            mixed = t * q + (1 - t) * uniform
            if feasible(mixed):
                assert objective(mixed) <= objective(p) + 1e-7
                break


def test_constrained_chi2_weights_sit_on_the_divergence_boundary():
    losses = torch.rand(20, dtype=D, generator=torch.Generator().manual_seed(8))
    p = robust_weights(losses, geometry="chi2", size=0.5)
    m = 20
    torch.testing.assert_close(((m * p - 1) ** 2).sum() / (2 * m), torch.tensor(0.5, dtype=D), atol=1e-7, rtol=0)
    big = robust_weights(losses, geometry="chi2", size=10.0)  # m <= 1 + 2 rho: all weight on the largest loss
    assert big[losses.argmax()] == 1 and big.sum() == 1
    flat = robust_weights(torch.ones(5, dtype=D), geometry="chi2", size=0.5)
    assert torch.equal(flat, torch.full((5,), 0.2, dtype=D))


def test_no_gradient_flows_through_the_weights():
    losses0 = torch.rand(9, dtype=D, generator=torch.Generator().manual_seed(9)) * 2
    for kwargs in (
        {"geometry": "cvar", "size": 0.3},
        {"geometry": "chi2", "size": math.inf, "reg": 1.0},
        {"geometry": "cvar", "size": 0.5, "reg": 0.3},
    ):
        losses = losses0.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(robust_loss(losses, **kwargs), losses)
        torch.testing.assert_close(grad, robust_weights(losses0, **kwargs))


# ----------------------------------------------------------------------------------------- fairness


def fairness_batch(seed: int = 0, n: int = 40, d: int = 6):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(n, d, generator=gen, dtype=D)
    labels = torch.randint(0, 2, (n,), generator=gen).to(D)
    groups = torch.randint(0, 3, (n,), generator=gen)
    x0 = torch.randn(d, generator=gen, dtype=D) * 0.3
    return features, labels, groups, x0


def gcivr_reference(logits, labels, groups, epsilon=0.01, alpha=0.1, gamma=0.1):
    """GCIVR's lagrangian_loss written out: a loop over groups, main BCE over all rows, plus log."""
    criterion = torch.nn.BCEWithLogitsLoss()
    main = criterion(logits, labels)
    total = torch.zeros((), dtype=logits.dtype)
    for k in range(3):
        rows = (groups == k) & (labels >= 1)
        const = criterion(logits[rows], labels[rows]) - main - epsilon
        total = total + 1 / 4 * (1 / 3 + torch.exp(const * alpha / gamma))
    return main + torch.log(total)


def test_fairness_composed_equals_gcivr_code_and_soft_max_form():
    features, labels, groups, x0 = fairness_batch()
    logits = features @ x0
    composed = eo_plain(logits, labels) + eo_outer(eo_inner(logits, labels, groups))
    torch.testing.assert_close(composed, gcivr_reference(logits, labels, groups))
    torch.testing.assert_close(composed, eo_value(logits, labels, groups))
    c, present = eo_constraints(logits, labels, groups)
    assert present.all() and c.shape == (3,)
    soft_max = eo_plain(logits, labels) + torch.logsumexp(torch.cat([torch.zeros(1, dtype=D), c]), 0) - math.log(4)
    torch.testing.assert_close(composed, soft_max)
    membership = F.one_hot(groups, 3)
    torch.testing.assert_close(eo_inner(logits, labels, membership), eo_inner(logits, labels, groups))


@pytest.mark.parametrize("overall", ["all", "positives"])
def test_fairness_gradient_matches_finite_differences(overall):
    features, labels, groups, x0 = fairness_batch(seed=2)

    def objective(x):
        logits = features @ x
        inner = eo_inner(logits, labels, groups, alpha=0.3, gamma=0.1, overall=overall)
        return eo_plain(logits, labels) + eo_outer(inner)

    torch.testing.assert_close(autograd(objective, x0), fd_grad(objective, x0), rtol=1e-6, atol=1e-8)


def test_empty_group_in_a_small_batch_gives_finite_values_and_gradients():
    features, labels, groups, x0 = fairness_batch(seed=3, n=8)
    groups = torch.where(groups == 2, torch.zeros_like(groups), groups)  # group 2 absent
    x = x0.clone().requires_grad_(True)
    logits = features @ x
    value = eo_plain(logits, labels) + eo_outer(eo_inner(logits, labels, groups))
    (grad,) = torch.autograd.grad(value, x)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    _, present = eo_constraints(logits, labels, groups)
    assert present.tolist() == [True, True, False]
    torch.testing.assert_close(value.detach(), eo_value(logits.detach(), labels, groups))


# ------------------------------------------------------------------------------------------ misc


def test_compositions_pickle_for_ray():
    losses = torch.rand(5, dtype=D)
    for phi in (kl_dro(0.5, shift=1.0), chi2_dro(2.0)):
        clone = pickle.loads(pickle.dumps(phi))
        torch.testing.assert_close(clone.value(losses), phi.value(losses))


def test_bad_arguments_are_one_line_value_errors():
    losses = torch.rand(4)
    cases = [
        (lambda: kl_dro(0.0), "lam = 0.0: must be a positive finite number"),
        (lambda: kl_dro(1.0, scale="half"), "scale = 'half'"),
        (lambda: chi2_dro(1.0, variant="printed"), "variant = 'printed'"),
        (lambda: kl_inner(losses.view(2, 2), 1.0), r"losses of shape \(2, 2\)"),
        (lambda: robust_weights(losses, geometry="cvar", size=1.5), r"must be in \(0, 1\]"),
        (lambda: robust_weights(losses, geometry="chi2", size=math.inf), "unbounded"),
        (lambda: robust_weights(losses, geometry="wasserstein", size=0.5), "geometry = 'wasserstein'"),
        (lambda: robust_weights(losses, geometry="kl", size=0.5, reg=1.0), "size = 0.5: the 'kl' set is the whole simplex"),
        (lambda: eo_inner(torch.zeros(4), torch.ones(4), torch.tensor([0, 1, 2, 3])), "group ids in 0..2"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)


def eo_inner_bias(population, batch, draws, seed):
    """(mean of eo_inner over ``draws`` batches of ``batch`` rows drawn with replacement) / full-data value - 1,
    and the standard error of that ratio."""
    logits, labels, groups = population
    gen = torch.Generator().manual_seed(seed)
    exact = float(eo_inner(logits, labels, groups))
    rows = torch.randint(logits.numel(), (draws, batch), generator=gen)
    values = torch.stack([eo_inner(logits[r], labels[r], groups[r]) for r in rows]).reshape(-1)
    return float(values.mean()) / exact - 1, float(values.std()) / math.sqrt(draws) / exact


@pytest.mark.parametrize("shares, positive, draws", [pytest.param((1 / 3, 1 / 3, 1 / 3), 0.5, 3000, marks=pytest.mark.slow),
                                                      ((0.6, 0.3, 0.1), 0.3, 1000)])
def test_fairness_mini_batch_inner_value_is_biased_and_the_bias_shrinks_with_the_batch(shares, positive, draws):
    # The plug-in estimate of g on 16 rows is biased (eo_inner's docstring: Jensen, ratio estimates, dropped
    # empty groups); the bias is many standard errors from 0 at 16 rows and O(1/batch).
    gen = torch.Generator().manual_seed(0)
    n, d = 4000, 6
    features = torch.randn(n, d, generator=gen, dtype=D)
    labels = (torch.rand(n, generator=gen, dtype=D) < positive).to(D)
    groups = torch.multinomial(torch.tensor(shares), n, replacement=True, generator=gen)
    population = (features @ (0.3 * torch.randn(d, generator=gen, dtype=D)), labels, groups)
    small, small_se = eo_inner_bias(population, 16, draws, seed=1)
    large, large_se = eo_inner_bias(population, 128, draws // 2, seed=2)
    assert abs(small) > 5 * small_se and abs(small) > 0.01
    assert abs(large) < abs(small) / 4 + 3 * large_se


def test_kl_geometry_is_the_softmax_best_response_and_the_batch_kl_objective():
    losses = torch.rand(12, dtype=D, generator=torch.Generator().manual_seed(7)) * 4
    p = robust_weights(losses, geometry="kl", size=math.inf, reg=0.7)
    torch.testing.assert_close(p, torch.softmax(losses / 0.7, 0))
    torch.testing.assert_close(robust_loss(losses, geometry="kl", size=math.inf, reg=0.7), kl_value(losses, 0.7))
    huge = torch.tensor([1e4, 0.0, 5.0], dtype=torch.float32)  # exp(l / reg) would overflow: softmax does not
    assert torch.isfinite(robust_weights(huge, geometry="kl", size=math.inf, reg=1.0)).all()
    with pytest.raises(ValueError, match=r"size = 1\.0: the 'kl' set is the whole simplex"):
        robust_weights(losses, geometry="kl", size=1.0, reg=0.7)
    with pytest.raises(ValueError, match=r"reg = 0\.0: the 'kl' geometry needs reg"):
        robust_weights(losses, geometry="kl", size=math.inf, reg=0.0)
