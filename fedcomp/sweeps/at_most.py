"""Tune's trial schedulers, holding a sweep to its ``max_concurrent`` trials at once on a resume too.

Tune keeps to ``max_concurrent_trials`` only by its searcher not making more trials than that; the trials a
restored sweep takes up again (failed ones retried, unfinished ones continued) are not the searcher's to make, and
Tune starts each of them at once, as far as the cluster's CPUs allow. A sweep of ``max_concurrent: 1`` that stopped
after failing trials ran two of them at once on its resume on 2 CPUs: twice the memory (or GPU memory) the user had
held it to. Here every trial Tune adds -- new, or restored as pending -- waits as paused, and the scheduler starts the
first waiting one only while fewer than ``at_most`` trials are staged or running (Tune starts a paused trial only
when its scheduler chooses it).
"""

from __future__ import annotations

from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler


class _AtMost:
    """The cap, for a Tune scheduler class that it is mixed into (before it)."""

    def __init__(self, *args: Any, at_most: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.at_most = at_most
        self._retried: set[Trial] = set()

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        super().on_trial_error(tune_controller, trial)  # type: ignore[misc]
        self._retried.add(trial)  # if Tune retries it (max_failures), it adds it again at once, filed as pending

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        super().on_trial_add(tune_controller, trial)  # type: ignore[misc]
        if trial in self._retried:  # a retry keeps the place of the attempt that failed
            self._retried.discard(trial)
        elif trial.status == Trial.PENDING:  # a new or restored trial: Tune files it under its status after this call
            trial.set_status(Trial.PAUSED)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        trials = tune_controller.get_trials()
        if sum(trial.status in (Trial.PENDING, Trial.RUNNING) for trial in trials) >= self.at_most:
            return None
        return next((trial for trial in trials if trial.status == Trial.PAUSED), None)


class FifoAtMost(_AtMost, FIFOScheduler):
    """Trials in the order Tune adds them, at most ``at_most`` at once."""


class AshaAtMost(_AtMost, AsyncHyperBandScheduler):
    """ASHA's early stopping, at most ``at_most`` trials at once."""
