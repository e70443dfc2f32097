"""Partitioners: disjoint, sized as asked, deterministic in the seed, label skew as defined, clear errors."""

from __future__ import annotations

import pytest
import torch

from fedcomp.datasets.partition import dirichlet, iid, label_shards, stratified, stride, train_val_split

SORTED = torch.arange(10).repeat_interleave(6000)
SHUFFLED = SORTED[torch.randperm(60000, generator=torch.Generator().manual_seed(5))]


def assert_disjoint(parts, n):
    every = torch.cat(parts)
    assert all(p.dtype == torch.int64 for p in parts)
    assert every.unique().numel() == every.numel() and int(every.min()) >= 0 and int(every.max()) < n


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_iid_sizes_disjoint_and_seeded():
    parts = iid(60000, 100, 600, seed=0)
    assert len(parts) == 100 and all(p.numel() == 600 for p in parts)
    assert_disjoint(parts, 60000)
    assert same(parts, iid(60000, 100, 600, seed=0)) and not same(parts, iid(60000, 100, 600, seed=1))
    assert [p.numel() for p in iid(1244, 10, None, seed=0)] == [124] * 10


def test_iid_spread_keeps_every_example_with_sizes_differing_by_at_most_one():
    parts = iid(795, 8, None, seed=0, remainder="spread")
    assert [p.numel() for p in parts] == [100, 100, 100, 99, 99, 99, 99, 99]
    assert_disjoint(parts, 795) and torch.cat(parts).sort().values.tolist() == list(range(795))
    assert same(parts, iid(795, 8, None, seed=0, remainder="spread"))
    assert sum(p.numel() for p in iid(795, 8, None, seed=0)) == 792  # the default drops 795 mod 8 = 3
    with pytest.raises(ValueError, match="remainder = 'keep': allowed: 'drop', 'spread'"):
        iid(795, 8, None, seed=0, remainder="keep")


def test_iid_mixes_labels():
    parts = iid(5000, 10, 500, seed=0)
    assert all(torch.unique(torch.arange(10).repeat_interleave(500)[p]).numel() == 10 for p in parts)


def test_label_shards_on_mnist_layout():
    parts = label_shards(SHUFFLED, 100, 2, 300, seed=0)
    assert len(parts) == 100 and all(p.numel() == 600 for p in parts)
    assert_disjoint(parts, 60000)
    assert max(SHUFFLED[p].unique().numel() for p in parts) <= 2
    assert same(parts, label_shards(SHUFFLED, 100, 2, 300, seed=0))
    assert not same(parts, label_shards(SHUFFLED, 100, 2, 300, seed=1))


def test_label_shards_client_labels_are_exactly_those_of_its_shards():
    labels = SHUFFLED[:5000]
    order = torch.sort(labels, stable=True).indices
    shards = {tuple(order[i : i + 25].tolist()) for i in range(0, 5000, 25)}
    for part in label_shards(labels, 50, 3, 25, seed=2):
        pieces = [tuple(part[i : i + 25].tolist()) for i in range(0, 75, 25)]
        assert all(piece in shards for piece in pieces)
        assert set(labels[part].tolist()) == set().union(*(labels[list(p)].tolist() for p in pieces))
        assert labels[part].unique().numel() <= 2 * 3


def test_label_shards_leaves_the_remainder_unused():
    labels = torch.arange(10).repeat_interleave(torch.tensor([500, 300, 180, 108, 65, 39, 24, 14, 9, 5]))
    parts = label_shards(labels, 10, 2, 62, seed=0)
    assert_disjoint(parts, labels.numel())
    assert sum(p.numel() for p in parts) == 1240


def test_dirichlet_covers_every_index_once_and_skews_labels():
    parts = dirichlet(SHUFFLED[:5000], 10, 0.1, seed=0)
    assert len(parts) == 10
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(5000))
    assert same(parts, dirichlet(SHUFFLED[:5000], 10, 0.1, seed=0))
    assert not same(parts, dirichlet(SHUFFLED[:5000], 10, 0.1, seed=1))
    skewed = [SHUFFLED[:5000][p].bincount(minlength=10).max() / max(p.numel(), 1) for p in parts if p.numel()]
    assert sum(skewed) / len(skewed) > 0.5
    flat = dirichlet(SHUFFLED[:5000], 10, 1000.0, seed=0)
    assert all(SHUFFLED[:5000][p].bincount(minlength=10).max() / p.numel() < 0.2 for p in flat)


def test_dirichlet_min_size():
    parts = dirichlet(SHUFFLED[:5000], 10, 0.1, seed=0, min_size=100)
    assert min(p.numel() for p in parts) >= 100
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(5000))


def test_train_val_split_sizes_follow_fednest():
    train, val = train_val_split(torch.arange(600) * 3, 0.5, seed=0)
    assert train.numel() == val.numel() == 300
    assert torch.equal(torch.sort(torch.cat([train, val])).values, torch.arange(600) * 3)
    assert [t.numel() for t in train_val_split(torch.arange(148), 0.8, seed=0)] == [118, 30]
    assert [t.numel() for t in train_val_split(torch.arange(600), 0.8, seed=0)] == [480, 120]
    a, b = train_val_split(torch.arange(600), 0.5, seed=0), train_val_split(torch.arange(600), 0.5, seed=1)
    assert torch.equal(a[0], train_val_split(torch.arange(600), 0.5, seed=0)[0]) and not torch.equal(a[0], b[0])


