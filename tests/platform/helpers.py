"""What the algorithms' tests share: running a local-backend server for some rounds, checking that a run
resumed from a checkpoint ends with the same numbers as the run that never stopped, and a short AUC run on a
real data set."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

import fedcomp
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.server import Server


def run(cfg: Any, rounds: int) -> Server:
    """A local-backend server after ``rounds`` rounds."""
    server = Server(cfg, LocalFederation)
    for _ in range(rounds):
        server.run_round()
    return server


def check_resume(cfg: Any, rounds: int, stop: int, keys: Iterable[str] | None = None) -> tuple[Server, Server, dict]:
    """Runs ``cfg`` for ``rounds`` rounds straight, and again for ``stop`` rounds, whose checkpoint a fresh server
    restores and runs for the remaining rounds; asserts the two end states are equal bit for bit (the tensors
    named ``keys``, by default all of the straight run's).

    Returns:
        The straight server, the resumed one (for checks of their private states) and the checkpoint.
    """
    straight = run(cfg, rounds)
    checkpoint = run(cfg, stop).checkpoint()
    resumed = Server(cfg, LocalFederation)
    resumed.restore(checkpoint)
    for _ in range(rounds - stop):
        resumed.run_round()
    for key in straight.tensors() if keys is None else keys:
        torch.testing.assert_close(resumed.tensors()[key], straight.tensors()[key], rtol=0, atol=0,
                                   msg=lambda text, key=key: f"{key}: {text}")
    return straight, resumed, checkpoint


def check_breast_cancer_run(out: Any, name: str, rounds: int, task: dict[str, Any] | None = None, **algo: Any) -> None:
    """Runs ``name`` end to end on the imbalanced breast-cancer task (2 local clients, 2 local steps of 16 examples
    a round) and checks its counters and that its test AUROC is a valid AUC."""
    result = fedcomp.run({
        "task": {"name": "imbalanced-binary", "dataset": "breast-cancer", **(task or {})},
        "algorithm": {"name": name, "local_steps": 2, "outer_batch": 16, **algo},
        "federation": {"clients": 2, "backend": "local"},
        "run": {"rounds": rounds, "progress": "none", "out": str(out)},
    })
    final = result.final
    assert final["comm_rounds"] == rounds and final["local_steps"] == 2 * rounds
    assert 0.0 <= final["test_auroc"] <= 1.0
