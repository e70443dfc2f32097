"""The base of every frozen, validated parameter model: task parameters, algorithm hyperparameters and the
config's sections. A leaf module (it imports nothing of fedcomp), so algorithms and tasks can subclass it
without importing the config loader or the registry."""

from __future__ import annotations

import os
import types
import typing
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator


class Params(BaseModel):
    """Frozen, forbids unknown keys, validates defaults, and rejects infinite and NaN floats (``lr=inf`` would
    otherwise run to a NaN loss) in every float field of every section, task and algorithm, and booleans in fields
    that do not take one (``run.rounds: true`` would otherwise be 1, ``beta: yes`` 1.0); a ``pathlib.Path`` is taken as the path it names."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_stray_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None and not _takes_bool(
                cls.model_fields[info.field_name].annotation):
            raise ValueError("a boolean where a number or a word is wanted")
        if isinstance(value, os.PathLike):  # a data root given as a pathlib.Path: the path it names
            return os.fspath(value)
        return value


def _absolute(path: str | None) -> str | None:
    if path is None:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):  # every dataset would be "not found" under it
        raise ValueError("a file, not a folder: give the folder the dataset's files are under (README, Data)")
    return path


DataRoot = Annotated[str | None, AfterValidator(_absolute)]
"""A task's data root: ``~`` expanded and made absolute against the working directory, so that ``run.json`` names
the folder the run read wherever it is verified, resumed or reported from (None: ``$FEDCOMP_DATA`` or the cache)."""


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type admits ``True`` as itself: ``bool``, or a union or ``Annotated`` holding it, or ``Any``."""
    if annotation is bool or annotation is Any:
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return any(isinstance(arg, bool) for arg in typing.get_args(annotation))
    return any(_takes_bool(arg) for arg in typing.get_args(annotation))


def field_lines(model: type[BaseModel]) -> list[str]:
    """One line per field of ``model`` -- its name, type, bounds, default and description: what ``fedcomp list NAME``
    shows of an algorithm's hyperparameters or a task's parameters."""
    lines = []
    for name, field in model.model_fields.items():
        kind = " ".join(filter(None, (_type_text(field.annotation), _bounds_text(field.metadata))))
        default = "required" if field.is_required() else f"default {field.get_default(call_default_factory=True)!r}"
        lines.append(f"{name:<22} {kind:<28} {default}" + (f"  {field.description}" if field.description else ""))
    return lines


def _bounds_text(metadata: list[Any]) -> str:
    """A field's bounds as an interval, ``in (0, 1]``, or one side, ``> 0``; empty where it has none."""
    bound = {attr: getattr(m, attr) for m in metadata for attr in ("gt", "ge", "lt", "le") if getattr(m, attr, None) is not None}
    low = ("(", bound["gt"]) if "gt" in bound else ("[", bound["ge"]) if "ge" in bound else None
    high = (bound["lt"], ")") if "lt" in bound else (bound["le"], "]") if "le" in bound else None
    if low and high:
        return f"in {low[0]}{low[1]}, {high[0]}{high[1]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    return f"{'<' if high[1] == ')' else '<='} {high[0]}" if high else ""


def _type_text(annotation: Any) -> str:
    """A field's type as a user writes its values: ``float``, ``'a' | 'b'``, ``int | None``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in args)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if args:  # a union, a list[...]
        parts = [_type_text(arg) for arg in args]
        return " | ".join(parts) if origin in (typing.Union, types.UnionType) else f"{getattr(origin, '__name__', origin)}[{', '.join(parts)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))