def test_train_val_split_of_clients():
    parts = iid(60000, 100, 600, seed=0)
    train, val = train_val_split(parts, 0.5, seed=0)
    assert len(train) == len(val) == 100
    assert_disjoint(train + val, 60000)
    assert all(set(t.tolist()) | set(v.tolist()) == set(p.tolist()) for t, v, p in zip(train, val, parts))
    positions = [torch.nonzero(torch.isin(p, t)).flatten() for p, t in zip(parts[:2], train[:2])]
    assert not torch.equal(positions[0], positions[1])



def test_stratified_balances_every_class_and_the_client_sizes():
    class_sizes = torch.tensor([5923, 6742, 5958, 6131, 5842, 1084, 1183, 1253, 1170, 1189])  # MNIST after E3's drop
    labels = torch.arange(10).repeat_interleave(class_sizes)
    labels = labels[torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(0))]
    parts = stratified(labels, 16, seed=0)
    assert len(parts) == 16
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(labels.numel()))
    counts = torch.stack([torch.bincount(labels[p], minlength=10) for p in parts])  # [clients, classes]
    n_c = torch.bincount(labels)
    assert torch.all((counts == n_c // 16) | (counts == n_c // 16 + 1))
    assert torch.equal(counts.sum(0), n_c)
    sizes = [p.numel() for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == labels.numel()
    assert all(torch.equal(p, torch.sort(p).values) for p in parts)
    assert same(parts, stratified(labels, 16, seed=0)) and not same(parts, stratified(labels, 16, seed=1))


def test_stride_is_d_auprc_dealing_of_the_class_ordered_shuffle():
    labels = torch.tensor([1, 0, 1, 2, 0, 1, 0, 2, 1, 0, 0])  # class sizes 5, 4, 2
    parts = stride(labels, 3, seed=5)
    gen = torch.Generator().manual_seed(5)
    members = [torch.nonzero(labels == c).flatten() for c in range(3)]
    rows = torch.cat([m[torch.randperm(m.numel(), generator=gen)] for m in members])
    assert [p.tolist() for p in parts] == [rows[0::3].tolist(), rows[1::3].tolist(), rows[2::3].tolist()]
    assert [p.numel() for p in parts] == [4, 4, 3]
    assert [labels[p].tolist() for p in parts] == [[0, 0, 1, 2], [0, 0, 1, 2], [0, 1, 1]]
    assert_disjoint(parts, labels.numel())
    assert same(parts, stride(labels, 3, seed=5)) and not same(parts, stride(labels, 3, seed=6))
    assert [set(p.tolist()) for p in parts] == [set(p.tolist()) for p in stratified(labels, 3, seed=5)]


def test_stride_and_stratified_reject_bad_arguments():
    with pytest.raises(ValueError, match=r"^clients = 4: must be at most the 3 examples$"):
        stride(torch.tensor([0, 1, 1]), 4, 0)
    with pytest.raises(ValueError, match=r"^clients = 0: must be a positive integer$"):
        stratified(torch.tensor([0, 1, 1]), 0, 0)
    with pytest.raises(ValueError, match=r"^seed = -2: must be a non-negative integer$"):
        stratified(torch.tensor([0, 1, 1]), 2, -2)

@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: iid(100, 0, 10, 0), "clients = 0: must be a positive integer"),
        (
            lambda: iid(100, 10, 11, 0),
            "per_client = 11: clients * per_client = 110 exceeds n = 100; allowed: at most 10",
        ),
        (lambda: iid(100, 10, 5, -1), "seed = -1: must be a non-negative integer"),
        (lambda: iid(5, 10, None, 0), "clients = 10: must be at most n = 5 for an equal split"),
        (
            lambda: label_shards(SORTED, 100, 2, 301, 0),
            "shard_size = 301: clients * shards_per_client * shard_size = 60200 exceeds the 60000 examples; "
            "allowed: at most 300",
        ),
        (lambda: label_shards(SORTED, 100, 0, 300, 0), "shards_per_client = 0: must be a positive integer"),
        (lambda: label_shards(SORTED.float(), 100, 2, 300, 0), "labels of shape (60000,) and dtype torch.float32"),
        (lambda: dirichlet(SORTED, 10, 0.0, 0), "alpha = 0.0: must be a positive finite number"),
        (lambda: dirichlet(SORTED[:50], 10, 1.0, 0, min_size=6), "min_size = 6: clients * min_size exceeds"),
        (lambda: train_val_split(torch.arange(10), 1.0, 0), "fraction_train = 1.0: must be a number strictly between"),
        (lambda: train_val_split(torch.zeros(3, 3).long(), 0.5, 0), "indices of shape (3, 3) and dtype torch.int64"),
    ],
)
def test_bad_arguments_raise_one_line_value_error(call, needle):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)
