"""The main job as a user runs it, packed three ways: ``fedcomp run quickstart`` (FCSG-M, 16 clients, 40 rounds on
a fresh local Ray) with ``federation.clients_per_actor`` at ``auto`` (one actor a CPU: 2 actors of 8 clients on 2
CPUs), 4 (the preset's old packing, 4 actors) and 1 (the field's old default, 16 actors).

    python benchmarks/packing.py [--repeats 3] [--packings auto 4 1]   # writes benchmarks/PACKING.md
    python benchmarks/packing.py --packings auto 16 --set federation.server=actor   # its own section of PACKING.md

Each run is a fresh ``python -m fedcomp run quickstart`` process in its own results folder, the packings
alternating within each repeat (the order reversed every other repeat): its wall time from the command to its exit,
the peak of the summed PSS of its process tree (the driver, Ray's daemons, the actors; sampled every 0.2 s), and its
final evaluation row, which must be the same for every packing (every packing gives the same numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from peers import TreeMemory

import common


def run_once(packing: str, overrides: list[str]) -> tuple[float, float, int, dict[str, float]]:
    """One ``fedcomp run quickstart`` with ``clients_per_actor = packing`` (and ``overrides``, ``KEY=VALUE``): wall
    time (s), peak PSS (MiB), the client actors it started (run.json) and its last evaluation row."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "RAY_ADDRESS": ""}
        sets = [f"run.out={out}", f"federation.clients_per_actor={packing}", "run.progress=none", *overrides]
        command = [sys.executable, "-m", "fedcomp", "run", "quickstart", *(a for s in sets for a in ("--set", s))]
        started = time.perf_counter()
        # in the results folder: `python -m` puts the working directory first on sys.path
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=out)
        with TreeMemory(proc.pid) as memory:
            _, err = proc.communicate()
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"clients_per_actor={packing} exited {proc.returncode}: {err[-2000:]}")
        (run,) = [p for p in Path(out).iterdir() if p.is_dir()]
        actors = json.loads((run / "run.json").read_text())["backend"]["client_actors"]
        last = pd.read_parquet(run / "metrics.parquet").dropna(subset=["test_accuracy"]).iloc[-1]
    row = {key: float(last[key]) for key in ("round", "test_accuracy", "train_loss") if key in last}
    return wall, memory.peak / 2**20, actors, row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--packings", nargs="+", default=["auto", "4", "1"])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more overrides for every run; the report becomes its own section of the file")
    parser.add_argument("--out", default=str(common.HERE / "PACKING.md"), help="report file ('-': print only)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    measured: dict[str, list[tuple[float, float, int, dict[str, float]]]] = {p: [] for p in args.packings}
    for repeat in range(args.repeats):
        for packing in args.packings if repeat % 2 == 0 else args.packings[::-1]:
            measured[packing].append(run_once(packing, args.set))
            wall, peak, actors, row = measured[packing][-1]
            print(f"clients_per_actor={packing}: {actors} actors, {wall:.1f} s, peak {peak:,.0f} MiB, {row}", flush=True)
    rows = {json.dumps(m[3], sort_keys=True) for runs in measured.values() for m in runs}
    first = args.packings[0]
    lines = [
        "| clients_per_actor | client actors | wall (s), each run | median | peak memory (MiB), each run | median | "
        f"wall / {first}'s, median |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = statistics.median(w for w, *_ in measured[first])
    for packing, runs in measured.items():
        walls, peaks = [w for w, *_ in runs], [p for _, p, *_ in runs]
        lines.append(f"| {packing} | {runs[0][2]} | {' / '.join(f'{w:.1f}' for w in walls)} | "
                     f"{statistics.median(walls):.1f} | {' / '.join(f'{p:,.0f}' for p in peaks)} | "
                     f"{statistics.median(peaks):,.0f} | {statistics.median(walls) / base:.2f} |")
    same = (f"Every run's last evaluation row is the same: {next(iter(rows))}." if len(rows) == 1
            else f"The last evaluation rows DIFFER: {sorted(rows)}.")
    intro = (f"{common.generated_by()}; {args.repeats} repeats; load average at the end "
             f"{os.getloadavg()[0]:.1f}. {' '.join(__doc__.split(chr(10) + chr(10))[2].split())} {same}")
    if args.set:
        title = f"## With {', '.join(f'`{s}`' for s in args.set)}"
        text = "\n".join([title, "", intro, "", *lines]) + "\n"
        print(text)
        if args.out != "-":
            common.put_section(args.out, f"packing.py {' '.join(args.set)}", text)
    else:
        text = "\n".join(["# The main job's packing: client actors per CPU", "", intro, "", *lines]) + "\n"
        common.publish(text, args.out)
    if len(rows) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
