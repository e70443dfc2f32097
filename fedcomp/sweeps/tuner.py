"""Launching, resuming and collecting a sweep: Ray Tune runs the trials, this module sets it up and turns
its results into one ``trials.parquet``.

A sweep lives in ``<run.out>/<sweep-id>/``: Tune's own experiment storage (trial folders, checkpoints,
experiment state), ``sweep.json`` (the validated spec, for ``--resume`` and ``fedcomp report``) and
``trials.parquet`` (one row per trial and evaluation round: the trial's full config flattened to
``section.key`` columns, then the same metric columns as a run's ``metrics.parquet``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pandas as pd
from pydantic import ValidationError

from fedcomp.actors.cluster import fedcomp_env, through_ray_client
from fedcomp.actors.quiet import Drop
from fedcomp.platform import results, tracking
from fedcomp.platform.config import Config, folder_of, overrides_of
from fedcomp.platform.environment import changed_modules, module_digests
from fedcomp.platform.errors import (
    ConfigError,
    Interrupted,
    NoResults,
    ResourceError,
    StorageError,
    TrialsFailed,
    first_line,
    resuming,
    to_continue,
)
from fedcomp.platform.progress import announce
from fedcomp.platform.signals import answering_sigterm, farewell
from fedcomp.sweeps import extend as edges_extend, tune_state
from fedcomp.sweeps.callbacks import (
    TrialProgress,
    logger_callbacks,
    no_auto_loggers,
    no_callback_census,
    tracking_environment,
)
from fedcomp.sweeps.data_check import check_data
from fedcomp.sweeps.edges import EXTEND_JSON
from fedcomp.sweeps.failures import FinalErrors, error_line, failing_alike
from fedcomp.sweeps.packs import make_packs, read_pack_rows, run_pack
from fedcomp.sweeps.spec import SweepSpec, axis_not_in_sweep, corners, load_spec
from fedcomp.sweeps.trial import (
    concurrent_trials,
    members,
    placement_group_factory,
    read_trial_rows,
    run_trial,
    trial_resources,
)

if TYPE_CHECKING:
    from ray import tune
    from ray.tune import ResultGrid
    from ray.tune.schedulers import TrialScheduler
    from ray.tune.search import Searcher

SWEEP_JSON = "sweep.json"
TRIALS = "trials.parquet"


@dataclass
class SweepResult:
    """A finished sweep: its folder, its spec and every trial's evaluation rows."""

    path: Path
    spec: SweepSpec
    trials: pd.DataFrame

    def best(self) -> pd.DataFrame:
        """Per algorithm, its best configuration by the mean over seeds of the final metric."""
        from fedcomp.sweeps.report import best_configurations

        return best_configurations(self.trials, self.spec)

    def __repr__(self) -> str:
        """One line: the sweep's name, how its trials ended and where (not the spec and the table)."""
        from fedcomp.sweeps.report import outcome_counts

        return f"SweepResult({self.path.name}: {outcome_counts(self.trials, self.spec)}, path={str(self.path)!r})"


