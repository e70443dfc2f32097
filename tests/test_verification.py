"""``fedcomp verify``: a finished run re-run from its run.json is bit-identical (also on the other backend),
a tampered metrics.parquet or environment is reported, bad input is one line with exit code 2."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import pytest

import fedcomp
from fedcomp.cli import main
from tests.conftest import small


def finished_run(tmp_path: Path, **over) -> Path:
    return fedcomp.run("quickstart", small(**{"run.out": str(tmp_path / "runs"), "run.rounds": 4, **over})).run_dir


def test_run_json_records_the_environment(tmp_path):
    run_dir = finished_run(tmp_path)
    env = json.loads((run_dir / "run.json").read_text())["environment"]
    assert set(env) >= {"packages", "git", "host", "cpu", "os", "devices"}
    assert env["packages"]["torch"] and env["packages"]["ray"] and env["packages"]["python"]
    assert env["devices"] == ["cpu"]
    checkout = Path(fedcomp.__file__).resolve().parent.parent
    if (checkout / ".git").exists():
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert env["git"]["revision"] == head.stdout.strip()


def test_a_verified_run_is_identical_and_nothing_is_left_behind(tmp_path, capsys):
    run_dir = finished_run(tmp_path)
    before = sorted(p.name for p in run_dir.iterdir())
    assert main(["verify", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "identical: all 12 metric columns bit-identical over 3 rows" in out and "test_accuracy" in out
    assert "environment: same as the original's" in out
    assert sorted(p.name for p in run_dir.iterdir()) == before
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]
    shown = repr(fedcomp.verify(run_dir))  # in a notebook: one line, not the dataclass's 800 characters
    assert shown.startswith(f"Verification(identical: 12 metric columns over 3 rows of {run_dir.name}, re-run in ")
    assert shown.endswith(" s; .report() says all)")


@pytest.mark.ray
@pytest.mark.smoke
def test_a_local_run_verified_on_ray_is_identical(keeping, tmp_path, capsys):
    # quickstart's full test set: its mean loss is a reduction torch splits across the local process's threads
    run_dir = finished_run(tmp_path, **{"task.test_samples": 50_000, "run.rounds": 8, "run.eval_every": 1})
    keep = tmp_path / "rerun"
    assert main(["verify", str(run_dir), "--backend", "ray", "--set", "federation.clients_per_actor=2",
                 "--out", str(keep)]) == 0
    out = capsys.readouterr().out
    assert "re-ran on ray (2 client actors, clients_per_actor=2)" in out and "identical:" in out
    (rerun,) = keep.iterdir()
    assert json.loads((rerun / "run.json").read_text())["backend"]["name"] == "ray"
    pd.testing.assert_frame_equal(pd.read_parquet(rerun / "metrics.parquet").drop(columns="wall_time"),
                                  pd.read_parquet(run_dir / "metrics.parquet").drop(columns="wall_time"),
                                  check_exact=True)


@pytest.mark.slow
@pytest.mark.ray
def test_a_run_verified_with_two_clients_per_actor_is_identical(keeping, tmp_path):
    run_dir = finished_run(tmp_path, **{"run.rounds": 6, "run.eval_every": 1})  # round 5 rounds differently
    outcome = fedcomp.verify(run_dir, backend="ray", overrides={"federation.clients_per_actor": 2})
    assert [d.column for d in outcome.differences] == []


def test_a_tampered_metrics_file_and_environment_are_reported(tmp_path, capsys):
    run_dir = finished_run(tmp_path)
    df = pd.read_parquet(run_dir / "metrics.parquet")
    df.loc[2, "test_accuracy"] += 1e-7
    df.loc[1, "samples"] += 1
    df.to_parquet(run_dir / "metrics.parquet", index=False)
    meta = json.loads((run_dir / "run.json").read_text())
    meta["environment"]["packages"]["torch"] = "0.0.1"
    (run_dir / "run.json").write_text(json.dumps(meta))

    assert main(["verify", str(run_dir)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("DIFFERENT: 2 of 12 metric columns differ")
    assert out[2] == "  samples: 1 of 3 rows differ, max abs diff 1"
    assert out[3].startswith("  test_accuracy: 1 of 3 rows differ, max abs diff 1e-07")
    assert "environment differs from the original's:" in out
    assert any(line.strip().startswith("packages.torch: 0.0.1 -> ") for line in out)


def test_a_run_without_a_recorded_environment_still_verifies(tmp_path):
    run_dir = finished_run(tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    del meta["environment"]
    (run_dir / "run.json").write_text(json.dumps(meta))
    outcome = fedcomp.verify(run_dir, progress="none")
    assert outcome.identical
    assert "environment: not recorded in the original run" in outcome.report()


def test_a_missing_row_is_reported(tmp_path):
    run_dir = finished_run(tmp_path)
    pd.read_parquet(run_dir / "metrics.parquet").iloc[:-1].to_parquet(run_dir / "metrics.parquet", index=False)
    outcome = fedcomp.verify(run_dir, progress="none")
    assert not outcome.identical and outcome.problems == ["2 rows in the original, 3 in the re-run"]


@pytest.mark.parametrize("args, needle", [
    (["--set", "algorithm.lr=0.5"], "verify --set algorithm.lr: only settings that leave the numbers unchanged"),
    (["--backend", "ray", "--set", "federation.clients_per_actor=0"], "federation.clients_per_actor = 0"),
    (["--backend", "gpu"], None),
])
def test_bad_verify_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, args, needle):
    run_dir = finished_run(tmp_path)
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    scratch = tmp_path / "scratch"  # where the re-run's temporary folder goes
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(SystemExit) if needle is None else _no_raise():
        assert main(["verify", str(run_dir), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    if needle is not None:
        assert len(err) == 1 and needle in err[0]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before
    assert list(scratch.iterdir()) == []


def test_a_folder_that_is_not_a_finished_run_is_one_line(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 2
    assert "not a fedcomp run folder" in capsys.readouterr().err
    run_dir = finished_run(tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    assert main(["verify", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "status is 'interrupted'" in err[0] and "--resume" in err[0]


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_verification_stopped_by_ctrl_c_says_there_is_nothing_to_continue(tmp_path, monkeypatch, capsys):
    """Its re-run lived in a temporary folder, removed as the verification stops: no ``--resume`` of a folder gone."""
    from fedcomp.platform.server import Server

    original = fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "run.rounds": 4, "run.checkpoint_every": 1}))
    real = Server.run_round

    def ctrl_c_in_round_3(self):
        if self.counters.round == 2:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Server, "run_round", ctrl_c_in_round_3)
    code = main(["verify", str(original.run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and err[-1] == ("fedcomp: interrupted: the re-run ran in a temporary folder, removed; nothing "
                                       "to continue: verify again")  # after the re-run's progress lines


@pytest.mark.parametrize("flag, lines", [([], 0), (["--progress", "log"], 4)])
def test_the_re_run_prints_progress_as_the_run_did_unless_told(tmp_path, capsys, flag, lines):
    """A run made with ``run.progress: none`` (a script's, CI's) was verified with round lines on stderr."""
    run_dir = finished_run(tmp_path, **{"run.progress": "none"})
    capsys.readouterr()
    assert main(["verify", str(run_dir), "--backend", "local", *flag]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith(f"verify {run_dir.name}: re-ran on local in ")
    assert sum(line.startswith("round ") for line in captured.err.splitlines()) == lines, captured.err


def test_the_re_run_line_names_a_server_transport_or_routing_that_differs():
    """A re-run moved to the server actor said only "re-ran on ray (2 client actors, clients_per_actor=2)"."""
    from fedcomp.verification import Verification

    ray = {"name": "ray", "client_actors": 2, "clients_per_actor": 2, "server": "replicated", "transport": "collective",
           "routing": "server"}
    outcome = Verification(Path("r"), None, ["x"], 1, backend={**ray, "server": "actor", "transport": "objects"},
                           original_backend=ray)
    assert outcome.report().splitlines()[0] == (
        "verify r: re-ran on ray (2 client actors, clients_per_actor=2, server actor, transport objects) in 0.0 s (the "
        "original ran on ray (2 client actors, clients_per_actor=2, server replicated, transport collective))")
    same = Verification(Path("r"), None, ["x"], 1, backend=ray, original_backend=ray).report().splitlines()[0]
    assert same == "verify r: re-ran on ray (2 client actors, clients_per_actor=2) in 0.0 s"


@pytest.mark.parametrize("argv", [["--set", "federation.server=actor"], ["--backend", "local", "--set",
                                                                          "federation.transport=graph"]])
def test_a_ray_placement_for_a_re_run_on_the_local_backend_is_refused(tmp_path, capsys, argv):
    """It re-ran on the local backend as before, the setting silently ignored."""
    run_dir = finished_run(tmp_path)
    capsys.readouterr()
    assert main(["verify", str(run_dir), *argv]) == 2
    key = argv[-1].split("=")[0]
    assert capsys.readouterr().err == (
        f"fedcomp: error: verify --set {key}: says where and how the Ray backend's clients run, and this runs on the "
        f"local backend, where it would change nothing; ask for the Ray backend too (federation.backend=ray), or drop "
        f"it\n")
    assert main(["run", "--resume", str(run_dir), *argv[-2:]]) == 2
    assert f"setting {key}: says where and how the Ray backend's clients run" in capsys.readouterr().err
