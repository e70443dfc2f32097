"""Tune's ``MLflowLoggerCallback``, plus each trial's full fedcomp config as MLflow params.

Tune logs a trial's Tune config only (the swept axes); a run's MLflow params are its whole config, so a
sweep's trials get the same ``section.key`` params beside Tune's. In its own module because importing
Tune's MLflow integration imports mlflow (about a second), which only ``run.track: mlflow`` needs.
"""

from __future__ import annotations

from typing import Any

from ray.air.integrations.mlflow import MLflowLoggerCallback

from fedcomp.platform.tracking import flat_config
from fedcomp.sweeps.spec import SweepSpec


class FullConfigMLflowLoggerCallback(MLflowLoggerCallback):
    """``MLflowLoggerCallback`` that also logs ``spec.trial_config(trial.config)`` flattened."""

    def __init__(self, spec_json: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec_json = spec_json

    def log_trial_start(self, trial: Any) -> None:
        super().log_trial_start(trial)
        config = SweepSpec.model_validate_json(self.spec_json).trial_config(dict(trial.config)).to_dict()
        params = {k: str(v) for k, v in flat_config(config).items()}
        self.mlflow_util.log_params(run_id=self._trial_runs[trial], params_to_log=params)
