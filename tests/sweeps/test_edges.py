"""The edge guard on hand-made trial frames: a best configuration at the smallest or largest value tried of a tuned
numeric axis (grid, two-valued grid, Optuna log range) is flagged per ranked group, with the next value to try
(clamped to the hyperparameter's bound); categorical, boolean, seed and group axes never are."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
import yaml

from fedcomp.cli import main
from fedcomp.sweeps.edges import Edge
from fedcomp.sweeps.report import (
    best_and_edges,
    best_configurations,
    markdown,
    paper_table,
)
from fedcomp.sweeps.spec import load_spec
from fedcomp.sweeps.tuner import load_sweep

BASE = {"base": "quickstart", "set": {"federation.backend": "local", "run.rounds": 2}, "seeds": 2}


def frame(grid: dict[str, list[Any]], score: Callable[[dict[str, Any]], float]) -> pd.DataFrame:
    """One trial per point of ``grid`` x seeds {0, 1}, two evaluation rounds; final accuracy = ``score(point)``
    + seed / 1000."""
    rows = []
    axes = list(grid)
    for i, (values, seed) in enumerate(itertools.product(itertools.product(*grid.values()), [0, 1])):
        point = dict(zip(axes, values))
        final = score(point) + seed / 1000
        for rnd, value in ((1, final - 0.2), (2, final)):
            rows.append({"trial": f"t{i}", "round": rnd, **point, "run.seed": seed, "test_accuracy": value})
    return pd.DataFrame(rows)


def by_axis(edges: list[Edge]) -> dict[tuple[Any, str], Edge]:
    return {(dict(e.group).get("algorithm.name"), e.axis): e for e in edges}


def test_grid_edges_per_algorithm_with_next_values_and_bounds():
    grid = {"algorithm.name": ["fcsg-m", "acc-fcsg-m"], "algorithm.lr": [0.01, 0.1, 1.0],
            "algorithm.beta": [0.1, 0.5, 0.9], "algorithm.local_steps": [2, 4, 8]}
    spec = load_spec({**BASE, "grid": grid})
    # fcsg-m: best lr 1 (largest), beta 0.5 (interior), local_steps 2 (smallest);
    # acc-fcsg-m: lr 0.1 (interior), beta 0.9 (largest; next 1.3 is past beta <= 1 -> clamped to 1), p 8 (largest)
    peak = {"fcsg-m": (1.0, 0.5, 2), "acc-fcsg-m": (0.1, 0.9, 8)}

    def score(p: dict[str, Any]) -> float:
        lr, beta, steps = peak[p["algorithm.name"]]
        return 0.9 - abs(math.log10(p["algorithm.lr"] / lr)) / 10 - abs(p["algorithm.beta"] - beta) / 10 - abs(math.log2(p["algorithm.local_steps"] / steps)) / 100

    best, edges = best_and_edges(frame(grid, score), spec)
    found = by_axis(edges)
    assert set(found) == {("fcsg-m", "algorithm.lr"), ("fcsg-m", "algorithm.local_steps"),
                          ("acc-fcsg-m", "algorithm.beta"), ("acc-fcsg-m", "algorithm.local_steps")}
    lr = found["fcsg-m", "algorithm.lr"]
    assert (lr.value, lr.side, lr.tried, lr.next) == (1.0, "high", (0.01, 0.1, 1.0), 10.0)  # the grid's ratio 10
    assert lr.warning() == "edge: fcsg-m's best algorithm.lr = 1 is the largest value tried; widen the grid (next: 10)"
    steps = found["fcsg-m", "algorithm.local_steps"]
    assert (steps.side, steps.next) == ("low", 1)  # ratio 2 below 2; local_steps >= 1 allows 1
    assert found["acc-fcsg-m", "algorithm.beta"].next == 1.0  # step 0.4 past 0.9 clamped to the inclusive bound
    assert found["acc-fcsg-m", "algorithm.local_steps"].next == 16
    # the Python API's column, in the order of the rows
    assert dict(zip(best["algorithm.name"], best["edge"])) == {
        "acc-fcsg-m": "algorithm.beta ↑, algorithm.local_steps ↑", "fcsg-m": "algorithm.lr ↑, algorithm.local_steps ↓"}
    text = markdown(frame(grid, score), spec)
    assert text.splitlines()[0].startswith("- edge: ")
    assert sum(line.startswith("- edge: ") for line in text.splitlines()) == 4
    assert "| fcsg-m | lr=1.0 ↑edge, beta=0.5, local_steps=2 ↓edge | 0.9005 ± 0.0007 | 2 |" in text.splitlines()


def test_at_the_bound_there_is_no_next_value():
    grid = {"algorithm.name": ["fcsg-m"], "algorithm.beta": [0.5, 0.75, 1.0], "algorithm.lr": [0.1, 0.2, 0.3]}
    spec = load_spec({**BASE, "grid": grid})
    edges = by_axis(best_and_edges(frame(grid, lambda p: p["algorithm.beta"] - p["algorithm.lr"]), spec)[1])
    beta, lr = edges["fcsg-m", "algorithm.beta"], edges["fcsg-m", "algorithm.lr"]
    assert (beta.next, beta.bound) == (None, "algorithm.beta <= 1")
    assert beta.warning().endswith("is the largest value tried; widen the grid -- at the bound (algorithm.beta <= 1)")
    assert (lr.side, lr.next, lr.bound) == ("low", None, "algorithm.lr > 0")  # arithmetic step 0.1 below 0.1 is 0


def test_two_values_are_always_an_edge_and_say_so():
    grid = {"algorithm.name": ["fcsg"], "algorithm.lr": [0.1, 0.3]}
    spec = load_spec({**BASE, "grid": grid})
    (edge,) = best_and_edges(frame(grid, lambda p: p["algorithm.lr"]), spec)[1]
    assert edge.two_values and edge.next == 0.9  # the two values' own ratio, 3
    assert "(only two values tried, so always an edge)" in edge.warning()


def test_categorical_boolean_and_seed_axes_are_ignored_and_an_interior_best_is_clean():
    grid = {"algorithm.name": ["fcsg"], "task.objective": ["paper", "official-code"],
            "task.identical_client_streams": [False, True], "algorithm.lr": [0.01, 0.1, 1.0]}
    spec = load_spec({**BASE, "grid": grid})
    best, edges = best_and_edges(frame(grid, lambda p: -abs(math.log10(p["algorithm.lr"]) + 1)), spec)
    assert edges == [] and best["edge"].tolist() == [""]
    assert not markdown(frame(grid, lambda p: -abs(math.log10(p["algorithm.lr"]) + 1)), spec).startswith("- edge")
    # all scores tied: the first configuration (lr = 0.01) wins -- an edge, and reported
    assert best_configurations(frame(grid, lambda p: 0.5), spec)["edge"].tolist() == ["algorithm.lr ↓"]


def test_several_groups_and_grids_judged_on_the_best_configurations_line():
    # A union of grids: p = 4 tried lr {0.1, 0.3, 1}, p = 8 tried lr {1, 3, 10}; ranked per (algorithm, p) each
    # group is judged on its own values; ranked per algorithm, lr = 1 at p = 4 is the largest tried *at p = 4*.
    grid = [{"algorithm.name": ["fcsg"], "algorithm.local_steps": [4], "algorithm.lr": [0.1, 0.3, 1.0]},
            {"algorithm.name": ["fcsg"], "algorithm.local_steps": [8], "algorithm.lr": [1.0, 3.0, 10.0]}]
    spec = load_spec({**BASE, "grid": grid})
    frames = [frame(g, lambda p: -abs(math.log10(p["algorithm.lr"] / 3)) + p["algorithm.local_steps"] / 100) for g in grid]
    trials = pd.concat([frames[0], frames[1].assign(trial=frames[1]["trial"] + "b")], ignore_index=True)
    _, per_cell = best_and_edges(trials, spec, by=["algorithm.name", "algorithm.local_steps"])
    assert [(dict(e.group)["algorithm.local_steps"], e.axis, e.value, e.side) for e in per_cell] == [(4, "algorithm.lr", 1.0, "high")]
    assert per_cell[0].warning().startswith("edge: fcsg at local_steps=4: best algorithm.lr = 1 is the largest")
    # Ranked per algorithm the best is p = 8, lr = 3: lr is interior on its line, and p was never tried at lr = 3
    # (one value on that line: not an axis there). At lr = 1, tried with both p, p = 8 is an edge (of two values),
    # and lr = 1 the smallest lr tried at p = 8.
    best, per_algorithm = best_and_edges(trials, spec)
    assert (best["algorithm.lr"].tolist(), per_algorithm) == ([3.0], [])
    shifted = trials.assign(test_accuracy=trials["test_accuracy"] + (trials["algorithm.lr"] == 1.0))
    assert {(e.axis, e.value, e.side, e.two_values) for e in best_and_edges(shifted, spec)[1]} == {
        ("algorithm.local_steps", 8, "high", True), ("algorithm.lr", 1.0, "low", False)}


def test_an_optuna_choice_edge_says_to_widen_its_choices_not_the_grid():
    """An Optuna sweep, which has no grid, said "widen the grid" at a choice axis' edge."""
    spec = load_spec({**BASE, "search": "optuna", "num_samples": 4,
                      "space": {"algorithm.lr": {"choice": [0.01, 0.1, 1.0]}}})
    (edge,) = best_and_edges(frame({"algorithm.name": ["fcsg"], "algorithm.lr": [0.01, 0.1, 1.0]},
                                   lambda p: p["algorithm.lr"]), spec)[1]
    assert edge.warning() == ("edge: fcsg's best algorithm.lr = 1 is the largest value tried; widen its choices in "
                              "space:")


