"""fedcomp's copy of Tune's state and its pruning of checkpoints: at every instant of a sweep, the state a resume
would start from names checkpoints that still exist, and a finished trial keeps its last checkpoint only."""

from __future__ import annotations

import functools
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyarrow import fs
from ray.tune.utils.serialization import TuneFunctionDecoder

import fedcomp
from fedcomp.sweeps import tune_state
from tests.sweeps.tiny import TINY


def checkpoint_managers(copy: bytes) -> dict[str, Any]:
    """Per trial id: Tune's checkpoint manager as the newest experiment state in fedcomp's copy holds it."""
    files = pickle.loads(copy)
    state = json.loads(files[max(n for n in files if n.startswith("experiment_state-"))])
    decoder = functools.partial(TuneFunctionDecoder, allow_cloudpickle=True)
    return {json.loads(trial)["trial_id"]: json.loads(metadata, cls=decoder)["checkpoint_manager"]
            for trial, metadata in state["trial_data"]}


def recorded_checkpoints(copy: bytes) -> dict[str, str]:
    """Per trial id: the checkpoint folder the newest experiment state in fedcomp's copy names as its latest."""
    return {trial: manager.latest_checkpoint_result.checkpoint.path
            for trial, manager in checkpoint_managers(copy).items() if manager.latest_checkpoint_result is not None}


def test_delete_older_keeps_the_latest_checkpoint_and_everything_that_is_not_an_older_one(tmp_path):
    for name in ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002", "checkpoint_000010", "checkpoints"]:
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint_000003").write_text("a file, not a checkpoint folder")
    (tmp_path / "result.json").write_text("{}")
    tune_state._delete_older(fs.LocalFileSystem(), str(tmp_path / "checkpoint_000002"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint_000002", "checkpoint_000003", "checkpoint_000010", "checkpoints", "result.json"]


@pytest.mark.ray
@pytest.mark.slow
def test_every_state_a_resume_could_start_from_names_checkpoints_that_exist(ray_session, tmp_path):
    # Trials checkpoint every round, faster than Tune saves its state: Tune's own pruning (num_to_keep) deleted
    # checkpoints that the saved state still named, and a sweep killed then could not resume those trials.
    spec = {"base": "quickstart", "max_concurrent": 2, "grid": {"algorithm.lr": [0.1, 0.05, 0.02, 0.01]},
            "set": {**TINY, "federation.backend": "local", "run.out": str(tmp_path), "run.rounds": 40,
                    "run.checkpoint_every": 1}}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedcomp", "sweep", str(spec_file), "--ray-address", address, "--verbose", "0"]
    log = tmp_path / "sweep.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    checked, missing, deadline = 0, [], time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)  # leave the sweep its CPUs
        copies = list(tmp_path.glob(f"*/{tune_state.COPY}"))
        if not copies:
            continue
        copy = copies[0].read_bytes()
        gone = [path for path in recorded_checkpoints(copy).values() if not Path(path).is_dir()]
        if copies[0].read_bytes() == copy:  # no newer copy (which may have pruned these) was written meanwhile
            checked += 1
            missing += gone
    proc.kill()
    assert proc.wait() == 0, log.read_text()
    assert checked > 10 and missing == []
    [sweep_dir] = [copy.parent for copy in tmp_path.glob(f"*/{tune_state.COPY}")]
    final = recorded_checkpoints((sweep_dir / tune_state.COPY).read_bytes())
    assert len(final) == 4
    for path in final.values():  # a finished trial keeps its last checkpoint only
        assert [p.name for p in Path(path).parent.glob("checkpoint_*")] == [Path(path).name]
    # and Tune's state lists at most two of a trial's 40 checkpoints (it grew by 2 KB a checkpoint)
    managers = checkpoint_managers((sweep_dir / tune_state.COPY).read_bytes())
    assert all(1 <= len(manager._checkpoint_results) <= 2 for manager in managers.values())


@pytest.mark.ray
@pytest.mark.slow
def test_a_resume_starts_from_fedcomps_copy_even_where_tunes_own_state_is_whole(ray_session, tmp_path):
    spec = {"base": "quickstart", "max_concurrent": 1, "grid": {"algorithm.lr": [0.1]},
            "set": {**TINY, "federation.backend": "local", "run.out": str(tmp_path)}}
    trials = fedcomp.sweep(spec).trials
    [state] = Path(trials["run.out"].iloc[0]).glob("*/experiment_state-*.json")
    copied = pickle.loads((state.parent / tune_state.COPY).read_bytes())[state.name]
    state.write_text(json.dumps({**json.loads(copied), "stats": {"start_time": 0.0}}))  # whole, but not the copy
    assert tune_state.repair(state.parent) == []  # nothing was broken ...
    assert state.read_bytes() == copied  # ... and the copy is what Tune restores from


def test_a_sweep_killed_before_tunes_first_state_save_is_refused_not_resumed_as_one_trial(ray_session, tmp_path):
    """Its folder had Tune's ``tuner.pkl`` and no state: Tune logged an error and ran a new experiment of one trial,
    and the resumed sweep of four reported one."""
    spec = {"base": "quickstart", "max_concurrent": 1, "grid": {"algorithm.lr": [0.1, 0.05]},
            "set": {**TINY, "federation.backend": "local", "run.out": str(tmp_path)}}
    folder = fedcomp.sweep(spec).path
    for name in (tune_state.STATE_GLOB, tune_state.COPY, "trials.parquet"):  # as at a kill before the first save
        for path in folder.glob(name):
            path.unlink()
    assert (folder / "tuner.pkl").is_file()
    with pytest.raises(fedcomp.ConfigError, match=r"Tune's experiment state is missing; the sweep never started$"):
        fedcomp.resume_sweep(folder)
