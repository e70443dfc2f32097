"""The FedDRO family and the DRO baselines on a real local Ray: the same numbers bit for bit as the local
backend with two clients per actor, partial cohorts included (clients that join late)."""

from __future__ import annotations

import pandas as pd
import pytest

import fedcomp

pytestmark = pytest.mark.ray

COMPOSITION = {"name": "heterogeneous-composition", "heterogeneity": 1.0}
CLASSIFICATION = {"name": "dro-classification", "dataset": "breast-cancer", "objective": "chi2", "lam": 2.0}


@pytest.mark.parametrize(
    "algorithm, task, extra, per_round",
    [
        ("feddro", COMPOSITION, {"local_steps": 3, "lr": 0.3}, 3),
        ("fedavg-co-shared-y", COMPOSITION, {"local_steps": 2, "lr": 0.3}, None),
        ("fedavg-co-1", COMPOSITION, {"local_steps": 2, "lr": 0.3}, 3),
        ("fedavg-co-2", COMPOSITION, {"local_steps": 2, "lr": 0.3}, 3),
        ("gcivr", COMPOSITION, {"lr": 0.3, "outer_batch": 4, "init": "code", "refresh_every": 2}, None),
        ("parallel-mbsgd", COMPOSITION, {"lr": 0.3}, 3),
        ("parallel-fastdro", CLASSIFICATION, {"lr": 0.05, "outer_batch": 8}, 3),
        ("parallel-pdsgd", CLASSIFICATION, {"lr": 0.05, "outer_batch": 8}, 3),
    ],
)
def test_same_numbers_on_local_and_ray(ray_session, tmp_path, algorithm, task, extra, per_round):
    raw = {"task": task, "algorithm": {"name": algorithm, **extra},
           "federation": {"clients": 4, "clients_per_round": per_round, "backend": "local"},
           "run": {"rounds": 3, "progress": "none", "out": str(tmp_path)}}
    local = fedcomp.run(raw).metrics.drop(columns="wall_time")
    on_ray = fedcomp.run(raw, {"federation.backend": "ray", "federation.clients_per_actor": 2})
    pd.testing.assert_frame_equal(on_ray.metrics.drop(columns="wall_time"), local, rtol=0, atol=0)
    assert local["comm_rounds"].iloc[-1] == 3
