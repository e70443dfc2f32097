"""A sweep killed between two of Tune's experiment-state saves, resumed: the trials that finished (or checkpointed)
after the last save are not run again, and the trials table is an uninterrupted sweep's."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import fedcomp
from fedcomp.platform import results
from fedcomp.platform.errors import StorageError
from fedcomp.sweeps.on_disk import TRIAL_JSON
from fedcomp.sweeps.packs import PACK_JSON

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "extension.py"
EXAMPLE_YAML = REPO / "examples" / "extension.yaml"
ROUNDS = 6
SEEDS = 6


def counting_task(folder: Path, name: str) -> Path:
    """A user's task module ``name`` (the example's least squares, as task ``name``) that notes its run's seed in
    ``evaluations.txt`` at every evaluation: a trial's evaluations there, one per round run (round 0 included), count
    the work it did."""
    module = folder / f"{name.replace('-', '_')}.py"
    module.write_text(textwrap.dedent(f"""
        from fedcomp.platform import catalog
        from fedcomp.platform.registry import register_task

        catalog.import_source({str(EXAMPLE)!r})


        @register_task({name!r})
        class Counted(catalog.task_class("least-squares")):
            def __init__(self, params, seed, clients, device="cpu"):
                super().__init__(params, seed, clients, device)
                self.counted_seed = seed

            def evaluator(self):
                evaluate = super().evaluator()

                def counted(state):
                    with open({str(folder / "evaluations.txt")!r}, "a") as out:
                        out.write(f"{{self.counted_seed}}\\n")
                    return evaluate(state)
                return counted
    """))
    return module


def spec(module: Path, out: Path, pack: str = "none") -> dict:
    """Six one-trial-at-a-time runs of the counted task (the seeds 0..5), checkpointed every 2 of their 6 rounds;
    ``pack: sequential``: two runs a trial, one after the other."""
    overrides = {"run.rounds": ROUNDS, "run.eval_every": 1, "run.checkpoint_every": 2, "run.progress": "none",
                 "run.track": "none", "federation.backend": "local", "federation.clients": 4,
                 "federation.clients_per_round": 4, "algorithm.local_steps": 3, "run.seed": 0,
                 "task.module": str(module), "task.name": module.stem.replace("_", "-"), "run.out": str(out)}
    return {"base": str(EXAMPLE_YAML), "set": overrides, "grid": {"algorithm.lr": [0.02]}, "seeds": SEEDS,
            "max_concurrent": 1, **({"pack": pack, "pack_size": 2} if pack != "none" else {})}


def evaluations(folder: Path) -> collections.Counter[int]:
    """Evaluations per seed noted so far (and the file emptied)."""
    path = folder / "evaluations.txt"
    seen = collections.Counter(int(line) for line in path.read_text().split()) if path.is_file() else collections.Counter()
    path.write_text("")
    return seen


def on_disk(sweep_dir: Path) -> dict[int, int]:
    """Per seed, the round of its latest whole checkpoint in the sweep's trial folders (a trial's Tune config is
    in each of its checkpoint folders; a packed trial's holds one checkpoint per configuration it has started,
    ``member-<k>``, listed in its ``pack.json``, and is whole only with all of them: a resume passes over a folder
    whose files do not all read back, as one the kill cut short while Tune filled it)."""
    rounds: dict[int, int] = {}
    for folder in sweep_dir.glob("*/checkpoint_*"):
        try:
            trial = json.loads((folder / TRIAL_JSON).read_text())
            if "pack" in trial:
                listed = json.loads((folder / PACK_JSON).read_text())["members"]
                runs = {folder / f"member-{k}": trial["pack"][k] for k in listed}
            else:
                runs = {folder: trial}
            taken = {config["run.seed"]: results.read_checkpoint(path / results.CHECKPOINT)["server"]["counters"]["round"]
                     for path, config in runs.items()}
        except (OSError, ValueError, StorageError):
            continue  # being written
        for seed, round in taken.items():
            rounds[seed] = max(rounds.get(seed, -1), round)
    return rounds


def settled(sweep_dir: Path, folder: Path) -> dict[int, int]:
    """:func:`on_disk` once the killed driver's trial process -- a worker of the test's Ray, not of the killed
    process group -- has stopped too (Ray ends a dead driver's workers, not at once): nothing evaluated or
    checkpointed for a second."""
    seen: tuple[object, ...] = ()
    for _ in range(120):
        now = (on_disk(sweep_dir), (folder / "evaluations.txt").stat().st_size)
        if now == seen:
            return now[0]
        seen = now
        time.sleep(1)
    raise AssertionError("the killed sweep's trial went on for 2 minutes")


def comparable(trials: pd.DataFrame) -> pd.DataFrame:
    """A trials table without what names the sweep and its trials (folders, ids) and the runs' clock times, in the
    order of the seeds."""
    kept = trials.drop(columns=["trial", "run.out", "run.name", "wall_time"], errors="ignore")
    return kept.sort_values(["run.seed", "round"], kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("pack", ["none", "sequential", "lockstep"])
def test_a_sweep_killed_after_trials_finished_unsaved_resumes_without_running_them_again(ray_session, tmp_path, pack):
    """Runs of a packed trial (``pack: sequential``, ``lockstep``) alike: Tune's checkpoints of a pack hold each
    run's. A lockstep pack whose runs had all finished unsaved failed on resume (nothing left to run together)."""
    module = counting_task(tmp_path, f"least-squares-counted-{pack}")
    alone = fedcomp.sweep(spec(module, tmp_path / "alone", pack)).trials
    assert evaluations(tmp_path) == {seed: ROUNDS + 1 for seed in range(SEEDS)}

    work = tmp_path / "killed"
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec(module, work, pack)))
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedcomp", "sweep", str(spec_file), "--ray-address", address, "--verbose", "0"]
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1000"}  # Tune saves its state once, as the sweep starts
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.time() + 240
    # until three trials have finished and the fourth has checkpointed: all after Tune's one save
    while time.time() < deadline and proc.poll() is None:
        taken = [r for folder in work.glob("*") for r in on_disk(folder).values()]
        if taken.count(ROUNDS) >= 3 and len(taken) >= 4:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    [sweep_dir] = work.iterdir()
    disk = settled(sweep_dir, tmp_path)
    assert list(disk.values()).count(ROUNDS) >= 3 and len(disk) >= 4 and not (sweep_dir / "trials.parquet").exists()
    before = evaluations(tmp_path)

    resumed = fedcomp.resume_sweep(sweep_dir).trials
    after = evaluations(tmp_path)
    redone = {seed: before[seed] + after[seed] - (ROUNDS + 1) for seed in range(SEEDS)}
    print(f"on disk at the kill {disk}; evaluations before {dict(before)}, after {dict(after)}, redone {redone}")
    assert set(resumed["status"]) == {"completed"} and resumed["trial"].nunique() == SEEDS
    pd.testing.assert_frame_equal(comparable(resumed), comparable(alone))
    # rounds run again: only those evaluated after the trial's latest checkpoint on disk (none for a finished trial)
    assert redone == {seed: before[seed] - 1 - disk.get(seed, -1) for seed in range(SEEDS)}
    if pack != "lockstep":  # lockstep's runs compute rounds ahead of the pack's saves (threads, lockstep.run_together)
        # a checkpoint every 2 rounds, written after its round's evaluation: at most the 2 rounds of the one cut short
        # evaluated since its last checkpoint (2 where the kill fell between round 2k's evaluation and its checkpoint)
        assert sum(redone.values()) <= 2
