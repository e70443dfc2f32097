"""What a sweep hands Tune besides the trainable: Tune's own logger callbacks for ``run.track`` and a
fedcomp progress line (or bar) per finished trial.

Tracking uses Tune's callbacks -- ``TBXLoggerCallback`` (event files in every trial folder),
``MLflowLoggerCallback`` (one MLflow run per trial in the store under the results root, experiment =
the sweep id; extended to log each trial's full config as params) and ``WandbLoggerCallback`` (offline
runs in the trial folders, group = the sweep id). Their step is Tune's ``training_iteration`` (one per
reported evaluation); the round is logged as the ``round`` metric. Tune's CSV and JSON result files are
always kept: Tune reads them back for ``trials.parquet``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray.tune import Callback

from fedcomp.platform import tracking
from fedcomp.platform.progress import duration, resolve, write_line
from fedcomp.sweeps.failures import ACTOR_REPLACEMENTS, FINAL_ERROR, last_error_line


def tracking_environment(track: str) -> None:
    """What Tune's tracking callback for ``track`` finds in this process, set before every fit -- a new sweep's, and
    a resumed one's, whose callbacks Tune unpickles: W&B logs offline unless ``WANDB_MODE`` says otherwise (without
    it, Tune's W&B callback asks for an API key, and a resumed W&B sweep failed so); tensorboardX is imported without
    torch (:func:`fedcomp.platform.tracking.tensorboardx`), so that the sweep's driver, which runs Tune's callbacks
    and no trial, never imports torch (about 400 MiB and a second of start-up)."""
    if track == "wandb":
        os.environ.setdefault("WANDB_MODE", "offline")
    elif track == "tensorboard":
        tracking.tensorboardx()


def logger_callbacks(track: str, path: Path, spec_json: str) -> list[Callback]:
    """Tune's result files plus the tracking callback ``track`` names, for the sweep in ``path``
    (``spec_json``: the sweep's spec, from which MLflow gets every trial's full config)."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

    tracking_environment(track)
    callbacks: list[Callback] = [CSVLoggerCallback(), JsonLoggerCallback()]
    if track == "tensorboard":

        class ClosingTBXLoggerCallback(TBXLoggerCallback):
            """Tune's TensorBoard logger, which also closes, as the sweep ends, the writers of trials that did not
            end (a sweep stopped by Ctrl-C): Tune left their threads and event files open in the driver, two
            threads and a file per stopped sweep in a notebook's process."""

            def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
                for trial in list(self._trial_writer):
                    self._trial_writer.pop(trial).close()
                    self._trial_result.pop(trial, None)

        callbacks.append(ClosingTBXLoggerCallback())  # type: ignore[no-untyped-call]
    elif track == "mlflow":
        from fedcomp.sweeps.mlflow_logger import FullConfigMLflowLoggerCallback

        out = path.parent
        # Created here so that its artifacts live under the results root, not in ./mlruns.
        tracking.mlflow_experiment(tracking.mlflow_client(out), out, path.name)
        callbacks.append(FullConfigMLflowLoggerCallback(
            spec_json, tracking_uri=tracking.mlflow_uri(out), experiment_name=path.name,
            tags={"fedcomp.sweep": path.name},
        ))
    elif track == "wandb":
        from fedcomp.sweeps.wandb_logger import SweepWandbLoggerCallback

        mode = os.environ["WANDB_MODE"]
        callbacks.append(SweepWandbLoggerCallback(
            project=os.environ.get("WANDB_PROJECT", "fedcomp"), group=path.name, mode=mode,
            # Tune's deprecated reinit=True, as W&B now spells it: Tune's actor logs through wandb.log, which only
            # reaches a run made this way ("create_new" made runs that stayed empty)
            reinit="finish_previous",
            settings={"console": "off", "silent": True, "save_code": False, "disable_git": True},
        ))
    return callbacks


@contextmanager
def no_auto_loggers() -> Iterator[None]:
    """Stop Tune from adding its default loggers (CSV, JSON, TensorBoard) beside ours while it sets up,
    so that ``run.track: none`` writes no event files; restores the variable afterwards."""
    name = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"
    before = os.environ.get(name)
    os.environ[name] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextmanager
def no_callback_census() -> Iterator[None]:
    """Skip Tune's usage-statistics count of the callbacks it is given, while it sets up: to tell its own callback
    classes from others it imports W&B and MLflow (Comet and Aim where installed) into the driver -- 2 s and 53 MiB
    per sweep on a slow day here, for one tag of Ray's usage report (which then lacks it) -- and W&B's import leaves
    temporary folders in /tmp wherever the driver is killed."""
    from ray.air._internal import usage  # the module Tune's entry point calls (ray.tune.tune.air_usage)

    before = usage.tag_callbacks
    usage.tag_callbacks = _uncounted
    try:
        yield
    finally:
        usage.tag_callbacks = before


def _uncounted(callbacks: Any) -> bool:
    return False  # "no usage recorded", as Tune's own answer for no callbacks


def trial_label(config: Mapping[str, Any]) -> str:
    """``algorithm.name=fcsg-m algorithm.lr=0.01 run.seed=1`` from a trial's Tune config (a packed trial:
    how many configurations, and its first one's label)."""
    if "pack" in config:
        pack = list(config["pack"])
        return f"[{len(pack)} configurations, first: {trial_label(pack[0])}]" if pack else "[empty pack]"
    flat = {**(config.get("point") or {}), **{k: v for k, v in config.items() if k != "point"}}
    return " ".join(f"{k}={v}" for k, v in flat.items())


