"""``benchmarks/feddro_exchange.py``: it times every transport a Ray federation offers, each on today's API."""

from __future__ import annotations

import math
from typing import get_args

import feddro_exchange
import pytest

from fedcomp.platform.config import FederationConfig

pytestmark = pytest.mark.ray


def test_every_transport_and_the_replicated_server_have_a_row():
    transports = get_args(FederationConfig.model_fields["transport"].annotation)
    rows = feddro_exchange.VARIANTS.values()
    assert sorted(t for b, t, where in rows if b == "ray" and where == "actor") == sorted(transports)
    assert [where for b, _, where in rows if b == "ray" and where != "actor"] == ["replicated"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(feddro_exchange.VARIANTS))
def test_each_row_times_both_algorithms(keeping, variant):
    for algorithm in ("feddro", "fedavg-co-1"):
        ms = feddro_exchange.per_step_ms(algorithm, 10, variant, rounds=1, steps=2, cpus_per_actor=0.25)
        assert math.isfinite(ms) and ms > 0
