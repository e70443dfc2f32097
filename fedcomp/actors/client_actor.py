"""The client actor: a thin Ray shell around :class:`ClientHost` (the clients' data, task and private state)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
import torch

from fedcomp.platform.accelerator import configure
from fedcomp.platform.algorithms.base import Tensors
from fedcomp.platform.config import Config
from fedcomp.platform.federation import ClientHost, Layout, Partial


class ClientActor:
    """Hosts ``clients`` on the GPU Ray assigned to it, if any, else on the CPU."""

    def __init__(self, config: Config, clients: Sequence[int], incarnation: int = 0) -> None:
        self.setup(config, clients, incarnation)

    def setup(self, config: Config, clients: Sequence[int], incarnation: int = 0) -> None:
        """Build the clients of a run (the constructor, and a kept actor's rebuild for the next run:
        :mod:`fedcomp.actors.kept`)."""
        torch.set_num_threads(1)
        self.error: Exception | None = None
        """An error building the clients (e.g. a missing data root), raised by :meth:`ready`: an exception
        leaving an actor's constructor reaches the driver only as text, after Ray has printed its traceback."""
        self.flags: dict[str, Any] = {}
        """The determinism flags set for CUDA (``run.deterministic``; empty on the CPU)."""
        try:
            device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
            self.flags = configure(device, config.run.deterministic)
            self.host = ClientHost(config, clients, device)
        except Exception as error:
            self.error = error
        self.incarnation = incarnation
        # Fault injection for the reliability tests: FEDCOMP_FAULT_KILL="<round>:<first client of the actor>"
        # (or "<round>:<client>:<sub>", or "<round>:<client>:<sub>:<step>" for a step of an exchange: 0 =
        # begin, k = the k-th answer) makes the first incarnation of that actor die (a real process exit) there.
        self._kill = os.environ.get("FEDCOMP_FAULT_KILL", "")

    def ready(self) -> dict[str, Any]:
        """Where this actor landed: its clients, node, process id, assigned GPU ids, the torch device it computes on
        and the CUDA determinism flags it set."""
        if self.error is not None:
            raise self.error
        return {
            "clients": list(self.host.clients),
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "device": self.host.device,
            "cuda_flags": self.flags,
        }

    def load_private(self, states: dict[int, Tensors]) -> None:
        self.host.load_private(states)

    def _die_at(self, *where: int) -> None:
        """Exit the process if this is the first incarnation and ``where`` is the fault to inject."""
        first = self.host.clients[0]
        spec = ":".join(str(w) for w in (where[0], first, *where[1:]))
        if self.incarnation == 0 and self._kill in (spec, f"{where[0]}:{first}"):
            os._exit(1)

    @staticmethod
    def _split(partial: Partial) -> tuple[Partial, dict[int, Tensors]]:
        """The partial sums, and (as a separate object) copies of the clients' private state."""
        private, partial.private = partial.private, {}
        return partial, private

    @ray.method(num_returns=2)
    def step(self, message: bytes, payload: np.ndarray | None, cohort: list[int]) -> tuple[Partial, dict[int, Tensors]]:
        """One federation call as the server sends it: ``message`` is ``(method, arguments)`` pickled once for
        every actor (with the payload when small), ``payload`` the large payload from the object store (else
        None), ``cohort`` this actor's members of the call's cohort (unused by ``resume``)."""
        method, args = pickle.loads(message)
        if payload is not None:
            args["payload"] = payload
        if method == "resume":
            return self.resume(**args)
        if method not in ("run", "begin"):
            raise ValueError(f"ClientActor.step: unknown method {method!r} (allowed: run, begin, resume)")
        return getattr(self, method)(cohort=cohort, **args)

    @ray.method(num_returns=2)
    def run(
        self, program: str, round: int, cohort: Sequence[int], payload: np.ndarray, layout: Layout, sub: int = 0
    ) -> tuple[Partial, dict[int, Tensors]]:
        self._die_at(round, sub)
        return self._split(self.host.run(program, round, cohort, payload, layout, sub))

    @ray.method(num_returns=2)
    def begin(
        self, program: str, round: int, cohort: Sequence[int], payload: np.ndarray, layout: Layout, sub: int = 0,
        last: bool = False,
    ) -> tuple[Partial, dict[int, Tensors]]:
        self._die_at(round, sub, 0)
        return self._split(self.host.begin(program, round, cohort, payload, layout, sub, last))

    @ray.method(num_returns=2)
    def resume(self, payload: np.ndarray, layout: Layout, last: bool = False) -> tuple[Partial, dict[int, Tensors]]:
        session = self.host.session
        if session is not None:
            self._die_at(session.round, session.sub, session.step + 1)
        return self._split(self.host.resume(payload, layout, last))
