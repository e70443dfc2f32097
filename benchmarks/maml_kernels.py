"""How far apart do two kernel families put the paper's MAML? The same run on one CPU with oneDNN's conv kernels
and with PyTorch's own; writes ``benchmarks/MAML_KERNELS.md``.

    python benchmarks/maml_kernels.py [--rounds 2] [--out benchmarks/MAML_KERNELS.md]

Why: on one H200 (``benchmarks/GPU.md``) FCSG-M's few-shot MNIST MAML ended 2 rounds 8% from the CPU in test
loss, while the logistic and MLP cases agreed to float32 rounding. Switching the CPU's conv kernels
(``torch.backends.mkldnn.flags``) is a perturbation of the same size as moving to another device -- the same
arithmetic summed in another order -- and needs no GPU. For each conv4 width the report gives the relative gap
between the two kernel families in the first meta-gradient of FCSG (at the initial point, second- and
first-order MAML; the loss beside it) and in every metric after each round of a short run (4 clients, 2 local
steps, 10 held-out tasks; the ``maml-fewshot-mnist`` preset otherwise). Same machine, same seed, one process.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

import fedcomp
from common import HERE, generated_by, publish
from fedcomp.platform.accelerator import configure
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_task
from fedcomp.platform.oracles import grad_and_loss
from fedcomp.platform.rng import generator

WIDTHS = (64, 16)
METRICS = ("train_loss", "test_loss", "test_accuracy")


@contextmanager
def kernels(onednn: bool) -> Iterator[None]:
    with warnings.catch_warnings(), torch.backends.mkldnn.flags(enabled=onednn):
        warnings.simplefilter("ignore", UserWarning)  # "TF32 acceleration on top of oneDNN ..." on CPU-only builds
        yield


def meta_gradient(channels: int, order: str, onednn: bool = True, device: str = "cpu") -> tuple[torch.Tensor, float]:
    """FCSG's meta-gradient at the initial point of client 1's first 5 episodes (a float64 copy on the CPU) and
    its loss, computed on ``device`` (on the CPU with or without oneDNN's conv kernels); the CUDA tests compare
    the two devices with it."""
    config = load_config("maml-fewshot-mnist", {"federation.clients": 4, "task.channels": channels, "task.maml": order})
    configure(device, deterministic=True)
    with kernels(onednn):
        task: Any = build_task(config, device)
        problem = task.problem("conditional")
        x = task.init_params(generator(0, "init"))["x"].to(device)
        gen = generator(0, "draw")
        outer = problem.sample_outer(1, 5, gen)
        grad, loss = grad_and_loss(problem, x, outer, problem.sample_inner(1, outer, 5, gen))
    return grad.detach().cpu().double(), float(loss)


def run_metrics(channels: int, rounds: int, onednn: bool, out: str) -> np.ndarray:
    overrides = {"federation.backend": "local", "federation.gpus_per_client": 0, "run.progress": "none",
                 "run.track": "none", "run.out": out, "federation.clients": 4, "algorithm.local_steps": 2,
                 "run.rounds": rounds, "run.eval_every": 1, "task.eval_tasks": 10, "task.channels": channels}
    with kernels(onednn):
        metrics = fedcomp.run("maml-fewshot-mnist", overrides).metrics
    return metrics[list(METRICS)].to_numpy(float)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(HERE / "MAML_KERNELS.md"))
    args = parser.parse_args(argv)
    gradient_rows, run_rows = [], []
    with tempfile.TemporaryDirectory(prefix="fedcomp-maml-kernels-") as tmp:
        for channels in WIDTHS:
            for order in ("second-order", "first-order"):
                print(f"maml_kernels: {channels} filters, {order} meta-gradient", file=sys.stderr, flush=True)
                (g1, l1), (g0, l0) = (meta_gradient(channels, order, onednn) for onednn in (True, False))
                gradient_rows.append(f"| {channels} | {order} | {float((g1 - g0).norm() / g0.norm()):.1e} | "
                                     f"{abs(l1 - l0) / abs(l0):.1e} |")
            print(f"maml_kernels: {channels} filters, {args.rounds}-round runs", file=sys.stderr, flush=True)
            with_onednn, without = (run_metrics(channels, args.rounds, onednn, f"{tmp}/{channels}-{onednn}")
                                    for onednn in (True, False))
            for r in range(with_onednn.shape[0]):
                gaps = [abs(a - b) / abs(b) if np.isfinite(b) and b else float("nan")
                        for a, b in zip(with_onednn[r], without[r])]
                run_rows.append(f"| {channels} | {r} | " + " | ".join("—" if np.isnan(g) else f"{g:.1e}" for g in gaps)
                                + " |")
    text = "\n".join([
        "# The paper's MAML under two kernel families", "",
        generated_by() + ". See the script's docstring for what is compared.", "",
        "First meta-gradient of FCSG at the initial point, oneDNN's conv kernels against PyTorch's own:", "",
        "| filters | MAML | gradient: relative gap (norm) | loss: relative gap |", "|---:|:---|---:|---:|",
        *gradient_rows, "",
        f"A {args.rounds}-round FCSG-M run (relative gap of each metric after each round; round 0 is the initial model):",
        "", "| filters | round | " + " | ".join(METRICS) + " |", "|---:|---:|" + "---:|" * len(METRICS), *run_rows, "",
    ])
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
