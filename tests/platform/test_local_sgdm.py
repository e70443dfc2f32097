"""LocalSGDM and LocalSGDM_RL against hand computations: the averaged state (x and the momentum buffer, or x
alone), FedAvg at mu = 0, centralised SGD with momentum for one client and period 1, the Ratio Loss monitor's
Ra on a linear model, the broadcast class weights, and one-line errors."""

from __future__ import annotations

import pytest
import torch

from fedcomp.platform.algorithms.local_sgdm_rl import (
    ClassPriorProblem,
    RatioLossProblem,
    monitor_ratios,
    prior_ratios,
    ratio_estimates,
)
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.server import Server
from tests.conftest import results_root
from tests.platform.helpers import run
from tests.platform.plain_tiny import SEED, config, step_gen, synthetic_config, x0

# ------------------------------------------------------------------------------------------------ LocalSGDM


@pytest.mark.parametrize("average", ["all", "model"])
def test_two_clients_two_steps_two_rounds_match_a_hand_computation(average):
    lr, mu = 0.1, 0.5
    cfg = config("local-sgdm", lr=lr, momentum=mu, local_steps=2, average=average)
    task = build_task(cfg)
    x, bufs = x0(task), [torch.zeros(3), torch.zeros(3)]
    for _ in range(2):
        xs = []
        for k in range(2):
            xk, bk = x.clone(), bufs[k].clone()
            for _ in range(2):
                bk = mu * bk + task.grad(k, xk)
                xk = xk - lr * bk
            xs.append(xk)
            bufs[k] = bk
        x = torch.stack(xs).mean(0)
        if average == "all":
            bufs = [torch.stack(bufs).mean(0)] * 2
    server = run(cfg, 2)
    torch.testing.assert_close(server.tensors()["x"], x, rtol=0, atol=1e-6)
    private = server.federation.private_states()
    if average == "all":
        assert set(server.tensors()) == {"x", "buf"} and private == {}
        torch.testing.assert_close(server.tensors()["buf"], bufs[0], rtol=0, atol=1e-6)
    else:
        assert set(server.tensors()) == {"x"} and all(set(s) == {"buf"} for s in private.values())
        for k in range(2):
            torch.testing.assert_close(private[k]["buf"], bufs[k], rtol=0, atol=1e-6)


def test_momentum_zero_is_fedavg_bit_for_bit_on_synthetic_classification():
    fedavg = run(synthetic_config("fedavg"), 3)
    for average in ("all", "model"):
        sgdm = run(synthetic_config("local-sgdm", momentum=0.0, average=average), 3)
        assert torch.equal(sgdm.tensors()["x"], fedavg.tensors()["x"]), average


