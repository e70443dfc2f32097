"""Shared fixtures: one real local Ray instance for the whole test session, and small configs."""

from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray (2 CPUs, no dashboard, small object store), started once per session."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # always a fresh instance, never a cluster someone started with `ray start`
            num_cpus=2,
            num_gpus=0,
            include_dashboard=False,
            object_store_memory=150 * 1024**2,
            logging_level=logging.WARNING,
        )
    yield ray
    ray.shutdown()


def small(**overrides):
    """Overrides for a fast invariant-logreg run (4 clients, q = 5, 3 rounds, local backend)."""
    base = {
        "federation.backend": "local",
        "federation.clients": 4,
        "algorithm.local_steps": 5,
        "algorithm.first_batch": 4,
        "task.test_samples": 2000,
        "run.rounds": 3,
        "run.progress": "none",
    }
    base.update(overrides)
    return base
