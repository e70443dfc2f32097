"""What FedDRO's per-step exchange of the inner value costs on the Ray backend.

Runs FedDRO (y, d_g = 2 floats, averaged every local step; the model every I steps) and vanilla FedAvg for
compositional problems, case I (the same local steps, no per-step exchange) on the
``heterogeneous-composition`` task with 8 clients packed into 2 client actors, for a small (d = 10) and a
large (d = 1,000,000) model, and prints the wall time per local step of each and their difference: the
cost of one per-step exchange plus FedDRO's extra computation, an upper bound on the exchange's cost. The
model never travels in a per-step exchange (it stays on the clients between model rounds), so the cost
should not grow with d. The rounds driven as the runner drives them, in blocks; median over the blocks, then
median (and range) over ``--repeats`` paired runs.

    python benchmarks/feddro_exchange.py [--rounds 20] [--local-steps 8] [--repeats 3] [--dims 10 1000000] [--report]

Each Ray row is run with ordinary actor calls (``federation.transport: calls``), with a compiled graph over
the client actors (``transport: graph``, ``fedcomp/actors/graph.py``) and with the actors averaging each step
among themselves (``transport: collective``, ``fedcomp/actors/collective.py``), and with the whole round program
replicated on the client actors (``federation.server: replicated``, ``fedcomp/actors/replicas.py``), side by side
in one run.
``--dims 10`` runs the small model only (a quick check; the report wants both).

``--report`` also publishes what it prints, verbatim, as the section "Cost of the per-step exchange on the Ray
backend" of ``benchmarks/FEDDRO.md`` (replacing an earlier one; ``feddro.py`` keeps it when it rewrites the
report), headed by the command, the revision and the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import common
from fedcomp.actors.cluster import connect
from fedcomp.api import make_server
from fedcomp.platform.config import load_config

REPORT = common.HERE / "FEDDRO.md"
HEADING = "## Cost of the per-step exchange on the Ray backend"


VARIANTS = {"ray": ("ray", "calls", "actor"), "ray, compiled graph": ("ray", "graph", "actor"),
            "ray, collective": ("ray", "collective", "actor"), "ray, server replicated": ("ray", "collective", "replicated"),
            "local": ("local", "calls", "actor")}
"""Row label -> (``federation.backend``, ``federation.transport``, ``federation.server``)."""
TARGET_MS = 1.2


BLOCKS = 4
"""The timed rounds are driven in this many blocks (fewer if there are fewer rounds)."""


def per_step_ms(algorithm: str, dim: int, variant: str, rounds: int, steps: int, **federation: object) -> float:
    """Wall time per local step over ``rounds`` rounds after a warm-up one, the median over :data:`BLOCKS` blocks of
    them, each block's rounds driven as the runner drives them (one ``run_rounds`` call: a server behind a hop
    runs them back to back, and a replicated one answers in batches, so a single round's time says little)
    (``federation``: more settings of that section, e.g. ``cpus_per_actor`` for a test on a busy Ray)."""
    backend, transport, where = VARIANTS[variant]
    config = load_config(
        {"task": {"name": "heterogeneous-composition", "dim": dim},
         "algorithm": {"name": algorithm, "lr": 0.1, "local_steps": steps},
         "federation": {"clients": 8, "clients_per_actor": 4, "backend": backend, "transport": transport,
                        "server": where, **federation},
         "run": {"rounds": rounds, "progress": "none"}}
    )
    server = make_server(config)
    blocks = min(BLOCKS, rounds)
    try:
        server.run_round()  # warm-up (and FedDRO's initial estimate)
        times = []
        for block in range(blocks):
            size = rounds * (block + 1) // blocks - rounds * block // blocks
            start = time.perf_counter()
            for _ in server.run_rounds([False] * size):
                pass
            times.append((time.perf_counter() - start) / size)
    finally:
        server.close()
    return 1000 * statistics.median(times) / steps


def write_report(printed: list[str], seconds: float) -> None:
    """Publish ``printed`` as FEDDRO.md's exchange section, under a line naming the command, revision and machine."""
    section = [
        HEADING,
        "",
        f"{common.generated_by()}, in {seconds:.0f} s; the machine was shared with other work. What the script "
        "printed:",
        "",
        *printed,
        "",
        "Reading it (a fixed note of the script, not a measurement): the rows at d = 10 isolate the per-step "
        "exchange, since there FedDRO's extra computation is negligible. At d = 1,000,000 the Ray difference also "
        "holds d-sized work that FedAvg-CO case I does not do: at the end of each round every actor also ships its "
        "clients' private state (x_prev, d floats per client) to the object store, for recovery and checkpoints "
        "(`fedcomp/platform/federation.py`, `ClientHost`); the per-step answers to the clients' generator programs "
        "(`fed.exchange`) carry only y (with `transport: collective` or the server replicated they never reach a server: the actors form "
        "them among themselves). The d = 1,000,000 rows also move with the machine's load (it is shared): "
        "compare the range column.",
        "",
    ]
    common.put_section(REPORT, "feddro_exchange.py", "\n".join(section))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dims", type=int, nargs="+", default=[10, 1_000_000], help="model sizes d")
    parser.add_argument("--report", action="store_true", help="also write the output into benchmarks/FEDDRO.md")
    args = parser.parse_args()
    if args.report and (10 not in args.dims):
        parser.error("--report needs d = 10 among --dims (the target's size)")
    started = time.time()
    torch.set_num_threads(1)
    cluster = connect()
    printed: list[str] = []

    def emit(line: str = "") -> None:
        """Print a line and keep it for --report."""
        printed.append(line)
        print(line, flush=True)

    emit(f"machine: {common.machine()}; {int(cluster.get('CPU', 0))} CPUs for Ray; "
         f"8 clients in 2 client actors; I = {args.local_steps}; {args.rounds} rounds a run in {min(BLOCKS, args.rounds)} "
         f"blocks driven as the runner does (run_rounds), median over the blocks, then over {args.repeats} runs")
    emit()
    emit("| model size d | backend | FedDRO (ms / local step) | FedAvg-CO case I (ms / local step) | difference (ms) "
         "| difference, min to max over runs (ms) |")
    emit("|---:|---|---:|---:|---:|---:|")
    diff: dict[str, dict[int, float]] = {variant: {} for variant in VARIANTS}
    for dim in args.dims:
        for variant in VARIANTS:
            # paired runs (FedDRO then FedAvg-CO) so that each difference sees the same machine load
            pairs = [(per_step_ms("feddro", dim, variant, args.rounds, args.local_steps),
                      per_step_ms("fedavg-co-1", dim, variant, args.rounds, args.local_steps)) for _ in range(args.repeats)]
            dro, van = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
            diffs = [a - b for a, b in pairs]
            diff[variant][dim] = statistics.median(diffs)
            emit(f"| {dim:,} | {variant} | {dro:.2f} | {van:.2f} | {statistics.median(diffs):+.2f} "
                 f"| {min(diffs):+.2f} to {max(diffs):+.2f} |")
    emit()
    emit("On Ray the difference is the per-step exchange plus FedDRO's extra computation (g_k at two points), so it")
    emit("bounds the exchange's cost from above. Subtracting the local backend's difference (that computation run")
    emit("serially in one process; Ray runs it on the client actors in parallel, so the subtraction over-corrects")
    emit("when it is large) gives the second figure:")
    ray_variants = [v for v in VARIANTS if VARIANTS[v][0] == "ray"]
    for variant in ray_variants:
        emit(f"- {variant}: " + ", ".join(
            f"{ms:+.2f} ms per local step at d = {dim:,} ({ms - diff['local'][dim]:+.2f} less the local backend's)"
            for dim, ms in diff[variant].items()) + ".")
    if 10 in args.dims:
        met = [v for v in ray_variants if diff[v][10] <= TARGET_MS]
        emit(f"Target (issue #16): <= {TARGET_MS} ms per step at d = 10: "
             + (f"met ({', '.join(met)})." if met else "not met."))
    if args.report:
        write_report(printed, time.time() - started)


if __name__ == "__main__":
    main()
