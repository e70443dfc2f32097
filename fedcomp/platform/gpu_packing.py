"""GPU packing (``federation.gpu_packing: auto``): how many clients each actor hosts, from one client's measured
GPU memory (:class:`Footprint`, measured by :func:`fedcomp.platform.gpu_probe.probe_footprint`).

Arithmetic only (no torch): the driver plans its actors with it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fedcomp.platform.errors import ResourceError


@dataclass(frozen=True)
class Footprint:
    """What one GPU actor's memory holds, in bytes (measured by :func:`fedcomp.platform.gpu_probe.probe_footprint`)."""

    fixed: int
    """Whatever the actor's clients: its task's data and model on the device."""
    state: int
    """Per hosted client: its private state between rounds (parameters and optimiser state kept per client)."""
    step: int
    """Per client stepping at once: the peak memory of one client's local steps above the fixed and state bytes
    (activations, gradients, the broadcast); lockstep (``vectorise``) steps a host's cohort members together."""
    device: int = 0
    """The total memory of the GPU the probe ran on."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def pick_clients_per_actor(
    footprint: Footprint, gpu_bytes: int, actors_per_gpu: int, clients: int, cohort: int, gpus: int,
    headroom: float = 0.9,
) -> int:
    """How many clients each actor hosts when ``actors_per_gpu`` actors share each of ``gpus`` GPUs of
    ``gpu_bytes``: the clients spread evenly over the actors, provided one actor's share of the memory
    (``headroom`` of the GPU over ``actors_per_gpu``) holds its fixed bytes, each hosted client's state and the
    step memory of the cohort members it may run at once (all of its clients, at most ``cohort``).

    Raises:
        ResourceError: the clients do not fit; the message gives the bytes of each part.
    """
    if min(gpu_bytes, actors_per_gpu, clients, cohort, gpus) < 1 or not 0 < headroom <= 1:
        raise ValueError("pick_clients_per_actor needs positive sizes and 0 < headroom <= 1")
    per = math.ceil(clients / (gpus * actors_per_gpu))
    budget = int(gpu_bytes * headroom) // actors_per_gpu
    need = footprint.fixed + per * footprint.state + min(per, cohort) * footprint.step
    if need > budget:
        mib = 2**20
        raise ResourceError(
            f"federation.gpu_packing = 'auto': {clients} clients over {gpus * actors_per_gpu} actors ({actors_per_gpu} "
            f"per GPU) put {per} clients in an actor needing {need / mib:.0f} MiB (data and model "
            f"{footprint.fixed / mib:.0f} MiB, {footprint.state / mib:.1f} MiB state per client, "
            f"{footprint.step / mib:.1f} MiB per client stepping) but an actor's share of a GPU is "
            f"{budget / mib:.0f} MiB; use more GPUs or fewer clients"
        )
    return per
