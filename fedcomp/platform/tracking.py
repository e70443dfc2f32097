"""Experiment tracking of single runs: ``run.track: none | tensorboard | mlflow | wandb``.

Each writer gets the run's config (flattened to ``section.key``), every evaluation row (metrics and
counters, step = round) and, at the end, the final report (status, timings, environment, the run's
files). Everything stays offline and inside the results folder:

- ``tensorboard`` (the default): event files in ``<run-dir>/tensorboard/`` written with tensorboardX,
  the writer Tune's ``TBXLoggerCallback`` uses (installed with ``ray[tune]``); ``tensorboard --logdir
  results`` shows every run, with the final metrics in the HParams tab.
- ``mlflow``: one MLflow store per results root, ``<run.out>/mlflow/mlflow.db`` (SQLite; MLflow 3
  refuses its old ``./mlruns`` file store unless told to allow it) with artifacts in
  ``<run.out>/mlflow/artifacts``; experiment ``fedcomp``, one MLflow run per fedcomp run;
  ``mlflow ui --backend-store-uri sqlite:///results/mlflow/mlflow.db``.
- ``wandb``: an offline W&B run in ``<run-dir>/wandb/`` (``WANDB_MODE`` may say otherwise);
  ``wandb sync <run-dir>/wandb/offline-run-*`` uploads it later.

The results folder (``metrics.parquet``, ``run.json``) stays the source of truth: a tracker that fails
mid-run prints one warning and is switched off; the run goes on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import logging
import math
import numbers
import os
import re
import shlex
import shutil
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

from fedcomp.platform.errors import ConfigError, StorageError, first_line

TRACKERS = ("none", "tensorboard", "mlflow", "wandb")
EXTRA = "fedcomp[track]"
PACKAGES = {"tensorboard": "tensorboardX", "mlflow": "mlflow", "wandb": "wandb"}
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlflow"
MLFLOW_EXPERIMENT = "fedcomp"
TIME_COLUMNS = ("wall_time",)


WANDB_MODES = ("offline", "online", "disabled", "dryrun", "run")
"""The values of ``WANDB_MODE`` that W&B takes (fedcomp's default: offline)."""


def require(track: str) -> None:
    """Fail at once (before any work) when the library ``track`` writes with is not installed.

    Raises:
        ConfigError: one line naming the value, the missing package and the extra that installs it.
    """
    if track not in TRACKERS:
        raise ConfigError(f"run.track = {track!r}: allowed {', '.join(TRACKERS)}")
    package = PACKAGES.get(track)
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"run.track = {track!r} needs the {package} package, which is not installed: pip install '{EXTRA}'"
        )
    mode = os.environ.get("WANDB_MODE")
    if track == "wandb" and mode is not None and mode not in WANDB_MODES:
        raise ConfigError(f"WANDB_MODE = {mode!r} (run.track = 'wandb'): allowed {', '.join(WANDB_MODES)}")


def check_store(track: str, out: str | Path) -> None:
    """Fail at once when the tracking store under the results root ``out`` cannot be used: MLflow's folder a file,
    its database not one: a run and a sweep check it before any work, as they check ``run.out``. (A store that fails
    later all the same -- taken away mid-run -- a run warns about and goes on without.)

    Raises:
        StorageError: naming ``run.track``, the file and what is wrong with it.
    """
    if track != "mlflow":
        return
    folder, db = Path(out) / MLFLOW_DIR, Path(out) / MLFLOW_DIR / "mlflow.db"
    if folder.exists() and not folder.is_dir():
        raise StorageError(f"run.track = 'mlflow': {str(folder)!r} is a file, where MLflow's store goes")
    if db.is_file():
        import sqlite3

        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
                connection.execute("PRAGMA schema_version").fetchall()
        except sqlite3.Error as error:
            raise StorageError(f"run.track = 'mlflow': {str(db)!r} cannot be read as MLflow's database ({error})") from None


