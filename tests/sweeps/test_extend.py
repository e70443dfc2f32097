"""``--extend-edges``: the next grid value past each group's edge optimum, for that group only and with its other
axis values, until the optimum is interior, the cap or the bound; real sweeps that extend, stop at the cap and
resume a step; bad input as one line."""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
import yaml

import fedcomp
from fedcomp.cli import main
from fedcomp.platform import results
from fedcomp.platform.errors import ConfigError
from fedcomp.sweeps.extend import DEFAULT_CAP, check_options, plan, summary
from fedcomp.sweeps.report import best_and_edges, sweep_report
from fedcomp.sweeps.spec import load_spec

BASE = {"base": "quickstart", "set": {"federation.backend": "local", "run.rounds": 2}}


def frame(points: list[dict[str, Any]], score: Callable[[dict[str, Any]], float]) -> pd.DataFrame:
    """One trial per point, two evaluation rounds, final accuracy ``score(point)``."""
    rows = []
    for i, point in enumerate(points):
        for rnd, value in ((1, score(point) - 0.2), (2, score(point))):
            rows.append({"trial": f"t{i}", "round": rnd, **point, "run.seed": 0, "test_accuracy": value})
    return pd.DataFrame(rows)


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def peak(lr: dict[str, float]) -> Callable[[dict[str, Any]], float]:
    """Accuracy peaking at each algorithm's ``lr`` (log distance), beta a small bonus."""
    return lambda p: 0.9 - abs(math.log10(p["algorithm.lr"] / lr[p["algorithm.name"]])) / 10 + p.get("algorithm.beta", 0) / 100


def run_steps(spec, grid, score, cap):
    """Apply :func:`plan` until it stops, 'running' each step's points with ``score``; the steps and final rows."""
    points, steps = grid_points(grid), []
    while True:
        trials = frame(points, score)
        step = plan(trials, spec, steps, cap)
        if not step.points:
            return steps, trials
        steps.append({"moves": [m.to_json() for m in step.moves], "points": step.points, "done": True})
        points += step.points


def test_the_next_value_runs_for_the_edge_group_only_with_its_other_axis_values():
    grid = {"algorithm.name": ["fcsg-m", "acc-fcsg-m"], "algorithm.lr": [0.01, 0.1, 1.0], "algorithm.beta": [0.1, 0.9]}
    spec = load_spec({**BASE, "grid": grid})
    # fcsg-m peaks at 100 (past the grid), acc-fcsg-m at 0.1 (interior): only fcsg-m moves, at both betas
    step = plan(frame(grid_points(grid), peak({"fcsg-m": 100.0, "acc-fcsg-m": 0.1})), spec, [], DEFAULT_CAP)
    new_lr = [p for p in step.points if p["algorithm.lr"] not in grid["algorithm.lr"]]
    assert sorted(p["algorithm.beta"] for p in new_lr) == [0.1, 0.9, 1.0]  # the corner with beta's move too
    assert {(p["algorithm.name"], p["algorithm.lr"]) for p in new_lr} == {("fcsg-m", 10.0)}
    # beta moved per group too, at every lr of that group
    assert sorted((p["algorithm.name"], p["algorithm.lr"]) for p in step.points if p["algorithm.beta"] == 1.0) == sorted(
        [(name, lr) for name in grid["algorithm.name"] for lr in grid["algorithm.lr"]] + [("fcsg-m", 10.0)])
    # beta: both groups' best sit at 0.9 of {0.1, 0.9}; the next value (x9) is clamped to beta <= 1
    assert {(dict(m.group)["algorithm.name"], m.axis, m.to) for m in step.moves} == {
        ("fcsg-m", "algorithm.lr", 10.0)} | {(name, "algorithm.beta", 1.0) for name in ("fcsg-m", "acc-fcsg-m")}
    steps, trials = run_steps(spec, grid, peak({"fcsg-m": 100.0, "acc-fcsg-m": 0.1}), DEFAULT_CAP)
    assert [[m["to"] for m in s["moves"] if m["axis"] == "algorithm.lr"] for s in steps] == [[10.0], [100.0], [1000.0]]
    best, edges = best_and_edges(trials, spec)
    assert dict(zip(best["algorithm.name"], best["algorithm.lr"])) == {"acc-fcsg-m": 0.1, "fcsg-m": 100.0}
    assert [(e.axis, e.value) for e in edges] == [("algorithm.beta", 1.0)] * 2  # beta stays at its bound
    lines = summary(trials, spec, steps, DEFAULT_CAP)
    assert "extended: fcsg-m algorithm.lr upward in 3 steps: 1 → 10 → 100 → 1000; best now 100 (interior)" in lines
    assert "extended: acc-fcsg-m algorithm.beta upward in 1 step: 0.9 → 1; best now 1 (still an edge)" in lines
    assert "edge remains: fcsg-m algorithm.beta = 1 (largest tried): at the bound (algorithm.beta <= 1)" in lines


