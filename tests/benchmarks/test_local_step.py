"""``benchmarks/local_step.py``: its exact runners (autograd's gradient and the untaped one) end on the same weights, the fused one within float32 rounding of
them, and the report gives the paired and best-of ratios next to the medians, and each runner's page faults per
round."""

from __future__ import annotations

import local_step

from fedcomp.platform.algorithms import base


def test_the_report_has_the_paired_and_best_ratios_one_exact_hash_and_the_fused_difference(monkeypatch, capsys):
    monkeypatch.setattr(local_step, "WORKLOADS", {"tiny MLP 32-8-10, 20 clients": ([8], 20)})
    monkeypatch.setattr(base, "IN_PLACE_MIN_FLOATS", 0)  # the tiny model stepped in place, so fused_sgd applies
    assert local_step.main(["--rounds", "2", "--repeats", "2", "--out", "-"]) == 0
    report = capsys.readouterr().out
    header = next(line for line in report.splitlines() if line.startswith("| workload"))
    names = [c.strip() for c in header.strip("|").split("|")]
    for name in ("after / taped paired", "after / optim paired", "best / best", "fused / after paired",
                 "fused / optim paired"):
        assert name in names
    row = next(line for line in report.splitlines() if line.startswith("| tiny MLP"))
    cells = dict(zip(names, (c.strip() for c in row.strip("|").split("|")), strict=True))
    before, taped, after, optim, fused = cells["final weights sha256 (before / taped / after / optim / fused)"].split(" / ")
    assert before == taped == after == optim  # the exact runners' final weights, bit for bit
    assert float(cells["fused vs after, max abs diff"]) < 1e-6
    faults = cells["page faults per round (before / taped / after / optim / fused)"].split(" / ")
    assert len(faults) == 5 and all(count.isdigit() for count in faults)  # counted for each runner
    kernels = [line for line in report.splitlines() if line.startswith(("| form", "| add it", "| fused:"))]
    assert len(kernels) == 3 and all(float(line.strip("|").split("|")[1]) > 0 for line in kernels)
    others = [line for line in report.splitlines() if line.startswith(("| LocalSGDM", "| FedProx"))]
    assert len(others) == 2
    for line in others:
        exact_ms, fused_ms, *_, diff = (c.strip() for c in line.strip("|").split("|")[2:])
        assert float(exact_ms) > 0 and float(fused_ms) > 0
        assert 0 < float(diff) < 1e-6, line  # the fused steps ran: other roundings, the same steps
