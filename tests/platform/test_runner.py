"""The runner's results folder, evaluation cadence, checkpoints, resume and load_results."""

from __future__ import annotations

import itertools
import json

import pandas as pd
import pytest

import fedcomp
from fedcomp.platform import results
from fedcomp.platform.errors import StorageError
from tests.conftest import failing_in_round, small


def test_run_writes_parquet_and_run_json(tmp_path):
    result = fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "run.rounds": 5, "run.eval_every": 2}))
    run_dir = result.run_dir
    assert run_dir.parent == tmp_path
    # curves.png and the default tracking (run.track: tensorboard) sit next to the results
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoint.pt", "curves.png", "metrics.parquet", "run.json", "tensorboard"]
    df = pd.read_parquet(run_dir / "metrics.parquet")
    assert df["round"].tolist() == [0, 2, 4, 5]  # initial model, every 2 rounds, and the last round
    for column in ("comm_rounds", "local_steps", "samples", "floats_up", "floats_down", "wall_time",
                   "train_loss", "test_accuracy", "test_loss"):
        assert column in df.columns
    assert df["local_steps"].tolist() == [0, 10, 20, 25]
    final = result.final  # the last row, each value of its column's type (the CLI prints round and comm_rounds)
    assert final == df.iloc[-1].to_dict() and type(final["round"]) is int and type(final["comm_rounds"]) is int
    assert type(final["test_accuracy"]) is float
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "completed" and meta["config"]["algorithm"]["name"] == "fcsg-m"
    assert set(meta["versions"]) >= {"fedcomp", "python", "torch"}
    assert meta["timings"]["train_s"] > 0
    assert not list(run_dir.glob(".*"))  # no temporary files left behind


def test_load_results_reads_one_run_or_a_root(tmp_path):
    a = fedcomp.run("quickstart", small(**{"run.out": str(tmp_path)}))
    b = fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "algorithm.name": "fcsg", "run.seed": 1}))
    one = fedcomp.load_results(a.run_dir)
    assert one["run_id"].unique().tolist() == [a.run_dir.name]
    both = fedcomp.load_results(tmp_path)
    assert sorted(both["algorithm"].unique()) == ["fcsg", "fcsg-m"]
    assert sorted(both["seed"].unique()) == [0, 1]
    pd.testing.assert_frame_equal(
        both[both.run_id == b.run_dir.name].reset_index(drop=True).drop(columns="wall_time"),
        fedcomp.load_results(b.run_dir).drop(columns="wall_time"),
    )
    with pytest.raises(FileNotFoundError):
        fedcomp.load_results(tmp_path / "empty")


def test_same_seed_same_numbers_and_different_seed_different(tmp_path):
    over = small(**{"run.out": str(tmp_path), "run.rounds": 4})
    a = fedcomp.run("quickstart", over).metrics.drop(columns="wall_time")
    b = fedcomp.run("quickstart", over).metrics.drop(columns="wall_time")
    c = fedcomp.run("quickstart", {**over, "run.seed": 5}).metrics.drop(columns="wall_time")
    pd.testing.assert_frame_equal(a, b)
    assert not a["test_accuracy"].equals(c["test_accuracy"])


def test_resume_rejects_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(fedcomp.ConfigError, match="not a fedcomp run folder"):
        fedcomp.resume(tmp_path)


def test_failure_before_first_checkpoint_leaves_no_folder(tmp_path, monkeypatch):
    from fedcomp.platform.server import Server

    def boom(self):
        raise RuntimeError("client exploded")

    monkeypatch.setattr(Server, "run_round", boom)
    with pytest.raises(RuntimeError, match="client exploded"):
        fedcomp.run("quickstart", small(**{"run.out": str(tmp_path)}))
    assert list(tmp_path.iterdir()) == []


def test_a_new_run_folder_name_never_names_a_folder_that_exists(tmp_path, monkeypatch):
    """Runs started in the same second differ by a random tail only: a tail drawn again is drawn anew."""
    second = results.datetime(2026, 12, 6, 1, 2, 3)

    class Now:
        @staticmethod
        def now():
            return second

    tails = iter(["aaaa", "aaaa", "bbbb"])
    monkeypatch.setattr(results, "datetime", Now)
    monkeypatch.setattr(results.secrets, "token_hex", lambda n: next(tails))
    first = results.new_folder_name(tmp_path, "fedavg_task")
    assert first == "fedavg_task_20261206-010203_aaaa"
    (tmp_path / first).mkdir()
    assert results.new_folder_name(tmp_path, "fedavg_task") == "fedavg_task_20261206-010203_bbbb"


def test_claiming_a_folder_whose_name_was_taken_draws_another_tail(tmp_path, monkeypatch):
    """A folder another process created since the name was drawn is left alone: the same name with a new tail is
    created instead; a folder that cannot be created at all is one line."""
    monkeypatch.setattr(results, "_tail", lambda: "bbbb")
    (tmp_path / "run_20261206-010203_aaaa").mkdir()
    assert results.claim_folder(tmp_path / "run_20261206-010203_aaaa") == tmp_path / "run_20261206-010203_bbbb"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run_20261206-010203_aaaa", "run_20261206-010203_bbbb"]
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError, match=f"^cannot create the folder {tmp_path / 'file' / 'x'}: "):
        results.claim_folder(tmp_path / "file" / "x")


