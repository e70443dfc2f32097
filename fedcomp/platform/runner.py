"""The runner: drives a server for ``run.rounds`` rounds, evaluates every ``run.eval_every`` rounds,
checkpoints every ``run.checkpoint_every`` rounds, shows progress, and writes the run's results.

It never sees Ray: it is handed a factory that builds a server (in-process or a Ray actor proxy).
Nothing is written until the server is up, and a run that fails before its first checkpoint leaves no
folder behind; one that fails later keeps its folder so that ``fedcomp run --resume`` continues it. A run
whose training loss or model turns non-finite stops there (``run.on_divergence``) and keeps its finite
rounds; client actors the backend replaced are reported on stderr and in ``run.json``.
"""

from __future__ import annotations

import contextlib
import math
import platform as _stdlib_platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import pandas as pd

from fedcomp.platform import catalog, results, run_checks, tracking
from fedcomp.platform.config import Config, load_config
from fedcomp.platform.counters import Counters
from fedcomp.platform.curves import CURVES, write_curves
from fedcomp.platform.environment import default_data_root, environment, torch_build
from fedcomp.platform.errors import (
    ConfigError,
    Diverged,
    Interrupted,
    NotThisRun,
    PlatformError,
    StorageError,
    add_note,
    command,
    resuming,
    to_continue,
)
from fedcomp.platform.progress import RunProgress, announce, output_mode
from fedcomp.platform.server_like import ServerLike
from fedcomp.platform.signals import answering_sigterm, farewell

ServerFactory = Callable[[Config], ServerLike]


@dataclass
class RunResult:
    """A finished (or resumed and finished) run: where it lives, its config and its metrics table."""

    run_dir: Path
    config: Config
    metrics: pd.DataFrame

    @property
    def final(self) -> dict[str, Any]:
        """The last evaluation row, each value of its column's type (``round`` an int; a row taken as one Series
        would make every number of an all-numeric table a float)."""
        return cast(dict[str, Any], self.metrics.iloc[[-1]].to_dict("records")[0])

    def __repr__(self) -> str:
        """One line: what ran, how far, its headline metric at the end and where (not the config and the table)."""
        headline = build_task_metrics(self.config)[0]
        final = self.final if len(self.metrics) else {}
        shown = f", {headline}={final[headline]:.4g}" if isinstance(final.get(headline), (int, float)) else ""
        return (f"RunResult({self.config.algorithm_name} on {self.config.task_name}, round {final.get('round', '?')} of "
                f"{self.config.run.rounds}{shown}, run_dir={str(self.run_dir)!r})")


def completed_result(run_dir: str | Path, config: Config) -> RunResult | None:
    """The result of the run in ``run_dir`` (of ``config``, its ``run.json``'s), read from its files, where it
    completed: ``run.json`` says so, its checkpoint is its own (as a resume checks) at its last round, and its metrics
    file holds every row of it. None otherwise -- a resume then runs, and writes what is missing or damaged.

    Raises:
        ConfigError, StorageError: the checkpoint is another run's, or cannot be read (as for a resume).
    """
    run_dir = Path(run_dir).absolute()
    if results.read_json(run_dir / results.RUN_JSON).get("status") != "completed":
        return None
    checkpoint = run_checks.open_checkpoint(run_dir, config)
    if checkpoint["server"]["counters"]["round"] != config.run.rounds or not (run_dir / results.METRICS).is_file():
        return None
    try:
        metrics = results.read_parquet(run_dir / results.METRICS)
    except StorageError:
        return None
    return RunResult(run_dir, config, metrics) if len(metrics) == len(checkpoint["rows"]) else None


def new_run_id(config: Config) -> str:
    return results.new_folder_name(Path(config.run.out), config.run.name or f"{config.algorithm_name}_{config.task_name}")


