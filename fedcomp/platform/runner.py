"""The runner: drives a server for ``run.rounds`` rounds, evaluates every ``run.eval_every`` rounds,
checkpoints every ``run.checkpoint_every`` rounds, shows progress (``platform/progress.py``), and writes the
run's results (``metrics.parquet``, ``run.json`` with the environment, ``curves.png``) and its tracking
(``run.track``, ``platform/tracking.py``).

It never sees Ray: it is handed a factory that builds a server (in-process or a Ray actor proxy).
Nothing is written until the server is up, and a run that fails before its first checkpoint leaves no
folder behind; one that fails later keeps its folder so that ``fedcomp run --resume`` continues it.
"""

from __future__ import annotations

import math
import platform as _stdlib_platform
import secrets
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import torch

from fedcomp.platform import results, tracking
from fedcomp.platform.config import Config, load_config
from fedcomp.platform.curves import CURVES, write_curves
from fedcomp.platform.environment import environment
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.progress import RunProgress, output_mode
from fedcomp.platform.registry import TASKS
from fedcomp.platform.server import Counters, ServerLike

ServerFactory = Callable[[Config], ServerLike]


@dataclass
class RunResult:
    """A finished (or resumed and finished) run: where it lives, its config and its metrics table."""

    run_dir: Path
    config: Config
    metrics: pd.DataFrame

    @property
    def final(self) -> dict[str, Any]:
        """The last evaluation row."""
        return self.metrics.iloc[-1].to_dict()


def new_run_id(config: Config) -> str:
    prefix = config.run.name or f"{config.algorithm_name}_{config.task_name}"
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{prefix}_{stamp}_{secrets.token_hex(2)}"


def _versions() -> dict[str, str]:
    import fedcomp

    versions = {"fedcomp": fedcomp.__version__, "python": sys.version.split()[0], "torch": torch.__version__}
    if "ray" in sys.modules:
        versions["ray"] = sys.modules["ray"].__version__
    return versions