def test_a_run_whose_folder_another_run_created_meanwhile_takes_another_name(tmp_path, monkeypatch):
    """Two runs started in the same second (a job array's) drew the same name, and the other one created the folder
    while this one started up: this run ends in a folder of the same prefix and second with another tail, its
    run.json names that, and the other run's folder is as that run left it."""
    from fedcomp.platform import runner

    taken = []
    drawn = runner.new_run_id

    def raced(config):
        name = drawn(config)
        (tmp_path / name).mkdir()  # the other run, meanwhile
        (tmp_path / name / "theirs").write_text("")
        taken.append(name)
        return name

    monkeypatch.setattr(runner, "new_run_id", raced)
    result = fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "run.rounds": 1}))
    [name] = taken
    assert result.run_dir.parent == tmp_path and result.run_dir.name != name
    assert result.run_dir.name.rsplit("_", 1)[0] == name.rsplit("_", 1)[0]
    assert json.loads((result.run_dir / "run.json").read_text())["run_id"] == result.run_dir.name
    assert [p.name for p in (tmp_path / name).iterdir()] == ["theirs"]


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "x.json"
    results.write_json(path, {"a": 1})
    results.write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_a_written_file_has_the_modes_the_umask_gives_not_the_owners_only(tmp_path):
    import os

    before = os.umask(0o022)
    try:
        results.write_json(tmp_path / "x.json", {"a": 1})
        os.umask(0o077)
        results.write_json(tmp_path / "y.json", {"a": 1})
    finally:
        os.umask(before)
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o644  # others may read results on a shared run.out
    assert (tmp_path / "y.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_resuming_a_run_checkpointed_at_its_end_writes_its_metrics_again(tmp_path, damage):
    """A full disk or a kill can stop a run between its last checkpoint and its metrics file: the resume, with no
    round left to run, writes that file from the checkpoint's rows (and drops the kill's temporary files)."""
    done = fedcomp.run("quickstart", small(**{"run.out": str(tmp_path)}))
    metrics = done.run_dir / results.METRICS
    if damage == "deleted":
        metrics.unlink()
    else:
        metrics.write_bytes(b"not parquet")
    (done.run_dir / ".checkpoint.pt.k1ll3d").write_bytes(b"half")
    again = fedcomp.resume(done.run_dir)
    pd.testing.assert_frame_equal(results.read_parquet(metrics), done.metrics)
    pd.testing.assert_frame_equal(again.metrics, done.metrics)
    assert not list(done.run_dir.glob(".*"))
    assert json.loads((done.run_dir / results.RUN_JSON).read_text())["status"] == "completed"


def test_failure_after_a_checkpoint_keeps_a_resumable_folder(tmp_path, monkeypatch, capsys):
    over = small(**{"run.out": str(tmp_path), "run.rounds": 5, "run.checkpoint_every": 2})
    mended = failing_in_round(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="power cut") as failed:
        fedcomp.run("quickstart", over)
    (run_dir,) = tmp_path.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "failed" and "power cut" in meta["error"]  # not Ctrl-C's "interrupted"
    # a bug's traceback ends with what was kept and how to continue
    assert failed.value.__notes__ == [f"fedcomp: round 2 is checkpointed; continue the run with: fedcomp.resume({str(run_dir)!r})"]
    mended()
    capsys.readouterr()
    resumed = fedcomp.resume(run_dir, {"run.progress": "log"})
    assert f"fedcomp: resuming {run_dir} from its checkpoint at round 2 of 5" in capsys.readouterr().err.splitlines()
    resumed_meta = json.loads((run_dir / "run.json").read_text())
    assert resumed_meta["status"] == "completed"  # and where the rounds before the resume ran
    assert resumed_meta["earlier_legs"] == [{k: meta[k] for k in ("status", "host", "written", "backend")} | {"until_round": 2}]
    full = fedcomp.run("quickstart", {**over, "run.out": str(tmp_path / "ref")})
    pd.testing.assert_frame_equal(resumed.metrics.drop(columns="wall_time"), full.metrics.drop(columns="wall_time"))


def test_a_platform_error_after_a_checkpoint_says_how_to_continue_the_run(tmp_path, monkeypatch):
    from fedcomp.platform.errors import ClientFailure

    failing_in_round(monkeypatch, 3, ClientFailure("client 2 kept failing"))
    with pytest.raises(ClientFailure, match=r"^client 2 kept failing; round 2 is checkpointed; continue the run with: "
                                            r"fedcomp.resume\('.*'\)$") as failed:
        fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "run.rounds": 5, "run.checkpoint_every": 2}))
    (run_dir,) = tmp_path.iterdir()
    assert failed.value.path == run_dir  # what the API continues: fedcomp.resume(error.path)


