"""fedcomp -- a Ray-based experiment platform for federated nested stochastic optimisation.

Public API::

    fedcomp.run(config_or_preset, **overrides) -> RunResult
    fedcomp.resume(run_dir) -> RunResult
    fedcomp.sweep(preset_or_file, search=, seeds=, overrides=, ...) -> SweepResult
    fedcomp.resume_sweep(sweep_dir) -> SweepResult
    fedcomp.load_results(path) -> pandas.DataFrame
    fedcomp.load_config(source, overrides) -> Config
    fedcomp.verify(run_dir, backend=, overrides=) -> Verification (is every metric bit-identical?)
"""

__version__ = "0.1.0"

from fedcomp.api import resume, resume_sweep, run, sweep
from fedcomp.platform.config import Config, load_config, preset_names
from fedcomp.platform.errors import ClientFailure, ConfigError, Diverged, PlatformError, ResourceError, StorageError
from fedcomp.platform.registry import ALGORITHMS, TASKS, register_algorithm, register_task
from fedcomp.platform.results import load_results
from fedcomp.platform.runner import RunResult
from fedcomp.verify import Verification, verify

__all__ = [
    "ALGORITHMS",
    "TASKS",
    "ClientFailure",
    "Config",
    "ConfigError",
    "Diverged",
    "PlatformError",
    "ResourceError",
    "RunResult",
    "Verification",
    "load_config",
    "load_results",
    "preset_names",
    "register_algorithm",
    "register_task",
    "resume",
    "resume_sweep",
    "run",
    "StorageError",
    "sweep",
    "verify",
]
