"""``benchmarks/fednest_epoch.py``: its plain loops make exactly FedNest's minimax updates."""

from __future__ import annotations

from fednest_epoch import NUMPY_RTOL, PRESET, check_iterates

from fedcomp.platform.config import load_config


def test_the_plain_torch_loop_gives_fedcomps_iterates_bit_for_bit_and_numpy_within_tolerance():
    config = load_config(PRESET, {"federation.backend": "local", "federation.clients": 5, "algorithm.inner_steps": 3,
                                  "algorithm.local_steps": 2, "algorithm.inner_rounds": 2})
    torch_diff, numpy_rel = check_iterates(config, 3)
    assert torch_diff == 0.0
    assert numpy_rel <= NUMPY_RTOL
