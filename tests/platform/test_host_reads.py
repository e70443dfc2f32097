"""A client program reads no tensor on the host between its first and its last local step: on a GPU each read
waits for every kernel queued before it, so a read per step (the step's loss, a blocking index copy) keeps the
host from queueing the next step while the GPU runs this one. Counted on the CPU, where the same reads happen."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedcomp.api import make_server
from fedcomp.platform.algorithms import feddro
from fedcomp.platform.algorithms.base import mean_loss
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_algorithm
from tests.platform.test_gpu import CUDA

READS = {"_local_scalar_dense"}  # what float(t), t.item() and t.tolist() of a one-element tensor dispatch


class Operators(TorchDispatchMode):
    """The names of the aten operators dispatched while active, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        kwargs = kwargs or {}
        if name == "_to_copy" and args[0].device.type == "cpu" and torch.device(kwargs.get("device", "cpu")).type == "cuda":
            name = "host-to-GPU copy, non-blocking" if kwargs.get("non_blocking") else "host-to-GPU copy, blocking"
        self.names.append(name)
        return func(*args, **kwargs)


@pytest.mark.parametrize(("preset", "overrides", "step"), [
    ("quickstart", {"algorithm.name": "fedavg", "task.test_samples": 200}, None),
    ("quickstart", {"task.test_samples": 200}, None),  # FCSG-M
    ("auc-table1-offline", {"algorithm.name": "local-sgdam"}, None),
    ("feddro-negative-result", {"algorithm.name": "fedavg-co-1"}, (feddro, "plain_inner_vjp")),
])
def test_no_host_read_between_a_programs_first_and_last_step(preset: str, overrides: dict[str, Any],
                                                             step: tuple[Any, str] | None, monkeypatch) -> None:
    """``step``: what each local step calls once, where the algorithm has no ``update`` per step."""
    operators, after = program_operators(preset, overrides, monkeypatch, step)
    # the program's losses are read once the steps are queued: one by one, or stacked into one tensor and read at
    # once (``tolist`` reads a CPU tensor's memory without dispatching an operator)
    assert READS & set(after) or "stack" in after
    assert not [name for name in operators if name in READS], operators


@pytest.mark.parametrize("dtypes", [(torch.float32,), (torch.float32, torch.float64), (torch.bfloat16,)])
def test_a_programs_mean_loss_read_at_once_has_the_bits_of_one_read_a_step(dtypes: tuple[torch.dtype, ...]) -> None:
    draws = torch.rand(37, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 10
    losses = [draw.to(dtypes[i % len(dtypes)]) for i, draw in enumerate(draws)]
    one_by_one = 0.0
    for loss in losses:
        one_by_one += float(loss) / len(losses)
    with Operators() as operators:
        assert mean_loss(losses) == one_by_one
    assert "stack" in operators.names and not READS & set(operators.names)  # one tensor, read at once
    assert mean_loss([float(loss) for loss in losses]) == one_by_one


@CUDA
@pytest.mark.parametrize("preset", ["auc-table1-offline", "maml-fewshot-mnist"])
def test_on_cuda_no_blocking_copy_to_the_gpu_between_a_programs_first_and_last_step(preset: str, monkeypatch) -> None:
    operators, _ = program_operators(preset, {"federation.gpus_per_client": 1, "task.eval_tasks": 5}
                                     if preset == "maml-fewshot-mnist" else {"federation.gpus_per_client": 1}, monkeypatch)
    assert "host-to-GPU copy, non-blocking" in operators  # the drawn indices
    assert "host-to-GPU copy, blocking" not in operators and not READS & set(operators)


def program_operators(preset: str, overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                      step: tuple[Any, str] | None = None) -> tuple[list[str], list[str]]:
    """(the operators dispatched from the start of a client program's first local step to the end of its last, those
    dispatched after it in the round) of the second round of a 4-step run on the local backend."""
    config = load_config(preset, {**overrides, "federation.backend": "local", "federation.clients": 2,
                                  "federation.clients_per_round": 1, "algorithm.local_steps": 4, "run.progress": "none"})
    operators, calls = Operators(), []
    cls = type(build_algorithm(config))
    for owner, name in [step] if step else [(cls, "update"), (cls, "update_")]:
        original = getattr(owner, name, None)
        if original is None:
            continue

        def recorded(*args: Any, _original: Any = original) -> Any:
            start = len(operators.names)
            out = _original(*args)
            calls.append((start, len(operators.names)))
            return out

        monkeypatch.setattr(owner, name, recorded)
    server = make_server(config)
    try:
        server.run_round()
        calls.clear()
        with operators:
            server.run_round()
    finally:
        server.close()
    assert len(calls) == 4
    first, last = calls[0][0], calls[-1][1]
    return operators.names[first:last], operators.names[last:]
