"""The base of every frozen, validated parameter model: task parameters, algorithm hyperparameters and the
config's sections. A leaf module (it imports nothing of fedcomp), so algorithms and tasks can subclass it
without importing the config loader or the registry."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class Params(BaseModel):
    """Frozen, forbids unknown keys, validates defaults, and rejects infinite and NaN floats (``lr=inf`` would
    otherwise run to a NaN loss) in every float field of every section, task and algorithm, and booleans in fields
    that do not take one (``run.rounds: true`` would otherwise be 1, ``beta: yes`` 1.0)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_stray_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None and not _takes_bool(
                cls.model_fields[info.field_name].annotation):
            raise ValueError("a boolean where a number or a word is wanted")
        return value


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type admits ``True`` as itself: ``bool``, or a union or ``Annotated`` holding it, or ``Any``."""
    if annotation is bool or annotation is Any:
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return any(isinstance(arg, bool) for arg in typing.get_args(annotation))
    return any(_takes_bool(arg) for arg in typing.get_args(annotation))
