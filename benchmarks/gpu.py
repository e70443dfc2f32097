"""Many clients per GPU: ResNet20 and conv4 MAML client training on one GPU, with the GPU's busy share sampled.

    python benchmarks/gpu.py                              # on a GPU machine: writes benchmarks/GPU.md (--budget-s 510)
    python benchmarks/gpu.py --tiny --device cpu --backend local --out X.md   # a seconds-long smoke run anywhere

Data: CIFAR-shaped images that this script generates (seeded; uint8 [N, 3, 32, 32], the class shifting each
image's mean so that there is something to learn) and writes in torchvision's CIFAR-10 format to a temporary
data root; the real loader reads them (``verify_md5: false``), so no download. Workloads (``imbalanced-binary``,
ResNet20 with BatchNorm, 5 local steps of batch 32): FedAvg and LocalSCGDAM with 100 and 1,000 clients, 10
and 100 of them a round; conv4 MAML on the offline few-shot MNIST task (FCSG-M and Local-SCGDM, 16 clients);
the small invariant-logreg model (FCSG-M, 16 clients) one at a time and in lockstep (``vmap``); and the
1,000-client FedAvg round once more with ``run.deterministic: false`` (what determinism costs).

On a GPU the Ray backend packs clients with ``federation.gpu_packing: auto`` (a probe of one client's GPU
memory picks the clients per actor, ``--actors-per-gpu`` actors sharing the GPU; the choice is in the table).
Per workload: one warm-up round, then ``--rounds`` timed rounds; client steps/s = cohort x local steps x
rounds / seconds. GPU busy % and peak memory come from ``nvidia-smi`` sampled every 200 ms during the timed
rounds (the whole device: every actor's process and CUDA context). pfl runs beside fedcomp only where it is
importable (``benchmarks/peers.py`` installs it for its CPU workload); otherwise the table says so.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import common
from fedcomp.backends import make_server
from fedcomp.datasets.cifar import write_cifar_batches
from fedcomp.platform.config import load_config

TITLE = "# Many clients per GPU"


@dataclass(frozen=True)
class Workload:
    name: str
    base: Any
    overrides: dict[str, Any]
    clients: int
    cohort: int
    local_steps: int
    extra: dict[str, Any] = field(default_factory=dict)


def resnet(algorithm: str, clients: int, cohort: int, root: str, steps: int, batch: int, **extra: Any) -> Workload:
    task = {"name": "imbalanced-binary", "dataset": "cifar10", "construction": "ratio", "ratio": 0.1,
            "positive_rule": "first-half", "model": "resnet20", "root": root, "verify_md5": False}
    algo: dict[str, Any] = {"name": algorithm, "lr": 0.1, "local_steps": steps, "outer_batch": batch}
    if algorithm == "local-scgdam":
        algo["inner_batch"] = batch
    label = {"fedavg": "FedAvg", "local-scgdam": "LocalSCGDAM"}[algorithm]
    suffix = "".join(f", {k.split('.')[-1]} = {v}" for k, v in extra.items())
    return Workload(f"ResNet20 {label}{suffix}", {"task": task, "algorithm": algo}, {}, clients, cohort, steps, extra)


def workloads(root: str, tiny: bool) -> list[Workload]:
    """The benchmark's workloads; ``tiny``: the same kinds, a few clients, one step of small batches."""
    steps, batch = (1, 4) if tiny else (5, 32)
    sizes = [(4, 2)] if tiny else [(100, 10), (100, 100), (1000, 10), (1000, 100)]
    out = [resnet(a, k, c, root, steps, batch) for a in ("fedavg", "local-scgdam") for k, c in sizes]
    k, c = sizes[-1]
    out.append(resnet("fedavg", k, c, root, steps, batch, **{"run.deterministic": False}))
    maml_clients, maml_steps = (2, 1) if tiny else (16, 3)
    for algorithm, label in (("fcsg-m", "FCSG-M"), ("local-scgdm", "Local-SCGDM")):
        out.append(Workload(f"conv4 MAML {label}", "maml-fewshot-mnist",
                            {"algorithm.name": algorithm, "algorithm.local_steps": maml_steps, "task.eval_tasks": 5,
                             **({"task.channels": 8, "algorithm.outer_batch": 1} if tiny else {})},
                            maml_clients, maml_clients, maml_steps))
    logreg_clients, logreg_steps = (4, 5) if tiny else (16, 50)
    for vectorise in (False, True):
        out.append(Workload(f"invariant-logreg FCSG-M, {'lockstep vmap' if vectorise else 'one at a time'}",
                            "quickstart", {"task.test_samples": 200, "algorithm.local_steps": logreg_steps},
                            logreg_clients, logreg_clients, logreg_steps, {"federation.vectorise": vectorise}))
    return out


