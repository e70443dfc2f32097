"""Clients on an accelerator: the determinism flags of a client process and exact sums on the device (how many
clients one GPU actor can hold is :mod:`fedcomp.platform.gpu_packing`).

* :func:`configure` -- what ``run.deterministic`` means on CUDA: deterministic kernels (``torch.
  use_deterministic_algorithms``, cuDNN's deterministic algorithms, no cuDNN autotuning), cuBLAS's fixed
  workspace (``CUBLAS_WORKSPACE_CONFIG``, set before cuBLAS starts) and full float32 (no TF32), so the same
  seed gives the same numbers run to run and CPU and GPU agree to float32 rounding. On the CPU kernels are
  deterministic at a given number of threads (:func:`one_thread`).
* :func:`one_thread` -- what ``run.deterministic`` means on the CPU: client programs compute with one intra-op
  thread in every process, so that the number of threads a process has does not change the order of a float
  reduction.
* :class:`ExactSum`, :func:`exact_sums` -- float64 sums of the clients' outputs in client order, added on the
  outputs' device as each client finishes and copied to the host once (one device->host copy per call instead
  of one per client). Float64 addition is correctly rounded on every IEEE device, so the sums equal the
  host's bit for bit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's deterministic workspace setting (https://docs.nvidia.com/cuda/cublas/#results-reproducibility)."""


def configure(device: str | torch.device, deterministic: bool) -> dict[str, Any]:
    """Set this process's determinism flags for computing on ``device``; returns what was set (empty on the CPU).

    Call it before the process's first CUDA computation: cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when it
    starts. Operations without a deterministic CUDA kernel warn (``warn_only``) rather than stop a run."""
    if torch.device(device).type != "cuda":
        return {}
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cuda.matmul.allow_tf32 = not deterministic
    torch.backends.cudnn.allow_tf32 = not deterministic
    return {
        "deterministic": deterministic,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32": not deterministic,
    }


@contextlib.contextmanager
def one_thread(enabled: bool = True) -> Iterator[None]:
    """Run the block with one intra-op thread (the process's setting is put back after it); as it is when not
    ``enabled``.

    The hosts run every client program this way under ``run.deterministic`` (the default), as every client actor
    does anyway: torch splits some float reductions across threads (FedDRO's step at d = 26,600 on an Intel Xeon
    ended a round in other last bits with the 2 threads of a 2-core machine's process than with 1), so clients
    computing with the driver's threads on the local backend would not give the Ray backend's numbers. Switching
    costs microseconds per call."""
    before = torch.get_num_threads()
    if before == 1 or not enabled:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


HOST_FLOATS = (torch.float32, torch.float64)
"""Output dtypes a host-memory sum adds through NumPy, which widens each block of the addend as it adds it."""


class ExactSum:
    """A float64 running sum of outputs' ``keys``, flattened and concatenated, added in the order they come, on
    their device (each output's tensors added into one float64 buffer: no flat copy per output).

    Added one output at a time, a host can let each client's outputs go as soon as they are counted: a cohort
    of large models is never held all at once. In host memory a float32 output is added by NumPy
    (``np.add(total, output, out=total)``: one pass, widened a block at a time), since torch's ``add_`` of a float32
    tensor into a float64 one on the CPU first makes a float64 copy of it (megabytes per client of a large model,
    fresh pages faulted in on first touch: twice the memory traffic, a measurable share of a CPU round); on a
    GPU torch widens in its kernel. Each sum gets a buffer of its own, so a reply's sums stay what they were after
    the host's next call."""

    def __init__(self) -> None:
        self.keys: tuple[str, ...] = ()
        self.buffer: Tensor | None = None
        """The current sum (float64, on the outputs' device; a new one for every sum)."""
        self.parts: Sequence[Tensor] = ()
        self.arrays: Sequence[np.ndarray] = ()
        """The parts as NumPy arrays (host memory), empty on a GPU."""
        self.added = 0

    def begin(self, keys: Sequence[str]) -> ExactSum:
        """Start a new sum of ``keys`` (in a new buffer: the previous one's :meth:`value` stays as it was)."""
        self.keys, self.added = tuple(keys), 0
        return self

    def add(self, output: Mapping[str, Tensor]) -> None:
        if not self.keys:
            return
        tensors = [output[k].detach().reshape(-1) for k in self.keys]
        if self.added == 0:
            size, device = sum(t.numel() for t in tensors), tensors[0].device
            self.buffer = torch.empty(size, dtype=torch.float64, device=device)
            self.parts = self.buffer.split([t.numel() for t in tensors])
            self.arrays = [p.numpy() for p in self.parts] if device.type == "cpu" else []
            for part, t in zip(self.parts, tensors):
                part.copy_(t)
        else:
            for i, (part, t) in enumerate(zip(self.parts, tensors)):
                if self.arrays and t.dtype in HOST_FLOATS:  # arrays: the sum is in host memory, as the outputs are
                    np.add(self.arrays[i], t.numpy(), out=self.arrays[i])
                else:
                    part.add_(t)
        self.added += 1

    def value(self) -> np.ndarray:
        """The sums as a host array (one device -> host copy; on the CPU, the buffer itself); empty without keys."""
        if not self.keys:
            return np.zeros(0, np.float64)
        assert self.added and self.buffer is not None, "ExactSum.value before any output was added"
        return self.buffer.cpu().numpy()


def exact_sums(outputs: Sequence[Mapping[str, Tensor]], keys: Sequence[str]) -> np.ndarray:
    """The float64 sum over ``outputs`` (in order) of each output's ``keys`` flattened and concatenated, as a
    host array (:class:`ExactSum` over all of them)."""
    assert outputs or not keys, "exact_sums needs at least one output"
    total = ExactSum().begin(keys)
    for out in outputs:
        total.add(out)
    return total.value()
