"""The imbalanced-binary task: parameters, each problem kind's oracles, the compositional inner map's
Jacobian vs finite differences, metrics vs scikit-learn, and end-to-end runs of the algorithms on it."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score, roc_auc_score

import fedcomp
from fedcomp.datasets import binary, partition
from fedcomp.losses.auc import AUCForm, ap_surrogate_loss, auc_square_loss
from fedcomp.platform.catalog import load_builtins
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_task
from fedcomp.platform.kinds import COMPOSITIONAL_MINIMAX, CONDITIONAL, MINIMAX, PLAIN
from fedcomp.platform.oracles import inner_value_vjp
from fedcomp.platform.registry import ALGORITHMS
from fedcomp.platform.tasks import builtins
from fedcomp.platform.tasks.imbalanced import ImbalancedBinary
from tests.conftest import results_root

D = torch.float64


def cfg(algorithm: str = "fedavg", clients: int = 4, algo: dict | None = None, **task):
    return load_config({
        "task": {"name": "imbalanced-binary", **task},
        "algorithm": {"name": algorithm, "lr": 0.1, "local_steps": 5, "outer_batch": 16, **(algo or {})},
        "federation": {"clients": clients, "backend": "local"},
        "run": {"rounds": 3, "progress": "none", "out": results_root()},
    })  # fmt: skip


def make(**task) -> ImbalancedBinary:
    return build_task(cfg(**task))


def point(task: ImbalancedBinary, seed: int = 0, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A random x = (w, a, b) and y = [alpha]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(task.dim + 2, generator=gen, dtype=dtype) * 0.3, torch.randn(1, generator=gen, dtype=dtype)


def test_dataset_names_and_auc_forms_are_the_data_layers_and_the_losses():
    assert get_args(builtins.Dataset) == binary.DATASETS
    assert get_args(builtins.AUCForm) == get_args(AUCForm)


def test_variables_prior_and_client_split():
    task = make()
    params = task.init_params(torch.Generator().manual_seed(0))
    assert params["x"].shape == (task.dim + 2,) and params["x"].dtype == torch.float32
    assert task.dim == 31  # linear 30 -> 1 on breast-cancer
    assert params["x"][-2:].tolist() == [0.0, 0.0] and params["y"].tolist() == [0.0]
    assert task.prior == pytest.approx(float(task.y_train.double().mean()))
    assert 0.09 < task.prior < 0.11  # construction: ratio 0.1
    assert make(prior=0.3).prior == 0.3
    joined = torch.cat(task.shards)
    assert joined.numel() == task.y_train.numel() == joined.unique().numel()
    positives = [int(task.y_train[s].sum()) for s in task.shards]
    assert max(positives) - min(positives) <= 1  # stratified: an equal share of each class
    assert sorted(torch.cat(make(partition="stride").shards).tolist()) == sorted(joined.tolist())


def test_plain_kind_is_bce_with_class_weights_and_a_monitor():
    task = make(positives_per_batch=3)
    assert task.problem(PLAIN) is task
    x, _ = point(task)
    batch = task.sample_batch(1, 8, torch.Generator().manual_seed(0))
    assert batch[1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]  # positives first
    logits = batch[0] @ x[:30] + x[30]
    expected = F.binary_cross_entropy_with_logits(logits, batch[1].float())
    torch.testing.assert_close(task.loss(x, batch), expected)
    torch.testing.assert_close(task.class_weighted_loss(x, batch, torch.ones(2)), expected)
    weights = torch.tensor([0.5, 4.0])
    per = F.binary_cross_entropy_with_logits(logits, batch[1].float(), reduction="none")
    torch.testing.assert_close(task.class_weighted_loss(x, batch, weights), (weights[batch[1]] * per).mean())
    x = x.requires_grad_(True)
    (grad,) = torch.autograd.grad(task.loss(x, batch), x)
    assert grad[-2:].tolist() == [0.0, 0.0] and grad[:31].abs().sum() > 0  # a, b do not enter CE
    assert task.monitor_slice == slice(0, 30)  # the output layer's weight matrix
    monitor = task.monitor_batches()
    assert [b[1].unique().tolist() for b in monitor] == [[0], [1]]
    assert monitor[0][1].numel() == monitor[1][1].numel() == min(32, int(task.y_train.sum())) == 31  # balanced
    again = make(positives_per_batch=3).monitor_batches()  # drawn from data_seed: same on every process
    assert all(torch.equal(a[0], b[0]) for a, b in zip(monitor, again))
    with pytest.raises(fedcomp.ConfigError, match=r"^task.positives_per_batch = 3: must be at most the batch size 2$"):
        task.sample_batch(0, 2, torch.Generator())


@pytest.mark.parametrize("form", ["paper", "margin"])
def test_minimax_kind_is_the_auc_loss_with_a_b_from_x_and_alpha_from_y(form):
    task = make(auc_form=form, margin=0.6)
    view = task.problem(MINIMAX)
    x, y = point(task, 1)
    batch = view.sample(2, "inner", 20, torch.Generator().manual_seed(1))
    h = torch.sigmoid(batch[0] @ x[:30] + x[30])
    expected = auc_square_loss(h, batch[1], x[31], x[32], y[0], task.prior, form=form, margin=0.6)
    torch.testing.assert_close(view.loss(x, y, batch), expected)
    torch.testing.assert_close(view.scores(x, batch), h)
    assert view.labels(batch) is batch[1] and view.prior == task.prior
    assert [float(v) for v in view.auc_ab(x)] == [float(x[31]), float(x[32])]
    assert view.margin == (0.6 if form == "margin" else 0.0)
    logit_view = make(score="logit").problem(MINIMAX)
    torch.testing.assert_close(logit_view.scores(x, batch), batch[0] @ x[:30] + x[30])
    assert view.sample(0, "outer", None, torch.Generator())[1].numel() == task.shards[0].numel()


def test_compositional_inner_is_a_ce_step_and_its_vjp_matches_finite_differences():
    task = make(rho=0.3)
    view = task.problem(COMPOSITIONAL_MINIMAX)
    xi = view.sample_inner(0, 24, torch.Generator().manual_seed(2))
    xi = (xi[0].double(), xi[1])
    x, y = point(task, 2, D)
    # the value: x - rho (grad_w BCE, 0, 0), by hand for the linear model (weights 0..29, bias 30)
    residual = torch.sigmoid(xi[0] @ x[:30] + x[30]) - xi[1].double()
    step = torch.cat([xi[0].T @ residual / 24, residual.mean().view(1), torch.zeros(2, dtype=D)])
    g, vjp = inner_value_vjp(view, x, xi)
    torch.testing.assert_close(g, x - 0.3 * step)
    # J^T v against central differences of x -> v . g(x)
    v = torch.randn(x.numel(), generator=torch.Generator().manual_seed(3), dtype=D)
    eps = 1e-6
    fd = torch.stack([(v @ view.inner(x + eps * e, xi) - v @ view.inner(x - eps * e, xi)) / (2 * eps)
                      for e in torch.eye(x.numel(), dtype=D)])
    got = vjp(v)
    torch.testing.assert_close(got, fd, rtol=1e-7, atol=1e-8)
    assert (got[:31] - v[:31]).abs().max() > 1e-3 and torch.equal(got[31:], v[31:])  # Hessian term on w only
    with torch.no_grad():  # the identity-Jacobian path evaluates g without a graph
        torch.testing.assert_close(view.inner(x, xi), g)
    zeta = view.sample_outer(0, 16, torch.Generator().manual_seed(4))
    zeta = (zeta[0].double(), zeta[1])
    h = torch.sigmoid(zeta[0] @ g[:30] + g[30])
    torch.testing.assert_close(view.outer(g, y, zeta), auc_square_loss(h, zeta[1], g[31], g[32], y[0], task.prior))


def test_conditional_kind_is_the_ap_surrogate_on_positives_first_batches():
    task = make(ap_margin=0.2)
    view = task.problem(CONDITIONAL)
    gen = torch.Generator().manual_seed(6)
    outer = view.sample_outer(3, 4, gen)
    inner = view.sample_inner(3, outer, 12, gen)
    assert outer[1].tolist() == [1] * 4 and inner[1].tolist() == [0] * 8  # the batch of 12: 4 positives, then 8
    x, _ = point(task, 3)
    features, labels = torch.cat([outer[0], inner[0]]), torch.cat([outer[1], inner[1]])
    h = torch.sigmoid(features @ x[:30] + x[30])
    torch.testing.assert_close(view.loss(x, outer, inner), ap_surrogate_loss(h[:4], h, labels, 0.2))
    with pytest.raises(fedcomp.ConfigError, match=r"^algorithm.inner_batch = 4: the positives-first inner batch"):
        view.sample_inner(3, outer, 4, gen)
    iid = make(ap_inner="iid").problem(CONDITIONAL)
    inner = iid.sample_inner(3, outer, 30, gen)
    assert inner[1].numel() == 30 and 0 < int(inner[1].sum()) < 30  # uniform draws from the client's data
    h_inner = torch.sigmoid(inner[0] @ x[:30] + x[30])
    torch.testing.assert_close(iid.loss(x, outer, inner), ap_surrogate_loss(h[:4], h_inner, inner[1], 0.1))


def test_metrics_equal_scikit_learn_on_the_same_scores():
    task = make(clients=3)
    x, _ = point(task, 4)
    metrics = task.evaluator()({"x": x})
    assert tuple(metrics) == task.metrics
    scores = (task.x_test @ x[:30] + x[30]).double().numpy()
    labels = task.y_test.numpy()
    assert metrics["test_auroc"] == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert metrics["test_ap"] == pytest.approx(average_precision_score(labels, scores), abs=1e-12)
    assert metrics["test_accuracy"] == pytest.approx(float(((scores > 0) == labels).mean()), abs=1e-7)
    shares = partition.stratified(task.y_test, 3, 0)  # each client's equal stratified share of the test set
    assert {len(s) for s in shares} <= {len(labels) // 3, len(labels) // 3 + 1}
    per_client = [roc_auc_score(labels[s.numpy()], scores[s.numpy()]) for s in shares]
    assert metrics["client_auroc_mean"] == pytest.approx(np.mean(per_client), abs=1e-12)
    assert metrics["client_auroc_var"] == pytest.approx(np.var(per_client), abs=1e-12)  # ddof 0
    assert metrics["client_auroc_var"] > 0


def test_image_models_on_digits_and_mismatches_are_one_line():
    task = make(dataset="digits", model="cifar-conv")
    assert task.x_train.shape[1:] == (1, 8, 8) and task.vmappable
    metrics = task.evaluator()(task.init_params(torch.Generator().manual_seed(0)))
    assert all(np.isfinite(v) for v in metrics.values())
    assert make(dataset="digits").model_name == "linear"
    resnet = make(dataset="digits", model="resnet20")
    assert resnet.dim == 269_137 - 2 * 9 * 16 and not resnet.vmappable  # 1-channel stem; BatchNorm
    view = resnet.problem(COMPOSITIONAL_MINIMAX)
    xi = view.sample_inner(0, 8, torch.Generator().manual_seed(0))
    x, _ = point(resnet, 5)
    g, vjp = inner_value_vjp(view, x, xi)  # Hessian-vector product through batch-statistics BatchNorm
    assert torch.isfinite(g).all() and torch.isfinite(vjp(torch.ones_like(x))).all()
    too_small = r"^task.model = 'mnist-conv' on task.dataset = 'digits': image_size = 8: too small"
    with pytest.raises(fedcomp.ConfigError, match=too_small):
        make(dataset="digits", model="mnist-conv")
    with pytest.raises(fedcomp.ConfigError, match=r"^task.model = 'resnet20': task.dataset = 'breast-cancer' is tabul"):
        make(model="resnet20")


@pytest.mark.parametrize(
    "override, message",
    [
        ({"task.ratio": 0.7}, r"^task.ratio = 0.7: Input should be less than or equal to 0.5$"),
        ({"task.model": "vgg"}, r"^task.model = 'vgg': Input should be 'auto', 'linear'"),
        ({"task.positives_per_batch": 0}, r"^task.positives_per_batch = 0: Input should be greater than or equal to 1"),
        ({"task.dataset": "imagenet"}, r"^task.dataset = 'imagenet': Input should be 'breast-cancer'"),
        ({"task.prior": 1.0}, r"^task.prior = 1.0: Input should be less than 1 \(or null, for none\)$"),
        ({"task.colour": 1}, r"^task.colour: unknown key; allowed keys: name, dataset"),
    ],
)
def test_bad_parameters_are_one_config_error(override, message):
    with pytest.raises(fedcomp.ConfigError, match=message):
        cfg().replace(**override)


def test_bad_data_requests_are_one_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    with pytest.raises(fedcomp.ConfigError, match=r"^task.dataset = 'cifar10': ") as error:
        make(dataset="cifar10")
    assert "\n" not in str(error.value)
    with pytest.raises(fedcomp.ConfigError, match=r"^federation.clients = 40: client \d+ gets 0 positives"):
        make(clients=40)
    from fedcomp.datasets.melanoma import write_melanoma

    # Kaggle's fold files 0..5, the last one the test split: its two images (6 and 8) both negative
    write_melanoma(tmp_path, torch.zeros(12, 3, 8, 8, dtype=torch.uint8), [0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 1],
                   [0, 1, 2, 3, 4, -1, 5, 0, 5, 2, -1, 4])
    with pytest.raises(fedcomp.ConfigError, match=r"^task.dataset = 'melanoma': its test split holds 0 positives and 2 "
                                                  r"negatives; test_auroc and test_ap need both"):  # nan every evaluation
        make(dataset="melanoma", root=str(tmp_path), clients=1)


def e2e_cases() -> list:
    """(algorithm, its extra hyperparameters): this project's algorithms for each kind the task offers."""
    fcsg = {"outer_batch": 4, "first_batch": 4, "inner_batch": 16}
    cases = [
        ("fedavg", {}), ("fcsg-m", fcsg), ("acc-fcsg-m", fcsg),  # plain, conditional
        ("local-sgdm", {}), ("local-sgdm-rl", {}), ("scaffold", {}), ("fedprox", {}),  # plain
        ("coda", {}), ("coda-plus", {}), ("local-sgdam", {}),  # minimax
        ("local-scgdam", {}),  # compositional minimax
    ]  # fmt: skip
    return [pytest.param(name, extra, id=name) for name, extra in cases]