def flat_config(config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{"algorithm.lr": 0.01, ...}`` from the four nested sections."""
    return {f"{section}.{key}": value for section, block in config.items() for key, value in block.items()}


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's numeric entries as floats (NaN kept: round 0 has no training loss yet)."""
    return {k: float(v) for k, v in row.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}


def _counter_names() -> frozenset[str]:
    from fedcomp.platform.counters import Counters

    return frozenset(f.name for f in fields(Counters))


def mlflow_uri(out: str | Path) -> str:
    """The SQLite tracking URI of the MLflow store under results root ``out``."""
    return f"sqlite:///{(Path(out) / MLFLOW_DIR / 'mlflow.db').resolve()}"


def mlflow_artifacts(out: str | Path) -> str:
    return (Path(out) / MLFLOW_DIR / "artifacts").resolve().as_uri()


def mlflow_client(out: str | Path) -> Any:
    """An ``MlflowClient`` on the store under ``out`` (created on first use, quietly)."""
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)  # "Creating initial MLflow database tables..."
    folder = Path(out) / MLFLOW_DIR
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), _exclusive(folder / ".create.lock"):
        warnings.simplefilter("ignore", DeprecationWarning)  # SQLAlchemy's notice about MLflow's mappers
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=mlflow_uri(out))
        client.search_experiments(max_results=1)  # creates the tables now, under the filters above
    return client


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """One process at a time on this machine (an advisory ``flock``): runs started together into a new results root
    each created MLflow's tables, and all but one failed on the columns another had just added."""
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def mlflow_experiment(client: Any, out: str | Path, name: str) -> str:
    """The id of experiment ``name`` (created with its artifacts under ``out`` if new)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return cast(str, found.experiment_id)
    try:
        return cast(str, client.create_experiment(name, artifact_location=f"{mlflow_artifacts(out)}/{name}"))
    except Exception:  # another process created it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return cast(str, found.experiment_id)


class Tracker:
    """Receives a run's rows and its final report; the base class tracks nothing (``run.track: none``)."""

    name = "none"

    def log_row(self, row: Mapping[str, Any]) -> None:
        """One evaluation row (step = its round)."""

    def finish(self, status: str, meta: Mapping[str, Any], files: Sequence[Path]) -> None:
        """The run ended with ``status`` (completed, interrupted); ``meta`` is run.json's content."""

    def discard(self) -> None:
        """The run failed before its first checkpoint and its folder is removed: leave nothing behind."""
        self.finish("failed", {}, ())

    def abandon(self) -> None:
        """Its disk is full: drop what is not written yet, so that nothing retries the write at exit."""


def _report_markdown(meta: Mapping[str, Any], final: Mapping[str, Any]) -> str:
    lines = [f"**{meta.get('run_id', '')}**: {meta.get('status', '')}", "", "| metric | final |", "|---|---:|"]
    lines += [f"| {k} | {v:.6g} |" for k, v in scalars(final).items()]
    timings = meta.get("timings") or {}
    if timings:
        lines += ["", "| timing | s |", "|---|---:|", *(f"| {k} | {v:.2f} |" for k, v in timings.items())]
    env = meta.get("environment") or {}
    if env:
        lines += ["", "| environment | |", "|---|---|"]
        for key, value in env.items():
            items = value.items() if isinstance(value, Mapping) else [("", value)]
            lines += [f"| {key}{'.' + k if k else ''} | {v} |" for k, v in items]
    return "\n".join(lines)


