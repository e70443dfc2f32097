"""The sweep report plots every algorithm (an axis an algorithm lacks, FCSG's beta, is NaN in the trials
table and must still match its rows), and a sweep at ``--verbose 0`` prints the report and nothing of Tune's."""

from __future__ import annotations

import io
import logging
import os
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

import fedcomp
from fedcomp.cli import main
from fedcomp.sweeps.report import _varying, best_configurations, best_curve, sweep_report
from fedcomp.sweeps.spec import load_spec

SPEC = {
    "base": "quickstart",
    "set": {"federation.backend": "local", "run.rounds": 2},
    "grid": [{"algorithm.name": ["fcsg"], "algorithm.lr": [0.1, 0.01]},
             {"algorithm.name": ["fcsg-m"], "algorithm.lr": [0.1, 0.01], "algorithm.beta": [0.1, 0.9]}],
}


def trials() -> pd.DataFrame:
    """FCSG trials have no beta (NaN after the Parquet round trip, as in a real trials.parquet)."""
    rows = []
    for i, (name, lr, beta) in enumerate([("fcsg", 0.1, None), ("fcsg", 0.01, None), ("fcsg-m", 0.1, 0.1),
                                          ("fcsg-m", 0.1, 0.9), ("fcsg-m", 0.01, 0.1), ("fcsg-m", 0.01, 0.9)]):
        final = {"fcsg": 0.8, "fcsg-m": 0.9}[name] - lr - (beta or 0) / 10
        for rnd in (0, 1, 2):
            rows.append({"trial": f"t{i}", "status": "completed", "algorithm.name": name, "algorithm.lr": lr,
                         "algorithm.beta": beta, "run.seed": 0, "round": rnd, "comm_rounds": rnd,
                         "test_accuracy": final * rnd / 2})
    buffer = io.BytesIO()
    pd.DataFrame(rows).to_parquet(buffer, index=False)
    return pd.read_parquet(buffer)


def test_every_algorithm_gets_its_curve_even_with_an_axis_it_lacks(tmp_path):
    table, spec = trials(), load_spec(SPEC)
    assert table["algorithm.beta"].isna().sum() == 6
    best = best_configurations(table, spec)
    assert sorted(best["algorithm.name"]) == ["fcsg", "fcsg-m"]
    keys = _varying(table, spec)
    for _, row in best.iterrows():
        curve = best_curve(table, keys, row, "comm_rounds", "test_accuracy")
        assert curve.index.tolist() == [0, 1, 2], row["algorithm.name"]
        assert curve["mean"].iloc[-1] == pytest.approx(row["mean"])
    png, md = sweep_report(SimpleNamespace(path=tmp_path, spec=spec, trials=table))
    assert png.stat().st_size > 1000 and "| fcsg | lr=0.01 |" in md.read_text()


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_at_verbose_0_prints_the_report_and_nothing_of_tunes(ray_session, tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump({
        "base": "quickstart", "grid": {"algorithm.lr": [0.1, 0.05]}, "max_concurrent": 1,
        "set": {"federation.backend": "local", "federation.clients": 4, "algorithm.local_steps": 5,
                "task.test_samples": 2000, "run.rounds": 2, "run.track": "none"},  # no fedcomp tracking line either
    }))
    assert main(["sweep", str(spec), "--verbose", "0", "--set", f"run.out={tmp_path / 'out'}"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("Final test_accuracy (higher is better)"), captured.out[:400]
    for noise in ("Configuration for experiment", "View detailed results", "tensorboard", "Trial status", "╭"):
        assert noise not in captured.out and noise not in captured.err, noise

    # A trial whose own Tune metrics files are missing (as for one killed before its first report): resuming
    # at the default verbosity gives the same rows, without Tune's warning that it could not read them.
    (sweep_dir,) = (tmp_path / "out").iterdir()
    before = pd.read_parquet(sweep_dir / "trials.parquet")
    trial_dir = sorted(sweep_dir.glob("run_trial_*"))[0]
    for name in ("result.json", "progress.csv"):
        (trial_dir / name).unlink()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("ray.tune.analysis.experiment_analysis").addHandler(handler)
    try:
        resumed = fedcomp.resume_sweep(sweep_dir, verbose=1)
    finally:
        logging.getLogger("ray.tune.analysis.experiment_analysis").removeHandler(handler)
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
    pd.testing.assert_frame_equal(resumed.trials, before)


@pytest.mark.ray
@pytest.mark.slow
def test_a_resumed_sweep_speaks_at_the_resuming_commands_verbosity(ray_session, tmp_path, capsys, monkeypatch):
    """Tune restores a sweep's run config as it was started (its verbosity, the progress callback's style); the
    resuming command's ``--verbose`` applies instead: a sweep started at 1 and resumed at 0 prints nothing of Tune's
    (it printed Tune's status table)."""
    spec = {"base": "quickstart", "grid": {"algorithm.lr": [0.1, 0.05]}, "max_concurrent": 1,
            "set": {"federation.backend": "local", "federation.clients": 4, "algorithm.local_steps": 5,
                    "task.test_samples": 2000, "run.rounds": 2, "run.track": "none", "run.out": str(tmp_path)}}
    monkeypatch.delenv("RAY_CHDIR_TO_TRIAL_DIR", raising=False)
    first = fedcomp.sweep(spec, verbose=1)
    assert "Trial status" in capsys.readouterr().out
    assert "RAY_CHDIR_TO_TRIAL_DIR" not in os.environ  # set for the fit only: the caller's own Tune use is its own
    resumed = fedcomp.resume_sweep(first.path, verbose=0)
    captured = capsys.readouterr()
    for noise in ("== Status ==", "Trial status", "Configuration for experiment", "╭", "trial 1/2"):
        assert noise not in captured.out and noise not in captured.err, noise
    pd.testing.assert_frame_equal(resumed.trials, first.trials)
    pd.testing.assert_frame_equal(fedcomp.load_sweep(first.path).trials, first.trials)  # read back, no Ray started
    with pytest.raises(FileNotFoundError, match=r"is a sweep's folder, not a run's: its trials are in fedcomp.load_sweep"):
        fedcomp.load_results(first.path)


def test_tunes_advice_to_restore_an_interrupted_sweep_is_left_out_at_every_verbosity():
    """fedcomp's own line says how to continue (``fedcomp sweep --resume``); Tune's said ``Tuner.restore(...)``. Below
    ``--verbose 2`` Tune's list of the failed trials is left out too: fedcomp's closing lines count and name them."""
    from fedcomp.sweeps.tuner import _quiet_tune

    tune_logger, seen = logging.getLogger("ray.tune.tune"), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    tune_logger.addHandler(handler)
    try:
        for verbose in (0, 1, 2):
            seen.clear()
            with _quiet_tune(verbose):
                tune_logger.warning("Experiment has been interrupted, but the most recent state was saved.\nResume "
                                    "experiment with: Tuner.restore(path=..., trainable=...)")
                tune_logger.error("Trials did not complete: %s", ["run_trial_0f1c2_00000"])
                tune_logger.error("Something else")
            failed = ["Trials did not complete: ['run_trial_0f1c2_00000']"] if verbose == 2 else []
            assert seen == [*failed, "Something else"], verbose
        seen.clear()
        tune_logger.warning("Experiment has been interrupted")  # outside a fit, Tune's loggers are as they were
        assert seen == ["Experiment has been interrupted"]
    finally:
        tune_logger.removeHandler(handler)
