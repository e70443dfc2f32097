"""``benchmarks/auc_tables.py``: running a table preset in parts and tabulating each cell from the newest sweep
folder that ran it with the preset's current grid."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

import auc_tables
from fedcomp.platform import results
from fedcomp.sweeps.spec import SweepSpec, load_spec
from fedcomp.sweeps.tuner import SWEEP_JSON, TRIALS

TABLE1 = "auc-table1-offline"


def test_restrict_cuts_joint_axes_value_by_value_and_drops_emptied_grids():
    full = load_spec(TABLE1)
    part = auc_tables.restrict(full, {"task.dataset": ["digits"], "algorithm.local_steps": [8]})
    points = part.points()
    assert {(p["task.dataset"], p["task.model"], p["algorithm.local_steps"], p["run.rounds"]) for p in points} == {("digits", "linear", 8, 24)}
    assert len(points) == len([p for p in full.points() if p["task.dataset"] == "digits" and p["algorithm.local_steps"] == 8]) == 35
    assert len(part.grids) == 3  # the three MNIST 5k grids are gone, not left with an empty axis
    assert part.name == TABLE1 and part.seeds == full.seeds


def test_restrict_to_nothing_names_what_is_allowed():
    with pytest.raises(SystemExit, match=r"leave no configuration of auc-table1-offline; allowed: .*'mnist5k'"):
        auc_tables.restrict(load_spec(TABLE1), {"task.dataset": ["cifar10"]})


def _sweep_folder(root: Path, name: str, spec: SweepSpec, cells: list[tuple[str, int]], age: int) -> Path:
    """A finished sweep folder as the tuner leaves it (its spec and trials), ``age`` seconds old."""
    folder = root / f"{TABLE1}_{name}"
    folder.mkdir()
    results.write_json(folder / SWEEP_JSON, {"spec": spec.model_dump(mode="json"), "cluster_has_gpus": False})
    rows = [{"trial": f"{name}-{dataset}-{p}", "task.dataset": dataset, "algorithm.local_steps": p, "round": 48}
            for dataset, p in cells]
    pd.DataFrame(rows).to_parquet(folder / TRIALS)
    stamp = 1_700_000_000 - age
    os.utime(folder, (stamp, stamp))
    return folder


def test_each_cell_comes_from_the_newest_folder_that_ran_it_with_the_current_grid(tmp_path):
    full = load_spec(TABLE1)
    digits = auc_tables.restrict(full, {"task.dataset": ["digits"]})
    older = _sweep_folder(tmp_path, "older", digits, [("digits", 4), ("digits", 8), ("digits", 16)], age=300)
    newer = _sweep_folder(tmp_path, "newer", auc_tables.restrict(full, {"task.dataset": ["digits"], "algorithm.local_steps": [8]}),
                          [("digits", 8)], age=200)
    stale = full.model_copy(update={"grid": [{**g, "algorithm.lr": [0.1]} if "algorithm.lr" in g else g for g in full.grids]})
    _sweep_folder(tmp_path, "stale", auc_tables.restrict(stale, {"task.dataset": ["breast-cancer"]}), [("breast-cancer", 4)], age=100)
    found = auc_tables.merged(tmp_path, TABLE1, auc_tables.TABLE1_PART)
    assert found is not None
    result, folders = found
    assert folders == [newer, older]  # the stale grid's folder gives nothing
    assert sorted(result.trials["trial"]) == ["newer-digits-8", "older-digits-16", "older-digits-4"]
    assert result.spec == full
    left = auc_tables.coverage(TABLE1, result, auc_tables.TABLE1_PART)[0]
    assert "dataset mnist5k, local_steps 4" in left and "dataset breast-cancer, local_steps 8" in left and "digits" not in left


def test_no_folder_of_the_preset_gives_none(tmp_path):
    assert auc_tables.merged(tmp_path, TABLE1, auc_tables.TABLE1_PART) is None


def test_a_report_rewrites_the_tabulated_presets_sections_and_keeps_the_others():
    table1 = ["## `auc-table1-offline` (new)", "", "new table 1", ""]
    first = auc_tables.report({TABLE1: ["## `auc-table1-offline` (old)", "", "old table 1", ""],
                               "auprc-table2-offline": ["## `auprc-table2-offline` (old)", "", "table 2", "| a |", ""]})
    second = auc_tables.report({TABLE1: table1}, first)
    assert "new table 1" in second and "old table 1" not in second
    assert second.index("new table 1") < second.index("## `auprc-table2-offline` (old)\n\ntable 2\n| a |\n") < second.index(auc_tables.PAPERS)
    assert auc_tables.report({}, second) == second  # nothing tabulated: every section kept as it was
    assert "Not tabulated yet: run `python benchmarks/auc_tables.py --only table2`" in auc_tables.report({TABLE1: table1})
