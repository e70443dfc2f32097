"""Sweeps on the session's real local Ray: every trial a whole federated run with the same numbers as
``fedcomp.run``, more trials than CPUs, Optuna seeded, ASHA, a failing trial retried from its checkpoint,
a killed sweep resumed (also when the kill cut Tune's state file short), and resource shortfalls reported at once."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

import fedcomp
from fedcomp.cli import main
from fedcomp.platform import results
from fedcomp.platform.errors import ResourceError
from fedcomp.sweeps import tune_state
from fedcomp.sweeps.on_disk import TRIAL_JSON
from fedcomp.sweeps.report import best_configurations, outcome_counts, sweep_report
from fedcomp.sweeps.trial import FAULT_EXIT
from fedcomp.sweeps.tuner import load_sweep
from tests.sweeps.test_tune_state import recorded_checkpoints
from tests.sweeps.tiny import TINY

pytestmark = [pytest.mark.ray, pytest.mark.slow]

METRICS = ["round", "comm_rounds", "local_steps", "samples", "train_loss", "test_accuracy", "test_loss"]


def tiny(out, backend="ray", set=None, **spec):
    """A sweep of tiny invariant-logreg runs under ``out`` (``set`` adds to the fixed overrides)."""
    fixed = {**TINY, "federation.backend": backend, "run.out": str(out), **(set or {})}
    return {"base": "quickstart", "set": fixed, **spec}


def reference(trials: pd.DataFrame, trial: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A trial's rows and the rows of ``fedcomp.run`` on the same config (local backend)."""
    rows = trials[trials["trial"] == trial].reset_index(drop=True)
    first = rows.iloc[0]
    overrides = {c: first[c] for c in rows.columns if c.startswith(("task.", "algorithm.", "run.")) and not pd.isna(first[c])}
    overrides.update({"federation.backend": "local", "federation.clients": int(first["federation.clients"]),
                      "run.progress": "none", "run.out": str(Path(first["run.out"]) / "reference")})
    overrides.pop("run.name", None)
    alone = fedcomp.run("quickstart", overrides).metrics
    return rows[METRICS], alone[METRICS]


def assert_rows_once(trials: pd.DataFrame, rounds: int) -> None:
    for _, rows in trials.groupby("trial"):
        assert rows["round"].tolist() == list(range(rounds + 1))


def client_pids(result) -> dict[str, tuple[int, ...]]:
    """Per Tune trial folder: the process ids of its client actors (from its last checkpoint's placement)."""
    out = {}
    for folder in (p for p in result.path.iterdir() if p.is_dir()):
        last = sorted(folder.glob("checkpoint_*/placement.json"))[-1]
        out[folder.name] = tuple(actor["pid"] for actor in json.loads(last.read_text()))
    return out


def test_grid_sweep_with_more_trials_than_cpus_matches_single_runs(ray_session, tmp_path):
    # One CPU per trial, two at once (not the default on 2 CPUs): two trials (each a server actor and two client
    # actors) share the 2 CPUs; the last two run in finished trials' processes, on their kept actors.
    result = fedcomp.sweep(tiny(tmp_path, grid={"algorithm.lr": [0.1, 0.05]}, seeds=2, cpus_per_trial=1,
                                max_concurrent=2))
    trials = result.trials
    assert result.path.parent == tmp_path and (result.path / "trials.parquet").is_file()
    assert trials["trial"].nunique() == 4 > ray_session.cluster_resources()["CPU"]
    assert set(trials["status"]) == {"completed"}
    assert_rows_once(trials, 4)
    assert sorted(map(tuple, trials[["algorithm.lr", "run.seed"]].drop_duplicates().values.tolist())) == [
        (0.05, 0), (0.05, 1), (0.1, 0), (0.1, 1)]
    pids = client_pids(result)
    assert all(len(set(p)) == 2 for p in pids.values())
    on_kept = sorted({name for name, p in pids.items() if list(pids.values()).count(p) > 1})
    assert len(on_kept) >= 2  # at least one trial ran on another's kept client actors
    for trial in sorted(trials["trial"].unique())[:1] + [t for t in trials["trial"].unique() if t in on_kept][-1:]:
        swept, alone = reference(trials, trial)
        pd.testing.assert_frame_equal(swept, alone, check_dtype=False)
    best = result.best()
    assert best["algorithm.name"].tolist() == ["fcsg"] and best["seeds"].tolist() == [2]
    finals = trials.sort_values("round").groupby("trial").tail(1).groupby("algorithm.lr")["test_accuracy"].mean()
    assert best["mean"].iloc[0] == pytest.approx(finals.max())
    png, md = sweep_report(result)
    assert png.stat().st_size > 1000 and "| fcsg | lr=" in md.read_text()


