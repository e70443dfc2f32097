"""Lockstep (``torch.func.vmap``) vs one-at-a-time local steps, side by side in one run.

    python benchmarks/vectorised.py [--rounds 10] [--repeats 3]   # prints a table, writes benchmarks/VECTORISED.md
    python benchmarks/vectorised.py --profile   # where a lockstep round of the large MLP spends its time (prints only)

Workloads: the invariant logistic regression task of the FCSG paper (16 clients, d = 10, q = 50, m = 10,
FCSG-M), the sinewave task with Local-SCGDM when it is registered, and FedAvg on the peers benchmark's small
(32-64-10) and heavy (32-1024-1024-10) MLPs -- on the local backend (every client in one host) and on the
Ray backend (the clients in 2 client actors, each stepping its share of the cohort together). Per workload
and setting: the median
per-round time over rounds and repeats, the speed-up, and the largest difference of the final metrics
between the two paths (float32 rounding; see ``fedcomp/platform/vectorised.py``). Measured, not asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import common
from fedcomp.api import make_server
from fedcomp.platform.catalog import load_builtins
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_algorithm, build_task
from fedcomp.platform.registry import TASKS
from fedcomp.platform.vectorised import can_lockstep

TITLE = "# Lockstep (vmap) vs one-at-a-time local steps"

def mlp_fedavg(hidden: list[int], clients: int) -> tuple[dict, dict]:
    """FedAvg on the peers benchmark's workload (benchmarks/peers.py): 10 clients a round, 5 steps of batch 16."""
    return ({"task": {"name": "synthetic-classification", "hidden": hidden},
             "algorithm": {"name": "fedavg", "lr": 0.05, "local_steps": 5, "outer_batch": 16}},
            {"run.progress": "none", "federation.clients": clients, "federation.clients_per_round": 10})


WORKLOADS = {
    "invariant-logreg, FCSG-M, 16 clients, d = 10, q = 50, m = 10": (
        "quickstart", {"task.test_samples": 2000, "run.progress": "none", "federation.clients": 16}),
    "sinewave, Local-SCGDM, 16 clients": (
        {"task": {"name": "sinewave"}, "algorithm": {"name": "local-scgdm"}}, {"run.progress": "none", "federation.clients": 16}),
    "MLP 32-64-10 (2,762 weights), FedAvg, 10 of 1,000 clients, q = 5": mlp_fedavg([64], 1000),
    "MLP 32-1024-1024-10 (1.1 M weights), FedAvg, 10 of 100 clients, q = 5": mlp_fedavg([1024, 1024], 100),
}
RAY_ACTORS = 2


def time_rounds(base, overrides: dict, backend: str, vectorise: bool, rounds: int) -> tuple[float, dict]:
    clients = int(overrides["federation.clients"])
    per_actor = clients if backend == "local" else -(-clients // RAY_ACTORS)
    config = load_config(base, {**overrides, "federation.backend": backend, "federation.vectorise": vectorise,
                                "federation.clients_per_actor": per_actor, "run.rounds": rounds})
    server = make_server(config)
    try:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            server.run_round()
            times.append(time.perf_counter() - started)
        return statistics.median(times), server.evaluate()
    finally:
        server.close()


def profile_lockstep(rounds: int = 2) -> None:
    """Print the operators a lockstep round of the large MLP spends most time in (``torch.profiler``, the local
    backend, per round after a warm-up round): why lockstep is slower than one at a time for large models."""
    from torch.profiler import ProfilerActivity, profile

    name = next(n for n in WORKLOADS if n.startswith("MLP 32-1024"))
    base, overrides = WORKLOADS[name]
    config = load_config(base, {**overrides, "federation.backend": "local", "federation.vectorise": True,
                                "federation.clients_per_actor": int(overrides["federation.clients"])})
    server = make_server(config)
    try:
        server.run_round()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(rounds):
                server.run_round()
    finally:
        server.close()
    print(f"{name}, local backend, lockstep: self CPU time per round by operator ({common.generated_by()})")
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    for event in events[:6]:
        print(f"  {event.key[:40]:<40} {event.self_cpu_time_total / 1e6 / rounds:6.3f} s  ({event.count // rounds} calls)")
    print(f"  {'all operators':<40} {total / 1e6 / rounds:6.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--publish", action="store_true", help="only copy the last VECTORISED.md into RESULTS.md")
    parser.add_argument("--profile", action="store_true", help="only profile a lockstep round of the large MLP")
    args = parser.parse_args()
    if args.profile:
        torch.set_num_threads(1)
        load_builtins()
        profile_lockstep()
        return
    if args.publish:
        publish((common.HERE / "VECTORISED.md").read_text())
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    torch.set_num_threads(1)
    load_builtins()
    load_before = common.load_average()
    lines = [
        "| workload | backend | lockstep applies | one at a time (ms/round) | lockstep vmap (ms/round) | speed-up | max metric difference |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, (base, overrides) in WORKLOADS.items():
        task = base["task"]["name"] if isinstance(base, dict) else "invariant-logreg"
        if task not in TASKS:
            lines.append(f"| {name} | — | task `{task}` not in this build | | | | |")
            continue
        config = load_config(base, overrides)
        algorithm = build_algorithm(config)
        applies = can_lockstep(algorithm, build_task(config).problem(algorithm.kind), "local_steps", 2)
        for backend in ("local", "ray"):
            runs = {True: [], False: []}
            metrics = {}
            for _ in range(args.repeats):
                for vectorise in (False, True):  # interleaved, so drifting load hits both alike
                    seconds, metrics[vectorise] = time_rounds(base, overrides, backend, vectorise, args.rounds)
                    runs[vectorise].append(seconds)
            slow, fast = statistics.median(runs[False]), statistics.median(runs[True])
            diff = max(abs(metrics[True][k] - metrics[False][k]) for k in metrics[True])
            lines.append(f"| {name} | {backend} | {'yes' if applies else 'no'} | {1e3 * slow:.1f} | {1e3 * fast:.1f} | {slow / fast:.1f}x | {diff:.1e} |")
    text = common.table_report(
        common.HERE / "VECTORISED.md",
        TITLE,
        f"{common.generated_by()} (in every process, actors included); median per-round time (driver's view of "
        f"`run_round`) over rounds, then over repeats. Ray: the clients in {RAY_ACTORS} client actors (each steps "
        "its share of the cohort in lockstep) + the server actor; local: every client in one host. Where lockstep does not apply (an algorithm that is not draw + pure "
        f"update, or a task not declared vmappable) both columns run one at a time. Load average (1/5/15 min) before: "
        f"{load_before}.",
        lines,
    )
    publish(text)


def publish(text: str) -> None:
    """Put this run's table into benchmarks/RESULTS.md as its own section, replacing the previous one."""
    section = text.replace(TITLE, "## Vectorised clients: lockstep (vmap) vs one at a time", 1)
    common.put_section(common.HERE / "RESULTS.md", "vectorised.py", section)


if __name__ == "__main__":
    main()
