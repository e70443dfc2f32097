"""Typed algorithm state: frozen records of named tensors.

An algorithm declares its client state and its server state as dataclasses derived from :class:`State`::

    @dataclass(frozen=True)
    class Momentum(State):
        x: Tensor
        u: Tensor

Every field exists from the start (no lazily created keys) and an update builds a new record
(``state.replace(x=...)``). On the wire, in checkpoints and under ``vmap`` a state travels as its plain mapping
of named tensors (:meth:`State.tensors`), which :meth:`State.of` turns back into the record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import torch
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
        """The field names, in declaration order (kept per class: read on every round and client step, where
        ``dataclasses.fields`` would build them anew)."""
        names = _NAMES.get(cls)
        if names is None:
            names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
        return names

    @classmethod
    def of(cls: type[S], tensors: Mapping[str, Tensor]) -> S:
        """The record from a mapping that holds (at least) every field; other keys are ignored."""
        missing = [name for name in cls.names() if name not in tensors]
        if missing:
            raise KeyError(f"{cls.__name__} needs {', '.join(missing)}; got {', '.join(sorted(tensors)) or 'nothing'}")
        return cls(**{name: tensors[name] for name in cls.names()})

    def tensors(self) -> dict[str, Tensor]:
        """The fields as a plain mapping (the form that crosses the wire and goes into checkpoints)."""
        return {name: getattr(self, name) for name in self.names()}

    def replace(self: S, **changes: Any) -> S:
        """A new record with some fields replaced."""
        return dataclasses.replace(self, **changes)


_NAMES: dict[type, tuple[str, ...]] = {}


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


def unsent() -> Tensor:
    """A message field the protocol has not sent yet (an empty tensor). A client record holds every field a
    round's calls broadcast; a call made before the server has the value carries it empty (and counts no floats)."""
    return torch.zeros(0)


class Means(dict[str, Tensor]):
    """The cohort means of a client program's outputs, by name; also readable as attributes (``means.x``)."""

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no mean named {name!r}; the program returned {', '.join(sorted(self))}") from None
