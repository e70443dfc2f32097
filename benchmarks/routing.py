"""Balanced routing against routing by hosting actor, side by side on the same Ray and the same actors; writes
``benchmarks/ROUTING.md``.

    python benchmarks/routing.py [--rounds 20] [--repeats 5] [--out benchmarks/ROUTING.md]

Workload: ``fedcomp bench``'s FedAvg (10 clients per round, 5 local SGD steps of batch 16, lr 0.05, one torch
thread per process) on the small MLP 32-64-10 and the heavy MLP 32-1024-1024-10, 100 clients packed into 2
client actors, the round program in a server actor. One local Ray serves every run and the actors are kept
between runs (:mod:`fedcomp.actors.kept`, as a Tune trial process keeps them), so a run's time is its rounds
only; ``federation.routing`` alternates (balanced, home) within every repeat. A run's round time is the median
over its rounds; the report gives the median over repeats of each routing, the ratio paired within each
repeat (median and range) and the busier actor's share of a cohort under each routing. The peers harness
(``peers.py``, one process per run) measures the same difference with more noise between runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from common import HERE, generated_by, publish
from fedcomp.actors import kept
from fedcomp.actors.cluster import connect
from fedcomp.bench import bench_config, busier_share, load_average, run_fedcomp, weights_hash

WORKLOADS = {"small MLP 32-64-10": [64], "heavy MLP 32-1024-1024-10": [1024, 1024]}
CLIENTS, COHORT, LOCAL_STEPS = 100, 10, 5
ROUTINGS = ("balanced", "home")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "ROUTING.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = load_average()
    connect()
    kept.keep_between_runs()
    rows = []
    try:
        for label, hidden in WORKLOADS.items():
            times: dict[str, list[float]] = {r: [] for r in ROUTINGS}
            hashes: set[str] = set()
            for repeat in range(args.repeats):
                for routing in ROUTINGS:
                    print(f"routing: {label}, repeat {repeat + 1}/{args.repeats}, {routing}", file=sys.stderr, flush=True)
                    config = bench_config(CLIENTS, COHORT, args.rounds, LOCAL_STEPS, hidden, "ray", server="actor", routing=routing)
                    m = run_fedcomp(config, "ray", repeat)
                    times[routing].append(m.median_round_s)
                    hashes.add(weights_hash(m.final))
            ms = {r: statistics.median(t) * 1e3 for r, t in times.items()}
            paired = [b / h for b, h in zip(times["balanced"], times["home"])]
            share = {r: busier_share(CLIENTS, COHORT, args.rounds, r) for r in ROUTINGS}
            rows.append(
                f"| {label} | {ms['balanced']:.1f} | {ms['home']:.1f} | {ms['balanced'] / ms['home']:.2f} | "
                f"{statistics.median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f}) | "
                f"{share['balanced']:.2f} / {share['home']:.2f} | {', '.join(sorted(hashes))} |"
            )
    finally:
        kept.keep_between_runs(False)
    lines = [
        "# Balanced routing against routing by hosting actor", "",
        generated_by() + f"; load average before: {load_before}, after: {load_average()} (a shared 2-core "
        "machine: the routings alternate within each repeat).", "",
        f"FedAvg, {CLIENTS} clients in 2 client actors + a server actor, {COHORT} per round, {LOCAL_STEPS} local SGD "
        f"steps of batch 16, lr 0.05, {args.rounds} rounds; median round time per run, then median over "
        f"{args.repeats} repeats. Busier actor: the cohort members the busier of the 2 actors runs, mean over the "
        "rounds (round 0 goes by hosting actor under both: the first call of a program learns whether it leaves "
        "private state). Hashes: every run's final weights.", "",
        "| workload | balanced (ms/round) | home (ms/round) | balanced / home | paired per repeat (range) "
        "| busier actor's clients of 10 (balanced / home) | final weights sha256 |",
        "|:---|---:|---:|---:|---:|---:|:---|",
        *rows,
    ]
    publish("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
