"""benchmarks/bn_step.py: a seconds-long run writes a report whose operator counts show what the kernels' path saves."""

from __future__ import annotations

import bn_step
import pytest


@pytest.mark.slow
def test_a_short_run_reports_each_runner_and_fewer_operators_after(tmp_path):
    out = tmp_path / "BN_STEP.md"
    assert bn_step.main(["--rounds", "1", "--repeats", "1", "--batch", "2", "--out", str(out)]) == 0
    rows = {cells[0]: cells[1:] for line in out.read_text().splitlines() if line.startswith("| ") and "runner" not in line
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    assert list(rows) == ["before", "after", "optim"]
    ops = {runner: float(cells[1]) for runner, cells in rows.items()}
    assert all(float(cells[0]) > 0 for cells in rows.values())  # ms per step
    assert ops["after"] < ops["before"]  # the hooks' mean and variance per BatchNorm layer are gone
    assert ops["after"] <= ops["optim"] * 1.05  # about what nn.Module + torch.optim dispatch


def test_asking_for_cuda_without_one_fails_in_one_line(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert bn_step.main(["--device", "cuda", "--out", str(tmp_path / "BN_STEP.md")]) == 2
    assert capsys.readouterr().err.splitlines() == ["bn_step.py: error: --device cuda but torch sees no CUDA GPU"]
    assert not (tmp_path / "BN_STEP.md").exists()
