"""The Adult fairness task through the real UCI-format loader (small generated files)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

import fedcomp
from fedcomp.datasets import adult
from tests.conftest import failing_in_round, results_root


@pytest.fixture
def adult_root(tmp_path, monkeypatch):
    adult.write_adult(tmp_path, adult.fake_adult_rows(600, 1), adult.fake_adult_rows(300, 2))
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    return tmp_path


def run(**task):
    return fedcomp.run({"task": {"name": "adult-fairness", **task},
                        "algorithm": {"name": "feddro", "lr": 0.5, "local_steps": 2, "outer_batch": None},
                        "federation": {"clients": 4, "backend": "local"},
                        "run": {"rounds": 10, "progress": "none", "out": results_root()}})


def test_feddro_on_adult_fairness(adult_root, monkeypatch):
    metrics = run().metrics
    monkeypatch.delenv("FEDCOMP_DATA")  # task.root instead (the task took $FEDCOMP_DATA only)
    pd.testing.assert_frame_equal(run(root=str(adult_root)).metrics.drop(columns="wall_time"),
                                  metrics.drop(columns="wall_time"))
    assert set(adult.AdultSplit._fields) >= {"groups", "proxy_groups"}
    assert metrics["objective"].iloc[-1] < metrics["objective"].iloc[0]
    for column in ("test_accuracy", "test_violation", "train_violation"):
        assert metrics[column].notna().all()


def test_unconstrained_baseline_has_no_penalty(adult_root):
    import torch.nn.functional as F

    from fedcomp.platform.config import load_config
    from fedcomp.platform.federation import build_task

    config = load_config({"task": {"name": "adult-fairness", "constrained": False}, "algorithm": {"name": "feddro"},
                          "federation": {"clients": 4, "backend": "local"}})
    task = build_task(config)
    x = task.init_params(None)["x"] + 0.01
    bce = F.binary_cross_entropy_with_logits(task.train.features @ x[:-1] + x[-1], task.train.labels.float())
    assert task.evaluator()({"x": x})["objective"] == pytest.approx(float(bce), rel=1e-6)


def test_missing_adult_files_is_one_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    with pytest.raises(fedcomp.ConfigError, match=r"task.name = 'adult-fairness': .*adult"):
        run()


def test_the_data_root_a_run_read_is_recorded_and_a_resume_elsewhere_warned(adult_root, tmp_path, monkeypatch, capsys):
    """No task.root: the run reads $FEDCOMP_DATA, and run.json says which folder that was; a resume in a shell whose
    $FEDCOMP_DATA names another folder is told (the data may have moved whole, so it is not refused)."""
    mended = failing_in_round(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="power cut"):
        fedcomp.run({"task": {"name": "adult-fairness"}, "algorithm": {"name": "feddro", "local_steps": 2},
                     "federation": {"clients": 4, "backend": "local"},
                     "run": {"rounds": 5, "checkpoint_every": 2, "progress": "none", "out": str(tmp_path / "runs")}})
    mended()
    [run_dir] = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["environment"]["data_root"] == str(adult_root)
    moved = tmp_path / "moved"
    shutil.copytree(adult_root / "adult", moved / "adult")
    monkeypatch.setenv("FEDCOMP_DATA", str(moved))
    capsys.readouterr()
    fedcomp.resume(run_dir)
    assert capsys.readouterr().err.splitlines() == [
        f"fedcomp: warning: fedcomp.resume({str(run_dir)!r}): it read its data under {adult_root} (no task.root: "
        f"$FEDCOMP_DATA or ~/.cache/fedcomp), this shell under {moved}; for the same data, resume with "
        f"FEDCOMP_DATA={adult_root}"]
    assert json.loads((run_dir / "run.json").read_text())["environment"]["data_root"] == str(moved)
    given = run(root=str(adult_root))  # a root given: recorded in the config, not here
    assert "data_root" not in json.loads((given.run_dir / "run.json").read_text())["environment"]