def test_a_sweep_with_the_server_replicated_on_the_client_actors_matches_single_runs(ray_session, tmp_path, capsys):
    """Three trials whose runs replicate the server on their two client actors (no server actor, no bundle for
    one), the later ones on kept actors: each trial's rows are ``fedcomp.run``'s on the local backend, exactly.
    By default a trial's three processes get a CPU each, so on 2 CPUs the trials run one at a time, all three in
    one trial process on the same two client actors."""
    result = fedcomp.sweep(tiny(tmp_path, set={"federation.server": "replicated"}, grid={"algorithm.lr": [0.1, 0.05, 0.02]},
                                cpus_per_trial=1))
    trials = result.trials
    assert set(trials["status"]) == {"completed"} and trials["trial"].nunique() == 3
    pids = client_pids(result)
    assert len(pids) == 3 and len(set(pids.values())) == 1 and len(next(iter(pids.values()))) == 2
    assert ("fedcomp: 1 trial at a time, a CPU for each process of a Ray-backend trial (max_concurrent sets it)"
            in capsys.readouterr().err.splitlines())
    assert_rows_once(trials, 4)
    for trial in sorted(trials["trial"].unique()):
        swept, alone = reference(trials, trial)
        pd.testing.assert_frame_equal(swept, alone, check_dtype=False, check_exact=True)


