"""fedcomp -- a Ray-based experiment platform for federated nested stochastic optimisation.

Public API::

    fedcomp.run(config_or_preset, **overrides) -> RunResult
    fedcomp.resume(run_dir) -> RunResult
    fedcomp.sweep(preset_or_file, search=, seeds=, overrides=, ...) -> SweepResult
    fedcomp.resume_sweep(sweep_dir) -> SweepResult
    fedcomp.load_sweep(sweep_dir) -> SweepResult  (a finished sweep's trials and spec, read back; no Ray started)
    with fedcomp.keep_actors(): ...  (Ray-backend runs in the block reuse each other's actors)
    fedcomp.load_results(path) -> pandas.DataFrame
    fedcomp.load_config(source, overrides) -> Config
    fedcomp.verify(run_dir, backend=, overrides=) -> Verification (is every metric bit-identical?)
    fedcomp.check(config_or_preset, overrides, ray=True) -> Conformance (same seed, Ray packings, stop + resume:
        every metric bit-identical to the first run's?)
    @fedcomp.register_algorithm("name") / @fedcomp.register_task("name")  (a user's own, in a module of theirs
        that the config names: ``algorithm.module``, ``task.module``)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from fedcomp.api import keep_actors, report, resume, run
    from fedcomp.conformance import Conformance, check
    from fedcomp.platform.config import Config, load_config, preset_names
    from fedcomp.platform.errors import (
        ActorLost,
        AlgorithmError,
        ClientFailure,
        ConfigError,
        Diverged,
        Interrupted,
        NoResults,
        PlatformError,
        ResourceError,
        StorageError,
        TaskError,
        TrialsFailed,
    )
    from fedcomp.platform.registry import ALGORITHMS, TASKS, register_algorithm, register_task
    from fedcomp.platform.results import load_results
    from fedcomp.platform.runner import RunResult
    from fedcomp.sweeps.tuner import load_sweep, resume_sweep, sweep
    from fedcomp.verification import Verification, verify

_HOME = {
    "keep_actors": "fedcomp.api", "report": "fedcomp.api", "resume": "fedcomp.api", "run": "fedcomp.api",
    "sweep": "fedcomp.sweeps.tuner", "resume_sweep": "fedcomp.sweeps.tuner",
    "Config": "fedcomp.platform.config", "load_config": "fedcomp.platform.config",
    "preset_names": "fedcomp.platform.config",
    "ClientFailure": "fedcomp.platform.errors", "ConfigError": "fedcomp.platform.errors",
    "Diverged": "fedcomp.platform.errors", "Interrupted": "fedcomp.platform.errors", "NoResults": "fedcomp.platform.errors",
    "PlatformError": "fedcomp.platform.errors",
    "ResourceError": "fedcomp.platform.errors", "StorageError": "fedcomp.platform.errors",
    "ALGORITHMS": "fedcomp.platform.registry", "TASKS": "fedcomp.platform.registry",
    "register_algorithm": "fedcomp.platform.registry", "register_task": "fedcomp.platform.registry",
    "load_results": "fedcomp.platform.results", "RunResult": "fedcomp.platform.runner",
    "Verification": "fedcomp.verification", "verify": "fedcomp.verification",
    "Conformance": "fedcomp.conformance", "check": "fedcomp.conformance",
    "ActorLost": "fedcomp.platform.errors", "TaskError": "fedcomp.platform.errors",
    "AlgorithmError": "fedcomp.platform.errors",
    "TrialsFailed": "fedcomp.platform.errors", "load_sweep": "fedcomp.sweeps.tuner",
}  # fmt: skip
"""Where each public name lives. They are imported on first use: a process that only hosts clients (a Ray
actor) then never imports the runner's pandas and the sweep layer."""


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:  # a subpackage or module, as ``import fedcomp; fedcomp.api`` found it when all was eager
        try:
            return importlib.import_module(f"fedcomp.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"fedcomp.{name}":
                raise
            raise AttributeError(f"module 'fedcomp' has no attribute {name!r}") from None
    from fedcomp.platform.signals import whole_imports

    with whole_imports():  # the sweep layer imports Ray: a Ctrl-C inside that import would break it for good
        module = importlib.import_module(home)
    value = getattr(module, name)
    globals()[name] = value
    return value


__all__ = [
    "ALGORITHMS",
    "TASKS",
    "ActorLost",
    "AlgorithmError",
    "ClientFailure",
    "Config",
    "ConfigError",
    "Conformance",
    "Diverged",
    "Interrupted",
    "NoResults",
    "PlatformError",
    "ResourceError",
    "RunResult",
    "StorageError",
    "TaskError",
    "TrialsFailed",
    "Verification",
    "check",
    "keep_actors",
    "load_config",
    "load_results",
    "load_sweep",
    "preset_names",
    "register_algorithm",
    "register_task",
    "report",
    "resume",
    "resume_sweep",
    "run",
    "sweep",
    "verify",
]
