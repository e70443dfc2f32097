"""``benchmarks/gpu.py``: its CPU smoke mode writes a report whose rows carry measured rates (the GPU columns
stay empty without a GPU); on a GPU machine the same script writes ``benchmarks/GPU.md``."""

from __future__ import annotations

import numpy as np

import gpu
from fedcomp.datasets.cifar import load_cifar


def test_generated_data_is_cifar_shaped_and_read_by_the_real_loader(tmp_path):
    gpu.write_data(tmp_path, 50, 20)
    images, labels = load_cifar("cifar10", "train", tmp_path, verify_md5=False)
    assert tuple(images.shape) == (50, 3, 32, 32) and images.dtype.is_floating_point is False
    test_images, _ = load_cifar("cifar10", "test", tmp_path, verify_md5=False)
    assert test_images.shape[0] == 20
    # the class moves the mean, so there is something to learn
    means = [float(images[labels == c].float().mean()) for c in labels.unique()]
    assert np.corrcoef(labels.unique().numpy(), means)[0, 1] > 0.9


def test_tiny_cpu_run_writes_a_report_with_measured_rates(tmp_path):
    out = tmp_path / "GPU.md"
    code = gpu.main(["--tiny", "--device", "cpu", "--backend", "local", "--only", "ResNet20 FedAvg,invariant-logreg",
                     "--out", str(out)])
    assert code == 0
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| workload")]
    names = [row.split(" | ")[0].lstrip("| ") for row in rows]
    assert names == ["ResNet20 FedAvg", "ResNet20 FedAvg, deterministic = False",
                     "invariant-logreg FCSG-M, one at a time", "invariant-logreg FCSG-M, lockstep vmap"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert "failed" not in cells[3]
        assert float(cells[5].replace(",", "")) > 0 and float(cells[6].replace(",", "")) > 0  # rounds/s, steps/s
        assert cells[7] == "—" and cells[8] == "—"  # no GPU sampled on the CPU
    assert "device cpu" in text


def test_asking_for_cuda_without_one_fails_in_one_line(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        return
    assert gpu.main(["--device", "cuda", "--out", str(tmp_path / "x.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpu.py: error: --device cuda but torch sees no CUDA GPU"]
    assert list(tmp_path.iterdir()) == []


def test_workloads_past_the_time_budget_are_listed_as_skipped(tmp_path):
    out = tmp_path / "GPU.md"
    assert gpu.main(["--tiny", "--device", "cpu", "--backend", "local", "--only", "invariant-logreg",
                     "--budget-s", "0", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| invariant-logreg")]
    assert len(rows) == 2 and all("skipped: past --budget-s 0" in row for row in rows)