def _flatten(config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {f"{section}.{key}": value for section, block in config.items() for key, value in block.items()}


def _check_fits(spec: SweepSpec, cluster: Mapping[str, float], has_gpus: bool) -> list[Config]:
    """Fail at once when a single trial cannot be placed on this cluster (Tune would wait forever); returns the
    configurations checked: the grid's points, or the Optuna axes' corners."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    configs = []
    for point in spec.points() if spec.search == "grid" else corners(spec):
        config = spec.base_config(**point)
        configs.append(config)
        res = trial_resources(spec, config, has_gpus)
        what = f"trial {point}" if point else "a trial"
        parts = "trial, server, client actors" if config.federation.server == "actor" else "trial, client actors"
        for key, need in res.total.items():
            have = float(cluster.get(key, 0.0))
            if need > have + 1e-9:
                raise ResourceError(f"{what} needs {key}={need:g} ({len(res.bundles)} bundles: {parts}) but the "
                                    f"cluster has {key}={have:g}; {_fewer(key, have)}")
        for bundle in res.bundles:
            if not any(all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()) for node in nodes):
                raise ResourceError(f"{what}: no node can hold the bundle {bundle}; nodes have {nodes}")
        if not _placeable(res.bundles, nodes):  # each fits some node, not all of them together: Tune waited forever
            shown = ", ".join(f"CPU={n.get('CPU', 0.0):g}" + (f" GPU={n['GPU']:g}" if n.get("GPU") else "") for n in nodes)
            raise ResourceError(f"{what}: its {len(res.bundles)} bundles ({parts}: "
                                f"{', '.join(str(dict(b)) for b in res.bundles)}) do not fit on the nodes together "
                                f"({shown}); {_fewer('CPU', 1.0)}")
    return configs


def _fewer(key: str, have: float) -> str:
    """What lowers a trial's need of ``key`` (CPU or GPU) on a cluster with ``have`` of it."""
    if key == "GPU":
        return ("set federation.gpus_per_client to 0 or 'auto' and gpus_per_trial to 0 (the cluster has no GPU)"
                if have == 0 else "lower gpus_per_trial or federation.gpus_per_client")
    return ("lower cpus_per_trial or federation.cpus_per_actor, or raise federation.clients_per_actor (fewer client "
            "actors)")


def _placeable(bundles: Sequence[Mapping[str, float]], nodes: Sequence[Mapping[str, float]]) -> bool:
    """Whether the bundles can all be placed on the nodes at once (what a trial's placement group needs, packed or
    spread): a search over bundles, largest first, that tries each distinct free capacity once."""
    order = sorted(bundles, key=lambda b: sorted(b.items(), reverse=True), reverse=True)
    keys = sorted({k for b in bundles for k in b})

    @functools.cache
    def place(i: int, free: tuple[tuple[float, ...], ...]) -> bool:
        if i == len(order):
            return True
        need = tuple(order[i].get(k, 0.0) for k in keys)
        for j, left in enumerate(free):
            if left in free[:j] or any(n > f + 1e-9 for n, f in zip(need, left)):
                continue
            rest = tuple(round(f - n, 6) for f, n in zip(left, need))
            if place(i + 1, tuple(sorted((*free[:j], rest, *free[j + 1:])))):
                return True
        return False

    return place(0, tuple(sorted(tuple(float(node.get(k, 0.0)) for k in keys) for node in nodes)))


def _trainable(spec: SweepSpec, has_gpus: bool) -> Any:
    from ray import tune

    fn = tune.with_parameters(
        run_pack if spec.pack != "none" else run_trial, spec_json=spec.model_dump_json(), cluster_has_gpus=has_gpus,
        env=fedcomp_env(), metric=spec.resolved_metric()[0],
    )
    return tune.with_resources(fn, functools.partial(placement_group_factory, spec=spec, cluster_has_gpus=has_gpus))


def _param_space(spec: SweepSpec) -> dict[str, Any]:
    from ray import tune

    if spec.search == "grid" and spec.pack != "none":
        return {"pack": tune.grid_search(make_packs(spec))}
    if spec.search == "grid":
        return {"point": tune.grid_search(spec.points()), "run.seed": tune.grid_search(spec.seed_values())}
    makers: dict[str, Callable[..., Any]] = {"uniform": tune.uniform, "loguniform": tune.loguniform, "int": lambda lo, hi: tune.randint(lo, hi + 1)}
    space = {}
    for axis, dist in spec.space.items():
        kind, args = next(iter(dist.items()))
        space[axis] = tune.choice(args) if kind == "choice" else makers[kind](*args)
    return space


def _tune_config(spec: SweepSpec, max_concurrent: int | None) -> tune.TuneConfig:
    from ray import tune

    from fedcomp.sweeps.at_most import AshaAtMost, FifoAtMost

    metric, mode = spec.resolved_metric()
    search_alg: Searcher | None = None
    scheduler: TrialScheduler | None = None
    num_samples = 1
    if spec.search == "optuna":
        import optuna
        from ray.tune.search import Repeater
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # its "[I ...] A new study created in memory" line
        search_alg = OptunaSearch(metric=metric, mode=mode, sampler=optuna.samplers.TPESampler(seed=spec.seed))
        if spec.seeds > 1:
            search_alg = Repeater(search_alg, repeat=spec.seeds, set_index=True)
        num_samples = spec.num_samples * spec.seeds
    if spec.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        asha: dict[str, Any] = {"time_attr": "trial_round", "max_t": spec.base_config().run.rounds, "grace_period": spec.grace_rounds}
        scheduler = ASHAScheduler(**asha) if max_concurrent is None else AshaAtMost(**asha, at_most=max_concurrent)
    elif max_concurrent is not None:
        scheduler = FifoAtMost(at_most=max_concurrent)
    return tune.TuneConfig(
        metric=metric, mode=mode, search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
        max_concurrent_trials=max_concurrent,
        reuse_actors=spec.reuse_actors,
    )


def _run_config(spec: SweepSpec, path: Path, verbose: int) -> tune.RunConfig:
    from ray import tune

    run = spec.base_config().run
    metric, mode = spec.resolved_metric()
    trials = trial_count(spec)
    return tune.RunConfig(
        name=path.name,
        storage_path=str(path.parent),
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),  # no num_to_keep: tune_state prunes
        verbose=verbose,
        callbacks=[FinalErrors(spec.max_failures), *logger_callbacks(run.track, path, spec.model_dump_json()),
                   TrialProgress(trials, metric, mode, run.progress, verbose,
                                 run.rounds if spec.scheduler == "asha" else None), tune_state.StateCopy()],
        log_to_file=not verbose,  # at verbose 0 the trials' own output goes to files in their folders
    )


