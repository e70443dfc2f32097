"""Clients on an accelerator: data held on the task's device, deterministic-mode options, memory sizing.

Without CUDA the device-residency tests build tasks on PyTorch's ``meta`` device -- a real device other than
the CPU, so a host->device copy made during a step shows up as a tensor changing device -- and the CUDA tests
skip (they are for a GPU machine: ``pytest tests/platform/test_gpu.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MOVES = (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.copy_)


class DeviceMoves(TorchFunctionMode):
    """Records (dtype, shape) of every tensor that a ``.to`` / ``.cuda`` / ``.cpu`` / ``.copy_`` moved to
    another device while active."""

    def __init__(self) -> None:
        super().__init__()
        self.moved: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in MOVES and isinstance(out, torch.Tensor):
            source = args[1] if func is torch.Tensor.copy_ else args[0]
            if isinstance(source, torch.Tensor) and source.device != out.device:
                self.moved.append((source.dtype, tuple(source.shape)))
        return out


Draw = Callable[[Any, torch.Generator], Any]
CASES: dict[str, tuple[str, dict[str, Any], Draw]] = {
    "imbalanced-binary": ("auc-table1-offline", {}, lambda t, g: t.sample_batch(1, 8, g)),
    "imbalanced-binary/conditional": (
        "auprc-table2-offline", {"task.dataset": "breast-cancer", "task.model": "linear"},
        lambda t, g: t.problem("conditional").sample_outer(1, 8, g),
    ),
    "dro-classification": ("feddro-offline", {}, lambda t, g: t.sample(1, 8, g)),
    "fewshot-mnist": ("maml-fewshot-mnist", {}, lambda t, g: t.episodes(1, 2, g)),
    "loss-tuning": ("fednest-losstune-offline", {"federation.clients_per_round": 4},
                    lambda t, g: t.sample(1, "outer", 8, g)),
    "fednest-minimax": ("fednest-minimax", {"federation.clients_per_round": 4},
                        lambda t, g: t.loss(torch.zeros(t.params.dim, device="meta"),
                                            torch.zeros(t.params.dim, device="meta"), 1)),
}


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, (tuple, list)):
        return [t for item in batch for t in _tensors(item)]
    return [getattr(batch, name) for name in ("support_x", "support_y", "query_x", "query_y")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_step_moves_only_index_vectors_to_the_device(case: str) -> None:
    """The task holds its clients' data on its device from construction; drawing a batch indexes it there, so the
    only tensors crossing from the host are the integer index vectors drawn on the CPU (same draws everywhere)."""
    preset, overrides, draw = CASES[case]
    task = build_task(load_config(preset, {"federation.clients": 4, **overrides}), "meta")
    moves = DeviceMoves()
    with moves:
        batch = draw(task, generator(0, "device-test"))
    assert all(t.device.type == "meta" for t in _tensors(batch))
    assert all(dtype == torch.int64 and len(shape) == 1 for dtype, shape in moves.moved), moves.moved


def test_on_the_cpu_the_held_data_is_the_loaded_data_and_steps_keep_it_in_place() -> None:
    """On the CPU ``resident`` copies nothing (same tensors, same numbers); rounds of local steps move no tensor
    between devices and leave the held data where it was."""
    config = load_config("auc-table1-offline", {"federation.clients": 4, "algorithm.local_steps": 2})
    server = Server(config, LocalFederation)
    task = server.federation.host.task
    features, labels = task.train_on_device
    assert features is task.x_train and labels is task.y_train
    before = (features.data_ptr(), labels.data_ptr())
    moves = DeviceMoves()
    with moves:
        server.run_round()
        server.run_round()
    assert moves.moved == []
    assert (task.train_on_device[0].data_ptr(), task.train_on_device[1].data_ptr()) == before


@CUDA
def test_on_cuda_a_task_holds_its_data_in_gpu_memory() -> None:
    task = build_task(load_config("auc-table1-offline", {"federation.clients": 4}), "cuda")
    features, labels = task.train_on_device
    assert features.is_cuda and labels.is_cuda
    batch = task.sample_batch(1, 8, generator(0, "device-test"))
    assert all(t.is_cuda for t in batch)
