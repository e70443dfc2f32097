"""Packed trials: several grid configurations per Tune trial, one at a time (bit for bit equal to
``fedcomp.run``) or in lockstep under ``vmap`` (equal within the stated tolerance), each configuration its own
rows in ``trials.parquet``, a failed packed trial continuing every configuration from its checkpoint, and
packing's bad input as one line."""

from __future__ import annotations

import pandas as pd
import pytest

import fedcomp
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError, TrialsFailed
from fedcomp.sweeps.lockstep import TOLERANCE, Lockstep, run_together
from fedcomp.sweeps.packs import make_packs, swept_floats
from fedcomp.sweeps.report import best_and_edges, outcome_counts
from fedcomp.sweeps.spec import load_spec
from fedcomp.sweeps.trial import FAULT_EXIT
from tests.sweeps.tiny import TINY as SWEEP_TINY

TINY = {**SWEEP_TINY, "federation.backend": "local", "algorithm.name": "fcsg-m"}
GRID = {"algorithm.lr": [0.1, 0.02], "algorithm.beta": [0.1, 0.9]}
METRICS = ["round", "comm_rounds", "local_steps", "samples", "floats_up", "floats_down", "train_loss",
           "test_accuracy", "test_loss"]
EXACT = ["round", "comm_rounds", "local_steps", "samples", "floats_up", "floats_down"]


def tiny(out, **spec):
    return {"base": "quickstart", "set": {**TINY, "run.out": str(out)}, "grid": GRID, **spec}


def alone(trials: pd.DataFrame, trial: str, out) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A configuration's rows in the sweep and the rows of ``fedcomp.run`` on the same config."""
    rows = trials[trials["trial"] == trial].reset_index(drop=True)
    first = rows.iloc[0]
    overrides = {**TINY, "algorithm.lr": first["algorithm.lr"], "algorithm.beta": first["algorithm.beta"],
                 "run.seed": int(first["run.seed"]), "run.progress": "none", "run.out": str(out)}
    return rows[METRICS], fedcomp.run("quickstart", overrides).metrics[METRICS]


def run_watched(configs, swept):
    """Every round's batch of ``run_together`` and the lockstep group (one per call it saw, whose ``batched_calls``
    counts the calls that ran under ``vmap``)."""
    groups = []
    original = Lockstep.submit

    def counted(self, index, call):
        groups.append(self)
        return original(self, index, call)

    Lockstep.submit = counted
    try:
        batches = list(run_together(configs, swept, [None] * len(configs)))
    finally:
        Lockstep.submit = original
    return groups, batches


def test_figure1_grid_packs_by_shape():
    spec = load_spec("fcsg-invariant-lr")
    assert spec.pack == "lockstep" and swept_floats(spec) == ["lr", "beta"]
    packs = make_packs(spec)
    # 9 panels x 3 seeds, each one pack per algorithm: 15 FCSG-M (lr x beta) and 3 FCSG (lr) configurations
    assert sorted(len(p) for p in packs) == [3] * 27 + [15] * 27
    assert sum(len(p) for p in packs) == 486
    for pack in packs:
        configs = [spec.trial_config(m) for m in pack]
        assert len({(c.run.seed, c.task.noise_ratio, c.algorithm.inner_batch, c.algorithm_name) for c in configs}) == 1


def test_lockstep_configurations_equal_runs_alone_within_tolerance(tmp_path):
    points = [{"algorithm.lr": lr, "algorithm.beta": beta} for lr in GRID["algorithm.lr"] for beta in GRID["algorithm.beta"]]
    configs = [load_config("quickstart", {**TINY, **p, "run.progress": "none"}) for p in points]
    calls, batches = run_watched(configs, ["lr", "beta"])
    last = {}
    for batch in batches:
        assert [k for k, _ in batch] == list(range(len(configs)))  # every configuration, every round
        last.update(batch)
    assert calls and calls[0].batched_calls == len(configs) * TINY["run.rounds"]  # every round ran batched
    for k, point in enumerate(points):
        swept = pd.DataFrame(last[k].rows)[METRICS]
        ref = fedcomp.run("quickstart", {**TINY, **point, "run.progress": "none", "run.out": str(tmp_path)}).metrics[METRICS]
        pd.testing.assert_frame_equal(swept[EXACT], ref[EXACT], check_dtype=False)
        assert (swept.drop(columns=EXACT) - ref.drop(columns=EXACT)).abs().max().max() <= TOLERANCE
    with pytest.raises(ValueError, match="may differ only in algorithm fields"):
        list(run_together([configs[0], configs[0].replace(**{"run.seed": 1})], ["lr"], [None, None]))


