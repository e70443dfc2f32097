"""``benchmarks/ray_start.py``: both starts run as the report says -- Ray's own launches its monitor and API server,
fedcomp's neither -- and every cell comes from the runs."""

from __future__ import annotations

import sys

import pytest
import ray_start

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_one_repeat_of_each_start_fills_the_table(tmp_path, monkeypatch):
    out = tmp_path / "RAY_START.md"
    monkeypatch.setattr(sys, "argv", ["ray_start.py", "--repeats", "1", "--out", str(out)])
    ray_start.main()
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    assert len(rows) == 4  # the header and three rows
    own, fedcomps, ratio = (row.strip("|").split(" | ") for row in rows[1:])
    assert own[1] == "yes" and fedcomps[1] == "no"
    for row in (own, fedcomps):
        medians = [float(cell.split(" (")[0]) for cell in row[2:]]
        assert len(medians) == 3 and all(m > 0 for m in medians) and medians[0] < medians[1]  # ready before the round
    assert ratio[1] == "—" and len(ratio[2:]) == 3 and all(float(cell) > 0 for cell in ratio[2:])
