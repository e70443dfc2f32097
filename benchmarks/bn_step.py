"""A BatchNorm network's local step: fedcomp's local backend against an in-place torch.optim loop on ResNet20;
writes ``benchmarks/BN_STEP.md``.

    python benchmarks/bn_step.py [--rounds 10] [--repeats 3] [--batch 8] [--device cpu] [--out benchmarks/BN_STEP.md]

Why: on one H200 (``benchmarks/GPU.md``) a ResNet20 client step of 32 images took about 15 ms in one process
with the GPU 26-28% busy -- bound by the host, which pays for every operator it dispatches (on a GPU about one
kernel launch each). So besides the time on this CPU the report counts the aten operators a local step
dispatches (a ``TorchDispatchMode`` over one round), which does not depend on the machine or its load.

Workload: ``imbalanced-binary`` on CIFAR-shaped images that ``benchmarks/gpu.py`` generates (written in
torchvision's format, read by the real loader), ResNet20 with BatchNorm running statistics, FedAvg, one client
a round taking 5 local SGD steps (lr 0.1) of ``--batch`` images, local backend, one torch thread. Runners, in
this process, alternating within each repeat:

* ``before``: ``FlatModel.kernel_statistics`` off -- forward pre-hooks record each BatchNorm layer's batch mean
  and variance and the momentum rule is applied outside the kernels (the previous revision's path, still the one
  inside ``torch.func`` transforms);
* ``after``: as built (under plain autograd the BatchNorm kernels move a copy of the running statistics);
* ``optim``: an ``nn.Module`` ResNet20 with its own BatchNorm buffers, ``torch.optim.SGD`` in place, BCE on
  batches the task draws (the same loss, network and batch shapes; not the same draws, so no weight hashes).

ms per local step = round time / 5 (median over rounds, then over repeats), so fedcomp's columns include the
round's share of broadcasting and averaging the 269 k weights, which the optim loop does not do. With ``--device
cuda`` every runner computes on the GPU (data held there, ``run.deterministic`` as configured: on) and a round's
time ends with ``torch.cuda.synchronize()``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import gpu
from common import HERE, generated_by, publish
from fedcomp.backends import make_server
from fedcomp.bench import load_average
from fedcomp.models.functional import FlatModel
from fedcomp.models.resnet import resnet20
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_task
from fedcomp.platform.rng import generator

LOCAL_STEPS = 5
RUNNERS = ("before", "after", "optim")


class OperatorCount(TorchDispatchMode):
    """Counts the aten operators dispatched while active (backward ones included)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def config(root: str, batch: int, device: str) -> Any:
    work = gpu.resnet("fedavg", 2, 1, root, LOCAL_STEPS, batch)
    return load_config(work.base, {
        "federation.clients": 2, "federation.clients_per_round": 1, "federation.backend": "local",
        "federation.gpus_per_client": 1 if device == "cuda" else 0, "run.progress": "none", "run.track": "none",
        "run.rounds": 10**6, "run.eval_every": 10**6,
    })  # fmt: skip


def fedcomp_round(root: str, batch: int, device: str, kernel_statistics: bool) -> tuple[Callable[[], None], Callable[[], None]]:
    """(one round, close) of the local backend with ``FlatModel.kernel_statistics`` as given."""
    FlatModel.kernel_statistics = kernel_statistics
    server = make_server(config(root, batch, device))
    return server.run_round, server.close


def optim_round(root: str, batch: int, device: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """(one round of 5 in-place SGD steps on an nn.Module ResNet20, nothing to close)."""
    task: Any = build_task(config(root, batch, device), device)
    module = resnet20(1, running_stats=True).train().to(device)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    gen = generator(0, "bn-step")

    def one_round() -> None:
        for _ in range(LOCAL_STEPS):
            features, labels = task.sample_batch(0, batch, gen)
            optimizer.zero_grad(set_to_none=True)
            F.binary_cross_entropy_with_logits(module(features).reshape(-1), labels.float()).backward()
            optimizer.step()

    return one_round, lambda: None


def measure(runner: str, root: str, batch: int, rounds: int, device: str) -> tuple[float, float]:
    """(median ms per local step, aten operators per local step) of one runner after a warm-up round."""
    if runner == "optim":
        run_round, close = optim_round(root, batch, device)
    else:
        run_round, close = fedcomp_round(root, batch, device, kernel_statistics=runner == "after")

    def one_round() -> None:
        run_round()
        if device == "cuda":
            torch.cuda.synchronize()

    try:
        one_round()
        with OperatorCount() as ops:
            one_round()
        seconds = []
        for _ in range(rounds):
            started = time.perf_counter()
            one_round()
            seconds.append(time.perf_counter() - started)
    finally:
        close()
        FlatModel.kernel_statistics = True
    return statistics.median(seconds) * 1e3 / LOCAL_STEPS, ops.count / LOCAL_STEPS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", default=str(HERE / "BN_STEP.md"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bn_step.py: error: --device cuda but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    load_before = load_average()
    ms: dict[str, list[float]] = {r: [] for r in RUNNERS}
    ops: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fedcomp-bn-step-") as root:
        gpu.write_data(Path(root), 1_000, 100)
        for repeat in range(args.repeats):
            for runner in RUNNERS:
                print(f"bn_step: repeat {repeat + 1}/{args.repeats}, {runner}", file=sys.stderr, flush=True)
                step_ms, ops[runner] = measure(runner, root, args.batch, args.rounds, args.device)
                ms[runner].append(step_ms)
    median = {r: statistics.median(v) for r, v in ms.items()}
    paired = [a / o for a, o in zip(ms["after"], ms["optim"])]
    lines = [
        "# A BatchNorm network's local step: fedcomp's local backend vs an in-place torch.optim loop", "",
        generated_by() + f"; load average before: {load_before}, after: {load_average()} (a shared machine: other "
        "work inflates every time alike, the runners alternate within each repeat; the operator counts do not move).",
        "",
        f"ResNet20 with BatchNorm running statistics, FedAvg, 1 client a round, {LOCAL_STEPS} local SGD steps of "
        f"{args.batch} CIFAR-shaped images on the {args.device.upper()}, {args.rounds} rounds, median over rounds then over {args.repeats} "
        "repeats; one torch thread. See the script's docstring for the runners.", "",
        "| runner | ms per local step | aten operators per local step | ms / optim's | operators / optim's |",
        "|:---|---:|---:|---:|---:|",
        *(f"| {r} | {median[r]:.2f} | {ops[r]:.0f} | {median[r] / median['optim']:.2f} | "
          f"{ops[r] / ops['optim']:.2f} |" for r in RUNNERS),
        "",
        f"after / optim paired within each repeat: median {statistics.median(paired):.2f} "
        f"(range {min(paired):.2f}-{max(paired):.2f}); before / after: {median['before'] / median['after']:.2f}x.",
    ]
    publish("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
