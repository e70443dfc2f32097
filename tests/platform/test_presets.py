"""Every shipped preset loads, describes itself, and -- where it needs no external data -- runs a round."""

from __future__ import annotations

import pytest
import torch

import fedcomp
from fedcomp.datasets.binary import OFFLINE_DATASETS
from fedcomp.platform.config import load_config, preset_description, preset_names

NEEDS_DATA = {"adult-fairness"}
SLOW = {"maml-fewshot-mnist"}  # over 5 s for its one round (second-order MAML on MNIST images)
# one round of these is minutes (16 clients x q = 10 second-order MAML steps on real Omniglot): fewer here
LIGHTER = {f"maml-omniglot-small-{k}shot": {"federation.clients": 2, "algorithm.local_steps": 1, "algorithm.outer_batch": 1,
                                            "algorithm.first_batch": 1, "task.eval_tasks": 2} for k in (1, 5)}


def needs_external_data(config) -> bool:
    task = config.task
    return (config.task_name in NEEDS_DATA or getattr(task, "source", None) in ("mnist", "omniglot")
            or str(getattr(task, "dataset", "")).startswith("cifar")
            or (config.task_name == "imbalanced-binary" and task.dataset not in OFFLINE_DATASETS))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in preset_names()])
def test_preset_loads_and_runs_offline(name, tmp_path):
    config = load_config(name)
    assert preset_description(name)
    if needs_external_data(config):
        pytest.skip(f"{name} reads real data from the data root")
    result = fedcomp.run(config, {"federation.backend": "local", "run.rounds": 1, "run.out": str(tmp_path),
                                  "run.progress": "none", **LIGHTER.get(name, {})})
    assert result.metrics["round"].tolist() == [0, 1]


@pytest.mark.parametrize("preset, dataset, model", [("auc-table1", "cifar10", None), ("auprc-table2", "cifar10", "cifar-conv")])
def test_real_data_auc_presets_run_on_files_in_torchvision_format(preset, dataset, model, tmp_path, monkeypatch):
    """The Table 1 / Table 2 presets' real-data path (torchvision's CIFAR loader, ResNet20 with the exact
    Hessian-vector Jacobian for LocalSCGDAM, D-AUPRC's CIFAR net for FCSG-M) on generated CIFAR-10 pickles."""
    from fedcomp.datasets.cifar import write_cifar_batches

    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", 400), ("test", 100)):
        images = torch.randint(0, 256, (n, 3, 32, 32), generator=gen, dtype=torch.uint8)
        write_cifar_batches(tmp_path, images, torch.arange(n) % 10, "cifar10", split)
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    overrides = {"task.dataset": dataset, "task.verify_md5": False, "federation.backend": "local",
                 "federation.clients": 4, "algorithm.local_steps": 1, "run.rounds": 1, "run.eval_every": 1,
                 "run.out": str(tmp_path / "out"), "run.progress": "none"}
    if model:
        overrides["task.model"] = model
    if preset == "auc-table1":
        overrides.update({"algorithm.outer_batch": 4, "algorithm.inner_batch": 4})
    result = fedcomp.run(preset, overrides)
    assert result.metrics["round"].tolist() == [0, 1]
    assert 0.0 <= result.final["test_auroc"] <= 1.0
