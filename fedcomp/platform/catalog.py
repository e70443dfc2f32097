"""Every algorithm and task by name: their declarations without torch, their classes on demand.

The config, ``fedcomp list``, ``report`` and a Ray run's driver need only declarations
(:func:`algorithms`, :func:`tasks`); whoever builds one imports its module (:func:`algorithm_class`,
:func:`task_class`), and :func:`load_builtins` imports them all (the conformance suite, which checks each).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, cast

from fedcomp.platform.registry import (
    ALGORITHMS,
    DECLARED_ALGORITHMS,
    DECLARED_TASKS,
    TASKS,
    AlgorithmDeclaration,
    TaskDeclaration,
)

if TYPE_CHECKING:
    from fedcomp.platform.algorithms.base import Algorithm
    from fedcomp.platform.tasks.base import Task


def _declare_builtins() -> None:
    import fedcomp.platform.algorithms.builtins
    import fedcomp.platform.tasks.builtins  # noqa: F401


def algorithms() -> dict[str, AlgorithmDeclaration]:
    """Name -> declaration of every built-in algorithm and every one registered so far."""
    _declare_builtins()
    return DECLARED_ALGORITHMS


def tasks() -> dict[str, TaskDeclaration]:
    """Name -> declaration of every built-in task and every one registered so far."""
    _declare_builtins()
    return DECLARED_TASKS


def algorithm_class(name: str) -> type[Algorithm[Any, Any]]:
    """The class of algorithm ``name``, its module imported if need be (``KeyError`` for an unknown name)."""
    if name not in ALGORITHMS:
        importlib.import_module(algorithms()[name].module)
    return cast("type[Algorithm[Any, Any]]", ALGORITHMS[name])


def task_class(name: str) -> type[Task]:
    """The class of task ``name``, its module imported if need be (``KeyError`` for an unknown name)."""
    if name not in TASKS:
        importlib.import_module(tasks()[name].module)
    return cast("type[Task]", TASKS[name])


def load_builtins() -> None:
    """Import every built-in algorithm and task module, so that each registers its class."""
    modules = [a.module for a in algorithms().values()] + [t.module for t in tasks().values()]
    for module in dict.fromkeys(modules):
        importlib.import_module(module)