def test_drive_asks_for_the_rounds_up_to_each_checkpoint_at_once_with_the_ones_it_evaluates():
    """``drive`` hands the server each stretch of rounds up to the next checkpoint in one ``run_rounds`` (so that a
    server behind a hop can pipeline them), marking the rounds it evaluates; it checkpoints only at a stretch's
    end, when nothing more runs; a row's wall time is its round's end less the evaluation."""
    from fedcomp.api import make_server
    from fedcomp.platform.config import load_config
    from fedcomp.platform.runner import drive

    config = load_config("quickstart", small(**{"run.rounds": 5, "run.eval_every": 2, "run.checkpoint_every": 3}))
    server = make_server(config)
    calls: list[object] = []
    run_rounds, evaluate, checkpoint = server.run_rounds, server.evaluate, server.checkpoint

    def counted_run_rounds(evaluated):
        calls.append(list(evaluated))
        return run_rounds(evaluated)

    server.run_rounds = counted_run_rounds  # type: ignore[method-assign]
    server.evaluate = lambda: calls.append("evaluate") or evaluate()  # type: ignore[method-assign]
    server.checkpoint = lambda: calls.append("checkpoint") or checkpoint()  # type: ignore[method-assign]
    steps = list(drive(config, server))
    # the initial evaluation; rounds 1-3 (round 2 evaluated: eval_every), a checkpoint; rounds 4-5 (5 is the last)
    assert calls == ["evaluate", [False, True, False], "evaluate", "checkpoint", [True, True], "evaluate", "evaluate",
                     "checkpoint"]
    assert [step.round for step in steps] == [1, 2, 3, 4, 5]
    assert [step.checkpoint is not None for step in steps] == [False, False, True, False, True]
    assert [step.row is not None for step in steps] == [False, True, False, True, True]
    rows = steps[-1].rows
    assert [row["round"] for row in rows] == [0, 2, 4, 5]
    assert all(a["wall_time"] <= b["wall_time"] for a, b in itertools.pairwise(rows))
    assert results.checkpoint_from_bytes(steps[2].checkpoint)["server"]["counters"]["round"] == 3


def test_run_out_takes_a_path_and_a_home_folder_and_the_result_names_its_folder_absolutely(tmp_path, monkeypatch):
    """``run.out`` as a ``pathlib.Path`` or ``~/...`` (expanded, not a folder named ``~``); the result's ``run_dir`` is
    absolute, so it still names the run after the caller changes its working directory."""
    from pathlib import Path

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    home = fedcomp.run("quickstart", small(**{"run.out": "~/results", "run.rounds": 1}))
    assert home.run_dir.parent == tmp_path / "home" / "results" and not (tmp_path / "~").exists()
    relative = fedcomp.run("quickstart", small(**{"run.out": Path("rel"), "run.rounds": 1}))
    assert relative.run_dir.is_absolute() and relative.run_dir.parent == tmp_path / "rel"
    monkeypatch.chdir(tmp_path / "home")
    assert relative.run_dir.is_dir() and len(fedcomp.load_results(relative.run_dir)) == 2


def test_resuming_a_completed_run_reads_it_back_and_rewrites_nothing(tmp_path):
    """No backend started (it took 2-6 s to start one, only to give back the stored results), run.json untouched."""
    done = fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "run.rounds": 2}))
    before = {p.name: p.read_bytes() for p in done.run_dir.iterdir() if p.is_file()}
    again = fedcomp.resume(done.run_dir)
    assert again.run_dir == done.run_dir and again.config == done.config
    pd.testing.assert_frame_equal(again.metrics, done.metrics, check_exact=True)
    assert {p.name: p.read_bytes() for p in done.run_dir.iterdir() if p.is_file()} == before


def test_the_apis_arguments_of_the_wrong_type_are_one_line():
    from fedcomp.platform.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^run.rounds given twice: 2 in overrides and run__rounds=3; give it once$"):
        fedcomp.run("quickstart", {"run.rounds": 2}, run__rounds=3)  # the keyword won, silently

    with pytest.raises(ConfigError, match=r"^overrides = \['run.rounds', 2\]: must be a mapping of 'section.key'"):
        fedcomp.run("quickstart", ["run.rounds", 2])  # type: ignore[arg-type]
    for bad in (3, None):
        with pytest.raises(ConfigError, match=rf"^run_dir = {bad}: must be a run folder's path"):
            fedcomp.resume(bad)  # type: ignore[arg-type]


def test_the_sweep_api_is_the_sweep_layers_own_signature_and_docs():
    """``help(fedcomp.sweep)`` lists its options (it was a ``**options`` wrapper)."""
    import inspect

    from fedcomp.sweeps import tuner

    assert fedcomp.sweep is tuner.sweep and fedcomp.resume_sweep is tuner.resume_sweep
    assert {"search", "seeds", "overrides", "extend_edges"} <= set(inspect.signature(fedcomp.sweep).parameters)
    assert "verbose" in (fedcomp.resume_sweep.__doc__ or "")
