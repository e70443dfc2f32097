"""What the runner drives (:class:`ServerLike`) and what each round of it answers (:data:`RoundReply`).

Kept apart from the in-process :class:`~fedcomp.platform.server.Server`, which imports torch: a Ray run's driver
drives a proxy and handles numbers and bytes only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

RoundReply = tuple[dict[str, Any], dict[str, float] | None, float]
"""One round of :meth:`ServerLike.run_rounds`: its record (cumulative counters and the round's training loss),
the evaluation after it (None where the round is not evaluated) and the seconds that evaluation took."""


class ServerLike(Protocol):
    """What the runner drives: the in-process :class:`~fedcomp.platform.server.Server`, or a proxy to a server on Ray
    (a server actor, or the server replicated on the client actors)."""

    def run_round(self) -> dict[str, Any]: ...
    def evaluate(self) -> dict[str, float]: ...
    def run_rounds(self, evaluated: Sequence[bool]) -> Iterator[RoundReply]:
        """``len(evaluated)`` rounds, round ``i`` followed by an evaluation where ``evaluated[i]``, each reply
        yielded as its round ends. A server behind a hop may start the next round of ``evaluated`` before the
        caller has taken this one's reply (so that the hop's latency overlaps a round): a caller that stops early
        may leave it one round further on (the server actor; a server whose replicas run further ahead goes back to
        the last reply taken before its next use); after the last reply nothing more runs, so that is where to
        checkpoint."""
        ...
    def checkpoint(self) -> dict[str, Any]:
        """The server's whole mutable state (tensors): what :meth:`restore` takes."""
        ...
    def checkpoint_file(self, extra: dict[str, Any]) -> bytes:
        """A run checkpoint's file content, ``{"server": <the checkpoint>, **extra}`` saved by
        :func:`~fedcomp.platform.results.checkpoint_bytes` where the state lives: a proxy's driver handles bytes,
        never tensors (so a Ray run's driver need not import torch)."""
        ...
    def restore(self, checkpoint: dict[str, Any]) -> None: ...
    def close(self) -> None: ...
    def describe(self) -> dict[str, Any]: ...


