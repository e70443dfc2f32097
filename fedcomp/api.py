"""The Python API: ``fedcomp.run(...)``, ``fedcomp.resume(...)``, ``fedcomp.sweep(...)``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedcomp.platform.config import Config, load_config

if TYPE_CHECKING:  # the runner and the backends import torch: a config is checked before they load
    from fedcomp.backends import make_server
    from fedcomp.platform.runner import RunResult

__all__ = ["make_server", "resume", "resume_sweep", "run", "sweep"]


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
    all_overrides = {**(overrides or {}), **kwargs}
    if isinstance(config, Config):
        config = config.replace(**all_overrides) if all_overrides else config
    else:
        config = load_config(config, all_overrides)
    from fedcomp.backends import make_server
    from fedcomp.platform.runner import execute

    return execute(config, make_server)


def resume(run_dir: str | Path) -> RunResult:
    """Continue the run in ``run_dir`` from its last checkpoint to its configured number of rounds."""
    from fedcomp.backends import make_server
    from fedcomp.platform.runner import execute, resume_config

    config = resume_config(run_dir)
    return execute(config, make_server, resume_dir=run_dir)


def sweep(source: Any = "quick", **options: Any) -> Any:
    """Run a Ray Tune sweep of whole federated runs; see :func:`fedcomp.sweeps.tuner.sweep`.

    Example:
        >>> result = fedcomp.sweep("quick", seeds=1, overrides={"run.rounds": 5})  # doctest: +SKIP
        >>> result.best()  # doctest: +SKIP

    ``extend_edges=True`` (``edge_cap=N``, default 3) keeps running the next grid value past each edge optimum.
    """
    from fedcomp.sweeps.tuner import sweep as run_sweep

    return run_sweep(source, **options)


def resume_sweep(path: str | Path, **options: Any) -> Any:
    """Continue an interrupted sweep without redoing its finished trials."""
    from fedcomp.sweeps.tuner import resume_sweep as resume

    return resume(path, **options)