def _versions() -> dict[str, str]:
    import fedcomp

    versions = {"fedcomp": fedcomp.__version__, "python": sys.version.split()[0], "torch": torch_build()}
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
    checkpoint's file content if one is due (``rows`` is every evaluation row so far, also stored in the
    checkpoint); ``loss`` is the round's training loss (None when no round was run: a resumed run that had
    finished); ``replaced``: the client actors the backend replaced since the previous round (each a dict of round,
    actor, clients, reason; :func:`replacement_line` says one)."""

    round: int
    row: dict[str, Any] | None
    checkpoint: bytes | None
    rows: list[dict[str, Any]]
    wall_time: float
    loss: float | None = None
    replaced: list[dict[str, Any]] = field(default_factory=list)


def replacement_line(event: dict[str, Any]) -> str:
    """What a user is told of one replaced client actor, or server actor (an event of :attr:`RoundDone.replaced`)."""
    if event["actor"] == "server":
        return (f"round {event['round']}: the server actor died ({event['reason']}); started another, with new client "
                f"actors, {event['rerun']}")
    clients = event["clients"]
    span = f"client {clients[0]}" if len(clients) == 1 else f"clients {clients[0]}-{clients[-1]}"
    return (f"round {event['round']}: client actor {event['actor']} ({span}) died ({event['reason']}); replaced it "
            f"and {event.get('rerun', 're-ran its share of the round')}")


def _replaced(server: ServerLike) -> list[dict[str, Any]]:
    """The client actors ``server`` replaced since last asked (a backend that replaces actors offers
    ``take_replacements()``)."""
    take = getattr(server, "take_replacements", None)
    return list(take()) if callable(take) else []


def drive(config: Config, server: ServerLike, checkpoint: dict[str, Any] | None = None) -> Iterator[RoundDone]:
    """Run ``server`` from round 0 (or from ``checkpoint``) to ``run.rounds``, yielding every round.

    Evaluates every ``run.eval_every`` rounds and hands out a checkpoint every ``run.checkpoint_every``
    rounds and at the last round, as the file's bytes the server saved (:meth:`ServerLike.checkpoint_file`);
    what to do with them (files, Tune reports) is the caller's business. A checkpoint carries the run's
    identity (:func:`~fedcomp.platform.run_checks.checkpoint_identity`), so a resume can tell a checkpoint of
    another run. ``checkpoint`` (to continue from) is a checkpoint as read back
    (:func:`~fedcomp.platform.results.read_checkpoint`).
    """
    if checkpoint is not None:
        server.restore(checkpoint["server"])
        rows, wall_offset = list(checkpoint["rows"]), checkpoint["wall_time"]
        first = checkpoint["server"]["counters"]["round"]
    else:
        rows, wall_offset, first = [], 0.0, 0
    identity = run_checks.checkpoint_identity(config)
    t0 = time.perf_counter()
    if not rows:
        rows.append({**Counters().as_dict(), "train_loss": math.nan, "wall_time": 0.0,
                     **run_checks.reports_declared(server.evaluate(), config)})
    if first >= config.run.rounds:  # nothing left to run: hand back what the checkpoint holds
        yield RoundDone(first, None, None, rows, wall_offset)
    r = first
    while r < config.run.rounds:
        # Up to the next checkpoint: a server behind a hop runs these rounds back to back (ServerLike.run_rounds).
        last = min((r // config.run.checkpoint_every + 1) * config.run.checkpoint_every, config.run.rounds)
        stretch = range(r + 1, last + 1)
        evaluated = [k % config.run.eval_every == 0 or k == config.run.rounds for k in stretch]
        for r, (record, metrics, evaluate_s) in zip(stretch, server.run_rounds(evaluated), strict=True):
            row = None
            if metrics is not None:
                row = {**record, "wall_time": wall_offset + time.perf_counter() - t0 - evaluate_s, **metrics}
                rows.append(row)
            wall = wall_offset + time.perf_counter() - t0
            ckpt = None
            if r == last:
                ckpt = server.checkpoint_file({"rows": rows, "wall_time": wall, "identity": identity})
            yield RoundDone(r, row, ckpt, rows, wall, float(record["train_loss"]), _replaced(server))


class _RunLog:
    """The run's ``run.json`` and its notices: status, timings, replaced client actors, divergence."""

    def __init__(self, config: Config, run_dir: Path, backend: dict[str, Any], earlier: dict[str, Any], resumed_at: int):
        """``earlier``: the ``run.json`` of a run resumed from its checkpoint at round ``resumed_at`` (else empty)."""
        self.config, self.run_dir, self.backend = config, run_dir, backend
        self.earlier_legs: list[dict[str, Any]] = [*earlier.get("earlier_legs", []), {
            "until_round": resumed_at, **{key: earlier.get(key) for key in ("status", "host", "written", "backend")},
        }] if earlier else []
        """Where and how the rounds before each resume ran (a resume may move a run to another cluster or backend)."""
        self.environment = environment(backend, config.run.deterministic, config.modules(),
                                       default_data_root() if run_checks.reads_default_root(config) else None)
        self.meta: dict[str, Any] = {}
        """What :meth:`write` wrote last (the tracker's copy of ``run.json``)."""
        self.replacements: list[dict[str, Any]] = list(earlier.get("actor_replacements", []))
        self.diverged: dict[str, Any] | None = earlier.get("diverged")

    def write(self, status: str, **extra: Any) -> None:
        notes: dict[str, Any] = {"actor_replacements": self.replacements} if self.replacements else {}
        if self.earlier_legs:
            notes["earlier_legs"] = self.earlier_legs
        if self.diverged is not None:
            notes["diverged"] = self.diverged
        meta = _meta(self.config, self.run_dir.name, self.backend, status, environment=self.environment, **notes, **extra)
        results.write_json(self.run_dir / results.RUN_JSON, meta)
        self.meta = meta

    def note_replacements(self, events: list[dict[str, Any]]) -> None:
        """Say on stderr, and record in ``run.json``, the client actors the backend replaced (``RoundDone.replaced``)."""
        for event in events:
            print(f"fedcomp: {replacement_line(event)}", file=sys.stderr, flush=True)
        if events:
            self.replacements.extend(events)
            self.write("running")


