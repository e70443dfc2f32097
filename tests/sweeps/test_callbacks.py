"""The sweep's progress callback (a line per finished trial, or a bar on a terminal with Tune's output off)
and its trial labels, on stand-in trials: no Tune run needed; Tune's callback census skipped."""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace

from fedcomp.sweeps.callbacks import TrialProgress, trial_label


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def trial(lr: float, value: float, metric: str = "test_accuracy", ran: int = 6) -> SimpleNamespace:
    """A finished trial that ran ``ran`` rounds; Tune marks its last result done, stopped by a scheduler or not."""
    return SimpleNamespace(config={"point": {"algorithm.lr": lr}, "run.seed": 0},
                           last_result={metric: value, "done": True, "trial_round": ran})


def test_a_line_per_finished_trial_with_counts_metric_and_eta(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    progress = TrialProgress(4, "test_accuracy", "max", progress="auto", verbose=1, rounds=6)
    progress.setup()
    progress.on_trial_complete(1, [], trial(0.1, 0.9))
    progress.on_trial_error(2, [], trial(0.5, float("nan")))
    progress.on_trial_complete(3, [], trial(0.03, 0.6, ran=2))  # ASHA stopped it (it showed as completed)
    progress.on_trial_complete(4, [], trial(0.01, 0.7))
    lines = err.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["trial 1/4 completed", "trial 2/4 failed",
                                                       "trial 3/4 stopped early", "trial 4/4 completed"]
    assert "algorithm.lr=0.1 run.seed=0  test_accuracy=0.9000  elapsed" in lines[0] and "eta" in lines[0]
    assert "eta" not in lines[3]
    assert progress.best == 0.9 and progress.failed == 1


def test_a_resumed_sweep_counts_on_from_the_trials_it_had_finished(monkeypatch):
    """Its lines started again at 1/N, and its ETA counted the time of the trials before it."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    progress = TrialProgress(5, "test_accuracy", "max", progress="auto", verbose=1)
    progress.setup()
    ended = [trial(0.1, 0.9), trial(0.3, 0.5), trial(0.5, float("nan"))]
    for finished, status in zip(ended, ("TERMINATED", "TERMINATED", "ERROR")):
        finished.status = status
    running = trial(0.03, 0.0)
    running.status = "RUNNING"
    progress.on_step_begin(1, [*ended, running])
    progress.on_step_begin(2, [*ended, running])  # counted once
    progress.on_trial_complete(3, [], trial(0.03, 0.6))
    [line] = err.getvalue().splitlines()
    assert line.startswith("trial 4/5 completed  algorithm.lr=0.03") and " eta " in line
    assert (progress.done, progress.failed, progress.best) == (4, 1, 0.9)


def test_a_bar_over_trials_on_a_terminal_when_tunes_output_is_off(monkeypatch):
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    progress = TrialProgress(2, "test_loss", "min", progress="auto", verbose=0)
    progress.setup()
    progress.on_trial_complete(1, [], trial(0.1, 0.5, "test_loss"))
    progress.on_trial_complete(2, [], trial(0.2, 0.3, "test_loss"))
    progress.on_experiment_end([])
    text = err.getvalue()
    assert "2/2" in text and "trial" in text and "best test_loss=0.3000" in text
    assert "trial 1/2 completed" not in text


def test_the_callback_pickles_without_its_bar(monkeypatch):
    import pickle

    monkeypatch.setattr(sys, "stderr", Terminal())
    progress = TrialProgress(2, "test_accuracy", "max", verbose=0)
    progress.setup()
    copy = pickle.loads(pickle.dumps(progress))
    assert copy._bar is None and copy.total == 2


def test_trial_labels_flatten_grid_points():
    assert trial_label({"point": {"algorithm.name": "fcsg", "algorithm.lr": 0.1}, "run.seed": 1}) == \
        "algorithm.name=fcsg algorithm.lr=0.1 run.seed=1"
    assert trial_label({"algorithm.lr": 0.02, "run.seed": 0}) == "algorithm.lr=0.02 run.seed=0"


CENSUS = """
import sys
import ray.tune.tune as entry
from ray.tune.logger import CSVLoggerCallback
from fedcomp.platform.tracking import WandbTracker  # fedcomp's own tracking imports W&B only when it is used
from fedcomp.sweeps.callbacks import no_callback_census
import fedcomp.sweeps.tuner  # the sweep driver's own imports
before = entry.air_usage.tag_callbacks
with no_callback_census():
    counted = entry.air_usage.tag_callbacks([CSVLoggerCallback()])  # what Tune's entry point calls as it sets up
print(counted, entry.air_usage.tag_callbacks is before, "wandb" in sys.modules, "mlflow" in sys.modules)
"""


def test_tunes_callback_census_is_skipped_and_imports_neither_wandb_nor_mlflow():
    """Counting the callbacks imported W&B and MLflow into every sweep's driver (2 s, 53 MiB there)."""
    done = subprocess.run([sys.executable, "-c", CENSUS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "False", "False"]
