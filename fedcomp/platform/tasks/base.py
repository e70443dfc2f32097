"""What every task is: validated parameters, the problem kinds it offers, an initial model and metrics."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from fedcomp.models.functional import FlatModel
from fedcomp.platform.params import Params
from fedcomp.platform.tasks.builtins import BatchNorm


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
    model: FlatModel | None = None
    """The task's network, where it has one; when it keeps BatchNorm running statistics the platform carries
    them per client (:meth:`running_statistics`)."""
    batchnorm: BatchNorm = "averaged"
    """The running statistics policy (:data:`BatchNorm`), for a :attr:`model` that keeps them."""

    def __init__(self, params: Any, seed: int, clients: int, device: str = "cpu") -> None:
        self.params, self.seed, self.clients = params, seed, clients
        self.device = torch.device(device)
        """Where oracles compute. Random draws are always made on the CPU (same numbers everywhere); a task that
        holds client data keeps it here (:meth:`resident`), so a step moves only the drawn index vector."""

    @classmethod
    def check_data(cls, params: Any) -> None:
        """Raise the ``ConfigError`` that building the task with ``params`` would raise for data files that are not
        there, without reading any: a sweep checks this once before its trials start (each would fail alike). A
        task that reads no files (the default) has nothing to check."""
        return None

    def resident(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        """``tensors`` placed on the task's device once, at construction, so that no step copies data from
        the host: on the CPU these are the very same tensors (no copy, same numbers); on a GPU each client
        actor holds its task's data in GPU memory for the whole run."""
        return tuple(t.to(self.device) for t in tensors)

    @staticmethod
    def gather(data: Tensor, positions: Tensor) -> Tensor:
        """``data[positions]`` for ``data`` held on the device (:meth:`resident`): only ``positions``, an index
        vector drawn on the CPU, crosses to the device (a no-op on the CPU) -- without waiting for the GPU: a
        blocking copy to a GPU first waits for every kernel queued before it, so each step's draw would stop the
        host from queueing the step while the GPU still runs the previous one (CUDA stages a pageable source
        before the call returns, so the index vector may go at once)."""
        return data[positions.to(data.device, non_blocking=True)]

    def problem(self, kind: str) -> Any:
        """The oracle object for ``kind`` (one of :attr:`kinds`); by default the task itself."""
        if kind not in self.kinds:
            raise ValueError(f"task {self.name!r} does not offer the {kind!r} problem kind")
        return self

    def running_statistics(self) -> FlatModel | None:
        """The model whose running statistics the federation carries per client, or None (no BatchNorm
        running statistics: a model without BatchNorm, or ``batchnorm: batch``)."""
        return self.model if self.model is not None and self.model.buffer_dim else None

    def stream_id(self, client: int) -> int:
        """The id that keys client ``client``'s random streams (a task may make clients share one)."""
        return client

    @abstractmethod
    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        """The initial variables as flat float32 vectors: ``{"x": x0}`` (plus ``"y"`` for two-level problems)."""

    @abstractmethod
    def evaluator(self) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        """A function from the server's state (``x``, and ``y`` where there is one) to metrics; builds test data once."""