@answering_sigterm()
def execute(
    config: Config,
    make_server: ServerFactory,
    resume_dir: str | Path | None = None,
    resumable: bool = True,
) -> RunResult:
    """Run ``config`` to completion (or continue the run in ``resume_dir``) and return its results.
    ``resumable=False``: the run's folder is a caller's temporary one (``verify``, ``check``), so an error does not
    say how to continue it.

    Raises:
        ConfigError, StorageError: before any work, for a run folder or checkpoint that cannot be used; a
            StorageError mid-run (disk full) says how to continue.
        Diverged: the training loss or the model became non-finite (``run.on_divergence: stop``); the run
            folder keeps the rounds before it.
        Interrupted: Ctrl-C (a ``KeyboardInterrupt``); the message says which round is checkpointed and how to
            continue, or that nothing was kept.
    """
    run_checks.importable(config)
    headline = build_task_metrics(config)[0]
    checkpoint: dict[str, Any] | None = None
    earlier: dict[str, Any] = {}
    if resume_dir is not None:
        run_dir = Path(resume_dir).absolute()
        checkpoint = run_checks.open_checkpoint(run_dir, config)
        earlier = results.read_json(run_dir / results.RUN_JSON) if (run_dir / results.RUN_JSON).is_file() else {}
        run_checks.same_modules(run_dir, earlier, config)
        run_checks.same_data_root(run_dir, earlier, config)
        results.check_writable(run_dir, resuming("run", run_dir))
        results.remove_temporaries(run_dir, (results.RUN_JSON, results.METRICS, results.CHECKPOINT, CURVES))
    else:
        run_dir = run_checks.run_folder(config, new_run_id(config))
        results.check_writable(run_dir.parent)

    tracking.require(config.run.track)
    tracking.check_store(config.run.track, run_dir.parent)
    created = checkpoint is None
    done = saved = checkpoint["server"]["counters"]["round"] if checkpoint else 0
    t_start = time.perf_counter()
    with output_mode(config.run.progress):  # "starting local Ray ..." follows run.progress
        if checkpoint is not None:
            announce(f"resuming {run_dir} from its checkpoint at round {done} of {config.run.rounds}"
                     + (" (no round left to run)" if done >= config.run.rounds else ""))
        if config.federation.torch_compile:
            announce("federation.torch_compile: every client process compiles the gradients at its first steps "
                     "(seconds to a minute on a 2-core CPU before inductor's cache holds the graphs)")
        try:
            server = make_server(config)
        except KeyboardInterrupt as stop:  # Ctrl-C during start-up: nothing started, the folder as it was
            raise stop if isinstance(stop, Interrupted) else Interrupted(_kept(created, saved, run_dir)) from None
    startup_s = time.perf_counter() - t_start
    log = _RunLog(config, run_dir, server.describe(), earlier, done)
    if log.backend.get("lockstep_off"):
        print(f"fedcomp: warning: federation.vectorise: algorithm {config.algorithm_name!r} on task {config.task_name!r}: "
              f"{log.backend['lockstep_off']}; its clients step one at a time (the numbers without it)",
              file=sys.stderr, flush=True)
    tracker: tracking.Tracker = tracking.Tracker()

    made = results.missing_parents(run_dir)  # results folders the claim creates

    def discard() -> None:  # a run that kept nothing leaves nothing: its folder and the folders made for it
        results.unclaim(run_dir, made)

    def abruptly() -> str:  # the cluster went with a SIGTERM: what a kill leaves, less a folder with nothing in it
        if created:
            discard()
        return _kept(created, saved, run_dir)

    closed = False
    written = -1  # rows in the metrics file this call wrote last
    with farewell(abruptly):
        try:
            if created:
                run_dir = log.run_dir = results.claim_folder(run_dir)  # another name if another run took this one
                log.write("running")
            tracker = tracking.open_tracker(config.run.track, run_dir, config.to_dict(), run_dir.name, done)
            progress = RunProgress(config.run.rounds, done, headline, config.run.progress, label=config.algorithm_name)
            logged = len(checkpoint["rows"]) if checkpoint else 0  # rows the tracker already has
            try:
                for step in drive(config, server, checkpoint):
                    log.note_replacements(step.replaced)
                    reason = run_checks.divergence(step.loss, server) if step.loss is not None else None
                    if reason is not None:
                        _diverged(config, log, step, reason)
                    progress.update(step.round, step.rows[-1])
                    for row in step.rows[logged:]:  # round 0's row arrives with round 1
                        tracker.log_row(row)
                    logged = len(step.rows)
                    if step.checkpoint is not None:
                        results.write_checkpoint(run_dir / results.CHECKPOINT, step.checkpoint)
                        created, saved = False, step.round  # resumable from here on, whatever the metrics file's fate
                        results.write_metrics(run_dir / results.METRICS, step.rows)
                        written = len(step.rows)
                    rows, wall, done = step.rows, step.wall_time, step.round
            finally:
                progress.close()
            if written != len(rows):  # a resume of a run checkpointed at its end: the metrics file may be missing
                results.write_metrics(run_dir / results.METRICS, rows)  # (a full disk, a kill) or damaged
            server.close()  # its actors' memory goes before the curves' imports come
            closed = True
            _draw_curves(run_dir, rows, headline)
            log.write("completed", timings={"startup_s": startup_s, "train_s": wall})
            tracker.finish("completed", log.meta, [run_dir / name for name in (results.RUN_JSON, results.METRICS, CURVES)])
        except Diverged:
            tracker.finish("diverged", log.meta, [run_dir / results.RUN_JSON, run_dir / results.METRICS])
            raise  # its folder holds the finite rounds (written by _diverged)
        except BaseException as error:
            if created:
                tracker.discard()
                discard()
            elif (run_dir / results.RUN_JSON).is_file():
                note = f"{type(error).__name__}: {error}"[:500]
                status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"  # Ctrl-C, SIGTERM; an error
                # the disk that stopped the run may not take these either; the checkpoint is what counts. The
                # tracker is finished even when run.json could not be written: else its writer's pending events
                # meet the full disk at exit, a traceback after the one line
                with contextlib.suppress(StorageError):
                    log.write(status, error=note, resume=command("run", "--resume", run_dir))
                with contextlib.suppress(StorageError):
                    tracker.finish(status, log.meta, [run_dir / results.RUN_JSON, run_dir / results.METRICS])
            kept = None if created else run_dir
            if isinstance(error, StorageError):
                tail = ("nothing was kept" if created else
                        f"the run stopped after round {saved}; make room and continue it with: {to_continue('run', run_dir)}")
                full = StorageError(f"{error}; {tail}")
                full.path = kept
                raise full from None
            if isinstance(error, KeyboardInterrupt) and not isinstance(error, Interrupted):
                raise Interrupted(_kept(created, saved, run_dir), kept) from None
            if isinstance(error, PlatformError) and not created and resumable and not isinstance(error, NotThisRun):
                error.args = (f"{error}; {_kept(created, saved, run_dir)}",)  # the folder resumes: say how
                error.path = run_dir
            elif isinstance(error, Exception) and not created and resumable:  # a bug (a user's code): its traceback
                add_note(error, f"fedcomp: {_kept(created, saved, run_dir)}")  # ends with what was kept
            raise
        finally:
            if not closed:
                server.close()
    return RunResult(run_dir, config, pd.DataFrame(rows))


