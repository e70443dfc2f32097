"""Typed algorithm state: frozen records of named tensors.

An algorithm declares its client state and its server state as dataclasses derived from :class:`State`::

    @dataclass(frozen=True)
    class Momentum(State):
        x: Tensor
        u: Tensor

Every field exists from the start (no lazily created keys) and an update builds a new record
(``state.replace(x=...)``). On the wire, in checkpoints and under ``vmap`` a state travels as its plain
mapping of named tensors (:meth:`State.tensors`), which :meth:`State.of` turns back into the record.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

from torch import Tensor

S = TypeVar("S", bound="State")


@dataclasses.dataclass(frozen=True)
class State:
    """Base of typed states: a frozen dataclass whose fields are tensors."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def of(cls: type[S], tensors: Mapping[str, Tensor]) -> S:
        """The record from a mapping that holds (at least) every field; other keys are ignored."""
        missing = [n for n in cls.names() if n not in tensors]
        if missing:
            raise KeyError(f"{cls.__name__} needs {', '.join(missing)}; got {', '.join(sorted(tensors)) or 'nothing'}")
        return cls(**{n: tensors[n] for n in cls.names()})

    def tensors(self) -> dict[str, Tensor]:
        """The fields as a plain mapping (the form that crosses the wire and goes into checkpoints)."""
        return {n: getattr(self, n) for n in self.names()}

    def replace(self: S, **changes: Any) -> S:
        """A new record with some fields replaced."""
        return dataclasses.replace(self, **changes)


class Means(dict[str, Tensor]):
    """The cohort means of a client program's outputs, by name; also readable as attributes (``means.x``)."""

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no mean named {name!r}; the program returned {', '.join(sorted(self))}") from None
