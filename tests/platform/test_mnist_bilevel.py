"""The FedNest paper's MNIST bilevel tasks (EXPERIMENTS.md E5, E6): the x / y split of hyper-representation,
loss tuning's zero direct hypergradient, the local Neumann series against a dense Hessian, the client
partitions, and the ``source: mnist`` data path (real IDX files, and a missing data root). No Ray."""

from __future__ import annotations

import math

import pytest
import torch

import fedcomp
from fedcomp.datasets.mnist import IDX_FILES, export_mnist5k
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_algorithm, build_task
from fedcomp.platform.kinds import BILEVEL
from fedcomp.platform.oracles import grad_xy, hvp_yy


def make_task(name: str, clients: int = 20, **params):
    config = load_config(
        {
            "task": {"name": name, **params},
            "algorithm": {"name": "fednest"},
            "federation": {"clients": clients, "backend": "local"},
            "run": {"progress": "none"},
        }
    )
    return build_task(config), config


# -- hyper-representation -------------------------------------------------------------------------------
def test_hyper_representation_splits_the_mlp_into_157000_outer_and_2010_inner_parameters():
    task, _ = make_task("hyper-representation", per_client=200, hidden=200)
    params = task.init_params(torch.Generator().manual_seed(0))
    assert params["x"].numel() == 784 * 200 + 200 == 157_000  # layer_input: the outer variable
    assert params["y"].numel() == 200 * 10 + 10 == 2_010  # header: the inner variable
    batch = task.sample(0, "inner", 8, torch.Generator().manual_seed(1))
    assert task.logits(params["x"], params["y"], batch[0], batch[1]).shape == (8, 10)


# -- loss tuning ----------------------------------------------------------------------------------------
def test_loss_tuning_direct_hypergradient_is_exactly_zero():
    task, _ = make_task("loss-tuning", clients=10, per_client=98, layers=2)
    params = task.init_params(torch.Generator().manual_seed(0))
    x = torch.randn(20, generator=torch.Generator().manual_seed(2))  # away from the initial x = 0
    batch = task.sample(3, "outer", None, torch.Generator().manual_seed(3))
    gx, gy = grad_xy(lambda a, b: task.outer_loss(a, b, batch), x, params["y"])
    assert gx.shape == (20,) and torch.count_nonzero(gx) == 0  # f depends on x only through y*(x)
    assert gy.abs().sum() > 0
    # ... while the inner loss does depend on x (the logit adjustment), so the indirect term is what moves x
    inner = task.sample(3, "inner", None, torch.Generator().manual_seed(4))
    gx_inner, _ = grad_xy(lambda a, b: task.inner_loss(a, b, inner), x, params["y"])
    assert gx_inner.abs().sum() > 0


@pytest.mark.parametrize("terms, step", [(3, 0.5), (6, 0.2)])
def test_local_neumann_series_matches_a_dense_hessian_reference(terms, step):
    # Loss tuning with a tiny 784-2-10 network (1,600 inner parameters) on one client's handful of images,
    # in float64: the local FedIHGP (local_ihgp) must equal (1/l) sum_{n=0..N} (I - H/l)^n v with H = d^2 g / dy^2.
    task, _ = make_task("loss-tuning", clients=10, per_client=98, layers=2)
    task.widths = [784, 2, 10]
    gen = torch.Generator().manual_seed(5)
    y = task.init_params(gen)["y"].double()
    assert y.numel() == 784 * 2 + 2 + 2 * 10 + 10
    x = (0.5 * torch.randn(20, generator=gen)).double()
    features, labels = task.sample(1, "inner", None, gen)
    batch = (features[:6].double(), labels[:6])
    config = load_config(
        {"task": {"name": "loss-tuning"}, "algorithm": {"name": "lfednest", "neumann_terms": terms, "neumann_lr": step},
         "federation": {"clients": 10}}
    )
    algorithm = build_algorithm(config)
    v = torch.randn(y.numel(), generator=gen, dtype=torch.float64)

    p = algorithm.local_ihgp(task.problem(BILEVEL), x, y, batch, v)

    hessian = torch.autograd.functional.hessian(lambda b: task.inner_loss(x, b, batch), y, vectorize=True)
    assert hessian.shape == (y.numel(), y.numel())
    torch.testing.assert_close(hessian, hessian.T, rtol=0, atol=1e-10)
    # the Hessian-vector product the series is built from agrees with the dense matrix
    torch.testing.assert_close(hvp_yy(lambda a, b: task.inner_loss(a, b, batch), x, y, v), hessian @ v)
    factor = torch.eye(y.numel(), dtype=torch.float64) - step * hessian
    reference, power = torch.zeros_like(v), v.clone()
    for _ in range(terms + 1):
        reference += power
        power = factor @ power
    reference = step * reference
    torch.testing.assert_close(p, reference, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(p, step * (terms + 1) * v)  # the Hessian terms matter in this instance


# -- partitions -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, clients, per_client, fraction", [
    ("hyper-representation", 20, 200, 0.5),
    ("loss-tuning", 10, 98, 0.8),
])
@pytest.mark.parametrize("partition", ["iid", "shards"])
def test_partitions_give_disjoint_client_data(name, clients, per_client, fraction, partition):
    task, _ = make_task(name, clients=clients, per_client=per_client, partition=partition, train_fraction=fraction)
    assert len(task.train_idx) == len(task.val_idx) == clients
    everything = torch.cat([*task.train_idx, *task.val_idx])
    assert everything.numel() == clients * per_client
    assert everything.unique().numel() == everything.numel()  # no image is held by two clients or in two splits
    n_val = math.ceil(round(per_client * (1 - fraction), 9))  # the validation share is rounded up
    assert {t.numel() for t in task.train_idx} == {per_client - n_val}
    assert {v.numel() for v in task.val_idx} == {n_val}
    # sample() reads only the client's own split
    for client in (0, clients - 1):
        for split, pool in (("inner", task.train_idx[client]), ("outer", task.val_idx[client])):
            labels = task.sample(client, split, None, torch.Generator().manual_seed(0))[-1]
            torch.testing.assert_close(labels, task.labels[pool])


