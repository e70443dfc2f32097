"""The Python API: ``fedcomp.run(...)``, ``fedcomp.resume(...)``, ``fedcomp.keep_actors()``, ``fedcomp.report(...)``
(``fedcomp.sweep`` is :func:`fedcomp.sweeps.tuner.sweep`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedcomp.platform.config import Config, folder_of, load_config, overrides_of, placed_on, placement_only
from fedcomp.platform.errors import ConfigError, resuming

if TYPE_CHECKING:  # the runner and the backends import torch: a config is checked before they load
    from fedcomp.backends import make_server
    from fedcomp.platform.runner import RunResult

__all__ = ["keep_actors", "make_server", "report", "resume", "run"]


def __getattr__(name: str) -> Any:
    if name == "make_server":
        from fedcomp.backends import make_server

        return make_server
    raise AttributeError(f"module 'fedcomp.api' has no attribute {name!r}")


def run(
    config: str | Path | Mapping[str, Any] | Config | None = None,
    overrides: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> RunResult:
    """Run one federated experiment and return its results.

    Args:
        config: a preset name (``"quickstart"``), a YAML file, a dict with the four sections, or a
            :class:`Config`; default ``"quickstart"``.
        overrides: ``{"algorithm.lr": 0.01, ...}``.
        **kwargs: more overrides spelt ``section__key`` (``algorithm__lr=0.01``).

    Example:
        >>> import fedcomp
        >>> result = fedcomp.run("quickstart", federation__backend="local", run__rounds=2)  # doctest: +SKIP
        >>> result.final["test_accuracy"]  # doctest: +SKIP
    """
    given = {key.replace("__", "."): value for key, value in overrides_of(overrides).items()}
    for key, value in kwargs.items():
        dotted = key.replace("__", ".")
        if dotted in given and given[dotted] != value:
            raise ConfigError(f"{dotted} given twice: {given[dotted]!r} in overrides and {key}={value!r}; give it once")
    all_overrides = {**given, **kwargs}
    if isinstance(config, Config):
        config = config.replace(**all_overrides) if all_overrides else config
    else:
        config = load_config(config, all_overrides)
    from fedcomp.backends import make_server
    from fedcomp.platform.runner import execute

    return execute(config, make_server)


@contextlib.contextmanager
def keep_actors() -> Iterator[None]:
    """Within this block, a Ray-backend run hands its actors to the next run of this process instead of killing
    them; when the block ends, the ones still kept are killed.

    The next run takes the actors started with the same resources and rebuilds them from its own config, as
    their constructor would, so its numbers are a fresh run's. It skips starting those processes and importing
    torch into each: seconds a run on a small machine (``benchmarks/SWEEP.md``, "in sequence, actors kept"). A
    sweep does the same in each trial process (``keep_actors`` in a sweep spec). Local-backend runs are unaffected.

    Example:
        >>> with fedcomp.keep_actors():  # doctest: +SKIP
        ...     results = [fedcomp.run("quickstart", algorithm__lr=lr) for lr in (0.1, 0.03, 0.01)]
    """
    from fedcomp.actors import kept  # no Ray import until actors are kept or killed

    before = kept.keeping()
    kept.keep_between_runs(True)
    try:
        yield
    finally:
        kept.keep_between_runs(before)  # off again: the actors still kept are killed


def resume(run_dir: str | Path, overrides: Mapping[str, Any] | None = None) -> RunResult:
    """Continue the run in ``run_dir`` from its last checkpoint to its configured number of rounds. A run that
    completed is read back as it is: no backend is started and nothing is rewritten.

    Args:
        overrides: where and how it continues, ``{"federation.backend": "local", "run.progress": "none", ...}``:
            only settings that leave its numbers unchanged (:data:`~fedcomp.platform.config.PLACEMENT`, and
            ``run.progress``); e.g. another cluster, or the local backend after the cluster went.

    Raises:
        ConfigError, StorageError: ``run_dir`` is not a run folder, or its files cannot be read; an override that
            could change the numbers.
        Interrupted: Ctrl-C (or SIGTERM) stopped it again; the message says what was kept.
        Diverged: the run became non-finite; its finite rounds are kept.
    """
    from fedcomp.backends import make_server
    from fedcomp.platform.runner import completed_result, execute, resume_config

    run_dir = folder_of(run_dir, "run_dir", "a run folder's path")
    changes = placement_only(overrides, f"{resuming('run', run_dir)}: setting", more=("run.progress",))
    config = resume_config(run_dir)
    placed_on(changes, changes.get("federation.backend", config.federation.backend), f"{resuming('run', run_dir)}: setting")
    if changes:
        config = load_config(config.to_dict(), changes)
    done = completed_result(run_dir, config)
    return done if done is not None else execute(config, make_server, resume_dir=run_dir)


def report(
    results_dir: str | Path, metric: str | None = None, x: str = "comm_rounds", out: str | Path | None = None
) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.md`` for the runs under ``results_dir`` -- or for the sweep whose folder it
    is: its best configuration per algorithm, edges flagged -- into it (or ``out``); return their paths. What
    ``fedcomp report`` writes; a sweep from the command line writes its own at its end, ``fedcomp.sweep`` leaves
    that to this.

    Args:
        metric: the metric plotted and ranked; default each run's task headline (a sweep's own metric).
        x: the x-axis column (``comm_rounds``, ``round``, ``local_steps``, ``samples``, ``wall_time``).

    Raises:
        NoResults: no run or sweep there; ConfigError: a ``metric`` or ``x`` the results do not have.
    """
    from fedcomp.platform.errors import ConfigError, NoResults
    from fedcomp.platform.report import report as report_runs
    from fedcomp.sweeps.report import sweep_report
    from fedcomp.sweeps.tuner import load_sweep

    folder = folder_of(results_dir, "results_dir", "a results or sweep folder's path")
    try:
        if (folder / "sweep.json").is_file():
            return sweep_report(load_sweep(folder), metric=metric, x=x, out=out)
        return report_runs(folder, metric=metric, x=x, out=out)
    except NoResults:
        raise
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(str(error)) from None