class TensorBoardTracker(Tracker):
    """Event files in ``<run-dir>/tensorboard/``: ``metrics/<name>``, ``counters/<name>``,
    ``time/wall_time`` per round; the config and the final report as text; the config and the final
    metrics in the HParams tab."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, config: Mapping[str, Any], run_id: str, start_round: int) -> None:
        SummaryWriter = tensorboardx().SummaryWriter

        self.logdir = Path(run_dir) / TENSORBOARD_DIR
        self.config, self.counters = config, _counter_names()
        self.final: dict[str, Any] = {}
        # On resume, events after the checkpoint's round (logged before the crash) are dropped.
        self.writer = SummaryWriter(logdir=str(self.logdir), purge_step=start_round + 1 if start_round else None)
        if not start_round:
            import yaml

            self.writer.add_text("config", "```yaml\n" + yaml.safe_dump(dict(config), sort_keys=False) + "```", 0)

    def _tag(self, key: str) -> str:
        if key in self.counters:
            return f"counters/{key}"
        return f"time/{key}" if key in TIME_COLUMNS else f"metrics/{key}"

    def log_row(self, row: Mapping[str, Any]) -> None:
        step = int(row["round"])
        for key, value in scalars(row).items():
            if key != "round" and math.isfinite(value):  # round 0 has no training loss; NaN only draws noise
                self.writer.add_scalar(self._tag(key), value, global_step=step)
        self.final = dict(row)
        self.writer.flush()

    def abandon(self) -> None:
        # Nothing more reaches the disk. tensorboardX's writer thread would still write what is queued and wait on
        # its queue until the interpreter tears the queue down under it (each a traceback after our one line), and
        # the event file is closed (flushed again) at exit: point the thread at nothing, stop it, mark the file
        # closed.
        events = getattr(getattr(self.writer, "file_writer", None), "event_writer", None)
        if events is None:
            return
        worker = getattr(events, "_worker", None)
        if worker is not None:
            worker._record_writer = _NoEvents()
            worker.stop()
            worker.join(timeout=5)
        events._closed = True

    def finish(self, status: str, meta: Mapping[str, Any], files: Sequence[Path]) -> None:
        if status == "completed" and self.final:
            from tensorboardX.summary import hparams

            step = int(self.final["round"])
            self.writer.add_text("report", _report_markdown(meta, self.final), step)
            hp = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flat_config(self.config).items()}
            metrics = {self._tag(k): v for k, v in scalars(self.final).items() if k != "round" and math.isfinite(v)}
            for summary in hparams(hp, metrics):
                self.writer.file_writer.add_summary(summary, step)
        self.writer.close()


def tensorboardx() -> Any:
    """tensorboardX, imported without torch where this process has not imported torch.

    tensorboardX imports torch whenever it is installed, only to take tensors as values (fedcomp gives it floats): a
    Ray run's driver, which needs no torch otherwise, would hold torch's ~330 MiB for its event files. ``None`` in
    ``sys.modules["torch"]`` fails that one ``import torch`` (tensorboardX then takes NumPy arrays), and goes at once,
    so that torch imports as usual afterwards (the driver's other threads import nothing meanwhile)."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        import tensorboardX

        return tensorboardX
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tensorboardX
    finally:
        del sys.modules["torch"]
    return tensorboardX


class _NoEvents:
    """An event writer that writes nothing: what an abandoned TensorBoard tracker's writer thread is left with."""

    def write_event(self, event: Any) -> None:
        pass

    def flush(self) -> None:
        pass


class MLflowTracker(Tracker):
    """One MLflow run in the store under the results root (experiment ``fedcomp``); params = the flat
    config, metrics per round, tags ``fedcomp.run_id`` / ``fedcomp.run_dir``, artifacts = the run's files."""

    name = "mlflow"

    def __init__(self, run_dir: Path, config: Mapping[str, Any], run_id: str, start_round: int) -> None:
        self.out = Path(run_dir).parent
        self.client = mlflow_client(self.out)
        experiment = mlflow_experiment(self.client, self.out, MLFLOW_EXPERIMENT)
        existing = self.client.search_runs(
            [experiment], filter_string=f"tags.`fedcomp.run_id` = '{run_id}'", max_results=1
        ) if start_round else []
        self.logged_through = -1
        """The last round already in the MLflow run: a resumed run does not log again the rounds the stopped one
        logged after its checkpoint (the same numbers; MLflow would keep both)."""
        if existing:  # a resumed run continues its MLflow run
            self.run_id = existing[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            self.logged_through = mlflow_last_step(self.client, self.run_id)
            return
        tags = {"fedcomp.run_id": run_id, "fedcomp.run_dir": str(Path(run_dir).resolve()),
                "algorithm": config["algorithm"]["name"], "task": config["task"]["name"]}
        self.run_id = self.client.create_run(experiment, run_name=run_id, tags=tags).info.run_id
        from mlflow.entities import Param

        params = [Param(k, str(v)) for k, v in flat_config(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_row(self, row: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(row["round"]), int(time.time() * 1000)
        if step <= self.logged_through:
            return
        metrics = [Metric(k, v, now, step) for k, v in scalars(row).items() if k != "round"]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, status: str, meta: Mapping[str, Any], files: Sequence[Path]) -> None:
        for path in files:
            if Path(path).is_file():
                self.client.log_artifact(self.run_id, str(path))
        if meta:
            self.client.set_tag(self.run_id, "fedcomp.status", status)
        self.client.set_terminated(self.run_id, {"completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED"))

    def discard(self) -> None:
        self.client.delete_run(self.run_id)


def mlflow_last_step(client: Any, run_id: str) -> int:
    """The highest step at which any metric of MLflow run ``run_id`` was logged (-1 for none)."""
    keys = client.get_run(run_id).data.metrics
    return max((m.step for key in keys for m in client.get_metric_history(run_id, key)), default=-1)


def where(track: str, folder: str | Path, sweep: bool = False) -> str:
    """How to open the tracking of the run (or, with ``sweep``, the sweep) in ``folder`` -- a command line, its paths
    quoted for the shell (a results folder may hold a space) -- or "" for ``none``."""
    folder = Path(folder)
    if track == "tensorboard":
        logs = shlex.quote(str(folder if sweep else folder / TENSORBOARD_DIR))
        return f"tensorboard --logdir {logs}" + _viewer("tensorboard", "tensorboard")
    if track == "mlflow":  # mlflow-skinny writes the store but serves no UI (it has no flask)
        return f"mlflow ui --backend-store-uri {shlex.quote(mlflow_uri(folder.parent))}" + _viewer("flask", "mlflow")
    if track == "wandb":  # the stars left to the shell
        return f"wandb sync {shlex.quote(str(folder))}{'/*' if sweep else ''}/wandb/offline-run-*"
    return ""


def _viewer(module: str, package: str) -> str:
    """What a viewer's command line needs installed first, where ``module`` (which it imports) is missing."""
    return "" if importlib.util.find_spec(module) is not None else f"  (after: pip install {package})"


def written(track: str, run_dir: str | Path) -> bool:
    """Whether the run in ``run_dir`` left tracking to open where :func:`where` points (a tracker that could not start
    left none: the run said so in its warning)."""
    run_dir = Path(run_dir)
    if track == "tensorboard":
        return (run_dir / TENSORBOARD_DIR).is_dir()
    if track == "wandb":
        return any((run_dir / "wandb").glob("*run-*"))
    if track == "mlflow":
        return _in_mlflow_store(run_dir.parent / MLFLOW_DIR / "mlflow.db", run_dir.name)
    return False


def _in_mlflow_store(db: Path, run_id: str) -> bool:
    """Whether MLflow's database ``db`` holds a run named ``run_id`` (one of another MLflow version's schema, which
    the tracker could not open, holds none)."""
    import sqlite3

    if not db.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            return connection.execute("SELECT 1 FROM runs WHERE name = ? LIMIT 1", (run_id,)).fetchone() is not None
    except sqlite3.Error:
        return False


def wandb_id(run_id: str) -> str:
    """A W&B run id from a fedcomp run id (W&B allows letters, digits, ``-`` and ``_``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", run_id)[-128:]


class WandbTracker(Tracker):
    """A W&B run in ``<run-dir>/wandb/``, offline unless ``WANDB_MODE`` says otherwise; config = the flat
    config, history per round, summary = the final row and the run's status and timings."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: Mapping[str, Any], run_id: str, start_round: int) -> None:
        import wandb

        self.mode = os.environ.get("WANDB_MODE", "offline")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "fedcomp"),
            name=run_id,
            id=wandb_id(run_id),
            dir=str(run_dir),
            mode=self.mode,  # type: ignore[arg-type]  # WANDB_MODE as set; wandb checks it
            config=flat_config(config),
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, save_code=False, disable_git=True),
        )
        self.dir = Path(self.run.dir).parent
        self.last_step = start_round

    def log_row(self, row: Mapping[str, Any]) -> None:
        step = int(row["round"])
        if step < self.last_step:  # W&B only takes increasing steps
            return
        self.last_step = step
        self.run.log({k: v for k, v in scalars(row).items() if k != "round"}, step=step)

    def finish(self, status: str, meta: Mapping[str, Any], files: Sequence[Path]) -> None:
        if meta:
            self.run.summary.update({"status": status, **(meta.get("timings") or {})})
        for path in files:  # files in the run's folder are uploaded with it (run.save would symlink and warn)
            if Path(path).is_file():
                shutil.copy2(path, Path(self.run.dir) / Path(path).name)
        self.run.finish(exit_code=0 if status == "completed" else 1)


_WRITERS = {"tensorboard": TensorBoardTracker, "mlflow": MLflowTracker, "wandb": WandbTracker}


class _Guarded(Tracker):
    """Runs a tracker so that its failure never stops the run: one warning, then it is switched off -- but a full
    disk, which the run's own files share, stops the run with the one line a full disk gives there."""

    def __init__(self, inner: Tracker) -> None:
        self.inner: Tracker | None = inner
        self.name = inner.name

    def _call(self, method: str, *args: Any) -> None:
        if self.inner is None:
            return
        try:
            getattr(self.inner, method)(*args)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                self._off(error)
                return
            # the run's own files are on the same disk: stop the run in one line, as a full disk does there
            inner, self.inner = self.inner, None
            inner.abandon()
            raise StorageError(f"cannot write the {self.name} tracking files: {error.strerror or error}") from None
        except Exception as error:  # tracking is a convenience; the run's own files are what count
            self._off(error)

    def _off(self, error: Exception) -> None:
        print(f"fedcomp: warning: {self.name} tracking failed and is off for this run "
              f"({type(error).__name__}: {first_line(error)}); results still go to metrics.parquet", file=sys.stderr)
        self.inner = None

    def log_row(self, row: Mapping[str, Any]) -> None:
        self._call("log_row", row)

    def finish(self, status: str, meta: Mapping[str, Any], files: Sequence[Path]) -> None:
        self._call("finish", status, meta, files)

    def discard(self) -> None:
        self._call("discard")


def open_tracker(track: str, run_dir: Path, config: Mapping[str, Any], run_id: str, start_round: int = 0) -> Tracker:
    """The tracker ``run.track`` names, started for the run in ``run_dir`` (which must exist).

    ``config`` is the nested config dict (``Config.to_dict()``); ``start_round`` is the checkpoint's round
    when the run is resumed.
    """
    if track == "none":
        return Tracker()
    try:
        return _Guarded(_WRITERS[track](Path(run_dir), config, run_id, start_round))
    except Exception as error:
        print(f"fedcomp: warning: {track} tracking could not start ({type(error).__name__}: {first_line(error)}); "
              "the run goes on without it", file=sys.stderr)
        return Tracker()