def test_lockstep_configurations_of_the_mlp_task_take_one_batched_untaped_pass_a_step(tmp_path, batched_passes):
    """A sweep's configurations of a perceptron task step in lockstep with the untaped gradient of every configuration's
    every client in one batched pass (``MlpPlan.batched_cross_entropy``), equal to runs alone within the tolerance."""
    mlp = {"task": {"name": "synthetic-classification", "hidden": [16], "test_samples": 50},
           "algorithm": {"name": "fedavg", "local_steps": 2}}
    overrides = {"federation.backend": "local", "federation.clients": 4, "run.rounds": 2, "run.progress": "none"}
    configs = [load_config(mlp, {**overrides, "algorithm.lr": lr}) for lr in (0.1, 0.02)]
    last = {}
    for batch in run_together(configs, ["lr"], [None, None]):
        last.update(batch)
    assert batched_passes == [2 * 4] * (2 * 2)  # two configurations of four clients, two steps in each of two rounds
    ref = fedcomp.run(mlp, {**overrides, "algorithm.lr": 0.02, "run.out": str(tmp_path)}).metrics
    assert (pd.DataFrame(last[1].rows)["test_loss"] - ref["test_loss"]).abs().max() <= TOLERANCE


def test_a_pack_of_an_algorithm_without_a_swept_field_batches_the_fields_it_has(tmp_path):
    # The Figure 1 grid sweeps lr and beta; FCSG has no beta, and its packs vary lr only.
    configs = [load_config("quickstart", {**TINY, "algorithm.name": "fcsg", "algorithm.lr": lr, "run.rounds": 2,
                                          "run.progress": "none"}) for lr in (0.1, 0.02)]
    last = {}
    for batch in run_together(configs, ["lr", "beta"], [None, None]):
        last.update(batch)
    ref = fedcomp.run("quickstart", {**TINY, "algorithm.name": "fcsg", "algorithm.lr": 0.02, "run.rounds": 2,
                                     "run.progress": "none", "run.out": str(tmp_path)}).metrics
    assert (pd.DataFrame(last[1].rows)["test_loss"] - ref["test_loss"]).abs().max() <= TOLERANCE


@pytest.mark.parametrize("hidden, batched", [([16], True), ([1024, 128], False)])
def test_configurations_of_a_large_model_on_a_cpu_run_one_at_a_time(tmp_path, hidden, batched):
    """Lockstep costs more than it saves for a client state over LOCKSTEP_MAX_CPU_FLOATS on a CPU: such a pack runs
    its configurations one at a time, bit for bit a run alone; a small model on the same task still batches."""
    base = {"task": {"name": "synthetic-classification", "hidden": hidden, "test_samples": 10},
            "algorithm": {"name": "fedavg", "local_steps": 2}}
    overrides = {"federation.backend": "local", "federation.clients": 4, "run.rounds": 2, "run.progress": "none"}
    configs = [load_config(base, {**overrides, "algorithm.lr": lr}) for lr in (0.1, 0.02)]
    groups, batches = run_watched(configs, ["lr"])
    last = {}
    for batch in batches:
        last.update(batch)
    assert (groups[0].batched_calls > 0) == batched
    if not batched:
        ref = fedcomp.run(base, {**overrides, "algorithm.lr": 0.02, "run.out": str(tmp_path)}).metrics[EXACT + ["test_loss"]]
        pd.testing.assert_frame_equal(pd.DataFrame(last[1].rows)[EXACT + ["test_loss"]], ref, check_dtype=False)