def trial_count(spec: SweepSpec) -> int:
    """The Tune trials the sweep runs (packs count once)."""
    if spec.search == "grid" and spec.pack != "none":
        return len(make_packs(spec))
    return len(spec.points()) * len(spec.seed_values()) if spec.search == "grid" else spec.num_samples * spec.seeds


def _connect(ray_address: str | None, verbose: int = 1, modules: Sequence[str] = ()) -> tuple[dict[str, float], bool]:
    from fedcomp.actors.cluster import connect

    cluster = connect(ray_address, worker_log_level=None if verbose else "WARNING", modules=modules)
    return cluster, float(cluster.get("GPU", 0.0)) > 0


def new_sweep_id(spec: SweepSpec, out: Path) -> str:
    return results.new_folder_name(out, spec.name or "sweep")


@answering_sigterm()
def sweep(
    source: str | Path | Mapping[str, Any] | SweepSpec = "quick",
    *,
    search: str | None = None,
    num_samples: int | None = None,
    seeds: int | None = None,
    scheduler: str | None = None,
    max_concurrent: int | None = None,
    pack: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    ray_address: str | None = None,
    verbose: int = 0,
    extend_edges: bool = False,
    edge_cap: int | None = None,
) -> SweepResult:
    """Run a sweep (a sweep preset name, a sweep YAML file, a mapping or a :class:`SweepSpec`) and return
    every trial's results.

    Args:
        search, num_samples, seeds, scheduler, max_concurrent, pack: replace the spec's values (the CLI flags).
        overrides: ``{"run.rounds": 10, ...}`` merged into the spec's ``set``; ``run.out`` picks the
            results root the sweep folder is created under.
        ray_address: the cluster to join (default: ``$RAY_ADDRESS``, an initialised Ray, else a local one).
        extend_edges: after the grid, keep running the next grid value past every edge optimum of a group until
            it is interior, ``edge_cap`` extensions per axis (default 3) or the bound (:mod:`fedcomp.sweeps.extend`;
            grid search only). The new trials join the same folder and ``trials.parquet``.

    Raises:
        ConfigError, ResourceError: before anything is written, naming the field and what is allowed.
        Interrupted: Ctrl-C stopped the sweep (Tune saved its state); :func:`resume_sweep` continues it.
        TrialsFailed: every trial failed; the first one's error in one line.

    Example:
        >>> result = fedcomp.sweep("quick", seeds=1, overrides={"run.rounds": 5})  # doctest: +SKIP
        >>> result.best()  # doctest: +SKIP
    """
    from ray import tune

    _check_call(overrides, ray_address, verbose)
    spec = load_spec(
        source, search=search, num_samples=num_samples, seeds=seeds, scheduler=scheduler,
        max_concurrent=max_concurrent, pack=pack, set=dict(overrides or {}),
    )
    cap = edges_extend.check_options(spec, extend_edges, edge_cap)
    run = spec.base_config().run
    tracking.require(run.track)
    results.check_writable(run.out)  # before Ray starts; and a link to nothing is not followed
    tracking.check_store(run.track, run.out)
    cluster, has_gpus = _connect(ray_address, verbose, spec.modules)
    configs = _check_fits(spec, cluster, has_gpus)
    check_data(configs)
    out = Path(run.out).resolve()
    path = out / new_sweep_id(spec, out)
    made = results.missing_parents(path)  # results folders the claim creates
    path = results.claim_folder(path)
    results.write_json(path / SWEEP_JSON, {"spec": spec.model_dump(mode="json"), "cluster_has_gpus": has_gpus,
                                           "modules": module_digests(spec.modules)})
    if cap is not None:
        edges_extend.start(path, cap)
    at_once = concurrent_trials(spec, configs, float(cluster.get("CPU", 0.0)), has_gpus)
    if spec.max_concurrent is None and at_once is not None and at_once < cluster.get("CPU", 0.0) // spec.cpus_per_trial:
        announce(f"{at_once} trial{'s' if at_once > 1 else ''} at a time, a CPU for each process of a Ray-backend trial "
                 f"(max_concurrent sets it)")
    try:
        run_config = _run_config(spec, path, verbose)
    except Exception as error:  # its tracking store: MLflow's database damaged, its folder a file
        results.unclaim(path, made)
        raise StorageError(f"run.track = {run.track!r}: the sweep's tracking could not start ({type(error).__name__}: "
                           f"{first_line(error)}); nothing was kept") from None
    tuner = tune.Tuner(
        _trainable(spec, has_gpus),
        param_space=_param_space(spec),
        tune_config=_tune_config(spec, at_once),
        run_config=run_config,
    )
    return _extended(_fit(tuner, spec, path, verbose), cluster, has_gpus, verbose)


