"""Typed algorithm state: frozen records of named tensors.

An algorithm declares its client state and its server state as dataclasses derived from :class:`State`::

    @dataclass(frozen=True)
    class Momentum(State):
        x: Tensor
        u: Tensor

Every field exists from the start (no lazily created keys) and an update builds a new record
(``state.replace(x=...)``). A field may itself be a record (a server optimiser's state inside the server
state). On the wire, in checkpoints and under ``vmap`` a state travels as its plain mapping of named tensors
(:meth:`State.tensors`; a nested record's fields as ``outer.inner``), which :meth:`State.of` turns back into
the record.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from torch import Tensor

S = TypeVar("S", bound="State")

BUFFERS = "buffers"
"""The wire name of the model's running statistics (BatchNorm buffers), which the platform carries beside the
algorithm's state (:mod:`fedcomp.platform.federation`); reserved: no record has a field of this name."""


@dataclasses.dataclass(frozen=True)
class State:
    """Base of typed states: a frozen dataclass whose fields are tensors."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def tensor_names(cls) -> tuple[str, ...]:
        """The names :meth:`tensors` gives (a nested record's fields as ``outer.inner``)."""
        nested = _nested_types(cls)  # type: ignore[arg-type]  # mypy: a class object is hashable
        return tuple(
            m for n in cls.names() for m in ([f"{n}.{k}" for k in nested[n].tensor_names()] if n in nested else [n])
        )

    @classmethod
    def of(cls: type[S], tensors: Mapping[str, Tensor]) -> S:
        """The record from a mapping that holds (at least) every field; other keys are ignored."""
        values: dict[str, Any] = {}
        missing = []
        for name in cls.names():
            nested = _nested_types(cls).get(name)  # type: ignore[arg-type]  # mypy: a class object is hashable
            if nested is not None:
                prefix = name + "."
                values[name] = nested.of({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
            elif name in tensors:
                values[name] = tensors[name]
            else:
                missing.append(name)
        if missing:
            raise KeyError(f"{cls.__name__} needs {', '.join(missing)}; got {', '.join(sorted(tensors)) or 'nothing'}")
        return cls(**values)

    def tensors(self) -> dict[str, Tensor]:
        """The fields as a plain mapping (the form that crosses the wire and goes into checkpoints)."""
        out: dict[str, Tensor] = {}
        for name in self.names():
            value = getattr(self, name)
            if isinstance(value, State):
                out.update({f"{name}.{k}": v for k, v in value.tensors().items()})
            else:
                out[name] = value
        return out

    def replace(self: S, **changes: Any) -> S:
        """A new record with some fields replaced."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Model(State):
    """The model alone: the state of algorithms whose clients and server keep nothing else (FedAvg, FCSG, ...)."""

    x: Tensor


@dataclasses.dataclass(frozen=True)
class MinimaxModel(State):
    """The minimax variables, the primal x and the dual y: the state of the min-max family (LocalSGDAM, CoDA, ...)
    and FedNest's (x, y) point."""

    x: Tensor
    y: Tensor


@functools.cache
def _nested_types(cls: type[State]) -> dict[str, type[State]]:
    """The fields of ``cls`` that are records themselves, with their types."""
    hints = typing.get_type_hints(cls)
    return {n: t for n, t in hints.items() if isinstance(t, type) and issubclass(t, State)}


class Means(dict[str, Tensor]):
    """The cohort means of a client program's outputs, by name; also readable as attributes (``means.x``)."""

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no mean named {name!r}; the program returned {', '.join(sorted(self))}") from None
