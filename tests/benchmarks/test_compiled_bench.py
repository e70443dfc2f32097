"""``benchmarks/compiled.py``: the paired cells of its tables and the eager run it nudges to read the compiled run's
differences against."""

from __future__ import annotations

import compiled

from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.server import Server


def test_paired_cells_give_each_sides_median_and_the_median_and_range_of_the_ratio_within_repeats():
    times = {False: [10.0, 12.0, 11.0], True: [5.0, 6.6, 5.5]}  # ratios 0.50, 0.55, 0.50
    assert compiled.paired(times) == "11.00 | 5.50 | 0.50x (0.50-0.55)"


def test_the_nudged_run_moves_by_rounding_size_from_the_run_left_alone():
    """Each element moved by 6e-8 of itself after round 1: the final state differs from the untouched run's, by about
    float32 rounding on this short, smooth run."""
    config = load_config({"task": {"name": "synthetic-classification", "features": 8, "classes": 3, "hidden": [16],
                                   "test_samples": 50},
                          "algorithm": {"name": "fedavg", "local_steps": 2}, "federation": {"clients": 3}})
    alone = Server(config, LocalFederation)
    for _ in range(3):
        alone.run_round()
    nudged = compiled.perturbed_run(config, 2)
    for name, value in alone.tensors().items():
        difference = (nudged[name] - value).abs().max().item()
        assert 0 < difference < 1e-5, (name, difference)