@pytest.mark.ray
@pytest.mark.slow
def test_sequential_packs_equal_runs_alone_bit_for_bit_and_report_per_configuration(ray_session, tmp_path):
    result = fedcomp.sweep(tiny(tmp_path, seeds=2, pack="sequential", pack_size=3, max_concurrent=1))
    trials = result.trials
    assert trials["trial"].nunique() == 8 and set(trials["status"]) == {"completed"}
    assert len([p for p in result.path.iterdir() if p.is_dir()]) == 3  # 8 configurations in 3 Tune trials
    assert outcome_counts(trials, result.spec) == "8 configurations in 3 packed trials, 0 failed"
    for _, rows in trials.groupby("trial"):
        assert rows["round"].tolist() == list(range(5))
    assert sorted(map(tuple, trials[["algorithm.lr", "algorithm.beta", "run.seed"]].drop_duplicates().values.tolist())) == [
        (lr, beta, seed) for lr in (0.02, 0.1) for beta in (0.1, 0.9) for seed in (0, 1)]
    for trial in sorted(trials["trial"].unique())[::3]:
        swept, ref = alone(trials, trial, tmp_path / "alone")
        pd.testing.assert_frame_equal(swept, ref, check_dtype=False)
    best, edges = best_and_edges(trials, result.spec)
    assert best["seeds"].tolist() == [2] and edges  # two values per axis: the best is on an edge of each


@pytest.mark.ray
@pytest.mark.slow
def test_a_failed_lockstep_trial_resumes_every_configuration_from_its_checkpoint(ray_session, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_EXIT, "3")  # the trial's process dies at round 3; its last checkpoint is round 2
    with pytest.raises(TrialsFailed, match=r"^every trial of the sweep failed \(4\); the first: ") as failed:
        fedcomp.sweep(tiny(tmp_path, pack="lockstep", max_failures=0))  # its 4 configurations in one Tune trial
    first = pd.read_parquet(failed.value.path / "trials.parquet")
    assert set(first["status"]) == {"error"} and first["trial"].nunique() == 4
    assert first.groupby("trial")["round"].max().tolist() == [2] * 4  # the checkpoint's rows (and no more)
    monkeypatch.delenv(FAULT_EXIT)
    result = fedcomp.resume_sweep(failed.value.path)
    trials = result.trials
    assert set(trials["status"]) == {"completed"} and trials["trial"].nunique() == 4
    assert len([p for p in result.path.iterdir() if p.is_dir()]) == 1
    for _, rows in trials.groupby("trial"):
        assert rows["round"].tolist() == list(range(5))
    swept, ref = alone(trials, sorted(trials["trial"].unique())[1], tmp_path / "alone")
    pd.testing.assert_frame_equal(swept[EXACT], ref[EXACT], check_dtype=False)
    assert (swept.drop(columns=EXACT) - ref.drop(columns=EXACT)).abs().max().max() <= TOLERANCE


@pytest.mark.parametrize("changes, message", [
    ({"pack": "sequential", "search": "optuna", "grid": {}, "space": {"algorithm.lr": {"loguniform": [0.01, 0.1]}}},
     "pack = 'sequential': packs grid configurations"),
    ({"pack": "lockstep", "scheduler": "asha"}, "ASHA stops whole trials"),
    ({"pack": "lockstep", "set": {**TINY, "federation.backend": "ray"}}, "set federation.backend = 'local'"),
    ({"pack_size": 4}, "pack_size = 4: only with pack = 'sequential' or 'lockstep'"),
    ({"pack": "vmap"}, "sweep pack = 'vmap'"),
    ({"set": {**TINY, "federation.gpu_packing": "auto"}}, "federation.gpu_packing = 'auto': a trial's placement group"),
])
def test_bad_packing_is_one_line(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_spec({"base": "quickstart", "set": TINY, "grid": GRID, **changes})
