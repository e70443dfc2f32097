"""Whether a sweep's trials will find their data files: checked once, before Tune starts a trial.

Without it, a sweep of a task whose files are not under the data root started its trials, which all failed alike,
and the sweep ended after three of them (:mod:`fedcomp.sweeps.failures`), half a minute later, leaving a sweep
folder to resume. The check reads no file (:meth:`~fedcomp.platform.tasks.base.Task.check_data`: whether the files
are there) and runs as one Ray task that asks for a CPU as a trial does: on a cluster, on a node a trial could run
on, with its file system and this process's ``$FEDCOMP_DATA`` (as the trials get it). A sweep whose tasks read no
files starts no such task. On a cluster whose CPUs are all taken (another job's), the check gives up after
:data:`CHECK_TIMEOUT_S` and the sweep goes on, its trials queued by Tune as before (they meet missing files as they
did before the check).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from fedcomp.actors.cluster import fedcomp_env
from fedcomp.actors.federation import unwrap
from fedcomp.platform.config import Config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.progress import announce

CHECK_TIMEOUT_S = 30.0
"""How long the check waits for a CPU to run on before the sweep goes on without it."""


def check_data(configs: Sequence[Config], timeout: float = CHECK_TIMEOUT_S) -> None:
    """Raise the ``ConfigError`` the first of ``configs`` (a sweep's grid points or Optuna corners) whose task's data
    files are not there would fail its trial with, before any trial starts.

    Raises:
        ConfigError: the task's own line, e.g. ``task.dataset = 'cifar10': cifar10 not found: <folder> must hold
            ...``, as a run of that configuration says it.
    """
    reading = _reading_files(configs)
    if not reading:
        return
    env = fedcomp_env()  # $FEDCOMP_DATA of this process, as the trials get it
    ref = _first_missing.options(runtime_env={"env_vars": env} if env else None).remote(reading)
    try:
        line = ray.get(ref, timeout=timeout)
    except RayTaskError as error:
        raise unwrap(error) from None
    except GetTimeoutError:
        ray.cancel(ref, force=True)
        announce(f"the check of the trials' data files found no free CPU within {timeout:g} s; the sweep goes on "
                 f"without it")
        return
    if line is not None:
        raise ConfigError(line)


def _reading_files(configs: Sequence[Config]) -> list[Config]:
    """One config per distinct task section among ``configs`` whose task takes a data root (``root``)."""
    distinct: dict[str, Config] = {}
    for config in configs:
        if "root" in type(config.task).model_fields:
            key = json.dumps([config.task_name, config.task.model_dump(mode="json")], sort_keys=True)
            distinct.setdefault(key, config)
    return list(distinct.values())


@ray.remote(num_cpus=1, max_retries=0)
def _first_missing(configs: list[Config]) -> str | None:
    """The error line of the first config whose task's files are not there, else None."""
    from fedcomp.platform import catalog

    for config in configs:
        try:
            catalog.task_class(config.task_name).check_data(config.task)
        except ConfigError as error:
            return str(error)
    return None

