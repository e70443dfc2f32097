"""Name -> algorithm and task, the names used in configs and on the CLI: what each one declares, and its class.

A new algorithm or task is one file that defines a class and decorates it with
``@register_algorithm("name")`` / ``@register_task("name")``; importing the file registers it, its class
attributes (``HParams``, ``kind``, ... / ``Params``, ``kinds``, ``metrics``, ...) making its declaration.

The built-ins are declared apart from their implementations (:mod:`fedcomp.platform.algorithms.builtins`,
:mod:`fedcomp.platform.tasks.builtins`: hyperparameter models and a few words each, no torch), so that the config,
``fedcomp list`` and a Ray run's driver know them without importing torch; each implementation registers with its
declaration (``@register_algorithm(FEDAVG)``), which gives the class those attributes.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from fedcomp.platform.params import Params

T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class AlgorithmDeclaration:
    """What the config and the CLI know of an algorithm: its hyperparameters, the problem kind it needs, a line
    for ``fedcomp list``, and the module whose import registers its class."""

    name: str
    HParams: type[Params]
    kind: str
    description: str
    module: str


@dataclass(frozen=True)
class TaskDeclaration:
    """What the config, the CLI and the results know of a task: its parameters, the problem kinds it offers, the
    metrics it reports (the first is its headline, better ``mode``), a line for ``fedcomp list``, and the module
    whose import registers its class."""

    name: str
    Params: type[Params]
    kinds: frozenset[str]
    metrics: tuple[str, ...]
    description: str
    module: str
    mode: Literal["max", "min"] = "max"


ALGORITHMS: dict[str, type[Any]] = {}
"""Name -> class (an :class:`~fedcomp.platform.algorithms.base.Algorithm`), for every algorithm whose module has
been imported. This module imports neither the algorithms' base nor the tasks': they import it."""
TASKS: dict[str, type[Any]] = {}
"""Name -> class (a :class:`~fedcomp.platform.tasks.base.Task`), for every task whose module has been imported."""
DECLARED_ALGORITHMS: dict[str, AlgorithmDeclaration] = {}
"""Name -> declaration, for every built-in (declared on import of its declarations) and registered algorithm."""
DECLARED_TASKS: dict[str, TaskDeclaration] = {}
"""Name -> declaration, for every built-in (declared on import of its declarations) and registered task."""


def _declare(table: dict[str, Any], kind: str, declaration: Any) -> Any:
    known = table.get(declaration.name)
    if known is not None and known != declaration:
        raise ValueError(f"{kind} name {declaration.name!r} is already declared by {known.module}")
    table[declaration.name] = declaration
    return declaration


def declare_algorithm(declaration: AlgorithmDeclaration) -> AlgorithmDeclaration:
    """Make a built-in algorithm known by name before its implementation is imported."""
    return _declare(DECLARED_ALGORITHMS, "algorithm", declaration)  # type: ignore[no-any-return]


def declare_task(declaration: TaskDeclaration) -> TaskDeclaration:
    """Make a built-in task known by name before its implementation is imported."""
    return _declare(DECLARED_TASKS, "task", declaration)  # type: ignore[no-any-return]


def register_algorithm(name: str | AlgorithmDeclaration) -> Callable[[T], T]:
    """Class decorator: make an algorithm available as ``algorithm.name: <name>``.

    With a name, the class's attributes ``HParams``, ``kind`` and ``description`` make its declaration; with a
    declaration (a built-in's), the class takes those attributes from it."""

    def decorate(cls: T) -> T:
        if isinstance(name, AlgorithmDeclaration):
            declared = name
            _adopt(cls, declared)
        else:
            _check_name(name, "algorithm")
            _require(cls, "HParams", _is_params, "a subclass of fedcomp.platform.params.Params (frozen, validated)")
            _require(cls, "kind", lambda v: isinstance(v, str), "the problem kind it runs on, a str")
            _not_a_misspelt_kind(cls, "kind", [cls.kind])  # type: ignore[attr-defined]
            for record in ("Client", "Server"):
                _require(cls, record, _is_state, "a subclass of fedcomp.platform.state.State declared with "
                         "@dataclass(frozen=True) (a typed record of tensors)")
            fields = cls.Client.names()  # type: ignore[attr-defined]
            local: Any = getattr(cls, "round_local", frozenset())
            if not (isinstance(local, (set, frozenset)) and local <= set(fields)):
                raise TypeError(f"{cls.__qualname__}.round_local = {local!r}: must be a set of the Client record's "
                                f"fields ({', '.join(fields)})")
            declared = AlgorithmDeclaration(name, cls.HParams, cls.kind,  # type: ignore[attr-defined]
                                            getattr(cls, "description", ""), cls.__module__)
        _enter(ALGORITHMS, DECLARED_ALGORITHMS, "algorithm", declared, cls)
        return cls

    return decorate


def register_task(name: str | TaskDeclaration) -> Callable[[T], T]:
    """Class decorator: make a task available as ``task.name: <name>``.

    With a name, the class's attributes ``Params``, ``kinds``, ``metrics``, ``description`` and ``mode`` make its
    declaration; with a declaration (a built-in's), the class takes those attributes from it."""

    def decorate(cls: T) -> T:
        if isinstance(name, TaskDeclaration):
            declared = name
            _adopt(cls, declared)
        else:
            _check_name(name, "task")
            _require(cls, "Params", _is_params, "a subclass of fedcomp.platform.params.Params (frozen, validated)")
            _require(cls, "kinds", _strings, "the problem kinds it offers, a non-empty set of str")
            _not_a_misspelt_kind(cls, "kinds", cls.kinds)  # type: ignore[attr-defined]
            _require(cls, "metrics", lambda v: isinstance(v, (tuple, list)) and _strings(v),
                     "the metrics its evaluator reports, a non-empty tuple of str, the headline first")
            if getattr(cls, "mode", "max") not in ("max", "min"):
                raise TypeError(f"{cls.__qualname__}.mode = {cls.mode!r}: must be 'max' or 'min' (its headline metric's "  # type: ignore[attr-defined]
                                f"better direction)")
            declared = TaskDeclaration(name, cls.Params, frozenset(cls.kinds), tuple(cls.metrics),  # type: ignore[attr-defined]
                                       getattr(cls, "description", ""), cls.__module__, getattr(cls, "mode", "max"))
        _enter(TASKS, DECLARED_TASKS, "task", declared, cls)
        return cls

    return decorate


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""What a user's algorithm or task may be called: it goes into configs, run ids and folder names (``fcsg-m``)."""


def _check_name(name: Any, kind: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"{kind} name {name!r}: must be letters, digits, '-', '_' or '.', a letter or digit first "
                         f"(e.g. 'my-sgd')")


def _require(cls: type, attribute: str, holds: Callable[[Any], bool], what: str) -> None:
    """A user's class declares ``attribute`` as registration needs it, else one line saying what it must be."""
    value = getattr(cls, attribute, None)
    if not holds(value):
        raise TypeError(f"{cls.__qualname__}.{attribute} = {value!r}: must be {what}")


def _not_a_misspelt_kind(cls: type, attribute: str, names: Any) -> None:
    """A kind that is not fedcomp's but nearly one of its names is a misspelling, refused here: the config would
    later say only that no task offers it. A name of the user's own (far from fedcomp's) is theirs to use."""
    from fedcomp.platform.kinds import KIND_DESCRIPTIONS

    for name in names:
        close = difflib.get_close_matches(name, KIND_DESCRIPTIONS, n=1, cutoff=0.8)
        if name not in KIND_DESCRIPTIONS and close:
            raise TypeError(f"{cls.__qualname__}.{attribute}: {name!r} is not a problem kind; did you mean {close[0]!r}? "
                            f"(fedcomp's: {', '.join(KIND_DESCRIPTIONS)})")


def _is_state(value: Any) -> bool:
    """A State record whose every field is a dataclass field: a subclass that declares fields without its own
    ``@dataclass(frozen=True)`` would fail only when a run first builds one."""
    from fedcomp.platform.state import State

    if not (isinstance(value, type) and issubclass(value, State)):
        return False
    names = {f.name for f in fields(value)}
    declared = {name for klass in value.__mro__ for name, kind in vars(klass).get("__annotations__", {}).items()
                if "ClassVar" not in str(kind)}
    return declared <= names


def _is_params(value: Any) -> bool:
    from fedcomp.platform.params import Params

    return isinstance(value, type) and issubclass(value, Params)


def _strings(value: Any) -> bool:
    return isinstance(value, (tuple, list, set, frozenset)) and bool(value) and all(isinstance(v, str) for v in value)


def _adopt(cls: type, declaration: Any) -> None:
    """Set the attributes of ``cls`` that its declaration holds (every field but its name and module; the class body
    must not set them: one place for each)."""
    attributes = [f.name for f in fields(declaration) if f.name not in ("name", "module")]
    twice = [a for a in attributes if a in vars(cls)]
    if twice:
        raise TypeError(f"{cls.__qualname__} sets {', '.join(twice)}, which its declaration {declaration.name!r} sets")
    if cls.__module__ != declaration.module:
        raise TypeError(f"{cls.__qualname__} is in {cls.__module__}; its declaration {declaration.name!r} says "
                        f"{declaration.module}")
    for attribute in attributes:
        setattr(cls, attribute, getattr(declaration, attribute))


def _enter(classes: dict[str, Any], declared: dict[str, Any], kind: str, declaration: Any, cls: type) -> None:
    """Register ``cls`` under its declaration's name. The same class defined again -- a notebook cell run again, its
    module reloaded: the same module and qualified name -- takes the name over; another class cannot."""
    name = declaration.name
    known = classes.get(name)
    if known is not None and known is not cls:
        if (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"{kind} name {name!r} is already registered by {known.__module__}.{known.__qualname__}")
        declared.pop(name, None)  # its declaration is the new class's (its HParams or Params, too)
    _declare(declared, kind, declaration)
    classes[name] = cls
    cls.name = name  # type: ignore[attr-defined]