class TrialProgress(Callback):
    """One line per finished trial (its configuration, final metric, trials done, ETA), or a tqdm bar
    over trials in a terminal when Tune's own output is off (``--verbose 0``)."""

    def __init__(self, total: int, metric: str, mode: str, progress: str = "auto", verbose: int = 0,
                 rounds: int | None = None) -> None:
        self.total, self.metric, self.mode = total, metric, mode
        self.rounds = rounds
        """The trials' ``run.rounds`` (a trial's own where swept) where a scheduler may stop them, else None."""
        self.progress = progress
        self.shown_at(verbose)
        self.done = self.failed = 0
        self.best = math.nan
        self.replaced: dict[str, int] = {}
        """Per trial id: the client actors it replaced, as it last reported."""
        self.t0: float | None = None
        self._bar: Any = None

    def shown_at(self, verbose: int) -> None:
        """Show progress as at ``verbose`` (a resumed sweep's own, in place of the one its callbacks were saved with)."""
        shown = resolve(getattr(self, "progress", "auto"))
        self.style = "bar" if shown == "bar" and verbose == 0 else ("none" if shown == "none" else "log")

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles its callbacks with the experiment state
        return {**self.__dict__, "_bar": None}

    def setup(
        self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None, **info: Any
    ) -> None:
        self.t0 = time.monotonic()
        self.before: int | None = None  # trials a resumed sweep had finished: counted at its first step
        if self.style == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, unit="trial", desc="sweep", dynamic_ncols=True, file=sys.stderr)

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        """At the first step, count the trials a resumed sweep had finished (its lines went on from 1/N)."""
        if getattr(self, "before", 0) is not None:
            return
        ended = [t for t in trials if t.status in ("TERMINATED", "ERROR")]
        self.done, self.failed = len(ended), sum(t.status == "ERROR" for t in ended)
        self.before = self.done
        for trial in ended:
            self._best_of(trial)
        if self._bar is not None and ended:
            self._bar.update(len(ended))

    def _best_of(self, trial: Any) -> Any:
        """The trial's final value of the metric (None where it reported none), kept as the best where it is."""
        last = trial.last_result or {}
        value = last.get(self.metric)
        if last.get(FINAL_ERROR) == 1.0 and isinstance(value, float) and math.isnan(value):
            value = None  # the mark of a trial that failed before it reported its metric
        if isinstance(value, (int, float)) and math.isfinite(value):
            better = value > self.best if self.mode == "max" else value < self.best
            self.best = value if math.isnan(self.best) or better else self.best
        return value

    def _finished(self, trial: Any, status: str) -> None:
        self.done += 1
        self.failed += status == "failed"
        value = self._best_of(trial)
        if self._bar is not None:
            self._bar.update(1)
            if not math.isnan(self.best):
                self._bar.set_postfix({f"best {self.metric}": f"{self.best:.4f}", "failed": self.failed}, refresh=False)
            return
        if self.style != "log":
            return
        elapsed = time.monotonic() - (self.t0 or time.monotonic())
        left, here = self.total - self.done, self.done - (getattr(self, "before", None) or 0)  # here: since it started
        eta = f"  eta {duration(elapsed / here * left)}" if left > 0 and here > 0 else ""
        shown = f"{self.metric}={value:.4f}" if isinstance(value, (int, float)) else f"{self.metric}=?"
        why = f"  {last_error_line(trial)}" if status == "failed" else ""
        write_line(f"trial {self.done}/{self.total} {status}  {trial_label(trial.config)}  {shown}  "
                   f"elapsed {duration(elapsed)}{eta}{why}")

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._replaced_in(trial, 0)  # a trial started again (after a failure) counts its replacements afresh

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        """Say, whatever the progress style, that an actor of the trial died and was replaced (a run says it as it
        happens; a trial's own line is in its log)."""
        count = result.get(ACTOR_REPLACEMENTS, 0)
        new = count - self._replaced_in(trial, count)
        if new > 0:
            actors = "an actor" if new == 1 else f"{new} actors"  # client actors, or a server actor with its own
            write_line(f"fedcomp: trial {trial_label(trial.config)}: {actors} died by round {result.get('trial_round')} "
                       f"and {'was' if new == 1 else 'were'} replaced; the work since ran again, to the same numbers "
                       f"({count} in this trial; its process's own line says which actor and why)")

    def _replaced_in(self, trial: Any, count: int) -> int:
        """The replacements last reported by ``trial``, which are ``count`` from now on."""
        replaced = self.__dict__.setdefault("replaced", {})  # not in the callback of a sweep started before it was kept
        before: int = replaced.get(trial.trial_id, 0)
        replaced[trial.trial_id] = count
        return before

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        if last.get("diverged") == 1.0:  # sweeps.trial.DIVERGED: a trial's stop mark
            self._finished(trial, "diverged")
        else:  # Tune marks the last result of a trial a scheduler stopped "done" too: its rounds tell
            rounds = getattr(self, "rounds", None)  # (a callback saved by a sweep started before it was kept: None)
            planned = (trial.config.get("point") or {}).get("run.rounds", rounds) if rounds else None
            short = planned is not None and last.get("trial_round", planned) < planned
            self._finished(trial, "stopped early" if short else "completed")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._finished(trial, "failed")

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
