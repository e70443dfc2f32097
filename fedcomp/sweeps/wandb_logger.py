"""Tune's ``WandbLoggerCallback`` with each trial's W&B run in the trial's folder of the sweep, and nothing left in
the temporary folder.

Tune writes each trial's W&B run from a Ray actor of its own, in the trial's staging folder inside Ray's session
folder (/tmp/ray/session_*/artifacts/...), which Tune copies into the sweep folder -- but its last copy is made
before it waits for those actors to finish their runs: a sweep tracked with W&B had no ``wandb/`` folder in any
trial's folder (its offline runs stayed in Ray's session folder, measured). Here the run is written to the trial's
folder of the sweep itself (the actor runs on the driver's node, where the sweep folder is).

The actor imports W&B, whose import makes two folders in the temporary folder (for media and artifacts) that only
the interpreter's exit removes; Tune ends the actor with ``ray.kill``, so no exit ran: two folders left in /tmp for
every trial (4 after a 2-trial sweep, measured). Here the actor stops W&B's service and removes them once its run
has finished.

In its own module because importing Tune's W&B integration imports wandb, which only ``run.track: wandb`` needs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import ray
from ray.air.integrations.wandb import WANDB_ENV_VAR, WandbLoggerCallback, _WandbLoggingActor
from ray.air.util.node import _force_on_current_node

from fedcomp.actors.quiet_exit import drop_lost_exits


def remove_wandb_temporary_folders() -> None:
    """Remove the temporary folders W&B's modules (and their classes) hold, as the interpreter's exit would."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "wandb" or name.startswith("wandb.")):
            continue
        for value in list(vars(module).values()):
            held = list(vars(value).values()) if isinstance(value, type) and value.__module__ == name else [value]
            for folder in held:
                if isinstance(folder, tempfile.TemporaryDirectory):
                    folder.cleanup()


class _TidyLoggingActor(_WandbLoggingActor):
    def run(self) -> Any:
        drop_lost_exits()  # Tune stops this actor too, and its process may get a SIGTERM
        try:
            return super().run()  # type: ignore[no-untyped-call]  # Tune's, untyped
        finally:
            self._wandb.teardown()  # its service, which no exit hook will stop either
            remove_wandb_temporary_folders()


class SweepWandbLoggerCallback(WandbLoggerCallback):
    """``WandbLoggerCallback`` writing each trial's run to ``<sweep>/<trial>/wandb/``, leaving nothing in /tmp."""

    _logger_actor_cls = _TidyLoggingActor

    def _start_logging_actor(self, trial: Any, exclude_results: list[str], **wandb_init_kwargs: Any) -> None:
        folder = Path(trial.path)  # the trial's folder in the sweep's (local) storage
        folder.mkdir(parents=True, exist_ok=True)
        if not self._remote_logger_class:
            # Tune's actor options but max_restarts=0: Tune asks Ray to restart a logging actor forever, which
            # Ray answers with an error line on every sweep ("constructor arguments in the object store and
            # max_restarts > 0": the trial's queue) -- rightly, as a restarted actor would start a fresh W&B run
            # without the results it had taken from the queue.
            key = {WANDB_ENV_VAR: os.environ[WANDB_ENV_VAR]} if WANDB_ENV_VAR in os.environ else {}
            here: dict[str, Any] = _force_on_current_node()  # type: ignore[assignment]  # a dict given no task
            self._remote_logger_class = ray.remote(num_cpus=0, **here, max_restarts=0,  # type: ignore[assignment]
                                                   runtime_env={"env_vars": key})(self._logger_actor_cls)
        super()._start_logging_actor(trial, exclude_results, **{**wandb_init_kwargs, "dir": str(folder)})

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        """Finish the runs of trials that did not end (a sweep stopped by Ctrl-C), then wait for every run as Tune
        does: Tune ends a trial's run only when the trial ends, so it waited on a cut trial's run for up to its
        ``upload_timeout`` (30 min; still waiting when killed after 15 here) before returning."""
        for trial in list(self._trial_queues):
            self._signal_logging_actor_stop(trial)
        super().on_experiment_end(trials, **info)
