"""Every shipped preset loads, describes itself, and -- where it needs no external data -- runs a round."""

from __future__ import annotations

import pytest

import fedcomp
from fedcomp.datasets.binary import OFFLINE_DATASETS
from fedcomp.platform.config import load_config, preset_description, preset_names

NEEDS_DATA = {"adult-fairness", "omniglot"}


def needs_external_data(config) -> bool:
    task = config.task
    return (config.task_name in NEEDS_DATA or getattr(task, "source", None) == "mnist"
            or str(getattr(task, "dataset", "")).startswith("cifar")
            or (config.task_name == "imbalanced-binary" and task.dataset not in OFFLINE_DATASETS))


@pytest.mark.parametrize("name", preset_names())
def test_preset_loads_and_runs_offline(name, tmp_path):
    config = load_config(name)
    assert preset_description(name)
    if needs_external_data(config):
        pytest.skip(f"{name} reads real data from the data root")
    result = fedcomp.run(config, {"federation.backend": "local", "run.rounds": 1, "run.out": str(tmp_path),
                                  "run.progress": "none"})
    assert result.metrics["round"].tolist() == [0, 1]
