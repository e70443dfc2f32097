"""Tracking of single runs with the real libraries, read back the way their own tools read them:
TensorBoard event files through TensorBoard's EventAccumulator, the MLflow store through MlflowClient,
the offline W&B run through its transaction log."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedcomp
from fedcomp.cli import main
from fedcomp.platform import tracking
from tests.conftest import failing_in_round, small
from tests.platform.wandb_log import read_offline_run

COUNTERS = ["comm_rounds", "local_steps", "samples", "floats_up", "floats_down"]


def tracked(tmp_path, track, **over):
    return fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "run.rounds": 4, "run.eval_every": 2,
                                               "run.track": track, **over}))


def test_tensorboard_event_files_hold_config_rounds_counters_and_final_report(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = tracked(tmp_path, "tensorboard")
    df = pd.read_parquet(result.run_dir / "metrics.parquet")
    events = EventAccumulator(str(result.run_dir / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    for metric in ("test_accuracy", "test_loss", "train_loss"):
        assert f"metrics/{metric}" in scalars
    for counter in COUNTERS:
        assert f"counters/{counter}" in scalars
    accuracy = events.Scalars("metrics/test_accuracy")
    assert [e.step for e in accuracy] == df["round"].tolist() == [0, 2, 4]
    np.testing.assert_array_equal([e.value for e in accuracy], df["test_accuracy"].to_numpy(np.float32))
    assert [e.value for e in events.Scalars("counters/comm_rounds")] == df["comm_rounds"].tolist()
    texts = {tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]
             if tag.endswith("text_summary")}
    assert "algorithm" in texts["config/text_summary"] and "fcsg-m" in texts["config/text_summary"]
    report = texts["report/text_summary"]
    assert "completed" in report and "test_accuracy" in report and "train_s" in report
    # the HParams tab: the config as hyperparameters, the final metrics as its metrics
    plugins = {tag for tag in events.summary_metadata if events.summary_metadata[tag].plugin_data.plugin_name == "hparams"}
    assert plugins


@pytest.mark.slow
def test_mlflow_store_holds_params_metrics_artifacts_and_status(tmp_path):
    result = tracked(tmp_path, "mlflow")
    df = pd.read_parquet(result.run_dir / "metrics.parquet")
    assert (tmp_path / "mlflow" / "mlflow.db").is_file()
    client = tracking.mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("fedcomp").experiment_id])
    assert run.info.run_name == result.run_dir.name and run.info.status == "FINISHED"
    assert run.data.tags["fedcomp.run_dir"] == str(result.run_dir.resolve())
    assert run.data.params == {k: str(v) for k, v in tracking.flat_config(result.config.to_dict()).items()}
    history = client.get_metric_history(run.info.run_id, "test_accuracy")
    assert [m.step for m in history] == df["round"].tolist()
    assert [m.value for m in history] == df["test_accuracy"].tolist()  # float64 both ways: exact
    assert [m.value for m in client.get_metric_history(run.info.run_id, "floats_up")] == df["floats_up"].tolist()
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"run.json", "metrics.parquet", "curves.png"}
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.slow
def test_mlflow_run_of_a_resumed_run_continues_and_a_failed_start_is_deleted(tmp_path, monkeypatch):
    over = {"run.rounds": 6, "run.checkpoint_every": 2, "run.eval_every": 1}
    mended = failing_in_round(monkeypatch, 0)  # before the first checkpoint
    with pytest.raises(RuntimeError):
        tracked(tmp_path, "mlflow", **over)
    mended()
    mended = failing_in_round(monkeypatch, 3)  # after the checkpoint of round 2
    with pytest.raises(RuntimeError):
        tracked(tmp_path, "mlflow", **over)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name != "mlflow"]
    mended()
    fedcomp.resume(run_dir)

    client = tracking.mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name("fedcomp").experiment_id
    from mlflow.entities import ViewType

    runs = client.search_runs([experiment], run_view_type=ViewType.ALL)
    assert sorted(r.info.lifecycle_stage for r in runs) == ["active", "deleted"]
    (active,) = [r for r in runs if r.info.lifecycle_stage == "active"]
    assert active.info.run_name == run_dir.name and active.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(active.info.run_id, "test_accuracy")]
    assert steps == list(range(7))  # every round once: round 3, logged before the failure, not again on resume


def test_wandb_offline_run_holds_config_history_and_summary(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is fedcomp's default
    result = tracked(tmp_path, "wandb")
    df = pd.read_parquet(result.run_dir / "metrics.parquet")
    (offline,) = (result.run_dir / "wandb").glob("offline-run-*")
    logged = read_offline_run(offline)
    assert logged["name"] == result.run_dir.name, f"records in the offline run's log: {logged['kinds']}"
    flat = tracking.flat_config(result.config.to_dict())
    assert {k: logged["config"][k] for k in flat} == flat
    history = [h for h in logged["history"] if "test_accuracy" in h]
    assert [h["_step"] for h in history] == df["round"].tolist()
    assert [h["test_accuracy"] for h in history] == df["test_accuracy"].tolist()
    assert [h["comm_rounds"] for h in history] == df["comm_rounds"].tolist()
    assert logged["summary"]["status"] == "completed" and logged["summary"]["train_s"] > 0
    assert logged["summary"]["test_accuracy"] == df["test_accuracy"].iloc[-1]
    assert sorted(p.name for p in (offline / "files").iterdir() if p.suffix != ".txt") == [
        "curves.png", "metrics.parquet", "run.json"]  # uploaded with the run by `wandb sync`


def test_none_writes_no_tracking_files(tmp_path):
    result = tracked(tmp_path, "none")
    assert sorted(p.name for p in result.run_dir.iterdir()) == ["checkpoint.pt", "curves.png", "metrics.parquet",
                                                                "run.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [result.run_dir.name]


def test_a_missing_tracking_library_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(tracking.PACKAGES, "wandb", "fedcomp_test_no_such_package")
    code = main(["run", "quickstart", "--set", "federation.backend=local", "--set", f"run.out={tmp_path}",
                 "--set", "run.track=wandb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "run.track = 'wandb'" in err[0] and "pip install 'fedcomp[track]'" in err[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_an_unknown_wandb_mode_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, command):
    """W&B's own check failed later: a pydantic traceback in a sweep (its folder left), a warning in a run."""
    monkeypatch.setenv("WANDB_MODE", "bogus")
    code = main([command, "quickstart" if command == "run" else "quick", "--set", "federation.backend=local", "--set",
                 f"run.out={tmp_path}", "--set", "run.track=wandb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["fedcomp: error: WANDB_MODE = 'bogus' (run.track = 'wandb'): allowed offline, online, "
                                 "disabled, dryrun, run"]
    assert list(tmp_path.iterdir()) == []


def store_of_another_mlflow(out: Path) -> None:
    """An MLflow database at a schema revision this MLflow does not know (written by a later one): readable as a
    database, so the run starts, and refused by MLflow's migration as the tracker starts."""
    (out / "mlflow").mkdir()
    with contextlib.closing(sqlite3.connect(out / "mlflow" / "mlflow.db")) as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES ('f0000000000f')")
        db.commit()


def test_an_unknown_tracker_is_a_config_error(tmp_path):
    with pytest.raises(fedcomp.ConfigError, match=r"run\.track"):
        tracked(tmp_path, "neptune")


def test_a_tracker_that_fails_warns_once_and_the_run_goes_on(tmp_path, capsys):
    store_of_another_mlflow(tmp_path)
    result = tracked(tmp_path, "mlflow")
    assert result.final["round"] == 4 and (result.run_dir / "metrics.parquet").is_file()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("fedcomp: warning: mlflow tracking could not start"), warnings
    assert json.loads((result.run_dir / "run.json").read_text())["status"] == "completed"


def test_cli_names_where_to_open_the_tracking(tmp_path, capsys):
    assert main(["run", "quickstart", "--set", "federation.backend=local", "--set", "federation.clients=4",
                 "--set", "algorithm.local_steps=5", "--set", "task.test_samples=2000", "--set", "run.rounds=2",
                 "--set", "run.progress=none", "--set", f"run.out={tmp_path}"]) == 0
    out = capsys.readouterr().out
    (run_dir,) = tmp_path.iterdir()
    assert f"curves: {run_dir / 'curves.png'}" in out
    assert f"tracking: tensorboard --logdir {run_dir / 'tensorboard'}" in out


def test_cli_names_the_mlflow_store_that_holds_the_run(tmp_path, capsys):
    assert main(["run", "quickstart", "--set", "federation.backend=local", "--set", "federation.clients=4",
                 "--set", "algorithm.local_steps=5", "--set", "run.rounds=1", "--set", "run.progress=none",
                 "--set", f"run.out={tmp_path}", "--set", "run.track=mlflow"]) == 0
    out = capsys.readouterr().out
    assert f"tracking: mlflow ui --backend-store-uri {tracking.mlflow_uri(tmp_path)}" in out, out


def test_a_viewers_command_says_what_to_install_where_it_is_missing(tmp_path, monkeypatch):
    """The tracking line's ``mlflow ui`` failed with "No module named 'flask'" under the ``track`` extra (its
    mlflow-skinny writes the store and serves no UI): a viewer whose module is missing here says what to install."""
    import importlib.util

    found = importlib.util.find_spec
    assert tracking.where("mlflow", tmp_path / "run") == (
        f"mlflow ui --backend-store-uri {tracking.mlflow_uri(tmp_path)}"
        + ("" if found("flask") else "  (after: pip install mlflow)"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else found(name, *a))
    assert tracking.where("tensorboard", tmp_path / "run") == (
        f"tensorboard --logdir {tmp_path / 'run' / 'tensorboard'}  (after: pip install tensorboard)")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert tracking.where("mlflow", tmp_path / "run") == f"mlflow ui --backend-store-uri {tracking.mlflow_uri(tmp_path)}"


def test_a_viewers_command_quotes_a_folder_with_a_space(tmp_path):
    """Pasted, ``tensorboard --logdir /x/my runs/...`` failed: "invalid choice: 'runs/...'"."""
    import shlex

    spaced = tmp_path / "my runs" / "run"
    assert shlex.split(tracking.where("tensorboard", spaced).split("  (")[0]) == [
        "tensorboard", "--logdir", str(spaced / "tensorboard")]
    assert shlex.split(tracking.where("mlflow", spaced).split("  (")[0]) == [
        "mlflow", "ui", "--backend-store-uri", tracking.mlflow_uri(spaced.parent)]
    assert shlex.split(tracking.where("wandb", spaced)) == ["wandb", "sync", f"{spaced}/wandb/offline-run-*"]
    assert tracking.where("wandb", spaced, sweep=True).endswith("'/*/wandb/offline-run-*")


def test_cli_names_no_tracking_to_open_where_the_tracker_could_not_start(tmp_path, capsys):
    """It pointed at a store that held nothing of the run (MLflow's database of another version)."""
    store_of_another_mlflow(tmp_path)
    assert main(["run", "quickstart", "--set", "federation.backend=local", "--set", "federation.clients=4",
                 "--set", "algorithm.local_steps=5", "--set", "run.rounds=1", "--set", "run.progress=none",
                 "--set", f"run.out={tmp_path}", "--set", "run.track=mlflow"]) == 0
    captured = capsys.readouterr()
    assert "mlflow tracking could not start" in captured.err and "tracking:" not in captured.out


@pytest.mark.slow
def test_runs_that_start_together_on_a_new_mlflow_store_all_track(tmp_path):
    """The first use creates the store's tables: processes that meet there take turns (each failed but one)."""
    import subprocess
    import sys
    import textwrap

    go = tmp_path / "go"
    code = textwrap.dedent(f"""
        import pathlib, time
        import mlflow.tracking  # the import before the start line, so that the processes meet at the tables
        from fedcomp.platform.tracking import mlflow_client, mlflow_experiment
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.01)
        client = mlflow_client({str(tmp_path / "results")!r})
        print(mlflow_experiment(client, {str(tmp_path / "results")!r}, "shared"))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    time.sleep(8)  # every process imported MLflow and waits
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-500:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1  # one experiment, found by all
