"""The runner's results folder, evaluation cadence, checkpoints, resume and load_results."""

from __future__ import annotations

import itertools
import json

import pandas as pd
import pytest

import fedcomp
from fedcomp.platform import results
from tests.conftest import small


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


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "x.json"
    results.write_json(path, {"a": 1})
    results.write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_failure_after_a_checkpoint_keeps_a_resumable_folder(tmp_path, monkeypatch):
    from fedcomp.platform.server import Server

    real = Server.run_round

    def fail_in_round_4(self):
        if self.counters.round == 3:
            raise RuntimeError("power cut")
        return real(self)

    over = small(**{"run.out": str(tmp_path), "run.rounds": 5, "run.checkpoint_every": 2})
    monkeypatch.setattr(Server, "run_round", fail_in_round_4)
    with pytest.raises(RuntimeError, match="power cut"):
        fedcomp.run("quickstart", over)
    (run_dir,) = tmp_path.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted" and "power cut" in meta["error"]
    monkeypatch.setattr(Server, "run_round", real)
    resumed = fedcomp.resume(run_dir)
    full = fedcomp.run("quickstart", {**over, "run.out": str(tmp_path / "ref")})
    pd.testing.assert_frame_equal(resumed.metrics.drop(columns="wall_time"), full.metrics.drop(columns="wall_time"))


def test_an_evaluated_round_is_one_call_to_the_server_and_its_wall_time_leaves_the_evaluation_out():
    """``drive`` asks for the round and its evaluation together (``run_round_evaluated``: one hop to a Ray server
    actor, not two) and only the rounds it evaluates; a row's wall time is the round's end, as before."""
    from fedcomp.api import make_server
    from fedcomp.platform.config import load_config
    from fedcomp.platform.runner import drive

    config = load_config("quickstart", small(**{"run.rounds": 5, "run.eval_every": 2}))
    server = make_server(config)
    calls: list[str] = []
    run_round, evaluate, evaluated = server.run_round, server.evaluate, server.run_round_evaluated

    def counted_evaluate():
        calls.append("evaluate")
        return evaluate()

    def counted_evaluated():
        calls.append("evaluated")
        return evaluated()

    server.run_round = lambda: calls.append("round") or run_round()  # type: ignore[method-assign]
    server.evaluate = counted_evaluate  # type: ignore[method-assign]
    server.run_round_evaluated = counted_evaluated  # type: ignore[method-assign]
    steps = list(drive(config, server))
    # the initial evaluation; rounds 2 and 4 (eval_every) and 5 (the last) evaluated with their round
    assert calls == ["evaluate", "round", "evaluated", "round", "evaluate", "round", "evaluated", "round", "evaluate",
                     "evaluated", "round", "evaluate"]
    rows = steps[-1].rows
    assert [row["round"] for row in rows] == [0, 2, 4, 5]
    assert all(a["wall_time"] <= b["wall_time"] for a, b in itertools.pairwise(rows))
