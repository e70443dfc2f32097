"""What a round adds to a run's counters (:class:`RoundRecord`) and the run's cumulative :class:`Counters`.

Plain numbers, no tensors: the driver of a Ray run reads them without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class RoundRecord:
    """What one round adds to the counters (floats: per participating client), and its training loss.

    ``comm_rounds`` and ``floats_*`` count model-sized messages; ``embedding_*`` count the low-dimensional
    exchanges some algorithms make between them (FedDRO's inner value, every local step).
    """

    comm_rounds: int
    local_steps: int
    samples: int
    floats_up: int
    floats_down: int
    train_loss: float
    embedding_exchanges: int = 0
    embedding_floats_up: int = 0
    embedding_floats_down: int = 0


@dataclass
class Counters:
    """Cumulative counters (the :class:`RoundRecord` fields summed over rounds); ``floats_*`` are per
    participating client, ``samples`` over all clients."""

    round: int = 0
    comm_rounds: int = 0
    local_steps: int = 0
    samples: int = 0
    floats_up: int = 0
    floats_down: int = 0
    embedding_exchanges: int = 0
    embedding_floats_up: int = 0
    embedding_floats_down: int = 0

    def add(self, record: RoundRecord) -> None:
        self.round += 1
        for name in COUNTED:
            setattr(self, name, getattr(self, name) + getattr(record, name))

    def as_dict(self) -> dict[str, int]:
        """The counters by name (a shallow copy: every field is an int; ``dataclasses.asdict`` recurses and deep-copies
        each, a third of a round program's own time)."""
        return dict(vars(self))


COUNTED = tuple(f.name for f in fields(RoundRecord) if f.name != "train_loss")
"""The :class:`RoundRecord` fields the counters sum."""