def test_a_ray_backend_trials_process_holds_no_torch_and_its_client_actors_do(ray_session, tmp_path):
    """The trial's process drives the run and handles numbers and bytes, as a Ray run's driver: no torch (its CUDA
    build ~400 MiB); its client actors compute. Read from the live processes' memory maps while the sweep runs."""
    maps: dict[str, list[str]] = {"trial": [], "actors": []}

    def read(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/maps").read_text()
        except OSError:  # ended meanwhile
            return ""

    def parsed(path: Path, first_line: bool = False) -> Any:
        try:
            text = path.read_text()
            return json.loads(text.split("\n", 1)[0] if first_line else text)
        except OSError:  # a checkpoint folder Tune has deleted since (it keeps the latest)
            return None
        except ValueError:  # Tune is still writing it
            return None

    def watch() -> None:
        deadline = time.time() + 240
        while time.time() < deadline and not (maps["trial"] and maps["actors"]):
            for report in tmp_path.glob("*/*/result.json"):
                first = parsed(report, first_line=True)
                if first is not None and not maps["trial"]:
                    maps["trial"] = [read(first["pid"])]
            for placement in tmp_path.glob("*/*/checkpoint_*/placement.json"):
                actors = parsed(placement)
                if actors is not None and not maps["actors"]:
                    maps["actors"] = [read(actor["pid"]) for actor in actors]
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = fedcomp.sweep(tiny(tmp_path, grid={"algorithm.lr": [0.1, 0.05]}, max_concurrent=1,
                                set={"run.rounds": 40, "run.checkpoint_every": 2}))
    watcher.join()
    assert set(result.trials["status"]) == {"completed"}
    [trial] = maps["trial"]
    assert "libpython" in trial or "/python" in trial  # a live process's maps were read
    assert "libtorch_cpu" not in trial
    assert len(maps["actors"]) == 2 and all("libtorch_cpu" in actor for actor in maps["actors"])


def test_optuna_search_is_seeded_and_repeats_each_configuration_over_seeds(ray_session, tmp_path):
    space = {"algorithm.lr": {"loguniform": [0.001, 0.2]}}
    def lrs(out):
        result = fedcomp.sweep(tiny(out, backend="local", search="optuna", space=space, num_samples=2, seeds=2, seed=5,
                                    max_concurrent=1))
        finals = result.trials.groupby("trial").tail(1)
        assert len(finals) == 4
        pairs = finals.groupby("algorithm.lr")["run.seed"].apply(sorted)
        assert pairs.tolist() == [[0, 1]] * 2  # every proposed lr ran with both seeds
        assert all(0.001 <= lr <= 0.2 for lr in pairs.index)
        return sorted(pairs.index)
    assert lrs(tmp_path / "a") == lrs(tmp_path / "b")


def test_asha_stops_weak_trials_and_the_report_ranks_full_runs(ray_session, tmp_path, capfd):
    """ASHA stops the weak trials and the report ranks the full runs; a trial it stopped says so, in its line and in
    trials.parquet (both said completed: Tune marks the last result of a stopped trial done too)."""
    result = fedcomp.sweep(tiny(tmp_path, backend="local", grid={"algorithm.lr": [0.1, 1e-5, 2e-5, 3e-5]},
                                scheduler="asha", grace_rounds=1, max_concurrent=1,
                                set={"run.rounds": 6}))
    lengths = result.trials.groupby("algorithm.lr")["round"].max()
    assert lengths[0.1] == 6 and (lengths < 6).any()
    for _, rows in result.trials.groupby("trial"):
        assert rows["round"].tolist() == list(range(len(rows)))
    assert best_configurations(result.trials, result.spec)["algorithm.lr"].tolist() == [0.1]
    stopped = int((lengths < 6).sum())
    said = [line.split("  ")[0].split(" ", 2)[2] for line in capfd.readouterr().err.splitlines()
            if line.startswith("trial ")]
    assert sorted(said) == sorted(["completed"] * (4 - stopped) + ["stopped early"] * stopped)
    last = result.trials.groupby("trial").tail(1)
    assert (last["status"] == last["round"].map(lambda ran: "completed" if ran == 6 else "stopped")).all()
    assert outcome_counts(result.trials, result.spec) == (
        f"4 trials, 0 failed, {stopped} stopped early by ASHA (their rounds kept; not in the tables of final values)")


def test_a_trial_that_cannot_fit_fails_at_once_and_writes_nothing(ray_session, tmp_path):
    with pytest.raises(ResourceError, match=r"needs CPU=3.9999 \(3 bundles: trial, client actors\) but the cluster has CPU=2"):
        fedcomp.sweep(tiny(tmp_path, cpus_per_trial=4.0))  # three shares of 4/3 CPU, rounded down
    with pytest.raises(ResourceError, match=r"needs CPU=4 \(4 bundles: trial, server, client actors\) but the cluster"):
        fedcomp.sweep(tiny(tmp_path, set={"federation.server": "actor"}, cpus_per_trial=4.0))
    with pytest.raises(ResourceError, match=r"but the cluster has GPU=0; set federation.gpus_per_client to 0 or 'auto' "
                                            r"and gpus_per_trial to 0 \(the cluster has no GPU\)$"):  # not clients_per_actor
        fedcomp.sweep(tiny(tmp_path, set={"federation.gpus_per_client": 0.5}))
    assert not any(tmp_path.iterdir())


def test_bundles_are_placeable_only_where_they_fit_the_nodes_together():
    from fedcomp.sweeps.tuner import _placeable

    two = [{"CPU": 1.0}, {"CPU": 1.0}]
    assert not _placeable([{"CPU": 0.6}] * 3, two)  # each fits a node; three do not fit two nodes
    assert _placeable([{"CPU": 0.6}, {"CPU": 0.6}, {"CPU": 0.4}], two)
    assert _placeable([{"CPU": 0.5}] * 4, two) and not _placeable([{"CPU": 0.5}] * 5, two)
    assert not _placeable([{"CPU": 0.5, "GPU": 1.0}] * 2, [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0}])
    assert _placeable([{"CPU": 1.0}] * 16, [{"CPU": 4.0}] * 4) and not _placeable([{"CPU": 1.0}] * 17, [{"CPU": 4.0}] * 4)
    assert _placeable([], two)


def test_a_failing_trial_is_retried_from_its_checkpoint_with_fresh_actors(ray_session, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(FAULT_EXIT, "3")  # the trial's process dies at round 3; its last checkpoint is round 2
    result = fedcomp.sweep(tiny(tmp_path, set={"federation.clients_per_actor": 4}))  # one client actor a trial
    assert "Restored on" not in capfd.readouterr().err  # Tune's INFO line in the retried trial's process
    trials = result.trials
    assert set(trials["status"]) == {"completed"}
    assert_rows_once(trials, 4)
    swept, alone = reference(trials, trials["trial"].iloc[0])
    pd.testing.assert_frame_equal(swept, alone, check_dtype=False)
    assert list(result.path.glob("*/error.txt")), "the first attempt did not fail"


def test_a_client_actor_dying_in_a_trial_is_replaced_and_the_user_told(ray_session, tmp_path, monkeypatch, capsys):
    """As in a run: the actor of clients 0-1 exits in round 3 (a real process death) and is replaced, its share of
    the round runs again, and the trial's rows are the run's; not a trial failure. The driver names the trial, and
    Tune's results count the replacement from the round it happened in."""
    monkeypatch.setenv("FEDCOMP_FAULT_KILL", "2:0")  # round index 2, the actor whose first client is 0
    result = fedcomp.sweep(tiny(tmp_path))
    trials = result.trials
    assert set(trials["status"]) == {"completed"} and not list(result.path.glob("*/error.txt"))
    swept, alone = reference(trials, trials["trial"].iloc[0])
    pd.testing.assert_frame_equal(swept, alone, check_dtype=False, check_exact=True)
    [told] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedcomp: trial ")]
    assert told == ("fedcomp: trial run.seed=0: an actor died by round 3 and was replaced; the work since ran "
                    "again, to the same numbers (1 in this trial; its process's own line says which actor and why)")
    [results_file] = result.path.glob("*/result.json")
    reported = [json.loads(line) for line in results_file.read_text().splitlines()]
    assert [(r["trial_round"], r["actor_replacements"]) for r in reported] == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1)]