def test_the_cap_stops_extending_and_the_edge_remains():
    grid = {"algorithm.name": ["fcsg"], "algorithm.lr": [0.3, 0.1, 0.03]}  # neither geometric nor arithmetic
    spec = load_spec({**BASE, "grid": grid})
    steps, trials = run_steps(spec, grid, peak({"fcsg": 1e-4}), cap=2)  # optimum far below the grid
    first = float(f"{0.03 / math.sqrt(10):.12g}")  # so / sqrt(10), twice
    second = float(f"{first / math.sqrt(10):.12g}")
    assert [s["points"] for s in steps] == [[{"algorithm.name": "fcsg", "algorithm.lr": first}],
                                            [{"algorithm.name": "fcsg", "algorithm.lr": second}]]
    assert summary(trials, spec, steps, 2) == [
        f"extended: fcsg algorithm.lr downward in 2 steps: 0.03 → {first:.6g} → {second:.6g}; best now {second:.6g} (still an edge)",
        f"edge remains: fcsg algorithm.lr = {second:.6g} (smallest tried): cap of 2 extensions reached"]


def test_an_interior_optimum_runs_nothing():
    grid = {"algorithm.name": ["fcsg"], "algorithm.lr": [0.01, 0.1, 1.0]}
    spec = load_spec({**BASE, "grid": grid})
    steps, trials = run_steps(spec, grid, peak({"fcsg": 0.1}), DEFAULT_CAP)
    assert steps == [] and summary(trials, spec, steps, DEFAULT_CAP) == ["no edge optimum: nothing extended"]


@pytest.mark.parametrize("extend, cap, changes, message", [
    (True, 0, {}, "edge_cap = 0: must be an integer >= 1"),
    (False, 2, {}, "edge_cap = 2: only with extend_edges (--extend-edges)"),
    (True, None, {"search": "optuna", "grid": {}, "space": {"algorithm.lr": {"loguniform": [0.01, 0.1]}}},
     "extend_edges with search = 'optuna': extends grid axes only"),
])
def test_bad_options_are_one_line(extend, cap, changes, message):
    spec = load_spec({**BASE, "grid": {"algorithm.lr": [0.1, 0.2]}, **changes})
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        check_options(spec, extend, cap)


