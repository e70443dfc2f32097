"""The runner's guards on real runs (local backend): a diverged run stops and keeps its finite rounds, a
resume accepts its own checkpoint, a full disk and a read-only folder are one line (real file systems, in a
private mount namespace), and ``fedcomp report`` shows each task's own headline metric."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

import fedcomp
from fedcomp.cli import main
from fedcomp.platform import results
from fedcomp.platform.errors import ConfigError
from tests.conftest import small

MINIMAX = ["run", "fednest-minimax", "--set", "federation.backend=local", "--set", "run.progress=none",
           "--set", "algorithm.lr=0.5", "--set", "run.checkpoint_every=2", "--set", "run.rounds=12"]
"""FedNest on the quadratic minimax with ten times too large a step: its iterates grow geometrically until
they overflow."""


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_diverged_run_stops_keeps_its_finite_rounds_and_exits_3(tmp_path, capsys):
    assert main([*MINIMAX, "--set", f"run.out={tmp_path / 'stop'}"]) == 3
    line = one_line(capsys)
    match = re.search(r"the run diverged in round (\d+): (train_loss = (nan|inf)|the model has non-finite parameters); "
                      r"kept rounds 0-(\d+) in (\S+); lower algorithm.lr \(now 0.5\)", line)
    assert line.startswith("fedcomp: error: ") and match, line
    bad, kept = int(match.group(1)), int(match.group(4))
    run_dir = Path(match.group(5))
    assert kept == bad - 1 and run_dir.parent == tmp_path / "stop"

    rows = pd.read_parquet(run_dir / results.METRICS)
    assert rows["round"].tolist() == list(range(bad))  # evaluated every round, up to the last finite one
    assert rows["train_loss"].iloc[1:].map(lambda v: bool(torch.isfinite(torch.tensor(v)))).all()
    checkpoint = results.read_checkpoint(run_dir / results.CHECKPOINT)
    assert checkpoint["server"]["counters"]["round"] == (bad - 1) // 2 * 2  # the last one before the blow-up
    assert all(torch.isfinite(v).all() for v in checkpoint["server"]["state"].values())
    meta = json.loads((run_dir / results.RUN_JSON).read_text())
    assert meta["status"] == "diverged" and meta["diverged"]["round"] == bad
    assert (run_dir / "curves.png").stat().st_size > 1000  # the finite rounds drawn, as a finished run's (none was)

    # The same run told to go on: it finishes, says so once, and its first non-finite round is the one above.
    assert main([*MINIMAX, "--set", f"run.out={tmp_path / 'go'}", "--set", "run.on_divergence=continue"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(warning) == 1 and f"the run diverged in round {bad}" in warning[0] and "continuing" in warning[0]
    (go_dir,) = (tmp_path / "go").iterdir()
    go = pd.read_parquet(go_dir / results.METRICS)
    finite = go["train_loss"].iloc[1:].map(lambda v: bool(torch.isfinite(torch.tensor(v))))
    assert int(go["round"].iloc[1:][~finite].iloc[0]) == bad
    pd.testing.assert_frame_equal(go.iloc[:bad].drop(columns="wall_time"), rows.drop(columns="wall_time"))
    assert json.loads((go_dir / results.RUN_JSON).read_text())["diverged"]["round"] == bad


def test_the_python_api_raises_diverged(tmp_path):
    with pytest.raises(fedcomp.Diverged, match="the run diverged in round 1: train_loss = nan") as diverged:
        fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "algorithm.lr": 1e38}))
    (run_dir,) = tmp_path.iterdir()
    assert diverged.value.path == run_dir
    assert pd.read_parquet(run_dir / results.METRICS)["round"].tolist() == [0]


def test_a_run_name_cannot_leave_run_out(tmp_path):
    out = tmp_path / "a" / "b"
    with pytest.raises(ConfigError, match=r"run\.name = '\.\./\.\./escaped': must be a plain folder name"):
        fedcomp.run("quickstart", small(**{"run.out": str(out), "run.name": "../../escaped"}))
    assert list(tmp_path.iterdir()) == []
    result = fedcomp.run("quickstart", small(**{"run.out": str(out), "run.name": "my run 1"}))
    assert result.run_dir.parent == out and result.run_dir.name.startswith("my run 1_")


def test_resume_accepts_its_own_checkpoint_and_continues_to_the_same_numbers(tmp_path):
    over = small(**{"run.out": str(tmp_path / "a"), "run.rounds": 2, "run.checkpoint_every": 1, "run.eval_every": 1})
    short = fedcomp.run("quickstart", over)
    meta = json.loads((short.run_dir / results.RUN_JSON).read_text())
    meta["config"]["run"]["rounds"] = 4  # run.rounds is not part of a checkpoint's identity
    (short.run_dir / results.RUN_JSON).write_text(json.dumps(meta))
    resumed = fedcomp.resume(short.run_dir)
    whole = fedcomp.run("quickstart", {**over, "run.rounds": 4, "run.out": str(tmp_path / "b")})
    pd.testing.assert_frame_equal(resumed.metrics.drop(columns="wall_time"), whole.metrics.drop(columns="wall_time"))
    identity = results.read_checkpoint(resumed.run_dir / results.CHECKPOINT)["identity"]
    assert identity["algorithm.name"] == "fcsg-m" and identity["federation.clients"] == 4 and identity["run.seed"] == 0


def test_report_shows_each_tasks_headline_metric(tmp_path, capsys):
    main(["run", "quickstart", "--set", "federation.backend=local", "--set", "federation.clients=4", "--set",
          "algorithm.local_steps=5", "--set", "task.test_samples=2000", "--set", "run.rounds=2", "--set",
          "run.progress=none", "--set", f"run.out={tmp_path}"])
    main(["run", "fednest-minimax", "--set", "federation.backend=local", "--set", "run.rounds=3", "--set",
          "run.progress=none", "--set", f"run.out={tmp_path}"])
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| fcsg-m_") or line.startswith("| fednest_")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        status, metric, final, best = cells[4], cells[6], float(cells[7]), float(cells[8])
        assert status == "completed" and metric == ("test_accuracy" if cells[2] == "invariant-logreg" else "x_dist_sq")
        assert final == final and best == best  # no nan: each run is shown with a metric it has
    minimax = fedcomp.load_results(tmp_path).query("task == 'minimax-quadratic'")
    assert float(rows[1].split("|")[9]) == pytest.approx(minimax["x_dist_sq"].min(), abs=1e-4)  # best = lowest
    from matplotlib.image import imread

    height, width = imread(tmp_path / "report.png").shape[:2]
    assert width > 1.5 * height  # one panel per metric, side by side


# -- storage: real file systems in a private mount namespace ----------------------------------------------------

UNSHARE = shutil.which("unshare")


def in_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) as root of a private user and mount namespace, where it may mount file systems."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PY": sys.executable}
    return subprocess.run([UNSHARE, "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)


def require_namespaces(tmp_path: Path) -> None:
    """Skip where this machine does not give an unprivileged user and mount namespace."""
    probe = tmp_path / "probe"
    probe.mkdir()
    if UNSHARE is None or in_namespace(f"mount -t tmpfs -o size=64k tmpfs {probe}", tmp_path).returncode != 0:
        pytest.skip("no user and mount namespaces here")


FAST = ("--set federation.backend=local --set federation.clients=4 --set algorithm.local_steps=5 "
        "--set algorithm.first_batch=4 --set task.test_samples=2000 --set run.progress=none --set run.eval_every=1")


def test_tensorboard_on_a_full_disk_stops_the_run_as_a_storage_error_with_nothing_retried_at_exit(tmp_path):
    require_namespaces(tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    # a real TensorBoard tracker on a real 256 KiB file system that fills after it started
    code = textwrap.dedent(f"""
        from pathlib import Path
        from fedcomp.platform import tracking
        from fedcomp.platform.errors import StorageError
        tracker = tracking.open_tracker("tensorboard", Path("{disk}"), {{"run": {{"seed": 0}}}}, "r")
        try:
            with open("{disk}/filler", "wb") as f:
                f.write(bytes(512 << 10))
        except OSError:
            pass
        try:
            tracker.log_row({{"round": 1, "test_accuracy": 0.5, "note": "x" * 4096}})
            print("no error")
        except StorageError as error:
            print("storage:", error)
        tracker.finish("interrupted", {{}}, ())
    """)
    (tmp_path / "probe.py").write_text(code)
    done = in_namespace(f'mount -t tmpfs -o size=256k tmpfs {disk} || exit 90\n"$PY" {tmp_path}/probe.py', tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "storage: cannot write the tensorboard tracking files: No space left on device"
    # no "tracking failed" warning, and nothing left for tensorboardX's exit hook to retry (its own writer
    # thread may still report the full disk in its flush, which is tensorboardX's output, not ours)
    assert "warning" not in done.stderr and "atexit" not in done.stderr, done.stderr


def test_a_run_stopped_by_its_disk_finishes_its_tracker_even_when_run_json_cannot_be_written(tmp_path, monkeypatch):
    """Else the tracker's writer keeps its pending events and meets the full disk again at exit: tensorboardX's
    exit hook printed a traceback after the one line (seen once in a fresh clone's suite)."""
    from fedcomp.platform import runner, tracking
    from fedcomp.platform.errors import StorageError

    finished: list[str] = []

    class Recording(tracking.Tracker):
        def finish(self, status, meta, files):
            finished.append(status)

    checkpoints = []

    def write_checkpoint(path, payload):
        checkpoints.append(path)
        if len(checkpoints) == 2:
            raise StorageError(f"cannot write {path}: No space left on device")
        return real_checkpoint(path, payload)

    def write(self, status, **fields):
        if status == "failed":
            raise StorageError("cannot write run.json: No space left on device")
        return real_write(self, status, **fields)

    real_checkpoint, real_write = results.write_checkpoint, runner._RunLog.write
    monkeypatch.setattr(results, "write_checkpoint", write_checkpoint)
    monkeypatch.setattr(runner._RunLog, "write", write)
    monkeypatch.setattr(tracking, "open_tracker", lambda *args: Recording())
    with pytest.raises(StorageError, match="the run stopped after round 1"):
        fedcomp.run("quickstart", small(**{"run.checkpoint_every": 1, "run.out": str(tmp_path)}))
    assert finished == ["failed"]


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_is_one_line_and_the_run_resumes(tmp_path):
    require_namespaces(tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    script = textwrap.dedent(f"""
        mount -t tmpfs -o size=2m tmpfs {disk} || exit 90
        "$PY" -m fedcomp run quickstart {FAST} --set run.rounds=100 --set run.checkpoint_every=1 \\
            --set run.out={disk}/out > {tmp_path}/run.out 2> {tmp_path}/run.err &
        pid=$!
        while [ -z "$(ls {disk}/out/*/checkpoint.pt 2>/dev/null)" ]; do sleep 0.05; done
        cat /dev/zero > {disk}/filler 2>/dev/null
        wait $pid; echo "first=$?"
        cp -r {disk}/out {tmp_path}/kept
        rm {disk}/filler
        "$PY" -m fedcomp run --resume {disk}/out/* > {tmp_path}/resume.out 2> {tmp_path}/resume.err
        echo "resume=$?"
        cp -r {disk}/out {tmp_path}/resumed
    """)
    done = in_namespace(script, tmp_path)
    assert "first=2" in done.stdout and "resume=0" in done.stdout, (done.stdout, done.stderr)
    err = (tmp_path / "run.err").read_text().strip().splitlines()
    assert len(err) == 1 and "No space left on device; the run stopped after round" in err[0], err
    assert "make room and continue it with: fedcomp run --resume" in err[0]
    (kept,) = (tmp_path / "kept").iterdir()
    assert not list(kept.glob(".*"))  # no half-written temporary files
    stopped = results.read_checkpoint(kept / results.CHECKPOINT)["server"]["counters"]["round"]
    assert 0 < stopped < 100

    (resumed,) = (tmp_path / "resumed").iterdir()
    reference = fedcomp.run("quickstart", small(**{"run.rounds": 100, "run.checkpoint_every": 1, "run.eval_every": 1,
                                                   "run.out": str(tmp_path / "ref")}))
    pd.testing.assert_frame_equal(fedcomp.load_results(resumed).drop(columns=["wall_time", "run_id"]),
                                  fedcomp.load_results(reference.run_dir).drop(columns=["wall_time", "run_id"]))


@pytest.mark.slow
def test_a_read_only_results_folder_is_one_line_before_any_work(tmp_path):
    require_namespaces(tmp_path)
    shelf = tmp_path / "shelf"
    (shelf / "old").mkdir(parents=True)
    script = textwrap.dedent(f"""
        mount --bind {shelf} {shelf} && mount -o remount,ro,bind {shelf} || exit 90
        "$PY" -m fedcomp run quickstart {FAST} --set run.rounds=2 --set run.out={shelf}/results 2> {tmp_path}/new.err
        echo "new=$?"
        "$PY" -m fedcomp run --resume {shelf}/old 2> {tmp_path}/old.err
        echo "old=$?"
        "$PY" -m fedcomp run --resume {shelf}/done > /dev/null 2>&1
        echo "done=$?"
    """)
    # A run killed at its end (its status not yet 'completed') to resume from inside the read-only folder; the
    # same run completed is read back (nothing to write).
    fedcomp.run("quickstart", small(**{"run.out": str(tmp_path / "tmp")}))
    (made,) = (tmp_path / "tmp").iterdir()
    shutil.rmtree(shelf / "old")
    shutil.copytree(made, shelf / "done")
    meta = json.loads((made / "run.json").read_text())
    (made / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    shutil.copytree(made, shelf / "old")
    done = in_namespace(script, tmp_path)
    assert "new=2" in done.stdout and "old=2" in done.stdout and "done=0" in done.stdout, (done.stdout, done.stderr)
    new = (tmp_path / "new.err").read_text().strip().splitlines()
    assert new == [f"fedcomp: error: run.out = '{shelf}/results': the folder '{shelf}' is not writable"]
    old = (tmp_path / "old.err").read_text().strip().splitlines()
    assert old == [f"fedcomp: error: --resume '{shelf}/old': the folder '{shelf}/old' is not writable"]
    assert sorted(p.name for p in shelf.iterdir()) == ["done", "old"]


def test_a_non_finite_model_is_seen_on_an_in_process_server():
    from fedcomp.platform.config import load_config
    from fedcomp.platform.federation import LocalFederation
    from fedcomp.platform.run_checks import model_finite
    from fedcomp.platform.server import Server

    config = load_config("quickstart", {"federation.backend": "local", "federation.clients": 2,
                                        "task.test_samples": 100, "run.progress": "none"})
    server = Server(config, LocalFederation)
    assert model_finite(server)
    server.state = server.state.replace(x=server.state.x.clone().fill_(float("inf")))
    assert not model_finite(server)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64])
def test_state_finite_answers_as_torch_does_for_every_value_and_dtype(dtype):
    from fedcomp.platform.run_checks import state_finite

    for bad in (None, float("nan"), float("inf"), float("-inf")):
        if bad is not None and not dtype.is_floating_point:
            continue
        for shape in ((7,), (3, 5)):
            x = torch.linspace(-3e4, 3e4, math.prod(shape)).to(dtype).reshape(shape)
            if bad is not None:
                x.view(-1)[4] = bad
            cases = {"x": x, "strided": x.t() if x.dim() == 2 else x[::2], "step": 3}
            assert state_finite(cases) == bool(torch.isfinite(x).all()) == (bad is None)
    big = torch.full((4,), torch.finfo(torch.float32).max)  # finite, though its sum overflows
    assert state_finite({"x": big, "w": big.requires_grad_()})