RESTORE_HINT = "Experiment has been interrupted"
"""Tune's "... Resume experiment with: Tuner.restore(...)": fedcomp's own line after it says how to continue the
sweep, and Tune's restore alone would not."""
TRIAL_TRACEBACK = "Trial task failed for trial"
"""Tune's line with a failed trial's traceback (each attempt's): fedcomp's line for the failed trial names its error,
and the trial's ``error.txt`` keeps the traceback."""
STOP_SIGNAL = "Stop signal received"
"""Tune's warning at Ctrl-C that it saves its state and a second Ctrl-C skips that: fedcomp's line follows it, saying
what was kept and how to continue."""
INCOMPLETE = "Trials did not complete"
"""Tune's closing list of the failed trials (their ids, the job's and the node's): fedcomp's closing lines count and
name them."""


@contextlib.contextmanager
def _quiet_tune(verbose: int) -> Iterator[None]:
    """Keep Tune's console output to what fedcomp does not say itself, for the duration of a fit.

    Always: Tune's warning that it could not read a trial's own metrics files (``result.json``, e.g. of a
    trial killed before its first report, on ``--resume``) -- fedcomp takes every trial's rows from its
    checkpoints -- and its advice to resume an interrupted sweep with ``Tuner.restore`` (:data:`RESTORE_HINT`).
    Below ``verbose=2``: a failed trial's traceback, Tune's list of the trials that failed and its warning at Ctrl-C
    (:data:`STOP_SIGNAL`). At ``verbose=0`` also: Tune's newer console output (it prints its experiment box and TensorBoard hint at
    every verbosity; its older reporter honours 0), its driver-side warnings and Optuna's notes ("A new study
    created in memory")."""
    names = ["ray.tune.analysis.experiment_analysis"] + ([] if verbose else ["ray.tune", "ray.train", "optuna"])
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    if not verbose:
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    hint, drop = logging.getLogger("ray.tune.tune"), Drop(RESTORE_HINT, *([INCOMPLETE, STOP_SIGNAL] if verbose < 2 else []))
    controller, tracebacks = logging.getLogger("ray.tune.execution.tune_controller"), Drop(TRIAL_TRACEBACK)
    hint.addFilter(drop)
    if verbose < 2:
        controller.addFilter(tracebacks)
    try:
        yield
    finally:
        hint.removeFilter(drop)
        controller.removeFilter(tracebacks)
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        if before is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before


