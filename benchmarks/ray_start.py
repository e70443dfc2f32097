"""How long a Ray run waits before its first round: a local Ray started as Ray starts it (its autoscaler monitor
and API server launched, then ended by fedcomp) against fedcomp's start (neither launched:
:func:`fedcomp.actors.cluster.idle_daemons_not_started`).

    python benchmarks/ray_start.py [--repeats 8]     # writes benchmarks/RAY_START.md

Each measurement is a fresh process, the two starts alternating within each repeat: it starts a local Ray with
:func:`fedcomp.actors.cluster.connect` (Ray ready), builds the benchmark's FedAvg server on it (small MLP, 100
clients in 2 client actors, the server replicated on them: the actors start and import torch), runs one round, then
closes the server and shuts Ray down. The launch of the Python process itself and the imports before ``connect`` are
outside every column. The raylet itself sometimes waits a further second before it serves (visible in its log as a
1 s gap before "ObjectManager server started"), whichever start: hence medians, and the ratio paired within repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import common

STARTS = {"ray": "Ray's own start (monitor and API server launched, then ended)",
          "fedcomp": "fedcomp's start (neither launched)"}
PROBE = r"""
import json, sys, time
from pathlib import Path
import ray
import fedcomp.actors.cluster as cluster
from fedcomp.api import make_server
from fedcomp.bench import bench_config
if sys.argv[1] == "ray":
    cluster.IDLE_DAEMONS = ()  # nothing kept from Ray: it launches both, connect then ends them
t0 = time.perf_counter()
cluster.connect("local")
t1 = time.perf_counter()
logs = Path(ray._private.worker._global_node.get_logs_dir_path())
launched = any(f.name.startswith(("monitor.", "dashboard.")) for f in logs.iterdir())
server = make_server(bench_config(100, 10, 1, 5, (64,), "ray"))
list(server.run_rounds([False]))
t2 = time.perf_counter()
server.close()
ray.shutdown()
t3 = time.perf_counter()
print(json.dumps({"ready": t1 - t0, "first_round": t2 - t0, "end": t3 - t2, "launched": launched}))
"""
COLUMNS = {"ready": "Ray ready (s)", "first_round": "to the first round's end (s)", "end": "close and shut down (s)"}


def measure(start: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", PROBE, start], capture_output=True, text=True, check=True,
                          cwd=common.REPO)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", default=str(common.REPO / "benchmarks" / "RAY_START.md"))
    args = parser.parse_args()
    clock, load_before = common.Stopwatch(), common.load_average()
    runs: dict[str, list[dict[str, float]]] = {start: [] for start in STARTS}
    for repeat in range(args.repeats):
        for start in STARTS:
            runs[start].append(measure(start))
            clock.log(f"repeat {repeat + 1}/{args.repeats}, {start}: {runs[start][-1]}")
    rows = ["| start | monitor and API server launched (their logs in the session) | "
            + " | ".join(f"{label}, median (range)" for label in COLUMNS.values()) + " |",
            "|---|---|" + "---:|" * len(COLUMNS)]
    for start, label in STARTS.items():
        cells = [f"{statistics.median(r[c] for r in runs[start]):.2f} "
                 f"({min(r[c] for r in runs[start]):.2f}-{max(r[c] for r in runs[start]):.2f})" for c in COLUMNS]
        launched = {r["launched"] for r in runs[start]}
        seen = "yes" if launched == {True} else "no" if launched == {False} else "in some runs"
        rows.append(f"| {label} | {seen} | " + " | ".join(cells) + " |")
    paired = [f"{statistics.median(f[c] / r[c] for f, r in zip(runs['fedcomp'], runs['ray'])):.2f}" for c in COLUMNS]
    rows.append("| fedcomp / Ray, paired within repeats (median) | — | " + " | ".join(paired) + " |")
    intro = (f"{common.generated_by()}, {clock.started_at}; load average before: {load_before}, after: "
             f"{common.load_average()}; {args.repeats} repeats. "
             + __doc__.split("\n\n")[2].replace("\n", " "))
    common.table_report(args.out, "# Starting a local Ray: Ray's own start against fedcomp's", intro, rows)


if __name__ == "__main__":
    main()
