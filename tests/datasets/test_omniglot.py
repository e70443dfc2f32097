"""Omniglot in torchvision's format: generated files load through the real loader with the Vinyals split sizes,
and the omniglot task runs on them."""

from __future__ import annotations

import pytest
import torch

import fedcomp
from fedcomp.datasets.omniglot import OMNIGLOT_ALPHABETS, load_omniglot, vinyals_split, write_omniglot
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import build_task
from fedcomp.platform.rng import generator


def test_generated_tree_loads_with_the_vinyals_split_sizes(tmp_path):
    write_omniglot(tmp_path, drawings=1, size=20)
    data = load_omniglot(tmp_path, verify_md5=False)
    assert data.images.shape == (1623, 1, 28, 28) and data.images.dtype == torch.uint8
    assert data.characters == sorted(data.characters)
    sizes = {s: vinyals_split(data.characters, s) for s in ("train", "val", "test")}
    assert [len(sizes[s]) for s in ("train", "val", "test")] == [1028, 172, 423]
    assert sorted(c for split in sizes.values() for c in split) == list(range(1623))  # disjoint and complete
    assert data.images.float().mean() < 128  # inverted: the generated black strokes are bright
    assert sum(sum(t.values()) for t in OMNIGLOT_ALPHABETS.values()) == 1623


def test_missing_files_and_md5_are_one_clear_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="Omniglot not found"):
        load_omniglot(tmp_path / "nothing", verify_md5=False)
    write_omniglot(tmp_path, {"images_background": {"Latin": 1}, "images_evaluation": {"Kannada": 1}}, size=8)
    with pytest.raises(FileNotFoundError, match="md5"):
        load_omniglot(tmp_path, verify_md5=True)


SMALL = {"images_background": {"Latin": 10, "Hebrew": 5}, "images_evaluation": {"Angelic": 5, "Kannada": 6}}


def test_omniglot_task_on_generated_files(tmp_path):
    write_omniglot(tmp_path, SMALL, drawings=20, size=12)
    overrides = {"task.name": "omniglot", "task.root": str(tmp_path), "task.verify_md5": False, "task.eval_tasks": 3,
                 "algorithm.name": "fcsg-m", "algorithm.first_batch": 2, "algorithm.outer_batch": 2,
                 "algorithm.inner_batch": 5, "algorithm.local_steps": 2, "federation.clients": 3,
                 "federation.backend": "local", "run.rounds": 1, "run.progress": "none", "run.out": str(tmp_path / "r")}
    task = build_task(load_config("quickstart", overrides))
    assert len(task.train_classes) == (10 + 5) * 4 and len(task.eval_classes) == 6 * 4  # rotations as classes
    owned = [set(classes) for classes, _ in task._shares]
    assert all(not (a & b) for i, a in enumerate(owned) for b in owned[i + 1:])
    assert set().union(*owned) == set(task.train_classes)
    episodes = task.episodes(1, 2, generator(0, "e"))
    assert episodes.support_x.shape == (2, 5, 1, 28, 28) and episodes.query_x.shape == (2, 75, 1, 28, 28)
    result = fedcomp.run(load_config("quickstart", overrides))
    assert 0.0 <= result.final["test_accuracy"] <= 1.0
    with pytest.raises(ConfigError, match=r"task\.client_split = 'classes'"):
        build_task(load_config("quickstart", {**overrides, "federation.clients": 16}))
    with pytest.raises(ConfigError, match=r"task\.root"):
        build_task(load_config("quickstart", {**overrides, "task.root": str(tmp_path / "none")}))
