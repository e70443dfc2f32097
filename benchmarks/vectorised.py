"""Lockstep (``torch.func.vmap``) vs one-at-a-time local steps, side by side in one run.

    python benchmarks/vectorised.py [--rounds 10] [--repeats 3]   # prints a table, writes benchmarks/VECTORISED.md
    python benchmarks/vectorised.py --profile   # why the large MLP steps one at a time on a CPU (prints only)
    python benchmarks/vectorised.py --crossover   # lockstep by clients in a call: writes benchmarks/LOCKSTEP_CROSSOVER.md

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
from fedcomp.platform.rng import generator
from fedcomp.platform.vectorised import LOCKSTEP_MAX_CPU_FLOATS, can_lockstep, lockstep_pays

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


def task_of(base: str | dict) -> str:
    """The task a workload's base config names (the quickstart preset's is the invariant logistic regression)."""
    return base["task"]["name"] if isinstance(base, dict) else "invariant-logreg"


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


def profile_lockstep(rounds: int = 4) -> None:
    """Why a CPU host steps a large model one at a time even with ``federation.vectorise`` on
    (``LOCKSTEP_MAX_CPU_FLOATS``): the large MLP on the local backend, lockstep forced past that limit against one at
    a time, rounds alternating after a warm-up round each; then the operators the forced lockstep round spends most
    time in (``torch.profiler``, per round)."""
    from torch.profiler import ProfilerActivity, profile

    from fedcomp.platform import vectorised

    name = next(n for n in WORKLOADS if n.startswith("MLP 32-1024"))
    base, overrides = WORKLOADS[name]
    servers = {vectorise: make_server(load_config(base, {
        **overrides, "federation.backend": "local", "federation.vectorise": vectorise,
        "federation.clients_per_actor": int(overrides["federation.clients"])})) for vectorise in (False, True)}
    limit = vectorised.LOCKSTEP_MAX_CPU_FLOATS
    vectorised.LOCKSTEP_MAX_CPU_FLOATS = 2**62  # force lockstep, whatever the size
    try:
        times: dict[bool, list[float]] = {False: [], True: []}
        for server in servers.values():
            server.run_round()
        for _ in range(rounds):
            for vectorise, server in servers.items():
                started = time.perf_counter()
                server.run_round()
                times[vectorise].append(time.perf_counter() - started)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                servers[True].run_round()
    finally:
        vectorised.LOCKSTEP_MAX_CPU_FLOATS = limit
        for server in servers.values():
            server.close()
    slow, fast = statistics.median(times[False]), statistics.median(times[True])
    print(f"{name}, local backend ({common.generated_by()})")
    print(f"  one at a time (in-place steps): {1e3 * slow:.1f} ms/round; lockstep forced: {1e3 * fast:.1f} ms/round "
          f"({fast / slow:.1f}x the time; medians of {rounds} alternating rounds)")
    print("  lockstep forced, self CPU time per round by operator:")
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    for event in events[:6]:
        print(f"    {event.key[:40]:<40} {event.self_cpu_time_total / 2e6:6.3f} s  ({event.count // 2} calls)")
    print(f"    {'all operators':<40} {sum(e.self_cpu_time_total for e in events) / 2e6:6.3f} s")


CROSSOVER_CLIENTS = (2, 3, 5, 10)
CROSSOVER_WORKLOADS = {
    "invariant-logreg, FCSG-M, d = 10, q = 50, m = 10": WORKLOADS["invariant-logreg, FCSG-M, 16 clients, d = 10, q = 50, m = 10"],
    "sinewave, Local-SCGDM": WORKLOADS["sinewave, Local-SCGDM, 16 clients"],
    "MLP 32-64-10, FedAvg, q = 5 (untaped)": mlp_fedavg([64], 100),
    "MLP 32-256-10, FedAvg, q = 5 (untaped)": mlp_fedavg([256], 100),
    "MLP 32-16-16-10, FedAvg, q = 5 (untaped)": mlp_fedavg([16, 16], 100),
}


def crossover(rounds: int, repeats: int) -> None:
    """Where ``LOCKSTEP_MIN_CPU_CLIENTS`` comes from: on the local backend, lockstep (forced below that limit) against
    one at a time, by how many clients a call steps (the cohort), per workload; the fastest round of each path."""
    from fedcomp.platform import vectorised

    load_before = common.load_average()
    lines = ["| workload | " + " | ".join(f"{n} clients" for n in CROSSOVER_CLIENTS) + " |",
             "|---|" + "---:|" * len(CROSSOVER_CLIENTS)]
    limit = vectorised.LOCKSTEP_MIN_CPU_CLIENTS
    vectorised.LOCKSTEP_MIN_CPU_CLIENTS = 0
    try:
        for name, (base, overrides) in CROSSOVER_WORKLOADS.items():
            if task_of(base) not in TASKS:
                continue
            cells = []
            for clients in CROSSOVER_CLIENTS:
                cohort = {**overrides, "federation.clients": max(16, int(overrides["federation.clients"])),
                          "federation.clients_per_round": clients}
                runs: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(repeats):
                    for vectorise in (False, True):
                        runs[vectorise].append(time_rounds(base, cohort, "local", vectorise, rounds)[0])
                alone, together = min(runs[False]), min(runs[True])
                cells.append(f"{together / alone:.2f} ({1e3 * together:.1f} / {1e3 * alone:.1f})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    finally:
        vectorised.LOCKSTEP_MIN_CPU_CLIENTS = limit
    common.table_report(
        common.HERE / "LOCKSTEP_CROSSOVER.md",
        "# Lockstep by clients in a call",
        f"{common.generated_by()}. Local "
        "backend, every client in one host, the cohort (clients a round) stepped in one call; per cell, lockstep's "
        "time over one at a time's (the fastest round of each over the repeats, interleaved), then both in ms a round. "
        f"Below 1, lockstep is faster. `LOCKSTEP_MIN_CPU_CLIENTS` = {limit} at this revision (forced to 0 here). The "
        "MLPs take the untaped gradient both ways (in lockstep, one batched pass a step). Load average (1/5/15 min) "
        f"before: {load_before}.",
        lines,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--publish", action="store_true", help="only copy the last VECTORISED.md into RESULTS.md")
    parser.add_argument("--profile", action="store_true", help="only time and profile lockstep forced on the large MLP")
    parser.add_argument("--crossover", action="store_true", help="only time lockstep by clients in a call (local backend)")
    args = parser.parse_args()
    if args.publish:
        publish((common.HERE / "VECTORISED.md").read_text())
        return
    torch.set_num_threads(1)
    load_builtins()
    if args.crossover:
        crossover(args.rounds, args.repeats)
        return
    if args.profile:
        profile_lockstep()
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    load_before = common.load_average()
    lines = [
        "| workload | backend | lockstep applies | one at a time (ms/round) | lockstep vmap (ms/round) | speed-up | max metric difference |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, (base, overrides) in WORKLOADS.items():
        task = task_of(base)
        if task not in TASKS:
            lines.append(f"| {name} | — | task `{task}` not in this build | | | | |")
            continue
        config = load_config(base, overrides)
        algorithm, task_object = build_algorithm(config), build_task(config)
        state = algorithm.join(algorithm.broadcast(algorithm.init(task_object.init_params(generator(0, "init")))))
        applies = "no"
        if can_lockstep(algorithm, task_object.problem(algorithm.kind), "local_steps", 2):
            big = not lockstep_pays([state.tensors()] * 10, "cpu")  # ten clients a round
            applies = f"no: over {LOCKSTEP_MAX_CPU_FLOATS:,} floats on a CPU" if big else "yes"
        for backend in ("local", "ray"):
            runs = {True: [], False: []}
            metrics = {}
            for _ in range(args.repeats):
                for vectorise in (False, True):  # interleaved, so drifting load hits both alike
                    seconds, metrics[vectorise] = time_rounds(base, overrides, backend, vectorise, args.rounds)
                    runs[vectorise].append(seconds)
            slow, fast = statistics.median(runs[False]), statistics.median(runs[True])
            diff = max(abs(metrics[True][k] - metrics[False][k]) for k in metrics[True])
            lines.append(f"| {name} | {backend} | {applies} | {1e3 * slow:.1f} | {1e3 * fast:.1f} | {slow / fast:.1f}x | {diff:.1e} |")
    text = common.table_report(
        common.HERE / "VECTORISED.md",
        TITLE,
        f"{common.generated_by()} (in every process, actors included); median per-round time (driver's view of "
        f"`run_round`) over rounds, then over repeats. Ray: the clients in {RAY_ACTORS} client actors (each steps "
        "its share of the cohort in lockstep) + the server actor; local: every client in one host. Where lockstep does not apply (an algorithm that is not draw + pure "
        f"update, a task not declared vmappable, or on a CPU a client state over LOCKSTEP_MAX_CPU_FLOATS) both columns run one at a time. Load average (1/5/15 min) before: "
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
