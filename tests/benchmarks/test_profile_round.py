"""``benchmarks/profile_round.py``: it reads every phase timer of the Ray federation and drives rounds each way
it reports, on today's API."""

from __future__ import annotations

import math

import profile_round
import pytest

from fedcomp.actors.federation import PHASES
from fedcomp.bench import bench_config

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("transport", profile_round.TRANSPORTS)
def test_profile_gives_every_phase_and_way(keeping, transport):
    config = bench_config(8, 4, 2, 2, (8,), "ray", server="actor", transport=transport).replace(**{"federation.cpus_per_actor": 0.25})
    phases, per_round = profile_round.profile(config, rounds=profile_round.BLOCK)
    assert set(PHASES) <= set(phases) and "server round program" in phases
    assert phases[profile_round.COMPUTE] > 0
    assert {profile_round.BARE, profile_round.PIPELINED, profile_round.PIPELINED_OVER} <= set(per_round)
    assert len(per_round) == 6 and all(math.isfinite(s) and s >= 0 for s in per_round.values())
    assert all(math.isfinite(s) for s in phases.values())


def test_the_replicated_server_is_profiled_from_every_replica(keeping):
    config = bench_config(8, 4, 2, 2, (8,), "ray", server="replicated").replace(**{"federation.cpus_per_actor": 0.25})
    phases, per_round = profile_round.profile_replicated(config, rounds=3)
    assert phases[f"{profile_round.REPLICA_COMPUTE}, busiest replica"] > 0
    assert phases[f"{profile_round.REPLICA_GATHERS} (mean over replicas)"] > 0
    assert "server round program (mean over replicas)" in phases and "driver waiting for replica 0's replies" in phases
    slowest = phases[f"{profile_round.SLOWEST_COMPUTE} (as a server counts it)"]
    assert slowest >= phases[f"{profile_round.REPLICA_COMPUTE}, busiest replica"]  # a sum of maxima, a max of sums
    assert len(per_round) == 4 and all(math.isfinite(s) and s > 0 for s in per_round.values())


def test_every_workload_builds_with_each_transport_and_the_server_replicated():
    for make in profile_round.workloads(rounds=2).values():
        for transport in (*profile_round.TRANSPORTS, profile_round.SERVER_REPLICATED):
            config = make(transport)
            replicated = transport == profile_round.SERVER_REPLICATED
            assert config.federation.server == ("replicated" if replicated else "actor")
            assert config.federation.transport == ("collective" if replicated else transport)