def test_a_killed_sweep_resumes_without_redoing_finished_trials(ray_session, tmp_path):
    spec = tiny(tmp_path, backend="local", grid={"algorithm.lr": [0.1, 0.05, 0.02, 0.01]}, max_concurrent=1,
                set={"run.rounds": 30, "run.checkpoint_every": 5})
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedcomp", "sweep", str(spec_file), "--ray-address", address, "--verbose", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # Checkpoints at rounds 5, 10, ..., 30 are numbered 0..5: a trial with checkpoint 5 had finished. Tune makes the
    # folder, then copies the files in: killed at once, the folder could be half-filled (read back below, it failed
    # once: a trial that finished as killed is the next test's case), so the kill waits for its files.
    def whole(folder: Path) -> bool:
        try:
            json.loads((folder / TRIAL_JSON).read_text())
            pd.read_parquet(folder / results.METRICS)
            return True
        except Exception:
            return False

    deadline = time.time() + 240
    while time.time() < deadline and not any(whole(folder) for folder in tmp_path.glob("*/*/checkpoint_000005")):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    [sweep_dir] = [p for p in tmp_path.iterdir() if (p / "sweep.json").is_file()]
    assert not (sweep_dir / "trials.parquet").exists()
    finished_before = {p.parent.name for p in sweep_dir.glob("*/checkpoint_000005")}
    assert 1 <= len(finished_before) < 4
    final_rows = {  # per finished trial's lr: its rows as its final checkpoint holds them, their clock times too
        json.loads((sweep_dir / name / "checkpoint_000005" / TRIAL_JSON).read_text())["point"]["algorithm.lr"]:
            pd.read_parquet(sweep_dir / name / "checkpoint_000005" / results.METRICS) for name in finished_before}
    result = fedcomp.resume_sweep(sweep_dir)
    trials = result.trials
    assert trials["trial"].nunique() == 4 and set(trials["status"]) == {"completed"}
    assert_rows_once(trials, 30)
    assert sorted(trials["algorithm.lr"].unique()) == [0.01, 0.02, 0.05, 0.1]
    swept, alone = reference(trials, sorted(trials["trial"].unique())[-1])
    pd.testing.assert_frame_equal(swept, alone, check_dtype=False)
    for name in finished_before:  # finished trials were not run again
        assert not list((sweep_dir / name).glob("checkpoint_000006"))
    for lr, rows in final_rows.items():  # also where Tune's last saved state had them unfinished: a run again has
        kept = trials[trials["algorithm.lr"] == lr].reset_index(drop=True)  # other wall_time values
        pd.testing.assert_frame_equal(kept[list(rows.columns)], rows, check_dtype=False)


