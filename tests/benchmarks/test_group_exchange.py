"""``benchmarks/group_exchange.py``: it times the actors' group exchange and its floor at every size it reports."""

from __future__ import annotations

import group_exchange


def test_the_report_has_one_row_per_size_with_a_positive_exchange_and_floor(tmp_path):
    out = tmp_path / "GROUP_EXCHANGE.md"
    assert group_exchange.main(["--exchanges", "2", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and not line.startswith("| partial")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == list(group_exchange.SIZES)
    for row in rows:
        exchange, floor = (float(cell) for cell in row.split(" | ")[2:4])
        assert exchange > 0 and floor > 0