@pytest.mark.parametrize("name, extra", e2e_cases())
def test_algorithms_run_end_to_end_and_raise_auroc(name, extra):
    load_builtins()
    if name not in ALGORITHMS:
        pytest.skip(f"algorithm {name!r} is not in this tree yet")
    metrics = fedcomp.run(cfg(name, algo=extra)).metrics
    assert metrics["round"].tolist() == [0, 1, 2, 3]
    assert np.isfinite(metrics[list(ImbalancedBinary.metrics)].to_numpy()).all()
    assert metrics["test_auroc"].iloc[-1] > 0.5
    if name in ("fedavg", "fcsg-m"):
        assert metrics["test_auroc"].iloc[-1] > metrics["test_auroc"].iloc[0]


def test_lockstep_clients_give_the_same_numbers():
    base = cfg(positives_per_batch=4).replace(**{"run.rounds": 2})
    one = fedcomp.run(base).metrics
    vec = fedcomp.run(base.replace(**{"federation.vectorise": True})).metrics
    np.testing.assert_allclose(vec["test_auroc"], one["test_auroc"], atol=1e-6)
    np.testing.assert_allclose(vec["train_loss"].iloc[1:], one["train_loss"].iloc[1:], rtol=1e-5)


def test_a_diverged_model_scores_nan_instead_of_failing_the_run():
    task = make()
    x = task.init_params(torch.Generator().manual_seed(0))["x"]
    x[0] = float("nan")
    metrics = task.evaluator()({"x": x})
    assert set(metrics) == set(task.metrics) and all(np.isnan(v) for v in metrics.values())
