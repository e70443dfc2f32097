"""What a Tune sweep costs over running the same runs yourself: a grid of 12 tiny runs on 2 CPUs, as a sweep
(one trial per run in a fresh process -- the old default --, one trial per run with Tune reusing trial
processes, and packed: several runs per trial, one at a time) and one after another in one process, for both
backends of the trials; and, with ``--figure1``, the FCSG paper's Figure 1 grid (``fedcomp sweep
fcsg-invariant-lr``, 486 runs in lockstep packs) end to end.

    python benchmarks/sweep_overhead.py            # the 12-run table -> benchmarks/SWEEP.md
    python benchmarks/sweep_overhead.py --figure1  # the Figure 1 grid (and one of its runs alone): its own section
    python benchmarks/sweep_overhead.py --longer   # longer Ray-backend runs, one trial at a time and two
    python benchmarks/sweep_overhead.py --quick [--against OTHER_CHECKOUT]  # the CLI's wall time and peak memory

Per backend and variant: the sweep's wall time, the same 12 runs' wall time in sequence (``fedcomp.run`` in this
process, the same Ray instance for the Ray backend; and again inside ``fedcomp.keep_actors()``), their ratio, and
the per-run overhead: the trial slots the sweep used (concurrent trials x its wall time) less the runs' own training
time, per run -- Tune's trial process and bookkeeping, building the task, and for the Ray backend starting the
server and client actors.
Numbers are measured, never asserted: the machine is shared and noisy, so the Figure 1 section also gives the
CPU seconds every process of the sweep used (this process, and its Ray's processes read from ``/proc`` while
they run) and the wall time those would take on 2 otherwise idle cores.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import common
import fedcomp
from fedcomp.actors.cluster import connect
from fedcomp.sweeps.spec import SweepSpec, load_spec
from fedcomp.sweeps.trial import concurrent_trials

WORKLOAD = {
    "task.test_samples": 5000,
    "federation.clients": 4,
    "federation.clients_per_actor": 2,
    "algorithm.local_steps": 10,
    "run.rounds": 10,
    "run.eval_every": 5,
    "run.progress": "none",
}
GRID = {"algorithm.lr": [0.01, 0.005, 0.001], "algorithm.beta": [0.1, 0.9]}
SEEDS = 2
VARIANTS = {
    "fresh process per trial": {"reuse_actors": False, "keep_actors": False},
    "reused trial processes, fresh actors per run": {"reuse_actors": True, "keep_actors": False},
    "reused trial processes and actors (default)": {"reuse_actors": True, "keep_actors": True},
    "packed, 6 runs per trial, one at a time": {"reuse_actors": True, "pack": "sequential", "pack_size": 6},
    "the other concurrency (max_concurrent: 1 local, 2 Ray), reused, kept actors": {
        "reuse_actors": True, "keep_actors": True, "max_concurrent": {"local": 1, "ray": 2}},
}
"""The sweep's trial machinery per row; every variant runs the default number of trials at a time (local: two, as
many as fit; Ray: one, a CPU for each of a trial's three processes) unless it says otherwise."""


def cpu_seconds() -> float:
    """CPU seconds of this process so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


class TreeCPU:
    """CPU seconds used by this process's descendants (Ray's GCS, raylet and its workers: the trials), read from
    ``/proc`` every ``interval`` seconds while it runs -- Ray's workers are not reaped into this process's
    ``getrusage`` -- keeping each process's last reading (Linux only)."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval, self.seen, self._stop = interval, {}, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _stats() -> dict[int, tuple[int, str, float]]:
        out = {}
        tick = os.sysconf("SC_CLK_TCK")
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                # after the name: state ppid ... utime (14th field) stime (15th) ... starttime (22nd)
                out[int(entry)] = (int(fields[1]), fields[19], (int(fields[11]) + int(fields[12])) / tick)
        return out

    def _sample(self) -> None:
        stats = self._stats()
        tree, frontier = set(), {os.getpid()}
        while frontier:
            tree |= frontier
            frontier = {pid for pid, (ppid, _, _) in stats.items() if ppid in frontier} - tree
        for pid in tree - {os.getpid()}:
            _, start, cpu = stats[pid]
            self.seen[(pid, start)] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> TreeCPU:
        self._sample()
        self.before = sum(self.seen.values())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()  # the last reading, for processes still alive

    @property
    def seconds(self) -> float:
        return sum(self.seen.values()) - self.before


