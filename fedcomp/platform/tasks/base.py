"""What every task is: validated parameters, the problem kinds it offers, an initial model and metrics."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Literal

import torch
from torch import Tensor

from fedcomp.platform.params import Params


class Task(ABC):
    """An objective plus its data. Built from its parameters, the run seed and the client count.

    A task object is cheap to build: every process that hosts clients builds its own copy; evaluation data
    is built only by :meth:`evaluator`, on the server.
    """

    name: ClassVar[str]
    Params: ClassVar[type[Params]]
    kinds: ClassVar[frozenset[str]]
    metrics: ClassVar[tuple[str, ...]]
    """Metric columns :meth:`evaluator` returns; the first is the headline metric."""
    mode: ClassVar[Literal["max", "min"]] = "max"
    vmappable: ClassVar[bool] = False
    """Whether the oracles are pure tensor functions ``torch.func.vmap`` can batch over clients (no BatchNorm
    in training mode, no in-place updates or data-dependent Python control flow); then a host may run its
    clients' local steps in lockstep when ``federation.vectorise`` is on (see :mod:`fedcomp.platform.vectorised`)."""
    description: ClassVar[str] = ""

    def __init__(self, params: Any, seed: int, clients: int, device: str = "cpu") -> None:
        self.params, self.seed, self.clients = params, seed, clients
        self.device = torch.device(device)
        """Where oracles compute; samples are always drawn on the CPU (same numbers everywhere) and moved here."""

    def problem(self, kind: str) -> Any:
        """The oracle object for ``kind`` (one of :attr:`kinds`); by default the task itself."""
        if kind not in self.kinds:
            raise ValueError(f"task {self.name!r} does not offer the {kind!r} problem kind")
        return self

    def stream_id(self, client: int) -> int:
        """The id that keys client ``client``'s random streams (a task may make clients share one)."""
        return client

    @abstractmethod
    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        """The initial variables as flat float32 vectors: ``{"x": x0}`` (plus ``"y"`` for two-level problems)."""

    @abstractmethod
    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        """A function from the server's state (``x``, and ``y`` where there is one) to metrics; builds test data once."""
