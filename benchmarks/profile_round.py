"""Where a Ray-backend round's time goes: serialisation, scheduling and transport, compute, server logic.

    python benchmarks/profile_round.py [--rounds 50]    # prints a table, writes benchmarks/PROFILE.md

Runs two workloads on the Ray backend and reads the phase timers the backend keeps
(``RayServer.profile()``; phases in ``fedcomp/actors/federation.py:PHASES``): the ``fedcomp bench``
FedAvg workload (MLP 32-64-10, 10 of 100 clients per round, 5 local steps, 2 client actors) and the FCSG
paper's invariant logistic regression (FCSG-M, 16 clients in 4 actors, q = 50), each with
``federation.transport`` ``calls`` and ``graph``. The phases add up to the driver's own time per round; the
first round (actor warm-up) is left out. Then as many pairs of rounds evaluate the server's model after each round
(what a run does by default; the compiled graph's idle actors poll meanwhile), alternately in a second call to the
server actor and in the same call as the round (``run_round_evaluated``, what the runner does).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

import common
from fedcomp.actors.server_actor import RayServer
from fedcomp.bench import bench_config
from fedcomp.platform.config import Config, load_config


def profile(config, rounds: int) -> tuple[dict[str, float], float, float, float]:
    """Seconds per round in each phase, per round, and per round followed by the server's evaluation (a run's
    default, ``run.eval_every: 1``: the client actors wait meanwhile, which a compiled graph's actors do polling)
    asked for in a second call to the server actor (as the runner did) and in the same call (as it does now)."""
    server = RayServer(config)
    try:
        server.run_round()  # warm-up: first calls import code and fill caches in the actors
        before = server.profile()
        started = time.perf_counter()
        for _ in range(rounds):
            server.run_round()
        total = time.perf_counter() - started
        after = server.profile()
        two_calls, one_call = 0.0, 0.0
        for _ in range(rounds):  # alternating, so that both see the same load
            started = time.perf_counter()
            server.run_round()
            server.evaluate()
            two_calls += time.perf_counter() - started
            started = time.perf_counter()
            server.run_round_evaluated()
            one_call += time.perf_counter() - started
        phases = {k: (after[k] - before.get(k, 0.0)) / rounds for k in after}
        return phases, total / rounds, two_calls / rounds, one_call / rounds
    finally:
        server.close()


TRANSPORTS = ("calls", "graph")
"""``federation.transport``: one actor call per actor, or a compiled graph over the actors (inline payloads)."""
TARGET_MS = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    torch.set_num_threads(1)
    load_before = common.load_average()
    workloads: dict[str, Callable[[str], Config]] = {
        "FedAvg MLP 32-64-10, 10 of 100 clients, 5 local steps, 2 actors":
            lambda transport: bench_config(100, 10, args.rounds, 5, (64,), "ray", transport=transport),
        "invariant-LR FCSG-M, 16 clients, q = 50, 4 actors": lambda transport: load_config(
            "quickstart", {"task.test_samples": 2000, "run.progress": "none", "federation.transport": transport}),
    }
    columns = [(name, transport) for name in workloads for transport in TRANSPORTS]
    results = {(name, transport): profile(workloads[name](transport), args.rounds) for name, transport in columns}
    phases = list(next(iter(results.values()))[0])
    lines = ["| phase | " + " | ".join(f"{n}, transport {t} (ms/round)" for n, t in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for phase in phases:
        cells = [f"{1e3 * results[c][0][phase]:.2f} ({100 * results[c][0][phase] / results[c][1]:.0f} %)" for c in columns]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines.append("| **round, as the driver sees it** | " + " | ".join(f"**{1e3 * results[c][1]:.2f}**" for c in columns) + " |")
    overhead = {c: results[c][1] - results[c][0]["actor compute (slowest actor)"] for c in columns}
    lines.append("| over the slowest actor's compute | " + " | ".join(f"{1e3 * overhead[c]:.2f}" for c in columns) + " |")
    lines.append("| round, then the server's evaluation in a second call | "
                 + " | ".join(f"{1e3 * results[c][2]:.2f}" for c in columns) + " |")
    lines.append("| round and evaluation in one call (`run_round_evaluated`, the runner's) | "
                 + " | ".join(f"{1e3 * results[c][3]:.2f}" for c in columns) + " |")
    common.table_report(
        common.HERE / "PROFILE.md",
        "# Where a Ray-backend round's time goes",
        f"{common.generated_by()} (in every process, actors included), load average (1/5/15 min) before the run "
        f"{load_before}. Mean per round over {args.rounds} rounds after one warm-up round; each workload by actor "
        "calls and through a compiled graph (`federation.transport`), one after the other. Target (issue #16): "
        f"<= {TARGET_MS} ms per round over the slowest actor's compute.",
        lines,
    )


if __name__ == "__main__":
    main()
