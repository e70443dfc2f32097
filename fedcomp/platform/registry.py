"""Name -> class registries for algorithms and tasks (the names used in configs and on the CLI).

A new algorithm or task is one file that defines a class and decorates it with
``@register_algorithm("name")`` / ``@register_task("name")``; importing the file registers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from fedcomp.platform.algorithms.base import Algorithm
    from fedcomp.platform.tasks.base import Task

T = TypeVar("T", bound=type)

ALGORITHMS: dict[str, type[Algorithm[Any, Any]]] = {}
TASKS: dict[str, type[Task]] = {}


def _register(table: dict[str, Any], kind: str, name: str) -> Callable[[T], T]:
    def decorate(cls: T) -> T:
        if name in table and table[name] is not cls:
            raise ValueError(f"{kind} name {name!r} is already registered by {table[name].__qualname__}")
        table[name] = cls
        cls.name = name  # type: ignore[attr-defined]
        return cls

    return decorate


def register_algorithm(name: str) -> Callable[[T], T]:
    """Class decorator: make an algorithm available as ``algorithm.name: <name>``."""
    return _register(ALGORITHMS, "algorithm", name)


def register_task(name: str) -> Callable[[T], T]:
    """Class decorator: make a task available as ``task.name: <name>``."""
    return _register(TASKS, "task", name)