def write_data(root: Path, train: int, test: int, seed: int = 0) -> None:
    """CIFAR-10-shaped generated images in torchvision's format: class c's images centred on grey level 100 + 6c."""
    gen = np.random.default_rng(seed)
    for split, n in (("train", train), ("test", test)):
        labels = gen.integers(0, 10, n)
        noise = 40 * gen.standard_normal((n, 3, 32, 32), dtype=np.float32)
        images = np.clip(100 + 6 * labels[:, None, None, None] + noise, 0, 255).astype(np.uint8)
        write_cifar_batches(root, images, labels, "cifar10", split)


class GpuSampler:
    """``nvidia-smi`` sampling utilisation and memory of GPU 0 every ``period_ms`` while running (None: no nvidia-smi,
    or not ``active``: a run on the CPU of a machine that has a GPU samples nothing)."""

    def __init__(self, period_ms: int = 200, active: bool = True) -> None:
        self.period_ms = period_ms
        self.active = active
        self.samples: list[tuple[float, float]] = []
        self.process: subprocess.Popen[str] | None = None
        self.reader: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("nvidia-smi") is not None

    def __enter__(self) -> GpuSampler:
        if self.active and self.available():
            self.process = subprocess.Popen(
                ["nvidia-smi", "--id=0", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                 f"-lms={self.period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                busy, used = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((busy, used))

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
        if self.reader is not None:
            self.reader.join(timeout=5)

    def busy(self) -> float | None:
        return statistics.mean(b for b, _ in self.samples) if self.samples else None

    def peak_mib(self) -> float | None:
        return max(u for _, u in self.samples) if self.samples else None


def measure(work: Workload, device: str, backend: str, rounds: int, actors_per_gpu: int) -> dict[str, Any]:
    """Warm up one round, time ``rounds`` rounds; the row's numbers and the packing the run chose."""
    sets: dict[str, Any] = {**work.overrides, "federation.clients": work.clients,
                            "federation.clients_per_round": work.cohort, "federation.backend": backend,
                            "run.progress": "none", "run.track": "none", **work.extra}
    if device == "cuda":
        sets.update({"federation.gpus_per_client": "auto", "federation.gpu_packing": "auto",
                     "federation.actors_per_gpu": actors_per_gpu})
    else:
        sets.update({"federation.gpus_per_client": 0, "federation.clients_per_actor": math.ceil(work.clients / 2)})
    config = load_config(work.base, sets)
    server = make_server(config)
    try:
        server.run_round()
        with GpuSampler(active=device == "cuda") as sampler:  # a CPU run's rows say no GPU was sampled
            started = time.perf_counter()
            for _ in range(rounds):
                server.run_round()
            seconds = time.perf_counter() - started
        backend_info = server.describe() if hasattr(server, "describe") else {}
    finally:
        server.close()
    steps = work.cohort * work.local_steps * rounds
    return {"rounds_s": rounds / seconds, "steps_s": steps / seconds, "round_s": seconds / rounds,
            "busy": sampler.busy(), "peak_mib": sampler.peak_mib(), "backend": backend_info}


def packing(info: dict[str, Any]) -> str:
    if info.get("name") != "ray":
        return "1 in-process host"
    return f"{info.get('client_actors')} actors x {info.get('clients_per_actor')}"


def fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def rate(value: float) -> str:
    """A rate with three significant figures, without an exponent (1,520 rather than 1.52e+03)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def pfl_line() -> str:
    try:
        import pfl  # noqa: F401
    except ImportError:
        return ("pfl: not importable in this environment, so no pfl rows; `benchmarks/peers.py` compares with pfl on "
                "its CPU workload.")
    return ("pfl is importable here, but this script has no pfl ResNet20 runner yet: pfl's numbers on this GPU are "
            "still to be taken.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--backend", choices=("ray", "local"), default="ray")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long smoke run: few clients, small data")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per workload (default 3; --tiny 1)")
    parser.add_argument("--actors-per-gpu", type=int, default=4)
    parser.add_argument("--only", default="", help="comma-separated texts: run only the workloads whose name holds one")
    parser.add_argument("--out", default=str(common.HERE / "GPU.md"))
    parser.add_argument("--budget-s", type=float, default=510.0,
                        help="start no workload after this many seconds (its row says skipped); default fits a 10-minute slot")
    args = parser.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu.py: error: --device cuda but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    rounds = args.rounds or (1 if args.tiny else 3)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    stopwatch = common.Stopwatch()
    rows = [
        "| workload | clients | per round | packing | s/round | rounds/s | client steps/s | GPU busy % | peak GPU MiB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    packings: list[str] = []
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "no GPU (CPU run)"

    def write(final: bool) -> str:
        """The report as it stands (rewritten after every workload, so that a run cut short keeps its rows)."""
        intro = (
            f"{common.generated_by()}, device {device} ({gpu}), backend {args.backend}, {rounds} timed round(s) per "
            f"workload after one warm-up round, started {stopwatch.started_at}"
            f"{'' if final else ' (in progress: the run had not finished)'}. See the script's docstring for the "
            f"workloads and how each number is taken."
        )
        text = "\n".join([TITLE, "", intro, "", *rows, "", pfl_line(), ""])
        if packings:
            text += "\nPacking chosen by `federation.gpu_packing: auto` (probed bytes):\n\n" + "\n".join(packings) + "\n"
        Path(args.out).write_text(text)
        return text

    with tempfile.TemporaryDirectory(prefix="fedcomp-gpu-") as tmp:
        write_data(Path(tmp), 300 if args.tiny else 50_000, 100 if args.tiny else 2_000)
        for work in workloads(tmp, args.tiny):
            if args.only and not any(part and part in work.name for part in args.only.split(",")):
                continue
            if time.time() - stopwatch.start > args.budget_s:
                rows.append(f"| {work.name} | {work.clients} | {work.cohort} | skipped: past --budget-s "
                            f"{args.budget_s:g} | | | | | |")
                continue
            stopwatch.log(f"{work.name}: {work.clients} clients, {work.cohort} a round")
            try:
                m = measure(work, device, args.backend, rounds, args.actors_per_gpu)
            except Exception as error:  # a workload that cannot run here is a row saying why, not a lost report
                first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
                rows.append(f"| {work.name} | {work.clients} | {work.cohort} | failed: {first} | | | | | |")
                write(final=False)
                continue
            info = m["backend"]
            if info.get("gpu_packing"):
                packings.append(f"- {work.name}, {work.clients} clients: {info['gpu_packing']}")
            rows.append(
                f"| {work.name} | {work.clients} | {work.cohort} | {packing(info)} | {m['round_s']:.3f} | "
                f"{rate(m['rounds_s'])} | {rate(m['steps_s'])} | {fmt(m['busy'], '.0f')} | {fmt(m['peak_mib'], '.0f')} |"
            )
            write(final=False)
    print(write(final=True))
    return 0

if __name__ == "__main__":
    sys.exit(main())