def _kept(created: bool, saved: int, run_dir: Path) -> str:
    """What an interrupted run kept, and how to continue it."""
    if created:
        return "nothing was kept (no checkpoint yet)"
    return f"round {saved} is checkpointed; continue the run with: {to_continue('run', run_dir)}"


def _diverged(config: Config, log: _RunLog, step: RoundDone, reason: str) -> None:
    """React to a non-finite round: with ``run.on_divergence: stop`` keep the rounds before it (metrics and
    ``run.json``; the last checkpoint is older and finite) and raise; else say so once and go on."""
    first = log.diverged is None
    if first:
        log.diverged = {"round": step.round, "reason": reason}
    if config.run.on_divergence == "continue":
        if first:
            print(f"fedcomp: warning: the run diverged in round {step.round} ({reason}); continuing "
                  f"(run.on_divergence = continue)", file=sys.stderr, flush=True)
            log.write("running")
        return
    kept = [row for row in step.rows if row["round"] < step.round]
    results.write_metrics(log.run_dir / results.METRICS, kept)
    _draw_curves(log.run_dir, kept, build_task_metrics(config)[0])  # the rounds up to it, as a finished run's
    log.write("diverged")
    diverged = Diverged(
        f"the run diverged in round {step.round}: {reason}; kept rounds 0-{kept[-1]['round']} in {log.run_dir}; "
        f"{run_checks.divergence_hint(config)}, or set run.on_divergence=continue to run on"
    )
    diverged.path = log.run_dir
    raise diverged


