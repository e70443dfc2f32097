"""What a Tune sweep costs over running the same runs yourself: a grid of 12 tiny runs on 2 CPUs, as a
sweep and one after another in one process, for both backends of the trials.

    python benchmarks/sweep_overhead.py          # prints a markdown table and writes benchmarks/SWEEP.md

Per backend: the sweep's wall time, the same 12 runs' wall time in sequence (``fedcomp.run`` in this
process, the same Ray instance for the Ray backend), their ratio, and the per-trial overhead: the trial slots the sweep
used (concurrent trials x its wall time) less the runs' own training time, per trial -- Tune's trial process and
bookkeeping, building the task, and for the Ray backend starting the server and client actors. Numbers are measured, never asserted: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from pathlib import Path

import common
import fedcomp
from fedcomp.actors.cluster import connect

WORKLOAD = {
    "task.test_samples": 5000,
    "federation.clients": 4,
    "federation.clients_per_actor": 2,
    "algorithm.local_steps": 10,
    "run.rounds": 10,
    "run.eval_every": 5,
    "run.progress": "none",
}
GRID = {"algorithm.lr": [0.01, 0.005, 0.001], "algorithm.beta": [0.1, 0.9]}
SEEDS = 2
CONCURRENT = 2


def measure(backend: str, root: Path) -> dict[str, float]:
    overrides = {**WORKLOAD, "federation.backend": backend, "run.out": str(root / backend)}
    started = time.perf_counter()
    result = fedcomp.sweep({"base": "quickstart", "set": overrides, "grid": GRID, "seeds": SEEDS, "cpus_per_trial": 1.0})
    sweep_s = time.perf_counter() - started
    points = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    started = time.perf_counter()
    for seed in range(SEEDS):
        for point in points:
            fedcomp.run("quickstart", {**overrides, **point, "run.seed": seed})
    sequential_s = time.perf_counter() - started
    n = result.trials["trial"].nunique()
    # Two trials run at a time (cpus_per_trial = 1 on 2 CPUs): the sweep had 2 x its wall time of trial slots.
    overhead = (CONCURRENT * sweep_s - common.trials_seconds(result.trials)) / n
    return {"trials": n, "sweep_s": sweep_s, "sequential_s": sequential_s, "startup_s": overhead}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cpus = connect()["CPU"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            rows.append((backend, measure(backend, Path(tmp))))
    intro = (
        f"{common.generated_by()}, Ray with {cpus:g} CPUs, cpus_per_trial = 1 (two trials at a time). Workload: "
        f"invariant-logreg FCSG-M, 4 clients (2 client actors), q = 10, 10 rounds; grid lr {GRID['algorithm.lr']} x "
        f"beta {GRID['algorithm.beta']} x {SEEDS} seeds."
    )
    lines = [
        "| trial backend | trials | sweep wall (s) | same runs in sequence (s) | sequence / sweep | per-trial overhead (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for backend, r in rows:
        lines.append(
            f"| {backend} | {r['trials']} | {r['sweep_s']:.1f} | {r['sequential_s']:.1f} | "
            f"{r['sequential_s'] / r['sweep_s']:.2f} | {r['startup_s']:.2f} |"
        )
    common.table_report(common.HERE / "SWEEP.md", "# A sweep of 12 tiny runs vs the same runs in sequence", intro,
                        lines)


if __name__ == "__main__":
    main()
