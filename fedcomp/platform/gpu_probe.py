"""One short round on a CUDA device that measures a client's GPU memory (``torch.cuda.max_memory_allocated``),
for ``federation.gpu_packing: auto`` (:func:`fedcomp.platform.gpu_packing.pick_clients_per_actor`)."""

from __future__ import annotations

from typing import Any

import torch

from fedcomp.platform.errors import ResourceError
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.gpu_packing import Footprint
from fedcomp.platform.server import Server


def probe_footprint(config: Any, device: str = "cuda") -> Footprint:
    """Measure :class:`Footprint` with one round of ``config``'s algorithm on one client, on the CUDA ``device``:
    the memory allocated by the host (task data and model), by a client's kept state, and the peak of its step.

    Runs on the local backend in this process (a GPU must be visible here); the round's numbers are discarded.
    """
    if not torch.cuda.is_available():
        raise ResourceError("federation.gpu_packing = 'auto' measures a client on a GPU, but none is visible here")
    probe = config.replace(**{
        "federation.backend": "local", "federation.gpus_per_client": 1, "federation.clients_per_round": 1,
        "federation.vectorise": False, "run.rounds": 1,
    })  # fmt: skip
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    server = Server(probe, LocalFederation)
    fixed = torch.cuda.memory_allocated(device) - start
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    server.run_round()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    host = server.federation.host  # type: ignore[attr-defined]
    state = sum(t.numel() * t.element_size() for s in host.private.values() for t in s.values())
    del server, host
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    return Footprint(fixed=int(fixed), state=int(state), step=int(max(peak, 0)), device=int(total))
