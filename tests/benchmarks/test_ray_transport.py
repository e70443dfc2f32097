"""``benchmarks/ray_transport.py``: its old six-argument federation still runs on the current federation's retry and
bookkeeping internals and ends FedDRO's rounds (per-step exchanges by calls) in the state of today's transport."""

from __future__ import annotations

import pytest
import ray_transport

from fedcomp.platform.config import load_config

pytestmark = pytest.mark.ray


def test_the_old_transport_runs_and_ends_in_the_same_state(ray_session):
    config = load_config({"task": {"name": "heterogeneous-composition", "dim": 10},
                          "algorithm": {"name": "feddro", "lr": 0.1, "local_steps": 2},
                          "federation": {"clients": 4, "clients_per_actor": 2, "backend": "ray", "server": "actor", "transport": "calls",
                                         "cpus_per_actor": 0.25},
                          "run": {"rounds": 2, "progress": "none"}})
    rows = ray_transport.compare(config, 2)  # exits when the two transports end in different states
    assert [row.split("|")[1].strip() for row in rows] == ["six arguments (before)", "one message (now)",
                                                         "paired difference, now - before"]