def test_one_client_period_one_is_centralised_sgd_with_momentum():
    lr, mu, steps, b = 0.05, 0.9, 6, 4
    cfg = config("local-sgdm", clients=1, lr=lr, momentum=mu, local_steps=1, outer_batch=b, task_params={"noise": 1.0})
    task = build_task(cfg)
    param = x0(task).clone().requires_grad_(True)
    sgd = torch.optim.SGD([param], lr=lr, momentum=mu)
    for t in range(steps):
        _, _, z = task.sample_batch(0, b, step_gen(0, t))
        param.grad = task.grad(0, param.detach(), z)
        sgd.step()
    server = run(cfg, steps)
    torch.testing.assert_close(server.tensors()["x"], param.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name, task, extra", [
    ("local-sgdm", "tiny-quadratics", {"average": "all"}),
    ("local-sgdm", "tiny-quadratics", {"average": "model"}),
    ("local-sgdm-rl", "tiny-binary", {}),
])
def test_lockstep_clients_give_the_same_numbers(name, task, extra):
    def cfg(vectorise):
        return config(name, task=task, clients=3, federation={"vectorise": vectorise}, local_steps=3, lr=0.1,
                      outer_batch=4, task_params={"noise": 0.5} if task == "tiny-quadratics" else {}, **extra)

    one, lock = run(cfg(False), 2), run(cfg(True), 2)
    for key in one.tensors():
        torch.testing.assert_close(lock.tensors()[key], one.tensors()[key], rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ LocalSGDM_RL


def aux_gradient(x: torch.Tensor, batch) -> torch.Tensor:
    """d/dw of the mean logistic loss of a linear model (w, b) on ``batch``, in closed form."""
    features, labels = batch
    residual = torch.sigmoid(features @ x[:-1] + x[-1]) - labels
    return (residual[:, None] * features).mean(0)


def hand_weights(task, x, alpha=1.0, beta=0.1) -> torch.Tensor:
    d0, d1 = (aux_gradient(x, b) for b in task.monitor_batches())
    ra = torch.stack([(d0 / d1).mean().abs(), (d1 / d0).mean().abs()])
    return alpha + beta * ra


def test_monitor_ratio_on_a_linear_model_matches_a_hand_computation():
    task = build_task(config("local-sgdm-rl", task="tiny-binary"))
    assert isinstance(task, RatioLossProblem) and isinstance(task, ClassPriorProblem)
    x = x0(task)
    d0, d1 = (aux_gradient(x, b) for b in task.monitor_batches())
    torch.testing.assert_close(monitor_ratios(task, x), torch.stack([(d0 / d1).mean().abs(), (d1 / d0).mean().abs()]))
    magnitude = torch.stack([d0.abs().sum() / d1.abs().sum(), d1.abs().sum() / d0.abs().sum()])
    torch.testing.assert_close(monitor_ratios(task, x, "magnitude"), magnitude)


def test_magnitude_ratio_for_many_classes_reads_each_class_row():
    delta = torch.tensor([[1.0, -2.0, 9.0, 9.0, 9.0, 9.0],
                          [5.0, 5.0, 3.0, 0.0, 5.0, 5.0],
                          [7.0, 7.0, 7.0, -7.0, 1.0, 1.0]])
    rows = delta.view(3, 3, 2)
    expected = [2 * rows[c, c].abs().sum() / (rows[:, c].abs().sum() - rows[c, c].abs().sum()) for c in range(3)]
    torch.testing.assert_close(ratio_estimates(delta, "magnitude"), torch.stack(expected))
    torch.testing.assert_close(ratio_estimates(torch.zeros(2, 3), "magnitude"), torch.ones(2))


def test_ratio_for_many_classes_uses_each_class_row_and_skips_zero_denominators():
    # C = 3 classes, output weight [3, 2]: class c's ratio reads row c of each Delta W
    delta = torch.tensor([[1.0, 2.0, 9.0, 9.0, 9.0, 9.0],
                          [5.0, 5.0, 3.0, 0.0, 5.0, 5.0],
                          [7.0, 7.0, 7.0, 7.0, 1.0, 1.0]])
    row = lambda c: delta.view(3, 3, 2)[:, c]  # noqa: E731 -- row c of every class's matrix
    expected = []
    for c in range(3):
        num, den = 2 * row(c)[c], row(c).sum(0) - row(c)[c]
        expected.append((num / den).mean().abs())
    torch.testing.assert_close(ratio_estimates(delta), torch.stack(expected))
    # binary: an entry with a zero denominator is left out; no usable entry at all -> Ra = 1
    two = torch.tensor([[2.0, 1.0, 0.0], [4.0, 0.0, 0.0]])
    torch.testing.assert_close(ratio_estimates(two), torch.tensor([2 / 4, (4 / 2 + 0 / 1) / 2]))
    torch.testing.assert_close(ratio_estimates(torch.zeros(2, 3)), torch.ones(2))


def test_prior_weights_are_the_inverse_frequency_ratios():
    torch.testing.assert_close(prior_ratios(0.2), torch.tensor([0.25, 4.0]))
    cfg = config("local-sgdm-rl", task="tiny-binary", weights="prior", alpha_rl=1.0, beta_rl=0.5)
    server = Server(cfg, LocalFederation)
    w = server.algorithm.class_weights(server.problem, server.tensors()["x"])
    torch.testing.assert_close(w, torch.tensor([1.125, 3.0]))


def test_rl_round_weights_the_loss_with_the_monitors_broadcast_weights():
    lr, mu, steps, b = 0.2, 0.5, 2, 5
    cfg = config("local-sgdm-rl", task="tiny-binary", lr=lr, momentum=mu, local_steps=steps, outer_batch=b, ratio="entry-mean")
    task = build_task(cfg)
    x, buf = x0(task), torch.zeros(5)
    for r in range(2):
        w = hand_weights(task, x)
        xs, bufs = [], []
        for k in range(2):
            xk, bk = x.clone(), buf.clone()
            for s in range(steps):
                features, labels = task.sample_batch(k, b, step_gen(k, r * steps + s))
                per = w[labels.long()]
                residual = per * (torch.sigmoid(features @ xk[:-1] + xk[-1]) - labels) / per.sum()
                grad = torch.cat([residual @ features, residual.sum()[None]])
                bk = mu * bk + grad
                xk = xk - lr * bk
            xs.append(xk), bufs.append(bk)
        x, buf = torch.stack(xs).mean(0), torch.stack(bufs).mean(0)
    server = Server(cfg, LocalFederation)
    record = server.run_round()
    assert record["floats_down"] == 5 + 5 + 2 and record["floats_up"] == 5 + 5  # x, buf and the 2 weights
    server.run_round()
    torch.testing.assert_close(server.tensors()["x"], x, rtol=0, atol=1e-6)
    torch.testing.assert_close(server.tensors()["buf"], buf, rtol=0, atol=1e-6)


def test_rl_one_client_period_one_is_centralised_sgdm_on_the_ratio_loss():
    lr, mu, steps, b = 0.1, 0.9, 5, 6
    cfg = config("local-sgdm-rl", task="tiny-binary", clients=1, lr=lr, momentum=mu, local_steps=1, outer_batch=b,
                 ratio="entry-mean")
    task = build_task(cfg)
    param = x0(task).clone().requires_grad_(True)
    sgd = torch.optim.SGD([param], lr=lr, momentum=mu)
    for t in range(steps):
        w = hand_weights(task, param.detach())
        (param.grad,) = torch.autograd.grad(task.class_weighted_loss(param, task.sample_batch(0, b, step_gen(0, t)), w), param)
        sgd.step()
    torch.testing.assert_close(run(cfg, steps).tensors()["x"], param.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("weights, missing", [("monitor", "monitor_batches"), ("prior", "prior")])
def test_rl_on_a_task_without_the_ratio_loss_oracles_is_one_config_error(weights, missing):
    """Said as the server is built (it was said at the first round, after a Ray run's actors had started)."""
    cfg = load_config(
        {"task": {"name": "synthetic-classification", "hidden": [4], "test_samples": 10},
         "algorithm": {"name": "local-sgdm-rl", "weights": weights},
         "federation": {"clients": 2, "backend": "local"},
         "run": {"seed": SEED, "progress": "none", "out": results_root()}}
    )
    with pytest.raises(ConfigError, match=missing) as err:
        Server(cfg, LocalFederation)
    assert "local-sgdm-rl" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name, bad, field", [
    ("local-sgdm", {"momentum": 1.0}, "momentum"),
    ("local-sgdm", {"momentum": -0.1}, "momentum"),
    ("local-sgdm", {"average": "buffer"}, "average"),
    ("local-sgdm-rl", {"beta_rl": -1.0}, "beta_rl"),
    ("local-sgdm-rl", {"alpha_rl": -1.0}, "alpha_rl"),
    ("local-sgdm-rl", {"weights": "labels"}, "weights"),
])
def test_bad_hyperparameters_are_one_line_naming_the_field(name, bad, field):
    with pytest.raises(ConfigError, match=field) as err:
        config(name, **bad)
    assert "\n" not in str(err.value)
