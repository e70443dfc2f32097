"""What FedDRO's per-step exchange of the inner value costs on the Ray backend.

Runs FedDRO (y, d_g = 2 floats, averaged every local step; the model every I steps) and vanilla FedAvg for
compositional problems, case I (the same local steps, no per-step exchange) on the
``heterogeneous-composition`` task with 8 clients packed into 2 client actors, for a small (d = 10) and a
large (d = 1,000,000) model, and prints the wall time per local step of each and their difference: the
cost of one per-step exchange. The model never travels in a per-step exchange (it stays on the clients
between model rounds), so the cost should not grow with d. Median over rounds of ``--repeats`` runs.

    python benchmarks/feddro_exchange.py [--rounds 20] [--local-steps 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from fedcomp.actors.cluster import connect
from fedcomp.api import make_server
from fedcomp.platform.config import load_config


def per_step_ms(algorithm: str, dim: int, backend: str, rounds: int, steps: int) -> float:
    config = load_config(
        {"task": {"name": "heterogeneous-composition", "dim": dim},
         "algorithm": {"name": algorithm, "lr": 0.1, "local_steps": steps},
         "federation": {"clients": 8, "clients_per_actor": 4, "backend": backend},
         "run": {"rounds": rounds, "progress": "none"}}
    )
    server = make_server(config)
    try:
        server.run_round()  # warm-up (and FedDRO's initial estimate)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            server.run_round()
            times.append(time.perf_counter() - start)
    finally:
        server.close()
    return 1000 * statistics.median(times) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cluster = connect()
    print(f"machine: {platform.processor() or platform.machine()}, {int(cluster.get('CPU', 0))} CPUs for Ray; "
          f"8 clients in 2 client actors; I = {args.local_steps}; median of {args.rounds} rounds x {args.repeats} runs\n")
    print("| model size d | backend | FedDRO (ms / local step) | FedAvg-CO case I (ms / local step) | difference (ms) |")
    print("|---:|---|---:|---:|---:|")
    exchange = {}
    for dim in (10, 1_000_000):
        diff = {}
        for backend in ("ray", "local"):
            dro = statistics.median(per_step_ms("feddro", dim, backend, args.rounds, args.local_steps) for _ in range(args.repeats))
            van = statistics.median(per_step_ms("fedavg-co-1", dim, backend, args.rounds, args.local_steps) for _ in range(args.repeats))
            diff[backend] = dro - van
            print(f"| {dim:,} | {backend} | {dro:.2f} | {van:.2f} | {dro - van:+.2f} |")
        exchange[dim] = diff["ray"] - diff["local"]
    print()
    print("The local backend's difference is FedDRO's extra computation (g_k at two points); what the Ray backend")
    print("adds on top of it is the per-step exchange itself: " + ", ".join(
        f"{ms:.2f} ms per local step at d = {dim:,}" for dim, ms in exchange.items()) + ".")


if __name__ == "__main__":
    main()
