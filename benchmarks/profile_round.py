"""Where a Ray-backend round's time goes: serialisation, scheduling and transport, compute, server logic.

    python benchmarks/profile_round.py [--rounds 50]    # prints a table, writes benchmarks/PROFILE.md

Runs two workloads on the Ray backend and reads the phase timers the backend keeps
(``RayServer.profile()``; phases in ``fedcomp/actors/federation.py:PHASES``): the ``fedcomp bench``
FedAvg workload (MLP 32-64-10, 10 of 100 clients per round, 5 local steps, 2 client actors) and the FCSG
paper's invariant logistic regression (FCSG-M, 16 clients in 4 actors, q = 50), each with
``federation.transport`` ``calls`` and ``graph``. The phases add up to the driver's own time per round; the
first round (actor warm-up) is left out. Then as many rounds again are driven each of four ways, in turns of five
rounds: bare rounds pipelined (``RayServer.run_rounds``: the next round's call is submitted before this one's reply
is taken, as the runner does), and rounds that each evaluate the server's model after them (what a run does by
default; the compiled graph's idle actors poll meanwhile) in a second call to the server actor, in the same call
as the round, and in the same call pipelined (what the runner does now).

A second table profiles both workloads with the round program replicated on the client actors
(``federation.server: replicated``, :mod:`fedcomp.actors.replicas`): there the phases are each replica's own
(``ReplicatedServer.profile()``), read from every replica, and rounds are driven the runner's way only. Each
replica also hears, with each call's answer, the most seconds any actor computed on that call: a round's overhead
is measured over that sum of per-call maxima, as the first table's is over its slowest actor's compute.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterable

import torch

import common
from fedcomp.actors.replicas import SLOWEST_COMPUTE
from fedcomp.actors.replicated_server import ReplicatedServer
from fedcomp.actors.server_actor import RayServer
from fedcomp.bench import bench_config
from fedcomp.platform.config import Config, load_config

BLOCK = 5
"""Rounds timed in a row before the next way of driving them takes over (so that all see the same load)."""
COMPUTE = "actor compute (slowest actor)"
BARE = "bare rounds, one call each"
PIPELINED = "bare rounds, pipelined (`run_rounds`)"
PIPELINED_OVER = "pipelined, over the slowest actor's compute in those rounds"


def drain(replies: Iterable[object]) -> None:
    for _ in replies:
        pass


def profile(config, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per round in each phase, and per round driven each way: bare rounds one call at a
    time (the phases' rounds) and pipelined (``run_rounds``, the runner's way), and rounds each followed by the
    server's evaluation (a run's default, ``run.eval_every: 1``; the client actors wait meanwhile, which a compiled
    graph's actors do polling) asked for in a second call to the server actor, in the same call, and pipelined."""
    server = RayServer(config)
    try:
        server.run_round()  # warm-up: first calls import code and fill caches in the actors
        before = server.profile()
        started = time.perf_counter()
        for _ in range(rounds):
            server.run_round()
        per_round = {BARE: (time.perf_counter() - started) / rounds}
        after = server.profile()
        ways: dict[str, Callable[[], None]] = {
            PIPELINED: lambda: drain(server.run_rounds([False] * BLOCK)),
            "round, then its evaluation in a second call": lambda: [
                (server.run_round(), server.evaluate()) for _ in range(BLOCK)],
            "round and evaluation in one call": lambda: [next(server.run_rounds([True])) for _ in range(BLOCK)],
            "rounds and evaluations, pipelined (the runner's, now)": lambda: drain(server.run_rounds([True] * BLOCK)),
        }
        spent = dict.fromkeys(ways, 0.0)
        pipelined_compute = 0.0  # the slowest actor's compute in the pipelined bare rounds (their own, not the phases')
        for _ in range(max(1, rounds // BLOCK)):
            for name, way in ways.items():
                mark = server.profile()[COMPUTE] if name == PIPELINED else 0.0
                started = time.perf_counter()
                way()
                spent[name] += time.perf_counter() - started
                if name == PIPELINED:
                    pipelined_compute += server.profile()[COMPUTE] - mark
        timed = max(1, rounds // BLOCK) * BLOCK
        per_round |= {PIPELINED: spent[PIPELINED] / timed,
                      PIPELINED_OVER: (spent[PIPELINED] - pipelined_compute) / timed,
                      **{name: seconds / timed for name, seconds in spent.items() if name != PIPELINED}}
        phases = {k: (after[k] - before.get(k, 0.0)) / rounds for k in after}
        return phases, per_round
    finally:
        server.close()


REPLICA_COMPUTE = "actor compute (this replica)"
REPLICA_GATHERS = "group gathers"


def profile_replicated(config: Config, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per round in each replica's phases (each call's slowest actor's compute, as a server actor's profile
    counts it; the busiest replica's compute; the mean of each phase over the replicas) over ``rounds`` bare rounds
    driven as the runner drives them, and per round: those rounds, the part of them over the slowest actor's compute
    (the target's measure) and over the busiest replica's, and as many rounds each evaluated after it."""
    server = ReplicatedServer(config)
    actors = server.actors.actors

    def phases() -> list[dict[str, float]]:
        import ray

        return ray.get([actor.replica_profile.remote() for actor in actors])

    try:
        drain(server.run_rounds([False] * 2))  # warm-up: first calls import code and fill caches in the actors
        before, driver_before = phases(), server.driver_s
        started = time.perf_counter()
        drain(server.run_rounds([False] * rounds))
        bare = (time.perf_counter() - started) / rounds
        after = phases()
        per = [{k: (a[k] - b.get(k, 0.0)) / rounds for k in a} for a, b in zip(after, before)]
        slowest = per[0].pop(SLOWEST_COMPUTE)  # the same on every replica
        for p in per[1:]:
            del p[SLOWEST_COMPUTE]
        out = {f"{SLOWEST_COMPUTE} (as a server counts it)": slowest}
        out |= {f"{k} (mean over replicas)": sum(p[k] for p in per) / len(per) for k in per[0]}
        busiest = max(p[REPLICA_COMPUTE] for p in per)
        out[f"{REPLICA_COMPUTE}, busiest replica"] = busiest
        out["driver waiting for replica 0's replies"] = (server.driver_s - driver_before) / rounds
        started = time.perf_counter()
        drain(server.run_rounds([True] * rounds))
        evaluated = (time.perf_counter() - started) / rounds
        return out, {PIPELINED: bare, "over the slowest actor's compute each call": bare - slowest,
                     "over the busiest replica's compute": bare - busiest,
                     "rounds and evaluations, pipelined (the runner's)": evaluated}
    finally:
        server.close()


TRANSPORTS = ("calls", "graph")
"""``federation.transport``: one actor call per actor, or a compiled graph over the actors (inline payloads)."""
SERVER_REPLICATED = "replicated"
"""Passed for the transport: the server replicated on the client actors (``federation.server: replicated``)."""


def workloads(rounds: int) -> dict[str, Callable[[str], Config]]:
    """Each workload's config for a transport (:data:`TRANSPORTS`, or :data:`SERVER_REPLICATED`)."""
    return {
        "FedAvg MLP 32-64-10, 10 of 100 clients, 5 local steps, 2 actors": lambda transport: bench_config(
            100, 10, rounds, 5, (64,), "ray", transport=_transport(transport), server=_server(transport)),
        "invariant-LR FCSG-M, 16 clients, q = 50, 4 actors": lambda transport: load_config(
            "quickstart", {"task.test_samples": 2000, "run.progress": "none", "federation.clients_per_actor": 4,
                           "federation.transport": _transport(transport), "federation.server": _server(transport)}),
    }



def _server(transport: str) -> str:
    return "replicated" if transport == SERVER_REPLICATED else "actor"


def _transport(transport: str) -> str:
    return "collective" if transport == SERVER_REPLICATED else transport  # the server replicated: the actors' group
TARGET_MS = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    torch.set_num_threads(1)
    load_before = common.load_average()
    configs = workloads(args.rounds)
    columns = [(name, transport) for name in configs for transport in TRANSPORTS]
    results = {(name, transport): profile(configs[name](transport), args.rounds) for name, transport in columns}
    phases = list(next(iter(results.values()))[0])
    lines = ["| phase | " + " | ".join(f"{n}, transport {t} (ms/round)" for n, t in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for phase in phases:
        cells = [f"{1e3 * results[c][0][phase]:.2f} ({100 * results[c][0][phase] / results[c][1][BARE]:.0f} %)"
                 for c in columns]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines.append("| **round, as the driver sees it** | " + " | ".join(f"**{1e3 * results[c][1][BARE]:.2f}**" for c in columns) + " |")
    overhead = {c: results[c][1][BARE] - results[c][0][COMPUTE] for c in columns}
    lines.append("| over the slowest actor's compute | " + " | ".join(f"{1e3 * overhead[c]:.2f}" for c in columns) + " |")
    for way in list(next(iter(results.values()))[1])[1:]:
        lines.append(f"| {way} | " + " | ".join(f"{1e3 * results[c][1][way]:.2f}" for c in columns) + " |")
    replicated = {name: profile_replicated(make(SERVER_REPLICATED), args.rounds) for name, make in configs.items()}
    names = list(configs)
    lines += ["", "## The round program replicated on the client actors (`federation.server: replicated`)", "",
              "Every client actor runs the round program and the actors combine each call's partials among themselves "
              "(`fedcomp/actors/replicas.py`); the phases are each replica's own. Mean per round over "
              f"{args.rounds} rounds driven as the runner does (after two warm-up rounds), then as many evaluated.", "",
              "| phase | " + " | ".join(f"{n} (ms/round)" for n in names) + " |", "|---|" + "---:|" * len(names)]
    for phase in replicated[names[0]][0]:
        lines.append(f"| {phase} | " + " | ".join(f"{1e3 * replicated[n][0][phase]:.2f}" for n in names) + " |")
    for i, way in enumerate(replicated[names[0]][1]):
        cells = [f"{1e3 * replicated[n][1][way]:.2f}" for n in names]
        lines.append(f"| {'**' + way + '**' if i == 0 else way} | " + " | ".join(
            f"**{c}**" if i == 0 else c for c in cells) + " |")
    common.table_report(
        common.HERE / "PROFILE.md",
        "# Where a Ray-backend round's time goes",
        f"{common.generated_by()} (in every process, actors included), load average (1/5/15 min) before the run "
        f"{load_before}. Mean per round over {args.rounds} rounds after one warm-up round; each workload by actor "
        "calls and through a compiled graph (`federation.transport`), one after the other, then with the server "
        f"replicated on the client actors. Target (issue #16): <= {TARGET_MS} ms per round over the slowest actor's "
        "compute.",
        lines,
    )


if __name__ == "__main__":
    main()