@pytest.mark.parametrize("flags, message", [
    (["--extend-edges", "--edge-cap", "0"], "fedcomp: error: edge_cap = 0: must be an integer >= 1\n"),
    (["--edge-cap", "2"], "fedcomp: error: edge_cap = 2: only with extend_edges (--extend-edges)\n"),
    (["--extend-edges", "--search", "optuna"], None),
])
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, flags, message):
    spec = tmp_path / "s.yaml"
    axes = {"space": {"algorithm.lr": {"loguniform": [0.01, 0.1]}}} if "optuna" in flags else {"grid": {"algorithm.lr": [0.1, 0.2]}}
    spec.write_text(yaml.safe_dump({**BASE, **axes}))
    assert main(["sweep", str(spec), *flags, "--set", f"run.out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err == (message or err) and "edge" in err
    assert not (tmp_path / "out").exists()


def test_resume_takes_no_extend_flags(tmp_path, capsys):
    assert main(["sweep", "--resume", str(tmp_path), "--extend-edges"]) == 2
    assert "--resume SWEEP_DIR continues a sweep with its stored spec" in capsys.readouterr().err


TINY = {"federation.backend": "local", "federation.clients": 4, "algorithm.local_steps": 5,
        "task.test_samples": 2000, "run.rounds": 2, "run.track": "none", "run.progress": "none"}


def tiny(out) -> dict[str, Any]:
    """Two rounds of the quickstart problem: the best lr lies above the grid {1e-4, 1e-3, 1e-2}."""
    return {"base": "quickstart", "grid": {"algorithm.lr": [0.0001, 0.001, 0.01]}, "pack": "sequential",
            "set": {**TINY, "run.out": str(out)}}


@pytest.mark.ray
@pytest.mark.slow
def test_a_real_sweep_extends_until_interior_and_the_report_lists_it(ray_session, tmp_path, capsys):
    spec = tmp_path / "edge.yaml"
    spec.write_text(yaml.safe_dump(tiny(tmp_path / "out")))
    assert main(["sweep", str(spec), "--extend-edges", "--verbose", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    (folder,) = (tmp_path / "out").iterdir()
    result = fedcomp.sweeps.load_sweep(folder)
    best = result.best()
    assert best["edge"].tolist() == [""]  # interior now
    lrs = sorted(result.trials["algorithm.lr"].unique())
    assert lrs[:3] == [0.0001, 0.001, 0.01] and len(lrs) > 3
    assert lrs[3:] == [0.01 * 10 ** k for k in range(1, len(lrs) - 2)]  # the grid's own ratio, 10
    assert lrs[1:-1].count(best["algorithm.lr"].item()) == 1  # the best has a tried value either side
    line = next(x for x in out if x.startswith("extended: fcsg-m algorithm.lr upward in "))
    assert line.endswith("(interior)") and "0.01 → 0.1" in line
    assert f"- {line}" in (folder / "report.md").read_text().splitlines()
    # every extension row is a full run of the same machinery: equal to fedcomp.run on that config
    rows = result.trials[result.trials["algorithm.lr"] == 0.1].reset_index(drop=True)
    assert rows["trial"].str.startswith("extend-1/").all()
    alone = fedcomp.run("quickstart", {**TINY, "algorithm.lr": 0.1, "run.out": str(tmp_path / "alone")}).metrics
    pd.testing.assert_frame_equal(rows[alone.columns.drop("wall_time", errors="ignore")],
                                  alone.drop(columns="wall_time", errors="ignore"), check_dtype=False)


@pytest.mark.ray
@pytest.mark.slow
def test_the_cap_leaves_the_edge_and_a_step_whose_rows_were_not_stored_is_restored(ray_session, tmp_path):
    result = fedcomp.sweep(tiny(tmp_path), extend_edges=True, edge_cap=2)
    state = results.read_json(result.path / "extend.json")
    assert [s["points"] for s in state["steps"]] == [[{"algorithm.lr": 0.1}], [{"algorithm.lr": 1.0}]]
    assert all(s["done"] for s in state["steps"])
    assert state["summary"][-1] == "edge remains: fcsg-m algorithm.lr = 1 (largest tried): cap of 2 extensions reached"
    _, md = sweep_report(result)
    assert f"- {state['summary'][-1]}" in md.read_text().splitlines()
    before, told = result.trials, state["summary"]
    # as if killed during step 2 after its Tune trial finished: step 2 not marked done, its rows not stored
    state["steps"][1]["done"] = False
    state["summary"] = []
    results.write_json(result.path / "extend.json", state)
    (result.path / "extend-2" / "rows.parquet").unlink()
    pd.read_parquet(result.path / "trials.parquet").query("`algorithm.lr` != 1.0").to_parquet(result.path / "trials.parquet")
    trial_dirs = sorted(p.name for p in (result.path / "extend-2").iterdir() if p.is_dir())
    resumed = fedcomp.resume_sweep(result.path)
    assert sorted(p.name for p in (result.path / "extend-2").iterdir() if p.is_dir()) == trial_dirs  # restored, not re-run
    pd.testing.assert_frame_equal(resumed.trials.drop(columns="wall_time"), before.drop(columns="wall_time"))
    after = results.read_json(result.path / "extend.json")
    assert after["summary"] == told and [s["done"] for s in after["steps"]] == [True, True]


def test_a_joint_axis_and_a_bound_are_left_and_say_why():
    grid = {"algorithm.name": ["fcsg-m"], "algorithm.local_steps,run.rounds": [[2, 2], [4, 1]], "algorithm.beta": [0.5, 0.75, 1.0]}
    spec = load_spec({**BASE, "grid": grid})
    points = [{"algorithm.name": "fcsg-m", "algorithm.local_steps": p, "run.rounds": r, "algorithm.beta": b}
              for p, r in grid["algorithm.local_steps,run.rounds"] for b in grid["algorithm.beta"]]
    step = plan(frame(points, lambda p: p["algorithm.local_steps"] + p["algorithm.beta"]), spec, [], DEFAULT_CAP)
    assert step.points == [] and step.moves == []
    assert sorted((e.axis, why) for e, why in step.remaining) == [
        ("algorithm.beta", "at the bound (algorithm.beta <= 1)"),
        ("algorithm.local_steps", JOINT_STUCK), ("run.rounds", JOINT_STUCK)]


JOINT_STUCK = "a joint axis (algorithm.local_steps,run.rounds): its keys move together, and run.rounds is at the bound (run.rounds >= 1)"


def test_a_joint_axis_moves_all_its_keys_at_once_until_one_of_them_cannot():
    spec = load_spec({**BASE, "grid": {"algorithm.name": ["fcsg-m"], "algorithm.lr,algorithm.beta": [[0.01, 0.1], [0.03, 0.3]]}})
    points = [{"algorithm.name": "fcsg-m", "algorithm.lr": lr, "algorithm.beta": b} for lr, b in [(0.01, 0.1), (0.03, 0.3)]]
    score, steps = peak({"fcsg-m": 1.0}), []  # the larger the lr, the better: the optimum is past the grid
    while (step := plan(frame(points, score), spec, steps, DEFAULT_CAP)).points:
        assert [(m.axis, len(step.points)) for m in step.moves] == [("algorithm.lr,algorithm.beta", 1)]  # never one key alone
        steps.append({"moves": [m.to_json() for m in step.moves], "points": step.points, "done": True})
        points += step.points
    # each key steps by its own ratio (x3) at once; beta's 2.7 is clamped to its bound 1, after which it cannot move
    assert [(round(p["algorithm.lr"], 12), p["algorithm.beta"]) for p in points[2:]] == [(0.09, 0.9), (0.27, 1.0)]
    lines = summary(frame(points, score), spec, steps, DEFAULT_CAP)
    assert lines[0] == ("extended: fcsg-m algorithm.lr,algorithm.beta upward in 2 steps: (0.03, 0.3) → (0.09, 0.9) → "
                        "(0.27, 1); best now (0.27, 1) (still an edge)")
    assert lines[1:] == [f"edge remains: fcsg-m {key} = {value} (largest tried): a joint axis (algorithm.beta,algorithm.lr): "
                         "its keys move together, and algorithm.beta is at the bound (algorithm.beta <= 1)"
                         for key, value in (("algorithm.lr", 0.27), ("algorithm.beta", 1))]


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_killed_during_an_extension_step_resumes_it_from_checkpoints(ray_session, tmp_path):
    spec = tiny(tmp_path)
    # 60 rounds, a checkpoint every 5 (numbered 0..11): long enough that the kill below lands mid-trial
    spec["set"].update({"run.rounds": 60, "run.checkpoint_every": 5})
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedcomp", "sweep", str(spec_file), "--extend-edges", "--edge-cap", "1",
           "--ray-address", address, "--verbose", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and not list(tmp_path.glob("*/extend-1/*/checkpoint_00000[234]")):  # mid-trial
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    [folder] = [p for p in tmp_path.iterdir() if (p / "sweep.json").is_file()]
    state = results.read_json(folder / "extend.json")
    assert [(s["points"], s["done"]) for s in state["steps"]] == [([{"algorithm.lr": 0.1}], False)]
    assert not list(folder.glob("extend-1/*/checkpoint_000011"))  # killed before the step's trial finished
    result = fedcomp.resume_sweep(folder)
    assert set(result.trials["status"]) == {"completed"} and result.trials["trial"].nunique() == 4
    assert not list(folder.glob("extend-2"))  # cap 1
    [step_trial] = [p for p in (folder / "extend-1").iterdir() if p.is_dir()]  # continued, not started again
    assert list(step_trial.glob("checkpoint_000011"))
    rows = result.trials[result.trials["algorithm.lr"] == 0.1].reset_index(drop=True)
    assert rows["round"].is_unique and rows["round"].iloc[-1] == 60  # each round once
    alone = fedcomp.run("quickstart", {**TINY, "run.rounds": 60, "algorithm.lr": 0.1, "run.out": str(tmp_path / "alone")}).metrics
    columns = alone.columns.drop("wall_time", errors="ignore")
    pd.testing.assert_frame_equal(rows[columns], alone[columns], check_dtype=False)
