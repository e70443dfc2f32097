"""benchmarks/maml_kernels.py: a short run writes both tables, with the contrast between the widths it reports."""

from __future__ import annotations

import maml_kernels
import pytest
import torch


@pytest.mark.slow
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN's CPU kernels to switch")
def test_a_one_round_run_reports_gradient_and_run_gaps_per_width(tmp_path):
    out = tmp_path / "MAML_KERNELS.md"
    assert maml_kernels.main(["--rounds", "1", "--out", str(out)]) == 0
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.read_text().splitlines()
            if line.startswith("| ") and line[2].isdigit()]
    gradient = {(int(r[0]), r[1]): float(r[2]) for r in rows if len(r) == 4}
    runs = [r for r in rows if len(r) == 5]
    assert set(gradient) == {(w, o) for w in maml_kernels.WIDTHS for o in ("second-order", "first-order")}
    assert [(int(r[0]), int(r[1])) for r in runs] == [(w, k) for w in maml_kernels.WIDTHS for k in (0, 1)]
    assert gradient[16, "second-order"] < 1e-4 < gradient[64, "second-order"]  # why the CUDA check uses 16 filters
