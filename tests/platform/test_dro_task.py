"""The DRO classification task: its composition, client split, offline and CIFAR-ST data paths."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import fedcomp
from fedcomp.datasets import cifar
from fedcomp.losses import dro as dro_losses
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_task
from tests.conftest import results_root


def cfg(**task):
    return load_config({"task": {"name": "dro-classification", **task},
                        "algorithm": {"name": "feddro", "lr": 0.05, "local_steps": 2, "outer_batch": 8},
                        "federation": {"clients": 8, "backend": "local"},
                        "run": {"rounds": 2, "progress": "none", "out": results_root()}})


def test_clients_hold_an_equal_disjoint_split_and_the_composition_is_kl_dro():
    task = build_task(cfg(lam=2.0, shift=1.0))
    sizes = {len(s) for s in task.shards}
    assert len(sizes) == 1 and len(torch.cat(task.shards).unique()) == 8 * sizes.pop()
    x = task.init_params(torch.Generator().manual_seed(0))["x"]
    batch = task.sample(3, None, torch.Generator())
    losses = F.cross_entropy(task.model(x, batch[0]), batch[1], reduction="none")
    composed = task.outer(task.inner(x, batch)) + task.plain(x, batch)
    torch.testing.assert_close(composed, dro_losses.kl_value(losses, 2.0), rtol=1e-5, atol=1e-5)
    metrics = task.evaluator()({"x": x})
    assert set(metrics) == set(task.metrics) and 0 <= metrics["worst_class_accuracy"] <= metrics["test_accuracy"] + 1


def test_remainder_spread_trains_on_every_example_the_robust_loss_counts():
    dropped, spread = build_task(cfg()), build_task(cfg(remainder="spread"))
    n = dropped.y_train.numel()
    assert n % 8 and sum(len(s) for s in dropped.shards) == n - n % 8
    assert sorted(torch.cat(spread.shards).tolist()) == list(range(n))
    assert max(len(s) for s in spread.shards) - min(len(s) for s in spread.shards) == 1


def test_a_chi2_closed_form_that_is_only_an_upper_bound_is_warned_once():
    tight, loose = build_task(cfg(objective="chi2", lam=0.05)), build_task(cfg(objective="chi2", lam=50.0))
    x = tight.init_params(torch.Generator().manual_seed(0))["x"] * 10  # a spread of training losses
    with pytest.warns(UserWarning, match=r"^task.lam = 0.05: the chi\^2 closed form is only an upper bound"):
        tight.evaluator()({"x": x})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tight.evaluator()({"x": x})  # once per run
        loose.evaluator()({"x": x})  # exact: every closed-form weight is non-negative


@pytest.mark.parametrize("objective", ["kl", "chi2", "erm"])
def test_feddro_runs_on_each_objective(objective):
    result = fedcomp.run(cfg(objective=objective, lam=5.0))
    assert result.metrics["test_accuracy"].iloc[-1] > result.metrics["test_accuracy"].iloc[0]


def test_cifar_st_from_files_in_torchvision_format(tmp_path, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (200, 3, 32, 32), generator=gen, dtype=torch.uint8)
    labels = torch.arange(200) % 10
    for split in ("train", "test"):
        cifar.write_cifar_batches(tmp_path, images, labels, "cifar10", split)
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    config = cfg(dataset="cifar10-st", verify_md5=False).replace(**{"federation.clients": 2, "run.rounds": 1})
    task = build_task(config)
    counts = torch.bincount(task.y_train, minlength=10)
    assert counts[5:].tolist() == [20] * 5 and (counts[:5] < 20).all()  # half the classes reduced
    assert task.model.dim > 260_000  # ResNet20
    assert fedcomp.run(config).metrics["round"].tolist() == [0, 1]
    for model in ("linear", "mlp"):  # a shape mismatch mid-run before
        with pytest.raises(fedcomp.ConfigError, match=rf"^task.model = '{model}' takes feature vectors, and task.dataset = "
                                              r"'cifar10-st' holds images; allowed with it: resnet20 \(or auto\)$"):
            build_task(config.replace(**{"task.model": model}))


def test_missing_cifar_is_one_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    with pytest.raises(fedcomp.ConfigError, match=r"task.dataset = 'cifar10-st': .*cifar-10-batches-py"):
        fedcomp.run(cfg(dataset="cifar10-st"))
