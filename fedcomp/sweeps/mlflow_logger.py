"""Tune's ``MLflowLoggerCallback`` with three changes: each trial also gets its full fedcomp config as MLflow
params, a trial's result is written in one ``log_batch`` call, and a trial continued by ``fedcomp sweep --resume``
continues its MLflow run.

Tune starts an MLflow run for every trial it starts in this process, also one restored from the sweep's saved
state: a sweep stopped with Ctrl-C and resumed left each cut trial two runs, the first still RUNNING with the
rounds before the stop, the second with those after (reproduced). Here a trial whose run already exists in the
sweep's experiment (Tune tags it with the trial's name) takes that run up again, as a resumed ``fedcomp run``
does, without logging again the rounds the cut trial logged after the checkpoint it continues from (MLflow keeps
every value logged at a step: each of those rounds had two).

Tune logs a trial's Tune config only (the swept axes) and writes every metric of every result with its own
``log_metric`` call -- one SQLite transaction each, about 0.6 s per result on a loaded 2-core machine, which
made Tune warn about slow callbacks on every report. In its own module because importing Tune's MLflow
integration imports mlflow (about a second), which only ``run.track: mlflow`` needs.
"""

from __future__ import annotations

import time
from typing import Any

from ray.air.constants import TRAINING_ITERATION
from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.tune.result import TIMESTEPS_TOTAL
from ray.tune.utils import flatten_dict

from fedcomp.platform.tracking import flat_config, mlflow_last_step, scalars
from fedcomp.sweeps.spec import SweepSpec


class FullConfigMLflowLoggerCallback(MLflowLoggerCallback):
    """``MLflowLoggerCallback`` that logs ``spec.trial_config(trial.config)`` flattened, and batches results."""

    def __init__(self, spec_json: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec_json = spec_json
        self._client: Any = None
        self._logged_through: dict[str, int] = {}
        """Trial -> the last step its taken-up MLflow run already holds."""

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles its callbacks with the experiment state
        return {**self.__dict__, "_client": None}

    def _mlflow_client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def log_trial_start(self, trial: Any) -> None:
        if trial not in self._trial_runs:
            earlier = self._mlflow_client().search_runs(
                [self.mlflow_util.experiment_id], filter_string=f"tags.trial_name = '{trial}'", max_results=1)
            if earlier:
                run_id = earlier[0].info.run_id
                self._mlflow_client().update_run(run_id, status="RUNNING")
                self._logged_through[str(trial)] = mlflow_last_step(self._mlflow_client(), run_id)
                self._trial_runs[trial] = run_id  # Tune's start: a run only for a trial without one
        super().log_trial_start(trial)
        from mlflow.entities import Param

        config = SweepSpec.model_validate_json(self.spec_json).trial_config(dict(trial.config)).to_dict()
        params = [Param(k, str(v)) for k, v in flat_config(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self._mlflow_client().log_batch(self._trial_runs[trial], params=params[i : i + 100])

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        """Runs of trials that did not end (a sweep stopped by Ctrl-C) are marked KILLED, as a stopped run's is
        (Tune's stayed RUNNING); the resumed sweep sets them running again and finishes them."""
        mine = set(self._trial_runs.values())
        running = self._mlflow_client().search_runs(
            [self.mlflow_util.experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=50_000)
        for run in running:
            if run.info.run_id in mine:
                self._mlflow_client().set_terminated(run.info.run_id, "KILLED")

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step = result.get(TIMESTEPS_TOTAL) or result[TRAINING_ITERATION]
        if step <= self._logged_through.get(str(trial), -1):
            return
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in scalars(flatten_dict(result, delimiter="/")).items()]
        self._mlflow_client().log_batch(self._trial_runs[trial], metrics=metrics)