def sequential(backend: str, root: Path, keep: bool = False) -> float:
    """The sweep's runs one after another in this process by ``fedcomp.run``; ``keep``: inside
    ``fedcomp.keep_actors()``, each Ray-backend run taking the actors of the one before."""
    overrides = {**WORKLOAD, "federation.backend": backend, "run.out": str(root / f"{backend}-alone")}
    points = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    started = time.perf_counter()
    with fedcomp.keep_actors() if keep else contextlib.nullcontext():
        for seed in range(SEEDS):
            for point in points:
                fedcomp.run("quickstart", {**overrides, **point, "run.seed": seed})
    return time.perf_counter() - started


def trials_at_once(spec: SweepSpec, cpus: float) -> int:
    """The trials the sweep ran at a time: fedcomp's choice, else Tune's fit."""
    configs = [spec.base_config(**point) for point in spec.points()]
    return concurrent_trials(spec, configs, cpus, False) or int(cpus // spec.cpus_per_trial)


def measure(backend: str, variant: dict[str, Any], root: Path, seeds: int = SEEDS) -> dict[str, float]:
    overrides = {**WORKLOAD, "federation.backend": backend, "run.out": str(root / backend)}
    settings = {k: v[backend] if isinstance(v, dict) else v for k, v in variant.items()}
    spec = load_spec({"base": "quickstart", "set": overrides, "grid": GRID, "seeds": seeds, "cpus_per_trial": 1.0,
                      **settings})
    cpu0, tree = cpu_seconds(), TreeCPU()
    with tree:
        started = time.perf_counter()
        result = fedcomp.sweep(spec)
        sweep_s = time.perf_counter() - started
    n = result.trials["trial"].nunique()
    # The sweep had its trials at a time x its wall time of trial slots. A packed trial's runs follow one another:
    # each run's own time is its last wall_time.
    slots = trials_at_once(spec, connect()["CPU"])
    own = common.trials_seconds(result.trials)
    tune_trials = len([p for p in result.path.iterdir() if p.is_dir()])
    return {"runs": n, "tune_trials": tune_trials, "sweep_s": sweep_s, "own_s": own, "slots": slots,
            "startup_s": (slots * sweep_s - own) / n, "cpu_s": cpu_seconds() - cpu0 + tree.seconds}


def overhead_table(backends: list[str]) -> tuple[str, list[str]]:
    cpus = connect()["CPU"]
    lines = [
        "| trial backend | variant | runs | Tune trials | sweep wall (s) | same runs in sequence (s) | in sequence, "
        "actors kept (s) | sequence / sweep | "
        f"per-run overhead (s) | wall with {2 * SEEDS} seeds (s) | marginal overhead per run (s) | CPU of every "
        "process, 12 runs (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            alone = sequential(backend, Path(tmp))
            alone_kept = sequential(backend, Path(tmp), keep=True)
            for name, variant in VARIANTS.items():
                r = measure(backend, variant, Path(tmp) / name.split()[0])
                double = measure(backend, variant, Path(tmp) / name.split()[0], 2 * SEEDS)
                # what one more run costs beyond its own run time: the fixed costs of a sweep cancel out
                marginal = (r["slots"] * (double["sweep_s"] - r["sweep_s"]) - (double["own_s"] - r["own_s"])) / (
                    double["runs"] - r["runs"])
                lines.append(
                    f"| {backend} | {name} | {r['runs']} | {r['tune_trials']} | {r['sweep_s']:.1f} | {alone:.1f} | "
                    f"{alone_kept:.1f} | "
                    f"{alone / r['sweep_s']:.2f} | {r['startup_s']:.2f} | {double['sweep_s']:.1f} | {marginal:.2f} | "
                    f"{r['cpu_s']:.1f} |"
                )
                print(lines[-1], flush=True)
    intro = (
        f"{common.generated_by()}, Ray with {cpus:g} CPUs, cpus_per_trial = 1; trials at a time: the default "
        f"(local backend: two, as many as fit; Ray backend: one, a CPU for each of a trial's three processes) "
        f"unless the variant says otherwise; the variants ran side by side in this one run. Workload: invariant-logreg "
        f"FCSG-M, 4 clients (2 client actors), q = 10, 10 rounds; grid lr {GRID['algorithm.lr']} x beta "
        f"{GRID['algorithm.beta']} x {SEEDS} seeds, and again with {2 * SEEDS} seeds. In sequence: the 12 runs by "
        f"`fedcomp.run` one after another in this process, on fresh actors each, then inside `fedcomp.keep_actors()` "
        f"(each Ray-backend run takes the actors of the one before; nothing changes on the local backend). Per-run "
        f"overhead: (trials at "
        f"a time x sweep wall - the runs' own run time) / runs, which spreads a sweep's fixed costs (starting Tune, "
        f"its first trial processes, writing the results) over the runs; marginal overhead per run: the same "
        f"difference between the two sweep sizes, per added run, where the fixed costs cancel. CPU: the seconds "
        f"this process and every process it started (Ray's daemons, trial processes, actors) used during the "
        f"12-run sweep, read from /proc every 0.5 s. Load average at the end: {os.getloadavg()[0]:.1f} (the "
        f"machine is shared)."
    )
    return intro, lines


def figure1(root: Path) -> list[str]:
    """One Figure 1 run alone (local backend), then the whole grid as ``fedcomp sweep fcsg-invariant-lr``
    in a fresh local Ray whose processes' CPU time is read after it shuts down."""
    import ray

    ray.shutdown()  # the Figure 1 grid gets a fresh Ray, started from this process (so /proc sees its workers)
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    fedcomp.run("fig1-fcsg-m", {"federation.backend": "local", "run.eval_every": 2, "run.progress": "none",
                                "run.out": str(root / "alone")})
    alone_wall, alone_cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    with TreeCPU() as tree:
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        cpus = connect()["CPU"]
        result = fedcomp.sweep("fcsg-invariant-lr", overrides={"run.out": str(root / "fig1")})
        wall = time.perf_counter() - wall0
        tree._sample()  # before the shutdown ends Ray's processes
        ray.shutdown()
    cpu = cpu_seconds() - cpu0 + tree.seconds
    runs = result.trials["trial"].nunique()
    failed = int((result.trials.groupby("trial")["status"].first() != "completed").sum())
    tune_trials = len([p for p in result.path.iterdir() if p.is_dir()])
    # a lockstep trial's configurations share its clock: its own time is its longest configuration's
    trial_time = result.trials.groupby(result.trials["trial"].str.rsplit("-", n=1).str[0])["wall_time"].max().sum()
    cores, slots = os.cpu_count() or 1, trials_at_once(result.spec, cpus)
    gap = lockstep_gap(result.trials, root / "check")
    return [
        "## The FCSG Figure 1 grid end to end",
        "",
        f"`fedcomp sweep fcsg-invariant-lr` (the paper's grid: FCSG lr x m x noise ratio, FCSG-M lr x beta x m x noise "
        f"ratio, 3 seeds, 40 rounds, 16 clients, q = 50; `pack: lockstep` on the local backend), through "
        f"`fedcomp.sweep` in this process with a fresh local Ray. Load average at the end: {os.getloadavg()[0]:.1f}.",
        "",
        "| what | value |",
        "|---|---:|",
        f"| one Figure 1 run alone (FCSG-M, m = 10, local backend, `fedcomp.run`): wall / CPU (s) | "
        f"{alone_wall:.1f} / {alone_cpu:.1f} |",
        f"| runs (configurations x seeds) / Tune trials / failed | {runs} / {tune_trials} / {failed} |",
        f"| sweep wall time, end to end (min) | {wall / 60:.1f} |",
        f"| CPU time of every process of the sweep, summed (min) | {cpu / 60:.1f} |",
        f"| Tune trials' own run time (drive loops), summed (min) | {trial_time / 60:.1f} |",
        f"| per-run overhead: ({slots} x sweep wall - trials' own run time) / runs (s) | "
        f"{(slots * wall - trial_time) / runs:.2f} |",
        f"| CPU time per run (s) | {cpu / runs:.2f} |",
        f"| estimate on {cores} otherwise idle cores: summed CPU / {cores} (min) | {cpu / cores / 60:.1f} |",
        f"| lockstep vs alone: largest difference in test_accuracy, test_loss, train_loss over every row of "
        f"{len(CHECKED)} configurations re-run with `fedcomp.run` | {gap:.2g} |",
        "",
    ]


CHECKED = (
    {"algorithm.name": "fcsg-m", "algorithm.lr": 0.01, "algorithm.beta": 0.5, "algorithm.inner_batch": 1,
     "task.noise_ratio": 2.0, "run.seed": 1},
    {"algorithm.name": "fcsg", "algorithm.lr": 0.005, "algorithm.inner_batch": 100, "task.noise_ratio": 1.0,
     "run.seed": 2},
)
"""Figure 1 configurations re-run alone to measure how far lockstep's numbers are from a run alone."""


def lockstep_gap(trials: pd.DataFrame, out: Path) -> float:
    """The largest absolute difference, over every evaluation row, between :data:`CHECKED`'s rows in the sweep
    and the same configurations run alone (local backend); the counters must be equal."""
    worst = 0.0
    for config in CHECKED:
        mask = np.logical_and.reduce([trials[k] == v for k, v in config.items()])
        rows = trials[mask].sort_values("round").reset_index(drop=True)
        overrides = {**config, "federation.backend": "local", "run.eval_every": 2, "run.progress": "none",
                     "run.out": str(out)}
        alone = fedcomp.run("fig1-fcsg-m", overrides).metrics.reset_index(drop=True)
        counters = ["round", "comm_rounds", "local_steps", "samples", "floats_up", "floats_down"]
        if not rows[counters].astype("int64").equals(alone[counters].astype("int64")):
            raise AssertionError(f"{config}: the counters differ from a run alone")
        metrics = ["test_accuracy", "test_loss", "train_loss"]
        worst = max(worst, float((rows[metrics] - alone[metrics]).abs().max().max()))
    return worst


LONGER_ROUNDS = 1000
LONGER_GRID = {"algorithm.lr": [0.01, 0.005]}


def longer(root: Path, repeats: int = 2) -> list[str]:
    """Ray-backend sweeps of runs that compute for longer than they take to start (the 12-run workload with
    :data:`LONGER_ROUNDS` rounds, 4 runs), at the default number of trials at a time and two at a time,
    alternating (ABBA) over ``repeats`` pairs: does one trial at a time on 2 CPUs cost such sweeps time?"""
    cpus = connect()["CPU"]
    overrides = {**WORKLOAD, "federation.backend": "ray", "run.rounds": LONGER_ROUNDS,
                 "run.eval_every": LONGER_ROUNDS // 4}
    order = [None, 2, 2, None] * ((repeats + 1) // 2)
    measured: dict[int | None, list[tuple[float, float, float]]] = {None: [], 2: []}
    for i, at_once in enumerate(order[: 2 * repeats]):
        spec = load_spec({"base": "quickstart", "set": {**overrides, "run.out": str(root / f"longer{i}")},
                          "grid": LONGER_GRID, "seeds": 2, "cpus_per_trial": 1.0, "max_concurrent": at_once})
        with TreeCPU() as tree:
            started = time.perf_counter()
            result = fedcomp.sweep(spec)
            wall = time.perf_counter() - started
        runs = result.trials["trial"].nunique()
        measured[at_once].append((wall, common.trials_seconds(result.trials) / runs, tree.seconds))
        print(f"longer, max_concurrent {at_once}: {wall:.1f} s", flush=True)
    default = load_spec({"base": "quickstart", "set": overrides, "grid": LONGER_GRID, "cpus_per_trial": 1.0})
    labels = {None: f"default ({trials_at_once(default, cpus)} at a time here)", 2: "two at a time (max_concurrent 2)"}
    lines = [
        "## Longer runs on the Ray backend: one trial at a time or two",
        "",
        f"The 12-run table's workload with {LONGER_ROUNDS} rounds (evaluated every {LONGER_ROUNDS // 4}), grid lr "
        f"{LONGER_GRID['algorithm.lr']} x 2 seeds (4 runs, 2 client actors each), Ray backend, cpus_per_trial = 1 on "
        f"{cpus:g} CPUs; the two settings alternated (ABBA), {repeats} sweeps each, every value listed in the order "
        f"run. Load average at the end: {os.getloadavg()[0]:.1f}.",
        "",
        "| trials at a time | sweep wall (s) | a run's own time, mean (s) | CPU of every process (s) |",
        "|---|---:|---:|---:|",
    ]
    for at_once, label in labels.items():
        walls, owns, cpu = zip(*measured[at_once])
        lines.append(f"| {label} | {' / '.join(f'{w:.1f}' for w in walls)} | {' / '.join(f'{o:.2f}' for o in owns)} "
                     f"| {' / '.join(f'{c:.1f}' for c in cpu)} |")
    return [*lines, ""]


def quick(against: Path | None, repeats: int) -> list[str]:
    """``fedcomp sweep quick`` from the command line, a fresh local Ray each time: its wall time from the command to
    its exit and the peak summed PSS of its process tree (the driver, Ray's daemons, trial processes, actors),
    ``repeats`` times, alternating with another checkout's fedcomp where ``against`` names one (run with the same
    interpreter, ``PYTHONPATH`` at that checkout)."""
    from peers import TreeMemory  # imports torch: only for this section

    checkouts: list[tuple[str, Path | None]] = [(f"this tree ({common.revision()})", None)]
    if against is not None:
        rev = subprocess.run(["git", "-C", str(against), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        checkouts.append((f"{against.name} ({rev})", against))
    runs: dict[str, list[tuple[float, float, dict[int, tuple[str, int]]]]] = {label: [] for label, _ in checkouts}
    for repeat in range(repeats):
        for label, path in checkouts if repeat % 2 == 0 else checkouts[::-1]:
            env = {**os.environ, "RAY_ADDRESS": ""}
            if path is not None:
                env["PYTHONPATH"] = str(path)
            with tempfile.TemporaryDirectory() as out:
                started = time.perf_counter()
                # in the results folder: `python -m` puts the working directory first on sys.path
                proc = subprocess.Popen([sys.executable, "-m", "fedcomp", "sweep", "quick", "--set", f"run.out={out}"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=out)
                with TreeMemory(proc.pid) as memory:
                    _, err = proc.communicate()
                wall = time.perf_counter() - started
            if proc.returncode != 0:
                raise RuntimeError(f"fedcomp sweep quick ({label}) exited {proc.returncode}: {err[-2000:]}")
            runs[label].append((wall, memory.peak / 2**20, memory.peak_detail))
            print(f"{label}: {wall:.1f} s, peak {memory.peak / 2**20:.0f} MiB", flush=True)
    lines = [
        "## `fedcomp sweep quick` from the command line",
        "",
        f"`fedcomp sweep quick` (12 Ray-backend trials of 15 rounds, 2 client actors each, 2 CPUs) as a user runs it, "
        f"a fresh local Ray each time, {repeats} runs"
        + (" alternating with another checkout's fedcomp (the same interpreter, `PYTHONPATH` at it)" if against else "")
        + f"; wall time from the command to its exit; peak of the summed PSS of its process tree, sampled every 0.2 s. "
        f"Load average at the end: {os.getloadavg()[0]:.1f}.",
        "",
        "| fedcomp | wall (s), each run | peak memory (MiB), each run | at the peak of its last run, by process (MiB of PSS) |",
        "|---|---:|---:|---|",
    ]
    for label, measured in runs.items():
        walls = " / ".join(f"{w:.1f}" for w, _, _ in measured)
        peaks = " / ".join(f"{m:,.0f}" for _, m, _ in measured)
        detail = sorted(measured[-1][2].values(), key=lambda item: -item[1])
        by_process = ", ".join(f"{name} {size / 2**20:.0f}" for name, size in detail)
        lines.append(f"| {label} | {walls} | {peaks} | {by_process} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    parser.add_argument("--figure1", action="store_true", help="run the Figure 1 grid end to end (its own section)")
    parser.add_argument("--longer", action="store_true",
                        help="Ray-backend sweeps of longer runs, one trial at a time and two (their own section)")
    parser.add_argument("--quick", action="store_true",
                        help="`fedcomp sweep quick` from the command line: wall time and peak memory (its own section)")
    parser.add_argument("--against", type=Path, help="--quick: alternate with the fedcomp of this other checkout")
    parser.add_argument("--repeats", type=int, default=3, help="--quick: runs of each")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    report = common.HERE / "SWEEP.md"
    sections = {
        "--quick": lambda tmp: quick(args.against.resolve() if args.against else None, args.repeats),
        "--longer": longer,
        "--figure1": figure1,
    }
    for flag, measure_section in sections.items():
        if getattr(args, flag.removeprefix("--")):
            with tempfile.TemporaryDirectory() as tmp:
                lines = measure_section(Path(tmp))
            text = "\n".join([*lines[:2], f"{common.generated_by()}.", "", *lines[2:]])
            print(text)
            common.put_section(report, f"sweep_overhead.py {flag}", text)
            return
    intro, lines = overhead_table(args.backends)
    title = "# Sweeps of tiny runs: per-run overhead and the Figure 1 grid"
    common.write_report(report, "\n".join([title, "", intro, "", *lines]) + "\n")
    print(intro, *lines, sep="\n")


if __name__ == "__main__":
    main()
