"""Whether Ray's compiled graphs (``ray.dag``) would carry a per-step exchange faster than ordinary actor calls.

Issue 16 (item 2) proposes compiled graphs as the transport for latency-bound patterns (FedDRO's per-step
exchange, FedNest's sub-rounds); ``federation.transport: graph`` is that transport. This script measures, on
this machine, the bare round trip it replaces: the server sends one small pickled message (the shape of
``ClientActor.step``'s) to ``--actors`` actors and waits for every reply (a float and a small array), by

* ordinary actor calls (what ``RayFederation`` does: one call per actor, then ``ray.get``);
* one compiled graph (``MultiOutputNode`` over the actors' method bound to the graph's input), compiled once;
  its compile and teardown times are reported too;
* the actors' own group (``federation.transport: collective``): no message from the server at all, each actor
  sends its small row of partial sums to every other (through actor 0, over TCP) and forms the mean, with fedcomp's
  :class:`~fedcomp.actors.collective.Group` -- one step of a collective exchange, and what a round would cost if
  the actors averaged a round's outputs among themselves. Timed inside the actors over a block of gathers (the
  slowest actor's time per gather).

Median over ``--calls`` round trips, interleaved in blocks of 50 (the group's: median over the blocks' means). ``--report`` writes ``benchmarks/RAY_DAG.md``.

    python benchmarks/ray_dag_latency.py [--actors 2] [--calls 600] [--report]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
from ray.dag import InputNode, MultiOutputNode

import common
from fedcomp.actors.collective import Group

REPORT = common.HERE / "RAY_DAG.md"
BLOCK = 50
IDLE_S = 3.0


@ray.remote(num_cpus=0)
class Echo:
    """Unpickles the message and answers like a client actor's partial sum (a float and a small array)."""

    def __init__(self) -> None:
        self.group = Group()

    def step(self, message: bytes) -> tuple[float, np.ndarray]:
        pickle.loads(message)
        return 1.0, np.zeros(2)

    def address(self) -> str:
        return self.group.address()

    def join(self, address: str, rank: int, world: int) -> None:
        self.group.join(address, rank, world, timeout_s=60.0)

    def gathers(self, count: int) -> float:
        """Seconds for ``count`` means formed in the group (each actor adding one client's two floats)."""
        sums = np.ones(2)
        started = time.perf_counter()
        for _ in range(count):
            self.group.mean(1, sums)
        return time.perf_counter() - started

    def cpu_seconds(self) -> float:
        """CPU time this actor's process has used so far (user + system)."""
        times = os.times()
        return times.user + times.system


def idle_cpu_share(actors: list[Any], seconds: float) -> list[float]:
    """Each actor's CPU use while nothing is sent to it for ``seconds``, as a share of one core."""
    before = ray.get([a.cpu_seconds.remote() for a in actors])
    time.sleep(seconds)
    after = ray.get([a.cpu_seconds.remote() for a in actors])
    return [(b - a) / seconds for a, b in zip(before, after)]


def per_call_ms(fn: Callable[[], Any], times: list[float]) -> None:
    for _ in range(BLOCK):
        started = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - started))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--report", action="store_true", help=f"write {REPORT.name}")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    actors = [Echo.remote() for _ in range(args.actors)]
    message = pickle.dumps(("resume", {"payload": np.zeros(2, np.float32), "last": False}), protocol=5)
    ray.get([a.step.remote(message) for a in actors])
    idle_plain = idle_cpu_share(actors, IDLE_S)
    with InputNode() as message_in:
        dag = MultiOutputNode([a.step.bind(message_in) for a in actors])
    started = time.perf_counter()
    compiled = dag.experimental_compile()
    compile_s = time.perf_counter() - started
    ray.get(compiled.execute(message))
    times: dict[str, list[float]] = {"ordinary actor calls": [], "compiled graph": []}
    for _ in range(max(1, args.calls // BLOCK)):
        per_call_ms(lambda: ray.get([a.step.remote(message) for a in actors]), times["ordinary actor calls"])
        per_call_ms(lambda: ray.get(compiled.execute(message)), times["compiled graph"])
    idle_compiled = idle_cpu_share(actors, IDLE_S)
    started = time.perf_counter()
    compiled.teardown()
    teardown_s = time.perf_counter() - started
    address = ray.get(actors[0].address.remote())
    ray.get([a.join.remote(address, rank, len(actors)) for rank, a in enumerate(actors)])
    ray.get([a.gathers.remote(BLOCK) for a in actors])  # warm-up: the rows grow to the message's size once
    group = times["actors' group, one exchange step"] = []
    for _ in range(max(1, args.calls // BLOCK)):
        group.append(1000 * max(ray.get([a.gathers.remote(BLOCK) for a in actors])) / BLOCK)
    for actor in actors:
        ray.kill(actor)
    ordinary = statistics.median(times["ordinary actor calls"])
    lines = [
        f"One message to {args.actors} actors and every reply back, median of {len(times['compiled graph'])} round "
        f"trips each (interleaved in blocks of {BLOCK}); the actors' group: median over {len(group)} blocks of {BLOCK} "
        f"gathers, timed inside the actors (the slowest one's mean per gather); Ray {ray.__version__}, "
        f"{ray.cluster_resources().get('CPU', 0):g} CPUs for Ray:",
        "",
        "| transport | ms / round trip, median | 25th percentile | vs ordinary calls |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {statistics.median(v):.3f} | {np.percentile(v, 25):.3f} | {statistics.median(v) / ordinary:.2f}x |"
          for name, v in times.items()),
        "",
        f"Compiling the graph took {1000 * compile_s:.0f} ms and tearing it down {1000 * teardown_s:.0f} ms.",
        "",
        f"CPU use of each idle actor over {IDLE_S:g} s with nothing sent to it, as a share of one core: "
        f"{', '.join(f'{x:.2f}' for x in idle_plain)} with ordinary calls only; "
        f"{', '.join(f'{x:.2f}' for x in idle_compiled)} while the compiled graph is alive (its channel readers "
        "poll), which the actors' own compute between exchanges would share the cores with.",
    ]
    print("\n".join(lines))
    if args.report:
        text = ["# Compiled graphs (ray.dag) against ordinary actor calls for a small exchange", "",
                f"{common.generated_by()}; the machine was shared with other work.", "", *lines, "",
                "Reading it (a fixed note of the script): a graph cannot be compiled per exchange (the compile costs "
                "more than a round saves) and a graph kept alive polls, so on a machine without cores to spare "
                "(here: 2 cores, several processes per core) its readers take CPU from the clients' compute. The Ray "
                "backend therefore compiles one graph per run, over all its client actors, and only where asked "
                "(`federation.transport: graph`, `fedcomp/actors/graph.py`). The actors' group neither polls (a "
                "waiting actor blocks in a socket read) nor involves the server; it carries the steps of an exchange "
                "under the default `federation.transport: collective` (`fedcomp/actors/collective.py`). Its row is "
                "the idle cost of one step, without the clients' compute competing for the cores. What the "
                "transports give inside a run: `feddro_exchange.py` (FEDDRO.md) and `profile_round.py` (PROFILE.md).",
                ""]
        common.write_report(REPORT, "\n".join(text))


if __name__ == "__main__":
    main()
