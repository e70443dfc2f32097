"""The report's paper layout: one row per value of the row axes, one column per value of the column axis,
each cell the best configuration of the remaining axes (mean ± std over seeds), extra metrics at the same
configurations."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from fedcomp.platform.errors import ConfigError
from fedcomp.sweeps.report import paper_table
from fedcomp.sweeps.spec import load_spec

SPEC = {
    "base": "quickstart",
    "set": {"federation.backend": "local", "run.rounds": 2},
    "grid": {"algorithm.name": ["fcsg", "fcsg-m"], "algorithm.local_steps": [4, 8], "algorithm.lr": [0.1, 0.01]},
    "seeds": 2,
    "table": {"rows": ["algorithm.name"], "columns": "algorithm.local_steps", "metrics": ["test_loss"]},
}


def trials() -> pd.DataFrame:
    """Final accuracy = base(name) + p/100 + (0.05 if lr = 0.1) + seed/1000; loss = 1 - accuracy."""
    rows = []
    for i, (name, p, lr, seed) in enumerate(itertools.product(["fcsg", "fcsg-m"], [4, 8], [0.1, 0.01], [0, 1])):
        acc = {"fcsg": 0.5, "fcsg-m": 0.6}[name] + p / 100 + (0.05 if lr == 0.1 else 0.0) + seed / 1000
        for rnd, value in ((1, acc - 0.2), (2, acc)):
            rows.append({"trial": f"t{i}", "round": rnd, "algorithm.name": name, "algorithm.local_steps": p,
                         "algorithm.lr": lr, "run.seed": seed, "test_accuracy": value, "test_loss": 1 - value})
    return pd.DataFrame(rows)


def test_cells_are_the_best_configuration_per_row_and_column():
    text = paper_table(trials(), load_spec(SPEC))
    lines = text.splitlines()
    assert "| name | local_steps = 4 | local_steps = 8 |" in lines
    # best lr is 0.1 everywhere: fcsg, p = 4 -> 0.5 + 0.04 + 0.05 + mean(0, 0.001) = 0.5905, std of (0.590, 0.591)
    assert "| fcsg | 0.5905 ± 0.0007 † | 0.6305 ± 0.0007 † |" in lines
    assert "| fcsg-m | 0.6905 ± 0.0007 † | 0.7305 ± 0.0007 † |" in lines
    # the extra metric at the same configurations
    assert "| fcsg | 0.4095 ± 0.0007 † | 0.3695 ± 0.0007 † |" in lines


def test_table_axes_must_be_sweep_axes():
    with pytest.raises(ConfigError, match=r"table: 'task.dataset' is not an axis of this sweep; allowed: algorithm.name"):
        load_spec({**SPEC, "table": {"rows": ["task.dataset"], "columns": "algorithm.local_steps"}})
    with pytest.raises(ConfigError, match=r"table.metrics = 'auroc' is not reported by task"):
        load_spec({**SPEC, "table": {"rows": ["algorithm.name"], "columns": "algorithm.local_steps", "metrics": ["auroc"]}})


def test_rows_keep_the_sweep_order_and_runs_of_fewer_planned_rounds_count():
    """p = 8 trials plan half the rounds of p = 4 ones (a fixed iteration budget): their last round is final,
    not an early stop; a trial stopped before its own run.rounds is left out. Rows follow the sweep's order,
    not the ranking."""
    frame = trials()
    frame["run.rounds"] = frame["algorithm.local_steps"].map({4: 2, 8: 1})
    frame = frame[~((frame["algorithm.local_steps"] == 8) & (frame["round"] == 2))]  # p = 8 ran 1 round
    stopped = frame[frame["trial"] == "t0"].assign(trial="stopped", round=1, test_accuracy=0.99)
    frame = pd.concat([frame, stopped.head(1)])
    lines = paper_table(frame, load_spec(SPEC)).splitlines()
    rows = [line for line in lines if line.startswith("| fcsg")]
    assert rows[0].startswith("| fcsg |") and rows[1].startswith("| fcsg-m |")  # fcsg first though fcsg-m is better
    # p = 8: the round-1 values (acc - 0.2) are the final ones; the stopped trial's 0.99 is ignored
    assert rows[0] == "| fcsg | 0.5905 ± 0.0007 † | 0.4305 ± 0.0007 † |"


def test_a_configuration_with_a_diverged_seed_is_not_chosen():
    frame = trials()
    diverged = (frame["algorithm.lr"] == 0.1) & (frame["run.seed"] == 1) & (frame["algorithm.name"] == "fcsg")
    frame.loc[diverged & (frame["round"] == 2), "test_accuracy"] = float("nan")
    lines = paper_table(frame, load_spec(SPEC)).splitlines()
    # fcsg falls back to lr = 0.01: 0.5 + p/100 + mean(0, 0.001)
    assert "| fcsg | 0.5405 ± 0.0007 † | 0.5805 ± 0.0007 † |" in lines


def test_a_cell_whose_every_configuration_diverged_says_so():
    frame = trials()
    frame.loc[(frame["algorithm.name"] == "fcsg") & (frame["algorithm.local_steps"] == 4) & (frame["run.seed"] == 0)
              & (frame["round"] == 2), "test_accuracy"] = float("nan")
    assert "| fcsg | diverged | 0.6305 ± 0.0007 † |" in paper_table(frame, load_spec(SPEC)).splitlines()


def test_numeric_columns_are_in_order_whatever_order_the_trials_ran_in():
    frame = trials()
    reversed_rows = pd.concat([frame[frame["algorithm.local_steps"] == 8], frame[frame["algorithm.local_steps"] == 4]])
    lines = paper_table(reversed_rows, load_spec(SPEC)).splitlines()
    assert "| name | local_steps = 4 | local_steps = 8 |" in lines
    assert "| fcsg | 0.5905 ± 0.0007 † | 0.6305 ± 0.0007 † |" in lines