def test_a_sweep_killed_while_tune_filled_a_checkpoint_folder_resumes_to_the_same_numbers(ray_session, tmp_path):
    """A kill between Tune making a trial's next checkpoint folder and copying the files into it leaves that folder
    empty or half-filled beside the checkpoint Tune's state names; the resumed trial starts from the one named, writes
    its next checkpoint into the stale folder, and ends with the rows of a run alone."""
    spec = tiny(tmp_path, backend="local", grid={"algorithm.lr": [0.1, 0.05]}, max_concurrent=2,
                set={"run.rounds": 500, "run.checkpoint_every": 10, "run.eval_every": 10})
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedcomp", "sweep", str(spec_file), "--ray-address", address, "--verbose", "0"]
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "0.2"}  # Tune saves its state often (at least every 10 s else)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    named: dict[str, str] = {}
    deadline = time.time() + 240
    while len(named) < 2:  # until fedcomp's copy of Tune's state names a checkpoint of both trials
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.02)
        for copy in tmp_path.glob(f"*/{tune_state.COPY}"):
            named = recorded_checkpoints(copy.read_bytes())
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    [sweep_dir] = [p for p in tmp_path.iterdir() if (p / "sweep.json").is_file()]
    named = recorded_checkpoints((sweep_dir / tune_state.COPY).read_bytes())  # the copy a resume starts from
    assert len(named) == 2 and not (sweep_dir / "trials.parquet").exists()
    assert all(Path(path).name < "checkpoint_000049" for path in named.values())  # neither trial had finished
    planted = []
    for path, fill in zip(sorted(named.values()), ("empty", "half")):
        latest = Path(path)
        folder = latest.parent / f"checkpoint_{int(latest.name.removeprefix('checkpoint_')) + 1:06d}"
        for stale in latest.parent.glob("checkpoint_*"):  # what the kill itself left past the named one goes
            if stale.name > latest.name:
                shutil.rmtree(stale)
        folder.mkdir()
        if fill == "half":  # the checkpoint file cut short, the rows not yet copied
            data = (latest / results.CHECKPOINT).read_bytes()
            (folder / results.CHECKPOINT).write_bytes(data[: len(data) // 2])
        planted.append(folder)
    trials = fedcomp.resume_sweep(sweep_dir).trials
    assert trials["trial"].nunique() == 2 and set(trials["status"]) == {"completed"}
    for _, rows in trials.groupby("trial"):
        assert rows["round"].tolist() == list(range(0, 501, 10))
    for trial in sorted(trials["trial"].unique()):
        swept, alone = reference(trials, trial)
        pd.testing.assert_frame_equal(swept, alone, check_dtype=False)
    for folder in planted:  # numbered on from the one named, through the stale folder; only the last one is kept
        assert [p.name for p in folder.parent.glob("checkpoint_*")] == ["checkpoint_000049"]


def test_ctrl_c_stops_a_sweep_with_one_line_that_says_how_to_continue_it(ray_session, tmp_path):
    spec = tiny(tmp_path, backend="local", grid={"algorithm.lr": [0.1, 0.05]}, max_concurrent=1,
                set={"run.rounds": 30, "run.checkpoint_every": 5})
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedcomp", "sweep", str(spec_file), "--ray-address", address]  # --verbose 1
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not list(tmp_path.glob("*/*/checkpoint_000000")):
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends the terminal's foreground processes
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    [sweep_dir] = [p for p in tmp_path.iterdir() if (p / "sweep.json").is_file()]
    assert proc.returncode == 130, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1] == (f"fedcomp: interrupted: finished trials and the others' checkpoints are kept; continue the "
                         f"sweep with: fedcomp sweep --resume {sweep_dir}"), lines
    assert not any("Stop signal received" in line for line in lines)  # Tune's "press Ctrl-C again to skip ..."
    assert not (sweep_dir / "trials.parquet").exists()  # no table of trials cut short, as if they had finished
    assert main(["sweep", "--resume", str(sweep_dir)]) == 0  # the command it printed
    trials = pd.read_parquet(sweep_dir / "trials.parquet")
    assert trials["trial"].nunique() == 2 and set(trials["status"]) == {"completed"}
    assert_rows_once(trials, 30)


def test_a_sigterm_to_the_process_group_that_stops_the_local_ray_ends_the_sweep_at_once_saying_how_to_resume(
        tmp_path):
    """`timeout`'s or a job scheduler's SIGTERM to the whole group also stops the daemons of the Ray the sweep
    started: Tune's graceful stop then waited 60 s for them and Ray ended the driver with exit 1."""
    spec = tiny(tmp_path, backend="local", grid={"algorithm.lr": [0.1]}, set={"run.rounds": 300, "run.checkpoint_every": 5})
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "fedcomp", "sweep", str(spec_file), "--verbose", "0"]  # its own local Ray
    env = {**os.environ, "RAY_ADDRESS": "local"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        # until the first checkpoint holds its files: Tune copies them into the folder after making it, and the sweep
        # now ends within milliseconds of the SIGTERM, as a kill would
        while time.time() < deadline and not list(tmp_path.glob("*/*/checkpoint_000000/*")) and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its Ray is left
        except ProcessLookupError:
            pass
    [sweep_dir] = [p for p in tmp_path.iterdir() if (p / "sweep.json").is_file()]
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"fedcomp: interrupted: finished trials and the others' checkpoints are kept; continue the sweep with: "
        f"fedcomp sweep --resume {sweep_dir}")
    assert "Failed to connect to GCS" not in err
    assert list(sweep_dir.glob("*/checkpoint_000000/*")) and not (sweep_dir / "trials.parquet").exists()


