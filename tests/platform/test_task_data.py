"""``Task.check_data``: the error a task's construction raises for data files that are not there, without reading a
file -- what a sweep checks once before its trials start -- for every built-in task that reads a data root."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedcomp.datasets.adult import ADULT_FILES
from fedcomp.datasets.catvsdog import CATVSDOG_FILES, CATVSDOG_FOLDER
from fedcomp.datasets.cifar import CIFAR_FILES, CIFAR_FOLDERS
from fedcomp.datasets.melanoma import MELANOMA_FOLDER
from fedcomp.datasets.mnist import IDX_FILES
from fedcomp.datasets.omniglot_small import SMALL_ZIPS
from fedcomp.datasets.stl10 import STL10_FILES, STL10_FOLDER
from fedcomp.platform import catalog
from fedcomp.platform.errors import ConfigError

Layout = Callable[[Path], None]
"""Creates, under a data root, every file (or folder) a dataset's loader looks for, each empty."""


def files(folder: str, names: tuple[str, ...] | list[str]) -> Layout:
    def make(root: Path) -> None:
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            (root / folder / name).touch()
    return make


def cifar(name: str) -> Layout:
    listed = CIFAR_FILES[name]
    return files(CIFAR_FOLDERS[name], [*listed["train"], *listed["test"], listed["meta"]])


def omniglot_folders(root: Path) -> None:
    for name in ("images_background", "images_evaluation"):
        (root / "omniglot-py" / name).mkdir(parents=True)


READING: dict[str, tuple[str, dict[str, Any], Layout]] = {
    "imbalanced-mnist": ("imbalanced-binary", {"dataset": "mnist"}, files("MNIST/raw", IDX_FILES)),
    "imbalanced-fashionmnist": ("imbalanced-binary", {"dataset": "fashionmnist"}, files("FashionMNIST/raw", IDX_FILES)),
    "imbalanced-cifar10": ("imbalanced-binary", {"dataset": "cifar10"}, cifar("cifar10")),
    "imbalanced-cifar100": ("imbalanced-binary", {"dataset": "cifar100"}, cifar("cifar100")),
    "imbalanced-stl10": ("imbalanced-binary", {"dataset": "stl10"}, files(STL10_FOLDER, STL10_FILES)),
    "imbalanced-catvsdog": ("imbalanced-binary", {"dataset": "catvsdog"}, files(CATVSDOG_FOLDER, CATVSDOG_FILES)),
    "imbalanced-melanoma": ("imbalanced-binary", {"dataset": "melanoma"}, files(MELANOMA_FOLDER, ["train.csv"])),
    "dro-cifar10-st": ("dro-classification", {"dataset": "cifar10-st"}, cifar("cifar10")),
    "dro-cifar100-st": ("dro-classification", {"dataset": "cifar100-st"}, cifar("cifar100")),
    "hyper-representation-mnist": ("hyper-representation", {"source": "mnist"}, files("MNIST/raw", IDX_FILES)),
    "loss-tuning-mnist": ("loss-tuning", {"source": "mnist"}, files("MNIST/raw", IDX_FILES)),
    "adult-fairness": ("adult-fairness", {}, files("adult", ADULT_FILES)),
    "omniglot": ("omniglot", {"source": "omniglot"}, omniglot_folders),
    "omniglot-small": ("omniglot", {"source": "omniglot-small"}, files(".", list(SMALL_ZIPS))),
}
"""Every built-in task configuration that reads files under its data root, and the files it looks for."""


def build(task: str, params: dict[str, Any], root: Path | None) -> Any:
    cls = catalog.task_class(task)
    return cls(cls.Params(**params, root=None if root is None else str(root)), seed=0, clients=2)


def check(task: str, params: dict[str, Any], root: Path | None) -> None:
    cls = catalog.task_class(task)
    cls.check_data(cls.Params(**params, root=None if root is None else str(root)))


def test_every_task_that_takes_a_data_root_has_a_case():
    takes_root = {name for name, d in catalog.tasks().items() if "root" in d.Params.model_fields}
    assert takes_root == {task for task, _, _ in READING.values()}


@pytest.mark.parametrize("case", READING, ids=list(READING))
def test_missing_files_are_the_error_building_the_task_raises(case, tmp_path):
    task, params, _ = READING[case]
    with pytest.raises(ConfigError) as built:
        build(task, params, tmp_path)
    with pytest.raises(ConfigError) as checked:
        check(task, params, tmp_path)
    assert str(checked.value) == str(built.value)
    assert "not found" in str(checked.value) or "no such file" in str(checked.value)


@pytest.mark.parametrize("case", READING, ids=list(READING))
def test_files_that_are_there_pass_unread(case, tmp_path):
    """Every file there but empty: the check passes (it reads none); building the task fails on reading one."""
    task, params, layout = READING[case]
    layout(tmp_path)
    check(task, params, tmp_path)
    with pytest.raises(ConfigError):
        build(task, params, tmp_path)


def test_the_default_root_is_fedcomp_data(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    with pytest.raises(ConfigError, match=f"task.dataset = 'cifar10': cifar10 not found: {tmp_path}/cifar-10-batches-py"):
        check("imbalanced-binary", {"dataset": "cifar10"}, None)
    cifar("cifar10")(tmp_path)
    check("imbalanced-binary", {"dataset": "cifar10"}, None)


@pytest.mark.parametrize(("task", "params"), [
    ("imbalanced-binary", {"dataset": "breast-cancer"}),
    ("imbalanced-binary", {"dataset": "digits"}),
    ("imbalanced-binary", {"dataset": "mnist5k"}),
    ("dro-classification", {"dataset": "digits-st"}),
    ("dro-classification", {"dataset": "breast-cancer"}),
    ("hyper-representation", {"source": "mnist5k"}),
    ("loss-tuning", {"source": "mnist5k"}),
    ("omniglot", {"source": "omniglot-small", "root": None}),
])
def test_data_shipped_with_a_package_needs_no_root(task, params, tmp_path):
    cls = catalog.task_class(task)
    cls.check_data(cls.Params(**{"root": str(tmp_path / "nowhere"), **params}))


@pytest.mark.parametrize("task", sorted(n for n, d in catalog.tasks().items() if "root" not in d.Params.model_fields))
def test_a_task_that_reads_no_files_has_nothing_to_check(task):
    cls = catalog.task_class(task)
    assert cls.check_data(cls.Params()) is None
