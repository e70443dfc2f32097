"""Sweeps track through Tune's own logger callbacks: TensorBoard event files in every trial folder, one
MLflow run per trial (with the trial's full config) in the store under the results root, continued when the sweep
is resumed, one offline W&B run in every trial folder (a second one, of the same run id, for a trial a stopped
sweep cut and its resume continued; W&B's temporary folders removed by the actors that write them); and a fedcomp
line per finished trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fedcomp
from fedcomp.platform import tracking
from fedcomp.sweeps.tuner import load_sweep
from tests.platform.wandb_log import read_offline_run

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY = {
    "federation.backend": "local",
    "federation.clients": 4,
    "algorithm.name": "fcsg",
    "algorithm.local_steps": 5,
    "algorithm.first_batch": 4,
    "task.test_samples": 2000,
    "run.rounds": 3,
    "run.eval_every": 1,
    "run.checkpoint_every": 3,
    "run.progress": "log",
}


def sweep(tmp_path, track):
    spec = {"base": "quickstart", "set": {**TINY, "run.out": str(tmp_path), "run.track": track},
            "grid": {"algorithm.lr": [0.1, 0.05]}, "cpus_per_trial": 1.0,
            "max_concurrent": 1}  # one trial process for both (another would cost seconds of CPU importing torch)
    return fedcomp.sweep(spec)


def test_mlflow_gets_one_run_per_trial_with_its_full_config_and_rounds(ray_session, tmp_path, capsys):
    result = sweep(tmp_path, "mlflow")
    client = tracking.mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name(result.path.name)
    assert experiment.artifact_location.startswith((tmp_path / "mlflow" / "artifacts").as_uri())
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(r.data.params["algorithm.lr"] for r in runs) == ["0.05", "0.1"]
    assert {r.data.params["task.name"] for r in runs} == {"invariant-logreg"}
    assert {r.data.tags["fedcomp.sweep"] for r in runs} == {result.path.name}
    for run in runs:
        trial = result.trials[result.trials["algorithm.lr"] == float(run.data.params["algorithm.lr"])]
        rounds = client.get_metric_history(run.info.run_id, "round")
        accuracy = client.get_metric_history(run.info.run_id, "test_accuracy")
        assert [m.value for m in rounds] == trial["round"].tolist() == [0, 1, 2, 3]
        assert [m.value for m in accuracy] == trial["test_accuracy"].tolist()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trial ")]
    assert sorted(line.split()[1] for line in lines) == ["1/2", "2/2"]
    assert all("completed  algorithm.lr=" in line and "run.seed=0  test_accuracy=0." in line for line in lines)
    assert not (tmp_path / "mlruns").exists() and not list(result.path.rglob("events.out.tfevents.*"))


def stopped_and_resumed(tmp_path, track, between=lambda folder: None, resume=fedcomp.resume_sweep):
    """A 2-trial sweep tracked by ``track``, stopped by Ctrl-C while its first trial runs, then (after
    ``between(folder)``) resumed by ``resume(folder)``: (its folder, the resumed sweep's result)."""
    spec = {"base": "quickstart", "set": {**TINY, "run.rounds": 30, "run.eval_every": 5, "run.checkpoint_every": 5,
                                          "run.out": str(tmp_path), "run.track": track, "run.progress": "none"},
            "grid": {"algorithm.lr": [0.1, 0.05]}, "cpus_per_trial": 1.0, "max_concurrent": 1}

    def ctrl_c() -> None:  # once the first trial has two checkpoints: mid-fit, with a trial to cut
        deadline = time.time() + 240
        while time.time() < deadline and not list(tmp_path.glob("*/*/checkpoint_000001")):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    stopper = threading.Thread(target=ctrl_c, daemon=True)
    stopper.start()
    with pytest.raises(fedcomp.Interrupted) as stopped:
        fedcomp.sweep(spec)
    stopper.join()
    [folder] = [p for p in tmp_path.iterdir() if (p / "sweep.json").is_file()]
    assert stopped.value.path == folder  # what fedcomp.resume_sweep continues
    between(folder)
    return folder, resume(folder)


def test_a_stopped_tensorboard_sweep_leaves_no_event_file_open_nor_a_writers_thread(ray_session, tmp_path):
    """Tune's TensorBoard logger left the writer of the trial cut by Ctrl-C open in the driver: two threads and an
    event file per stopped sweep, in a notebook's long-lived process."""
    threads = {t.ident for t in threading.enumerate()}

    def open_event_files() -> list[str]:
        fds = Path("/proc/self/fd")
        targets = [os.readlink(fds / fd) for fd in os.listdir(fds) if (fds / fd).is_symlink()]
        return [t for t in targets if "events.out.tfevents" in t]

    def stopped(folder: Path) -> None:
        assert open_event_files() == []
        new = [t for t in threading.enumerate() if t.ident not in threads and t.is_alive()]
        assert not [t for t in new if "Thread" in t.name or "QueueFeeder" in t.name], new

    stopped_and_resumed(tmp_path, "tensorboard", between=stopped)


def test_a_stopped_and_resumed_mlflow_sweep_continues_each_trials_run(ray_session, tmp_path):
    """Tune started a second MLflow run for a trial it restored: a cut trial had two, the first left RUNNING.
    Stopped, the cut trial's run is KILLED, as a stopped run's is (Tune left it RUNNING)."""
    client = tracking.mlflow_client(tmp_path)

    def stopped(folder) -> None:
        runs = client.search_runs([client.get_experiment_by_name(folder.name).experiment_id])
        assert [r.info.status for r in runs] == ["KILLED"]  # the cut trial's; the other had not started

    folder, resumed = stopped_and_resumed(tmp_path, "mlflow", between=stopped)
    runs = client.search_runs([client.get_experiment_by_name(folder.name).experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        rounds = [m.value for m in client.get_metric_history(run.info.run_id, "round")]
        trial = resumed.trials[resumed.trials["algorithm.lr"] == float(run.data.params["algorithm.lr"])]
        assert rounds == trial["round"].tolist() == [0, 5, 10, 15, 20, 25, 30]  # each once, also the cut trial's


@pytest.mark.timeout(300)  # a hang detector: Tune waited on the cut trial's W&B run for up to 30 minutes
def test_a_stopped_and_resumed_wandb_sweep_logs_every_round_once(ray_session, tmp_path, monkeypatch):
    """The cut trial's run is finished when the sweep stops (Tune ends a run only with its trial, and waited on
    it for up to its upload timeout, 30 min); the resumed trial logs the rounds after the checkpoint it continues from
    to a second offline run of the same W&B run id, which ``wandb sync`` uploads after the first, as one run."""
    monkeypatch.delenv("WANDB_MODE", raising=False)

    def from_the_command_line(folder):
        """In a process of its own, as a user resumes: Tune's callback there had no WANDB_MODE, and asked for an
        API key."""
        env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
        address = ray_session.get_runtime_context().gcs_address
        done = subprocess.run([sys.executable, "-m", "fedcomp", "sweep", "--resume", str(folder), "--ray-address", address,
                               "--verbose", "0"], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return load_sweep(folder)

    folder, resumed = stopped_and_resumed(tmp_path, "wandb", resume=from_the_command_line)
    offline = {trial: sorted(folder.glob(f"*/wandb/offline-run-*-{trial}")) for trial in resumed.trials["trial"].unique()}
    assert sorted(len(runs) for runs in offline.values()) == [1, 2]  # the cut trial's second run
    for trial, runs in offline.items():
        logged = [read_offline_run(run) for run in runs]
        assert all(log["kinds"][-1] == "exit" for log in logged)  # each one finished
        points = [(h["round"], h["test_accuracy"]) for log in logged for h in log["history"] if "test_accuracy" in h]
        rows = resumed.trials[resumed.trials["trial"] == trial]
        assert rows["round"].tolist() == [0, 5, 10, 15, 20, 25, 30]
        # every round, in order; a round after the checkpoint the trial resumed from is logged again, the same
        assert sorted(set(points)) == list(zip(rows["round"], rows["test_accuracy"]))
        assert [r for r, _ in points] == sorted(r for r, _ in points)


def test_tensorboard_event_files_in_every_trial_folder_and_none_without_tracking(ray_session, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = sweep(tmp_path / "tb", "tensorboard")
    files = sorted(result.path.rglob("events.out.tfevents.*"))
    assert len(files) == 2
    for file in files:
        events = EventAccumulator(str(file.parent))
        events.Reload()
        assert [e.value for e in events.Scalars("ray/tune/round")] == [0, 1, 2, 3]
        assert len(events.Scalars("ray/tune/test_accuracy")) == 4
    none = sweep(tmp_path / "none", "none")
    assert not list(none.path.rglob("events.out.tfevents.*"))
    assert len(list(none.path.rglob("progress.csv"))) == 2  # Tune's own result files stay


DRIVER = """
import sys
import fedcomp
if sys.argv[1] == "new":
    result = fedcomp.sweep({"base": "quickstart", "set": {**eval(sys.argv[2]), "run.track": "tensorboard"}},
                           ray_address=sys.argv[3])
else:
    result = fedcomp.resume_sweep(sys.argv[2], ray_address=sys.argv[3])
print(result.path, result.trials["round"].max(), "torch" in sys.modules)
"""


def test_a_tensorboard_sweeps_driver_imports_no_torch_new_or_resumed(ray_session, tmp_path):
    """tensorboardX imports torch when it can, which put torch's CUDA build (~400 MiB, a second to import) into a
    sweep's driver, where Tune's TensorBoard logger runs; fedcomp imports it first, without torch, also before
    Tune unpickles the logger of a sweep it resumes. The events are written all the same."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ADDRESS": ""}

    def driver(*args: str) -> list[str]:
        done = subprocess.run([sys.executable, "-c", DRIVER, *args, address], capture_output=True, text=True,
                              timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.split()

    folder, rounds, torch = driver("new", repr({**TINY, "run.out": str(tmp_path), "run.progress": "none"}))
    assert (rounds, torch) == ("3", "False")
    [events] = Path(folder).rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    assert [e.value for e in accumulator.Scalars("ray/tune/round")] == [0, 1, 2, 3]
    assert driver("resume", folder) == [folder, "3", "False"]


def test_wandb_gets_one_offline_run_per_trial_in_its_folder(ray_session, tmp_path, monkeypatch, capfd):
    """Tune's logging actors wrote them into Ray's session folder, copied to the sweep folder only before they
    had finished: no trial folder held one. And Ray said nothing about restarting those actors (Tune asked for
    restarts, which Ray answered with an error line: "constructor arguments in the object store and max_restarts >
    0")."""
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is fedcomp's default
    result = sweep(tmp_path, "wandb")
    assert "max_restarts" not in capfd.readouterr().err
    hint = tracking.where("wandb", result.path, sweep=True)  # `wandb sync <sweep>/*/wandb/offline-run-*`
    offline = sorted(result.path.glob(hint.removeprefix("wandb sync ").removeprefix(str(result.path) + "/")))
    assert len(offline) == 2 and sorted(p.parents[1].parent for p in offline) == [result.path] * 2
    for run in offline:
        logged = read_offline_run(run)
        history = [h for h in logged["history"] if "test_accuracy" in h]
        trial = result.trials[result.trials["trial"] == run.name.rsplit("-", 1)[-1]]
        assert [h["round"] for h in history] == trial["round"].tolist() == [0, 1, 2, 3], logged["kinds"]
        assert [h["test_accuracy"] for h in history] == trial["test_accuracy"].tolist()


WANDB_TEMPORARY = """
import os, tempfile
from fedcomp.sweeps.wandb_logger import remove_wandb_temporary_folders  # imports W&B, as a logging actor does
made = len(os.listdir(tempfile.gettempdir()))
remove_wandb_temporary_folders()
print(made, len(os.listdir(tempfile.gettempdir())))
"""


def test_wandb_temporary_folders_are_removed_as_its_exit_would(tmp_path):
    """A logging actor ends by ray.kill, before any exit handler: W&B's import left two folders per trial."""
    done = subprocess.run([sys.executable, "-c", WANDB_TEMPORARY], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    made, left = map(int, done.stdout.split())
    assert made >= 1 and left == 0