def _draw_curves(run_dir: Path, rows: list[dict[str, Any]], headline: str) -> None:
    """``curves.png``; a plotting failure is reported, not allowed to fail a finished run."""
    try:
        write_curves(run_dir, pd.DataFrame(rows), headline, title=run_dir.name)
    except Exception as error:
        print(f"fedcomp: warning: could not draw {CURVES} ({type(error).__name__}: {error})", file=sys.stderr)


def build_task_metrics(config: Config) -> tuple[str, ...]:
    """The metric columns of the config's task (its first is the headline shown in progress output)."""
    return catalog.tasks()[config.task_name].metrics


def resume_config(run_dir: str | Path) -> Config:
    """The validated config stored in a run folder's ``run.json``.

    Raises:
        ConfigError, StorageError: no run folder, or a ``run.json`` that cannot be read or holds no valid config.
    """
    where = resuming("run", run_dir)
    meta = run_checks.read_resume_file(run_dir, results.RUN_JSON, results.read_json, "a fedcomp run folder")
    if not isinstance(meta.get("config"), dict):
        raise StorageError(f"{where}: {Path(run_dir) / results.RUN_JSON} holds no run config")
    try:
        return load_config(meta["config"])
    except ConfigError as error:
        raise ConfigError(f"{where}: the config in {results.RUN_JSON} is not valid: {error}") from None
