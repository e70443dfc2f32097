"""What a round program talks to: :class:`Round`, a view of the federation for one server round.

A round program (``Algorithm.round``) reads like the paper's pseudo-code over a few primitives:

* ``fed.cohort(k)``: the clients of the round's k-th sampled cohort;
* ``fed.local_steps(broadcast, steps)``: every cohort client runs the algorithm's ``local_steps`` client
  program from the broadcast values; returns the cohort means of the averaged fields;
* ``fed.call(program, cohort, broadcast)``: run any named client program; returns the means of its outputs;
  ``message="embedding"`` marks a low-dimensional exchange counted apart from the model-sized messages;
* ``fed.exchange(program, cohort, broadcast, steps)``: a model round whose client program is a generator
  that exchanges a low-dimensional value ``steps`` times on the way -- ``y_bar = yield {"y": y_k}`` in its
  loop, the cohort mean coming back -- and returns its outputs for averaging (FedDRO's local steps).

A model message also carries the model's running statistics where it keeps them (:class:`GlobalBuffers`);
round programs never see them.

The round counts what it does as the papers count it -- a model-sized call is one communication round with
its floats per participating client, an embedding call one exchange -- so an algorithm never builds its
:class:`RoundRecord` by hand; ``fed.count(local_steps=...)`` adds local steps a program took outside
``local_steps``, and ``fed.train_loss`` may be set to the loss the round should report.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from fedcomp.platform.counters import RoundRecord
from fedcomp.platform.state import BUFFERS, Means, State


@dataclass
class GlobalBuffers:
    """The server's copy of the model's running statistics (BatchNorm buffers) and its policy.

    Every model message carries them (``fed.local_steps``, ``fed.call(..., message="model")``,
    ``fed.exchange``): the broadcast sends :meth:`down` and the cohort's statistics come back with the outputs,
    their mean replacing :attr:`value`. Embedding-sized exchanges and the halves of a protocol step
    (``message=None``) leave them on the clients.
    """

    value: Tensor
    """The cohort mean of the statistics last sent up (what the server evaluates with)."""
    averaged: bool
    """``batchnorm: averaged``: the mean goes down with the model; ``local``: nothing goes down."""

    def down(self) -> Tensor:
        """What a model broadcast sends: the mean (averaged), or an empty tensor that only asks for the clients'
        statistics back (local)."""
        return self.value if self.averaged else self.value.new_zeros(0)


class Round:
    """One server round's access to the clients, with the round's counters."""

    def __init__(
        self,
        federation: Any,
        number: int,
        cohort: Callable[[int], list[int]],
        rng: Callable[..., torch.Generator],
        problem: Any,
        clients: int,
        buffers: GlobalBuffers | None = None,
    ) -> None:
        self.federation = federation
        self.number = number
        """The round's index (0-based)."""
        self._cohort = cohort
        self.rng = rng
        """``rng(*ids)`` -> a server-side generator keyed by the round and ``ids``."""
        self.problem = problem
        """The task's problem object for the algorithm's kind (for properties such as ``minimax``; no data)."""
        self.clients = clients
        """N, the number of registered clients (for server updates that scale by the participating share |S|/N)."""
        self.buffers = buffers
        """The model's running statistics (updated by model messages), or None."""
        self.record = RoundRecord(0, 0, 0, 0, 0, float("nan"))
        self._calls = 0
        self._loss: float | None = None

    def cohort(self, k: int = 0) -> list[int]:
        """The clients of the round's k-th sampled cohort (FedNest resamples per sub-round: 0, 1, ...)."""
        return self._cohort(k)

    @property
    def train_loss(self) -> float:
        """The loss the round reports: the last call's mean training loss unless set."""
        return self.record.train_loss if self._loss is None else self._loss

    @train_loss.setter
    def train_loss(self, value: float) -> None:
        self._loss = value

    def call(
        self,
        program: str,
        cohort: list[int],
        broadcast: Mapping[str, Tensor] | State,
        *,
        sub: int | None = None,
        message: Literal["model", "embedding"] | None = "model",
        resent: Collection[str] = (),
    ) -> Means:
        """Run the client program ``program`` on ``cohort`` with ``broadcast``; the means of its outputs.

        ``sub`` numbers the call within the round (it keys the clients' random streams); by default calls are
        numbered 0, 1, 2, ... in the order the round makes them. ``message=None``: the call is one half of a
        protocol step whose messages straddle calls (the model goes down with one call and comes back with
        the next); it counts its samples only, and the round program counts the protocol's messages with
        :meth:`count`. ``resent`` names broadcast fields the cohort already holds from the round's previous
        call (FedInn's local round after its anchor round): sent again for the engine, not counted again.
        """
        payload = self._payload(broadcast, model=message == "model")
        sub = self._calls if sub is None else sub
        self._calls += 1
        out = self.federation.call(program, self.number, cohort, payload, sub)
        self._take_buffers(out.means)
        r = self.record
        r.samples += out.samples
        r.train_loss = out.loss
        if message is None:
            pass
        elif message == "model":
            r.comm_rounds += 1
            r.floats_up += out.floats_up
            r.floats_down += out.floats_down - sum(int(payload[k].numel()) for k in resent)
        else:
            r.embedding_exchanges += 1
            r.embedding_floats_up += out.floats_up
            r.embedding_floats_down += out.floats_down
        return Means(out.means)

    def _payload(self, broadcast: Mapping[str, Tensor] | State, model: bool) -> dict[str, Tensor]:
        """The broadcast as named tensors, with the running statistics for a model message."""
        payload = broadcast.tensors() if isinstance(broadcast, State) else dict(broadcast)
        if BUFFERS in payload:
            raise ValueError(f"a broadcast field is named {BUFFERS!r}: the name is reserved for the model's running statistics")
        if model and self.buffers is not None:
            payload[BUFFERS] = self.buffers.down()
        return payload

    def _take_buffers(self, means: dict[str, Tensor]) -> None:
        """Keep the cohort mean of the running statistics the clients sent up (out of the means the round sees)."""
        value = means.pop(BUFFERS, None)
        if value is not None and self.buffers is not None:
            self.buffers.value = value

    def exchange(
        self,
        program: str,
        cohort: list[int],
        broadcast: Mapping[str, Tensor] | State,
        steps: int,
        *,
        resent: Collection[str] = (),
    ) -> Means:
        """One model round whose client program exchanges a value with the cohort ``steps`` times on the way.

        ``program`` is a generator method of the algorithm: from the broadcast it yields a mapping of
        low-dimensional values ``steps`` times, each time receiving their cohort means (``y_bar = (yield
        {"y": y_k}).y``), and finally returns ``(client state, outputs, info)`` like any client program. Returns
        the cohort means of the outputs together with the last mean of each exchanged value.

        Counted as the protocol sends it: ``steps`` embedding exchanges (each yielded value up, its mean
        down) and one model round (the broadcast down, the outputs up); ``resent`` names broadcast fields the
        clients already hold from an earlier exchange (sent again for any that missed it, not counted again).
        Local steps are the round program's to count (``fed.count(local_steps=...)``).
        """
        payload = self._payload(broadcast, model=True)
        sub, r = self._calls, self.record
        self._calls += 1
        done = self.federation.exchange(program, self.number, cohort, payload, sub, steps)
        exchanged: dict[str, Tensor] = {}
        for step in done.steps:
            exchanged = step.means
            r.embedding_exchanges += 1
            r.embedding_floats_up += step.floats_up
            r.embedding_floats_down += step.floats_up  # the mean of what went up
        out = done.final
        self._take_buffers(out.means)
        clash = sorted(set(exchanged) & set(out.means))
        if clash:
            raise ValueError(f"client program {program!r} both exchanges and outputs {', '.join(clash)}")
        r.comm_rounds += 1
        r.samples += out.samples
        r.train_loss = out.loss
        r.floats_up += out.floats_up
        r.floats_down += sum(int(v.numel()) for k, v in payload.items() if k not in resent)
        return Means({**exchanged, **out.means})

    def local_steps(self, broadcast: Mapping[str, Tensor] | State, steps: int, cohort: list[int] | None = None) -> Means:
        """``steps`` local steps on every client of ``cohort`` (default: the round's), then the cohort means."""
        means = self.call("local_steps", self.cohort() if cohort is None else cohort, broadcast)
        self.count(local_steps=steps)
        return means

    def count(self, **counts: int) -> None:
        """Add to the round's counters what its calls do not count themselves (e.g. local steps of sub-rounds)."""
        for name, value in counts.items():
            setattr(self.record, name, getattr(self.record, name) + value)

    def finish(self) -> RoundRecord:
        """The round's record (after the round program returned)."""
        self.record.train_loss = self.train_loss
        return self.record