def _meta(config: Config, run_id: str, backend_info: dict[str, Any], status: str, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "status": status,
        "config": config.to_dict(),
        "backend": backend_info,
        "versions": _versions(),
        "host": _stdlib_platform.node(),
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


@dataclass
class RoundDone:
    """One finished round as :func:`drive` yields it: the evaluation row if the round was evaluated and the
    checkpoint if one is due (``rows`` is every evaluation row so far, also stored in the checkpoint)."""

    round: int
    row: dict[str, Any] | None
    checkpoint: dict[str, Any] | None
    rows: list[dict[str, Any]]
    wall_time: float


def drive(config: Config, server: ServerLike, checkpoint: dict[str, Any] | None = None) -> Iterator[RoundDone]:
    """Run ``server`` from round 0 (or from ``checkpoint``) to ``run.rounds``, yielding every round.

    Evaluates every ``run.eval_every`` rounds and hands out a checkpoint every ``run.checkpoint_every``
    rounds and at the last round; what to do with them (files, Tune reports) is the caller's business.
    """
    if checkpoint is not None:
        server.restore(checkpoint["server"])
        rows, wall_offset = list(checkpoint["rows"]), checkpoint["wall_time"]
        first = checkpoint["server"]["counters"]["round"]
    else:
        rows, wall_offset, first = [], 0.0, 0
    t0 = time.perf_counter()
    if not rows:
        rows.append({**asdict(Counters()), "train_loss": math.nan, "wall_time": 0.0, **server.evaluate()})
    if first >= config.run.rounds:  # nothing left to run: hand back what the checkpoint holds
        yield RoundDone(first, None, None, rows, wall_offset)
    for r in range(first + 1, config.run.rounds + 1):
        record = server.run_round()
        row = None
        if r % config.run.eval_every == 0 or r == config.run.rounds:
            row = {**record, "wall_time": wall_offset + time.perf_counter() - t0, **server.evaluate()}
            rows.append(row)
        wall = wall_offset + time.perf_counter() - t0
        ckpt = None
        if r % config.run.checkpoint_every == 0 or r == config.run.rounds:
            ckpt = {"server": server.checkpoint(), "rows": rows, "wall_time": wall}
        yield RoundDone(r, row, ckpt, rows, wall)


def execute(
    config: Config,
    make_server: ServerFactory,
    resume_dir: str | Path | None = None,
) -> RunResult:
    """Run ``config`` to completion (or continue the run in ``resume_dir``) and return its results."""
    headline = build_task_metrics(config)[0]
    checkpoint: dict[str, Any] | None = None
    if resume_dir is not None:
        run_dir = Path(resume_dir)
        ckpt_path = run_dir / results.CHECKPOINT
        if not ckpt_path.is_file():
            raise ConfigError(f"--resume {str(run_dir)!r}: no {results.CHECKPOINT} there; not a resumable run folder")
        checkpoint = results.read_checkpoint(ckpt_path)
        run_id = run_dir.name
    else:
        run_id = new_run_id(config)
        run_dir = Path(config.run.out) / run_id

    tracking.require(config.run.track)
    t_start = time.perf_counter()
    with output_mode(config.run.progress):  # "starting local Ray ..." follows run.progress
        server = make_server(config)
    startup_s = time.perf_counter() - t_start
    backend_info = server.describe()
    env = environment(backend_info)
    created = checkpoint is None
    start = checkpoint["server"]["counters"]["round"] if checkpoint else 0
    tracker: tracking.Tracker = tracking.Tracker()
    try:
        if checkpoint is None:
            run_dir.mkdir(parents=True, exist_ok=False)
            results.write_json(run_dir / results.RUN_JSON, _meta(config, run_id, backend_info, "running", environment=env))
        tracker = tracking.open_tracker(config.run.track, run_dir, config.to_dict(), run_id, start)
        progress = RunProgress(config.run.rounds, start, headline, config.run.progress, label=config.algorithm_name)
        logged = len(checkpoint["rows"]) if checkpoint else 0  # rows the tracker already has
        try:
            for step in drive(config, server, checkpoint):
                progress.update(step.round, step.rows[-1])
                for row in step.rows[logged:]:  # round 0's row arrives with round 1
                    tracker.log_row(row)
                logged = len(step.rows)
                if step.checkpoint is not None:
                    results.write_checkpoint(run_dir / results.CHECKPOINT, step.checkpoint)
                    results.write_metrics(run_dir / results.METRICS, step.rows)
                    created = False
                rows, wall = step.rows, step.wall_time
        finally:
            progress.close()
        _draw_curves(run_dir, rows, headline, run_id)
        meta = _meta(config, run_id, backend_info, "completed", environment=env,
                     timings={"startup_s": startup_s, "train_s": wall})
        results.write_json(run_dir / results.RUN_JSON, meta)
        tracker.finish("completed", meta, [run_dir / name for name in (results.RUN_JSON, results.METRICS, CURVES)])
    except BaseException as error:
        if created:
            tracker.discard()
            shutil.rmtree(run_dir, ignore_errors=True)
        elif (run_dir / results.RUN_JSON).is_file():
            note = f"{type(error).__name__}: {error}"[:500]
            meta = _meta(config, run_id, backend_info, "interrupted", environment=env, error=note,
                         resume=f"fedcomp run --resume {run_dir}")
            results.write_json(run_dir / results.RUN_JSON, meta)
            tracker.finish("interrupted", meta, [run_dir / results.RUN_JSON, run_dir / results.METRICS])
        raise
    finally:
        server.close()
    return RunResult(run_dir, config, pd.DataFrame(rows))


def _draw_curves(run_dir: Path, rows: list[dict[str, Any]], headline: str, run_id: str) -> None:
    """``curves.png``; a plotting failure is reported, not allowed to fail a finished run."""
    try:
        write_curves(run_dir, pd.DataFrame(rows), headline, title=run_id)
    except Exception as error:
        print(f"fedcomp: warning: could not draw {CURVES} ({type(error).__name__}: {error})", file=sys.stderr)


def build_task_metrics(config: Config) -> tuple[str, ...]:
    """The metric columns of the config's task (its first is the headline shown in progress output)."""
    return TASKS[config.task_name].metrics


def resume_config(run_dir: str | Path) -> Config:
    """The validated config stored in a run folder's ``run.json``."""
    meta_path = Path(run_dir) / results.RUN_JSON
    if not meta_path.is_file():
        raise ConfigError(f"--resume {str(run_dir)!r}: no {results.RUN_JSON} there; not a fedcomp run folder")
    import json

    return load_config(json.loads(meta_path.read_text())["config"])