def test_optuna_log_range_edges_are_measured_in_log_space():
    spec = load_spec({**BASE, "search": "optuna", "num_samples": 4,
                      "space": {"algorithm.lr": {"loguniform": [0.001, 1.0]}, "task.objective": {"choice": ["paper", "official-code"]}}})
    for lr, side in ((0.0012, "low"), (0.04, None), (0.8, "high"), (0.5, None)):
        trials = frame({"algorithm.name": ["fcsg"], "algorithm.lr": [lr, 0.01], "task.objective": ["paper"]},
                       lambda p, lr=lr: 1.0 if p["algorithm.lr"] == lr else 0.0)
        edges = best_and_edges(trials, spec)[1]
        assert [e.side for e in edges] == ([side] if side else []), lr  # 0.04 is 4 % of the linear range, 53 % in log
    (edge,) = best_and_edges(frame({"algorithm.name": ["fcsg"], "algorithm.lr": [0.8], "task.objective": ["paper"]},
                                   lambda p: 1.0), spec)[1]
    assert edge.warning() == "edge: fcsg's best algorithm.lr = 0.8 lies in the upper 5% of its log range [0.001, 1]; widen the range"


def test_paper_table_marks_edge_cells_with_a_footnote():
    grid = {"algorithm.name": ["fcsg", "fcsg-m"], "algorithm.local_steps": [4, 8], "algorithm.lr": [0.01, 0.1, 1.0]}
    spec = load_spec({**BASE, "grid": grid, "table": {"rows": ["algorithm.name"], "columns": "algorithm.local_steps"}})
    # fcsg peaks at lr = 0.1 (interior), fcsg-m at lr = 1 (the edge)
    trials = frame(grid, lambda p: -abs(math.log10(p["algorithm.lr"]) - (0 if p["algorithm.name"] == "fcsg-m" else -1)) / 10 + 0.5)
    lines = paper_table(trials, spec).splitlines()
    assert "| fcsg | 0.5005 ± 0.0007 | 0.5005 ± 0.0007 |" in lines
    assert "| fcsg-m | 0.5005 ± 0.0007 † | 0.5005 ± 0.0007 † |" in lines
    assert "† the cell's best configuration lies on the edge of a tuned axis:" in lines
    assert "- edge: fcsg-m at local_steps=4: best algorithm.lr = 1 is the largest value tried; widen the grid (next: 10)" in lines