def test_a_sweep_whose_tune_state_was_cut_short_resumes_from_fedcomps_copy(ray_session, tmp_path, capfd):
    spec = tiny(tmp_path, backend="local", grid={"algorithm.lr": [0.1, 0.05]}, max_concurrent=1, set={"run.rounds": 2})
    before = fedcomp.sweep(spec).trials
    [state] = Path(before["run.out"].iloc[0]).glob("*/experiment_state-*.json")
    sweep_dir = state.parent
    assert tune_state.repair(sweep_dir) == []  # whole files (also the searcher's pickle named .json) stay Tune's
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a background copy killed half-way
    (sweep_dir / "trials.parquet").unlink()  # written at the end only: a killed sweep has none
    capfd.readouterr()
    after = fedcomp.resume_sweep(sweep_dir).trials
    err = capfd.readouterr().err
    assert f"{state.name} in {sweep_dir} was cut short" in err and "completed" not in err  # no trial ran again
    pd.testing.assert_frame_equal(after.sort_values(["trial", "round"]).reset_index(drop=True),
                                  before.sort_values(["trial", "round"]).reset_index(drop=True))
    copied = set(pickle.loads((sweep_dir / tune_state.COPY).read_bytes()))
    assert any(n.startswith("experiment_state-") for n in copied) and not copied & {"sweep.json", tune_state.COPY}
    for written in sweep_dir.glob("experiment_state-*.json"):  # killed before Tune's first copy reached the folder
        written.unlink()
    (sweep_dir / "trials.parquet").unlink()
    again = fedcomp.resume_sweep(sweep_dir).trials
    assert "missing when the sweep was killed" in capfd.readouterr().err
    pd.testing.assert_frame_equal(again.sort_values(["trial", "round"]).reset_index(drop=True),
                                  before.sort_values(["trial", "round"]).reset_index(drop=True))


def test_a_diverged_trial_keeps_its_rounds_before_it_and_never_ranks(ray_session, tmp_path, capsys):
    """A step size that blows up: the trial stops at the round it diverged in, as a run does (``run.on_divergence:
    stop``), its rows are the rounds before it, its status ``diverged``; its configuration's final metric is nan,
    so the best is the finite one, and the command line counts it apart from failures (exit 0)."""
    (tmp_path / "blows-up.yaml").write_text(yaml.safe_dump(tiny(tmp_path, backend="local", grid={"algorithm.lr": [0.1, 1e30]})))
    code = main(["sweep", str(tmp_path / "blows-up.yaml"), "--verbose", "0"])
    out = capsys.readouterr().out
    assert code == 0 and "2 trials, 0 failed, 1 diverged" in out and "| lr=1e+30 | diverged | 1 |" in out
    [folder] = [p for p in tmp_path.iterdir() if p.is_dir() and (p / "trials.parquet").is_file()]
    trials = pd.read_parquet(folder / "trials.parquet")
    blown = trials[trials["algorithm.lr"] == 1e30]
    assert set(blown["status"]) == {"diverged"} and blown["round"].tolist() == [0]
    assert set(trials[trials["algorithm.lr"] == 0.1]["status"]) == {"completed"}
    result = load_sweep(folder)
    assert best_configurations(result.trials, result.spec)["algorithm.lr"].tolist() == [0.1]


def test_a_finished_sweeps_resume_returns_its_results_without_starting_ray(ray_session, tmp_path):
    """As a finished run's resume does: it started a local Ray and rewrote trials.parquet with the same rows (6 s)."""
    spec = tiny(tmp_path, backend="local", grid={"algorithm.lr": [0.1, 0.05]}, set={"run.rounds": 2})
    before = fedcomp.sweep(spec)
    written = (before.path / "trials.parquet").stat().st_mtime_ns
    done = subprocess.run([sys.executable, "-m", "fedcomp", "sweep", "--resume", str(before.path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Ray" not in done.stderr and f"sweep {before.path.name}: 2 trials, 0 failed" in done.stdout, done.stderr
    assert (before.path / "trials.parquet").stat().st_mtime_ns == written
    pd.testing.assert_frame_equal(fedcomp.resume_sweep(before.path).trials, before.trials)