def _fit(tuner: Any, spec: SweepSpec, path: Path, verbose: int) -> SweepResult:
    """Run (or continue) the sweep and collect its trials, with Tune's console output kept quiet."""
    with _quiet_tune(verbose):
        return _finish(_fitted(tuner, path), spec, path)


def _fitted(tuner: Any, sweep: Path) -> ResultGrid:
    """``tuner.fit()``, or :class:`~fedcomp.platform.errors.Interrupted` where it stopped on Ctrl-C.

    For a fit on the main thread Tune puts a SIGINT handler of its own in place of the process's; when it catches
    one, it puts the previous handler back, stops, saves its state with the unfinished trials resumable and returns
    as if the sweep had ended -- its result grid then counts a trial cut short as terminated and leaves out the ones
    not yet started. So a fit that Tune could catch and that left the previous handler in place was interrupted.
    Tune leaves its handler installed after a whole fit; the previous one is put back here.

    Raises:
        Interrupted: the message says how to continue the sweep (``sweep``: its folder); also for a
            ``KeyboardInterrupt`` out of the fit (a second Ctrl-C, a SIGTERM), whose trials resume from fedcomp's
            copy of Tune's state as after a kill.
    """
    stopped = Interrupted(f"finished trials and the others' checkpoints are kept; continue the sweep with: "
                          f"{to_continue('sweep', sweep)}", sweep)
    before = signal.getsignal(signal.SIGINT)
    catching = threading.current_thread() is threading.main_thread() and not int(
        os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0")) and not through_ray_client()  # (a Ray Client's fit
    # runs in an actor on the cluster, which puts no handler here)
    try:
        # farewell: the local Ray went with a SIGTERM, so the sweep ends at once and resumes as after a kill
        with no_auto_loggers(), no_callback_census(), tune_environment(), farewell(lambda: str(stopped)):
            grid = tuner.fit()
    except KeyboardInterrupt:  # a second Ctrl-C, or SIGTERM (fedcomp.platform.signals): fedcomp's copy of Tune's state
        raise stopped from None
    except Exception as error:
        alike = failing_alike(error)
        if alike is None:
            raise
        raise TrialsFailed(f"{alike}; it stopped there, the others not run (each would meet it too); once it is fixed, "
                           f"continue with: {to_continue('sweep', sweep)} (a module or data files mended; a setting of "
                           f"the sweep's own is changed by running the sweep again)", sweep) from None
    finally:
        after = signal.getsignal(signal.SIGINT)
        if catching:
            signal.signal(signal.SIGINT, before)
    if catching and after is before:
        raise stopped
    return cast("ResultGrid", grid)


TUNE_ENVIRONMENT = {
    "RAY_CHDIR_TO_TRIAL_DIR": "0",  # trials keep the driver's working directory (Tune hands it to the trial actors)
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",  # trials checkpoint every few rounds by design
}
"""What a fit runs under, where the caller's environment does not say otherwise."""


@contextlib.contextmanager
def tune_environment() -> Iterator[None]:
    """:data:`TUNE_ENVIRONMENT` in ``os.environ`` for the duration of a fit, as it was afterwards: a script's own use
    of Tune after a sweep meets its own settings."""
    added = [name for name in TUNE_ENVIRONMENT if name not in os.environ]
    os.environ.update({name: TUNE_ENVIRONMENT[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def read_sweep_json(path: str | Path) -> dict[str, Any]:
    meta = Path(path) / SWEEP_JSON
    if not meta.is_file():
        raise ConfigError(f"sweep folder {str(path)!r}: no {SWEEP_JSON} there; not a fedcomp sweep folder")
    stored = results.read_json(meta)
    if not isinstance(stored.get("spec"), dict):
        raise StorageError(f"{meta} holds no sweep spec")
    return stored


def stored_spec(meta: Mapping[str, Any], path: str | Path) -> SweepSpec:
    """The spec stored in a sweep folder's ``sweep.json``.

    Raises:
        StorageError: it is not a valid spec (an edited or damaged file).
    """
    try:
        spec = SweepSpec.model_validate(meta["spec"])
    except ValidationError as error:
        raise StorageError(f"{Path(path) / SWEEP_JSON}: the stored spec is not valid ({error.errors()[0]['msg']})") from None
    stray = axis_not_in_sweep(spec)
    if stray is not None:  # an edited sweep.json: its report would fail on the missing axis
        raise StorageError(f"{Path(path) / SWEEP_JSON}: the stored spec's panels or table name {stray[1]!r}, not an "
                           f"axis of the sweep ({', '.join(spec.axes())})")
    return spec


def _check_call(overrides: Any, ray_address: Any, verbose: Any) -> None:
    """The Python API's arguments of a sweep that the spec does not validate, checked as the command line's flags are.

    Raises:
        ConfigError: naming the argument, its value and what is allowed.
    """
    overrides_of(overrides)
    if ray_address is not None and not isinstance(ray_address, str):
        raise ConfigError(f"ray_address = {ray_address!r}: must be an address (a str: 'HOST:PORT', 'ray://HOST:PORT', "
                          f"'auto') or None")
    if isinstance(verbose, bool) or verbose not in (0, 1, 2):
        raise ConfigError(f"verbose = {verbose!r}: allowed 0, 1, 2")


@answering_sigterm()
def resume_sweep(path: str | Path, ray_address: str | None = None, verbose: int = 0) -> SweepResult:
    """Continue an interrupted sweep: finished trials are kept, unfinished and failed ones continue from
    their last checkpoint; a sweep that finished with none failed returns its results as :func:`load_sweep` does,
    without starting Ray.

    Args:
        ray_address: the cluster to join, as for :func:`sweep`.
        verbose: this call's output (0: fedcomp's lines only), whatever the sweep was started with.

    Raises:
        ConfigError, StorageError: ``path`` is not a sweep folder, or its state cannot be read.
        Interrupted: Ctrl-C stopped it again.
    """
    from ray import tune

    _check_call(None, ray_address, verbose)
    path = folder_of(path, "path").resolve()
    meta = read_sweep_json(path)
    spec = stored_spec(meta, path)
    finished = _finished(path)
    if finished is not None:  # as a finished run's resume: its results, without starting Ray
        return SweepResult(path, spec, finished)
    for module, then, now in changed_modules(meta.get("modules"), spec.modules):
        print(f"fedcomp: warning: {module} changed since the sweep started (sha256 {then} then, {now} now): the "
              f"trials still to run or to continue run it as it is now; finished trials keep the numbers of the code "
              f"they ran", file=sys.stderr, flush=True)
    edges_extend.check_record(path)
    _repair(path)
    # tuner.pkl without a state (killed before Tune's first save): Tune ran a new experiment of one trial from it
    if not tune.Tuner.can_restore(str(path)) or not any(path.glob(tune_state.STATE_GLOB)):
        raise ConfigError(f"{resuming('sweep', path)}: Tune's experiment state is missing; the sweep never started")
    cluster, has_gpus = _connect(ray_address, verbose, spec.modules)
    check_data(_check_fits(spec, cluster, has_gpus))  # mended since, as the alike-stop's advice says, or not
    tracking_environment(spec.base_config().run.track)  # for the tracking callback Tune restores with the sweep
    with _quiet_tune(verbose):  # restoring reads the trials' Tune results too
        tuner = tune.Tuner.restore(
            str(path), trainable=_trainable(spec, meta["cluster_has_gpus"]), resume_unfinished=True, resume_errored=True
        )
    _shown_at(tuner, verbose)
    return _extended(_fit(tuner, spec, path, verbose), cluster, meta["cluster_has_gpus"], verbose)


def _finished(path: Path) -> pd.DataFrame | None:
    """The trials table of the sweep in ``path`` where it ended with every trial completed: the table written (at the
    end only), none failed (a resume retries those) and no ``--extend-edges`` steps (their own record says how far
    they got); else None. A table that cannot be read is rewritten by the resume."""
    if not (path / TRIALS).is_file() or (path / EXTEND_JSON).is_file():
        return None
    try:
        trials = results.read_parquet(path / TRIALS)
    except StorageError:
        return None
    return trials if "status" in trials and not (trials["status"] == "error").any() else None


def _shown_at(tuner: Any, verbose: int) -> None:
    """A restored sweep's output at the resuming command's ``verbose``: Tune restores the run config (its verbosity,
    whether trials log to files, the progress callback) as the sweep was started, and takes no new one. Through the
    restored tuner's own run config; a Ray client's tuner (``ray://``) lives on the cluster, and keeps the sweep's."""
    local = getattr(tuner, "_local_tuner", None)
    if local is None:
        return
    run_config = local.get_run_config()
    run_config.verbose, run_config.log_to_file = verbose, not verbose
    for callback in run_config.callbacks or []:
        if isinstance(callback, TrialProgress):
            callback.shown_at(verbose)


def _repair(path: Path) -> None:
    """Before a resume (and before asking Tune whether it can restore): put back fedcomp's whole copy of Tune's
    state where a kill cut Tune's own short or left it unwritten."""
    broken = tune_state.repair(path)
    if broken:
        print(f"fedcomp: warning: {', '.join(broken)} in {path} was cut short or missing when the sweep was killed; "
              f"resuming from fedcomp's whole copy of Tune's state ({tune_state.COPY})", file=sys.stderr, flush=True)


def _extended(result: SweepResult, cluster: Mapping[str, float], has_gpus: bool, verbose: int) -> SweepResult:
    """The sweep's result after its ``--extend-edges`` steps (the grid's alone when it was not asked for)."""
    if not (result.path / EXTEND_JSON).is_file():
        return result

    def run_step(step: SweepSpec, folder: Path, restore: bool) -> pd.DataFrame:
        from ray import tune

        configs = _check_fits(step, cluster, has_gpus)
        if restore:
            _repair(folder)
        if restore and tune.Tuner.can_restore(str(folder)):
            with _quiet_tune(verbose):
                tuner = tune.Tuner.restore(str(folder), trainable=_trainable(step, has_gpus), resume_unfinished=True,
                                           resume_errored=True)
            _shown_at(tuner, verbose)
        else:
            at_once = concurrent_trials(step, configs, float(cluster.get("CPU", 0.0)), has_gpus)
            tuner = tune.Tuner(_trainable(step, has_gpus), param_space=_param_space(step),
                               tune_config=_tune_config(step, at_once), run_config=_run_config(step, folder, verbose))
        with _quiet_tune(verbose):
            return collect(_fitted(tuner, result.path), step)

    trials = edges_extend.extend(result.path, result.spec, result.trials, run_step, TRIALS)
    return SweepResult(result.path, result.spec, trials)


def _finish(grid: ResultGrid, spec: SweepSpec, path: Path) -> SweepResult:
    """The sweep's result, its trials table written.

    Raises:
        TrialsFailed: no trial completed (a task or algorithm that fails alike for every configuration): the
            first one's error in one line.
    """
    frame = collect(grid, spec)
    results.write_parquet(path / TRIALS, frame)
    errors = [grid[i].error for i in range(len(grid))]
    if errors and all(errors):
        count = frame["trial"].nunique() if len(frame) else len(errors)  # configurations (a pack is one Tune trial)
        raise TrialsFailed(f"every trial of the sweep failed ({count}); the first: {error_line(cast(Exception, errors[0]))}; "
                           f"each trial's error.txt is under {path}; once it is fixed, continue with: "
                           f"{to_continue('sweep', path)} (a module or data files mended; a setting of the sweep's own "
                           f"is changed by running the sweep again)", path)
    return SweepResult(path, spec, frame)


def collect(grid: ResultGrid, spec: SweepSpec) -> pd.DataFrame:
    """One row per trial and evaluation round: trial id and status (``completed``, ``stopped`` by the scheduler,
    ``diverged``, ``error``), the trial's full config flattened
    to ``section.key`` columns, then its metric columns.

    Rows come from the trial's latest checkpoint (exactly the run's rows, once each even after retries
    and resumes); a trial stopped early by ASHA adds the rows it reported after that checkpoint.
    """
    frames, config_columns, metric_columns = [], {}, {}
    for i in range(len(grid)):  # a ResultGrid is indexed (its type declares no __iter__)
        result = grid[i]
        trial = dict(cast(dict[str, Any], result.config))  # a trial's result always holds its config
        status = "error" if result.error is not None else "completed"
        trial_id = (result.metrics or {}).get("trial_id") or os.path.basename(result.path)
        reported = result.metrics_dataframe
        packed = "pack" in trial
        for k, member in enumerate(members(trial)):
            config = _flatten(spec.trial_config(member).to_dict())  # section.key columns
            if packed:
                rows = read_pack_rows(result.checkpoint, k)
                later = None if reported is None or "member" not in reported else reported[reported["member"] == k]
            else:
                rows, later = read_trial_rows(result.checkpoint), reported
            rows += _later_rows(rows, later)
            rows, diverged = _until_divergence(rows, config["run.on_divergence"])
            frame = pd.DataFrame(rows or [{}])
            config_columns.update(dict.fromkeys(config))
            metric_columns.update(dict.fromkeys(frame.columns))
            name = f"{trial_id}-{k}" if packed else trial_id
            shown = "diverged" if diverged and status == "completed" else status
            if shown == "completed" and rows and rows[-1].get("round", 0) < config["run.rounds"]:
                shown = "stopped"  # by the scheduler (ASHA), its rounds kept
            head = pd.DataFrame([{"trial": name, "status": shown, **config}] * len(frame))
            frames.append(pd.concat([head, frame.reset_index(drop=True)], axis=1))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    out = out[["trial", "status", *config_columns, *(c for c in metric_columns if c not in config_columns)]]
    for column in config_columns:  # a swept 'auto'-or-number field holds both; Parquet needs one type
        if out[column].dtype == object and out[column].map(type).nunique() > 1:
            out[column] = out[column].map(lambda v: v if isinstance(v, (list, tuple)) else str(v))
    return out.sort_values(["trial", "round"], kind="stable", ignore_index=True) if "round" in out else out


def _until_divergence(rows: list[dict[str, Any]], on_divergence: str) -> tuple[list[dict[str, Any]], bool]:
    """A configuration's rows before its first non-finite training loss (after round 0, which has none), and whether
    it diverged: under ``run.on_divergence: stop`` a sweep keeps what a run keeps, the rounds before the divergence
    (a trial stops there, and reports a row with a non-finite loss to say so; a lockstep pack's configuration runs on
    with its neighbours); under ``continue``, every row, the run not counted as diverged (as a run's status)."""
    if on_divergence == "continue":
        return rows, False
    for i, row in enumerate(rows):
        loss = row.get("train_loss")
        if row.get("round", 0) > 0 and isinstance(loss, (int, float)) and not math.isfinite(loss):
            return rows[:i], True
    return rows, False


def _later_rows(rows: list[dict[str, Any]], reported: pd.DataFrame | None) -> list[dict[str, Any]]:
    """Rows reported after the latest checkpoint (a trial stopped early, or failed), in the checkpoint's columns."""
    if reported is None or "round" not in reported:
        return []
    last = max((r["round"] for r in rows), default=-1)
    later = reported[reported["round"] > last].drop_duplicates("round", keep="last")
    columns = [c for c in later.columns if c in (rows[0] if rows else later.columns) and c != "member"]
    return cast(list[dict[str, Any]], later[columns].to_dict("records"))


def load_sweep(path: str | Path) -> SweepResult:
    """The results of a sweep folder (its ``trials.parquet`` and spec), read back without starting Ray.

    Raises:
        ConfigError, StorageError: not a sweep folder, or its files cannot be read.
        NoResults: the sweep has not finished (no ``trials.parquet`` yet; a ``FileNotFoundError``).
    """
    path = folder_of(path, "path").absolute()
    meta = read_sweep_json(path)
    spec = stored_spec(meta, path)
    if not (path / TRIALS).is_file():
        raise NoResults(f"sweep folder {str(path)!r} has no {TRIALS} yet; finish it with: {to_continue('sweep', path)}")
    return SweepResult(path, spec, results.read_parquet(path / TRIALS))