@pytest.mark.ray
@pytest.mark.slow
def test_a_real_sweep_whose_best_is_on_the_edge_warns_and_marks_it(ray_session, tmp_path, capsys):
    spec = tmp_path / "edge.yaml"
    spec.write_text(yaml.safe_dump({
        "base": "quickstart", "grid": {"algorithm.lr": [0.0001, 0.001, 0.01]}, "max_concurrent": 1,
        "set": {"federation.backend": "local", "federation.clients": 4, "algorithm.local_steps": 5,
                "task.test_samples": 2000, "run.rounds": 2, "run.track": "none"},
    }))
    assert main(["sweep", str(spec), "--verbose", "0", "--set", f"run.out={tmp_path / 'out'}"]) == 0
    out = capsys.readouterr().out
    (folder,) = (tmp_path / "out").iterdir()
    best = load_sweep(folder).best()
    assert best["algorithm.lr"].tolist() == [0.01]  # the premise: the largest step wins in 2 rounds
    assert best["edge"].tolist() == ["algorithm.lr ↑"]
    warning = "edge: fcsg-m's best algorithm.lr = 0.01 is the largest value tried; widen the grid (next: 0.1)"
    assert out.splitlines().count(warning) == 1
    report = (folder / "report.md").read_text().splitlines()
    assert report[2] == f"- {warning}"  # under the title, before the plot
    assert any(line.startswith("| fcsg-m | lr=0.01 ↑edge |") for line in report)