def digits_per_client(task) -> list[int]:
    return [task.labels[torch.cat([t, v])].unique().numel() for t, v in zip(task.train_idx, task.val_idx)]


def test_shards_clients_see_at_most_two_digits_and_iid_clients_see_many():
    shards, _ = make_task("hyper-representation", clients=20, per_client=200, partition="shards")
    assert max(digits_per_client(shards)) <= 2  # 2 shards of 100 from the label-sorted 4,000 images
    iid, _ = make_task("hyper-representation", clients=20, per_client=200, partition="iid")
    assert min(digits_per_client(iid)) >= 8


def test_loss_tuning_shards_are_label_skewed():
    # On the long tail the rare classes (31, 19, 12, 7, 4 images) are smaller than a shard (49), so a shard can
    # span several of them -- as in FedNest's code (shards of 74, class 9 has 61 images); the head classes
    # (>= 52 images) give one or two digits a shard.
    shards, _ = make_task("loss-tuning", clients=10, per_client=98, partition="shards")
    iid, _ = make_task("loss-tuning", clients=10, per_client=98, partition="iid")
    skewed, mixed = digits_per_client(shards), digits_per_client(iid)
    assert sum(skewed) < sum(mixed) and min(skewed) <= 2 and max(skewed) <= 6


def test_loss_tuning_keeps_a_long_tail_of_the_training_images():
    task, _ = make_task("loss-tuning", clients=10, per_client=98, n_max=400)
    counts = torch.bincount(task.labels, minlength=10).tolist()
    assert counts == [400, 240, 144, 87, 52, 31, 19, 12, 7, 4]  # ceil(400 mu^c), mu = 0.01^(1/9)
    assert torch.bincount(task.test_labels).tolist() == [100] * 10


# -- source: mnist -------------------------------------------------------------------------------------
def test_source_mnist_reads_real_idx_files_from_the_data_root(tmp_path, monkeypatch):
    raw = export_mnist5k(tmp_path)
    assert sorted(p.name for p in raw.iterdir()) == sorted(IDX_FILES)
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    from_files, _ = make_task("hyper-representation", per_client=200, source="mnist")
    offline, _ = make_task("hyper-representation", per_client=200, source="mnist5k")
    assert torch.equal(from_files.images, offline.images) and torch.equal(from_files.labels, offline.labels)
    assert torch.equal(from_files.test_images, offline.test_images)
    assert torch.equal(from_files.test_labels, offline.test_labels)
    for a, b in zip(from_files.train_idx, offline.train_idx):
        assert torch.equal(a, b)
    # and a whole (tiny) run goes through that path
    result = fedcomp.run(
        "fednest-hr-offline",
        {"task.source": "mnist", "run.rounds": 1, "federation.backend": "local", "run.progress": "none",
         "run.out": str(tmp_path / "runs")},
    )
    assert 0.0 <= result.final["test_accuracy"] <= 1.0 and result.final["comm_rounds"] >= 4
    monkeypatch.delenv("FEDCOMP_DATA")  # task.root instead (the task took $FEDCOMP_DATA only)
    rooted, _ = make_task("hyper-representation", per_client=200, source="mnist", root=str(tmp_path))
    assert torch.equal(rooted.images, from_files.images)


def test_missing_data_root_is_a_one_line_config_error_naming_the_folder(tmp_path, monkeypatch):
    root = tmp_path / "no-mnist-here"
    monkeypatch.setenv("FEDCOMP_DATA", str(root))
    with pytest.raises(fedcomp.ConfigError) as info:
        make_task("hyper-representation", source="mnist")
    message = str(info.value)
    assert "\n" not in message
    assert str(root / "MNIST" / "raw") in message and "task.source" in message
    # through the public API too, before any run folder is made
    with pytest.raises(fedcomp.ConfigError) as info:
        fedcomp.run("fednest-losstune", {"federation.backend": "local", "run.out": str(tmp_path / "runs")})
    assert "\n" not in str(info.value) and str(root / "MNIST" / "raw") in str(info.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
