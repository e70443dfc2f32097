"""benchmarks/maml_kernels.py: a short run writes both tables, with the contrast between the widths it reports; and
the MAML device check it serves: at 16 filters the first meta-gradient hangs so little on the conv kernels that
CPU vs CUDA can be held to float32 rounding (at the paper's 64 it cannot: the table)."""

from __future__ import annotations

import maml_kernels
import pytest
import torch

from tests.platform.test_gpu import CPU_VS_CUDA_RTOL, CUDA


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


MAML_CHECK_CHANNELS = 16
"""The conv4 width of the MAML meta-gradient checks. At the paper's 64 filters the first meta-gradient itself hangs
on the kernels (oneDNN's and PyTorch's own CPU convs: 1.1% apart second-order, 0.2% first-order, losses 3e-5
apart: MAML_KERNELS.md); at 16 the two CPU families agree to 6.5e-5, and an H200 agreed with the CPU to 6.0e-5
(7.7e-6 first-order; 2026-12-04, by this computation in a one-off script)."""


def _relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("order", ["second-order", "first-order"])
def test_the_maml_meta_gradient_is_well_conditioned_across_cpu_kernels(order: str) -> None:
    """The premise of the CUDA check below: two CPU conv-kernel families give meta-gradients well inside its
    tolerance, so a CPU-vs-CUDA gap above it would be the device's doing, not the model's."""
    (with_onednn, _), (without, _) = (maml_kernels.meta_gradient(MAML_CHECK_CHANNELS, order, onednn)
                                      for onednn in (True, False))
    assert _relative_gap(with_onednn, without) < CPU_VS_CUDA_RTOL / 10


@CUDA
@pytest.mark.parametrize("order", ["second-order", "first-order"])
def test_cpu_and_cuda_maml_meta_gradients_agree(order: str) -> None:
    """The MAML path on CUDA (episodes cut on the device, adaptation, differentiating through it) computes the
    CPU's meta-gradient to float32 rounding."""
    (on_cuda, _), (on_cpu, _) = (maml_kernels.meta_gradient(MAML_CHECK_CHANNELS, order, device=device)
                                 for device in ("cuda", "cpu"))
    assert _relative_gap(on_cuda, on_cpu) < CPU_VS_CUDA_RTOL
