"""``benchmarks/local_step.py``: its three runners end on the same weights and the report gives the paired and
best-of ratios next to the medians, and each runner's page faults per round."""

from __future__ import annotations

import local_step


def test_the_report_has_the_paired_and_best_ratios_and_one_hash(monkeypatch, capsys):
    monkeypatch.setattr(local_step, "WORKLOADS", {"tiny MLP 32-8-10, 20 clients": ([8], 20)})
    assert local_step.main(["--rounds", "2", "--repeats", "2", "--out", "-"]) == 0
    report = capsys.readouterr().out
    header = next(line for line in report.splitlines() if line.startswith("| workload"))
    assert "after / optim paired per repeat (range)" in header and "best / best" in header
    row = next(line for line in report.splitlines() if line.startswith("| tiny MLP"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == len(header.strip("|").split("|"))
    before, after, optim = cells[-1].split(" / ")
    assert before == after == optim  # the three runners' final weights, bit for bit
    assert "page faults per round (before / after / optim)" in header
    assert all(count.isdigit() for count in cells[-2].split(" / "))  # counted for each runner
