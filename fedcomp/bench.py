"""``fedcomp bench``: time the Ray and local backends against a plain single-process PyTorch loop.

One workload -- FedAvg on ``synthetic-classification`` (an MLP on Gaussian-mixture client streams),
``--cohort`` clients per round out of ``--clients`` registered, ``--local-steps`` SGD steps of batch
:data:`BATCH` per client per round -- is run by three runners in one invocation:

* ``ray``: a Ray server actor with the registered clients packed into 2 client actors
  (``federation.clients_per_actor = ceil(clients / 2)``);
* ``local``: the in-process backend (every client in one in-process host);
* ``plain``: a hand-written loop doing the same arithmetic with nothing of fedcomp's machinery -- the same
  cohorts (:func:`~fedcomp.platform.server.sample_cohort`), the same keyed generators, the same task
  object's ``sample_batch`` and ``loss``, plain SGD on a flat parameter vector, and the same float64
  averaging -- so its final weights are the reference the other runners' weights are compared with.

fedcomp's runners are driven through :func:`fedcomp.api.make_server` (no result folders are written), so
start-up (server construction, including the Ray actors' start) is timed apart from the rounds. Ray itself
is started once per invocation and reused. The output is a table of measurements with the targets printed
next to them for information; the command never passes or fails on them.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import platform as _stdlib_platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from fedcomp.platform.config import Config, load_config
from fedcomp.platform.errors import PlatformError

RUNNERS = ("ray", "local", "plain")
ACTORS = 2
"""Client actors of the Ray runner: the registered clients are packed ``ceil(clients / ACTORS)`` to one."""
FEATURES, CLASSES, DEFAULT_HIDDEN = 32, 10, (64,)
BATCH = 16
LR = 0.05
SEED = 0
TARGET_OVERHEAD_MS = 50.0
TARGET_RATIO = 0.10


def bench_config(
    clients: int, cohort: int, rounds: int, local_steps: int, hidden: Sequence[int], backend: str,
    actors: int = ACTORS,
) -> Config:
    """The benchmark workload as a validated fedcomp config (Ray: clients packed into ``actors`` actors)."""
    return load_config(
        {
            "task": {"name": "synthetic-classification", "features": FEATURES, "classes": CLASSES,
                     "hidden": list(hidden)},
            "algorithm": {"name": "fedavg", "lr": LR, "local_steps": local_steps, "outer_batch": BATCH},
            "federation": {
                "clients": clients,
                "clients_per_round": min(cohort, clients),
                "backend": backend,
                "clients_per_actor": math.ceil(clients / actors),
            },
            "run": {"seed": SEED, "rounds": rounds, "progress": "none"},
        }
    )


@dataclass
class Measurement:
    """One runner's run: start-up time, per-round times and the final model."""

    runner: str
    clients: int
    repeat: int
    startup_s: float
    round_s: list[float]
    final: torch.Tensor
    test_accuracy: float
    rounds_started_at: float = 0.0
    """Wall-clock time (``time.time()``) when the first round began (start-up seen from outside)."""

    @property
    def median_round_s(self) -> float:
        return statistics.median(self.round_s)


def run_fedcomp(config: Config, runner: str, repeat: int) -> Measurement:
    """Drive a fedcomp server (local or Ray) directly: construct it, run the rounds, read the final model."""
    from fedcomp.api import make_server

    t0 = time.perf_counter()
    server = make_server(config)
    startup = time.perf_counter() - t0
    try:
        times = []
        started = time.time()
        for _ in range(config.run.rounds):
            t = time.perf_counter()
            server.run_round()
            times.append(time.perf_counter() - t)
        final = server.checkpoint()["state"]["x"].detach().cpu()
        accuracy = float(server.evaluate()["test_accuracy"])
    finally:
        server.close()
    return Measurement(runner, config.federation.clients, repeat, startup, times, final, accuracy, started)


def run_plain(config: Config, repeat: int) -> Measurement:
    """The same FedAvg rounds as a plain single-process PyTorch loop on a flat parameter vector."""
    from fedcomp.platform.federation import build_task
    from fedcomp.platform.rng import generator
    from fedcomp.platform.server import sample_cohort

    seed, clients, cohort_size = config.run.seed, config.federation.clients, config.federation.cohort_size
    q, batch_size, lr = config.algorithm.local_steps, config.algorithm.outer_batch, config.algorithm.lr  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    task = build_task(config)
    x = task.init_params(generator(seed, "init"))["x"]
    startup = time.perf_counter() - t0

    times = []
    started = time.time()
    for r in range(config.run.rounds):
        t = time.perf_counter()
        cohort = sample_cohort(seed, r, clients, cohort_size)
        total = torch.zeros(x.numel(), dtype=torch.float64)
        loss_sum = 0.0
        for client in cohort:
            xc = x.clone()
            for s in range(q):
                step = r * q + s
                batch = task.sample_batch(client, batch_size, generator(seed, "client-step", client, step))
                xg = xc.detach().requires_grad_(True)
                loss = task.loss(xg, batch)
                (grad,) = torch.autograd.grad(loss, xg)
                xc = xc - lr * grad
                loss_sum += float(loss.detach()) / q
            total += xc.double()
        x = (total / len(cohort)).float()
        times.append(time.perf_counter() - t)
    accuracy = float(task.evaluator()({"x": x})["test_accuracy"])
    return Measurement("plain", clients, repeat, startup, times, x, accuracy, started)


def weights_hash(x: torch.Tensor) -> str:
    """A short hash of the exact bytes of a float32 parameter vector."""
    return hashlib.sha256(x.detach().cpu().float().contiguous().numpy().tobytes()).hexdigest()[:12]


def busier_share(clients: int, cohort: int, rounds: int) -> float:
    """Mean over the rounds of the cohort members hosted by the busiest Ray client actor (load balance)."""
    from fedcomp.platform.server import sample_cohort

    per = math.ceil(clients / ACTORS)
    shares = []
    for r in range(rounds):
        members = sample_cohort(SEED, r, clients, min(cohort, clients))
        shares.append(max(sum(1 for c in members if c // per == a) for a in range(ACTORS)))
    return statistics.fmean(shares)


# -- machine ---------------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _stdlib_platform.processor() or _stdlib_platform.machine() or "unknown"


def load_average() -> str:
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def machine_lines(ray_cpus: float | None, ray_start_s: float | None, load_before: str) -> list[str]:
    cores = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = cores
    versions = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}"]
    if "ray" in sys.modules:
        versions.append(f"ray {sys.modules['ray'].__version__}")
    lines = [
        f"machine: {cpu_model()}, {cores} cores ({usable} usable), {_stdlib_platform.system()} "
        f"{_stdlib_platform.machine()}",
        f"versions: {', '.join(versions)}; driver torch threads: {torch.get_num_threads()}",
        f"load average (1/5/15 min) before: {load_before}, after: {load_average()} "
        f"(other work on the machine inflates the times)",
    ]
    if ray_cpus is not None:
        lines.append(f"ray: cluster with {ray_cpus:g} CPUs, started (or joined) once in {ray_start_s:.2f} s, not counted in start-up")
    return lines


# -- table -----------------------------------------------------------------------------------------------


@dataclass
class Row:
    runner: str
    clients: int
    cells: dict[str, str] = field(default_factory=dict)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(
    measurements: list[Measurement], runners: Sequence[str], clients: Sequence[int]
) -> tuple[list[str], list[Row], dict[tuple[str, int], float]]:
    """Table columns, rows and the median round time (s) per (runner, clients)."""
    base = clients[0]
    by: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        by.setdefault((m.runner, m.clients), []).append(m)
    round_s = {key: _median([m.median_round_s for m in ms]) for key, ms in by.items()}
    plain_final = {m.clients: m.final for m in measurements if m.runner == "plain" and m.repeat == 0}

    ratio_col = f"round time / round time at {base} clients"
    columns = ["runner", "clients", "actors", "start-up (s)", "round (ms, median)", "overhead vs plain (ms/round)",
               ratio_col, "test acc", "final weights sha256", "max abs diff vs plain"]
    rows = []
    for runner in runners:
        for n in clients:
            ms = by[(runner, n)]
            hashes = {weights_hash(m.final) for m in ms}
            digest = weights_hash(ms[0].final) + ("" if len(hashes) == 1 else f" (+{len(hashes) - 1} other across repeats)")
            plain = round_s.get(("plain", n))
            overhead = "—" if runner == "plain" or plain is None else f"{(round_s[(runner, n)] - plain) * 1e3:+.1f}"
            ratio = "—" if n == base else f"{round_s[(runner, n)] / round_s[(runner, base)]:.2f}"
            if runner == "plain" or n not in plain_final:
                diff = "—"
            else:
                diff = f"{max(float((m.final - plain_final[n]).abs().max()) for m in ms):.1e}"
            actors = str(math.ceil(n / math.ceil(n / ACTORS))) if runner == "ray" else "—"
            cells = {
                "runner": runner,
                "clients": str(n),
                "actors": actors,
                "start-up (s)": f"{_median([m.startup_s for m in ms]):.2f}",
                "round (ms, median)": f"{round_s[(runner, n)] * 1e3:.1f}",
                "overhead vs plain (ms/round)": overhead,
                ratio_col: ratio,
                "test acc": f"{_median([m.test_accuracy for m in ms]):.3f}",
                "final weights sha256": digest,
                "max abs diff vs plain": diff,
            }
            rows.append(Row(runner, n, cells))
    return columns, rows, round_s


def render(columns: list[str], rows: list[Row], markdown: bool) -> list[str]:
    table = [[r.cells[c] for c in columns] for r in rows]
    if markdown:
        right = {c: c not in ("runner", "final weights sha256") for c in columns}
        lines = ["| " + " | ".join(columns) + " |"]
        lines.append("|" + "|".join("---:" if right[c] else ":---" for c in columns) + "|")
        lines += ["| " + " | ".join(cells) + " |" for cells in table]
        return lines
    widths = [max(len(c), *(len(cells[i]) for cells in table)) for i, c in enumerate(columns)]
    left = {i for i, c in enumerate(columns) if c in ("runner", "final weights sha256")}

    def fmt(cells: list[str]) -> str:
        return "  ".join(v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(cells, widths)))

    return [fmt(columns), fmt(["-" * w for w in widths]), *(fmt(cells) for cells in table)]


def target_lines(runners: Sequence[str], clients: Sequence[int], round_s: dict[tuple[str, int], float]) -> list[str]:
    lines = ["targets (information only, not checked):"]
    if "ray" in runners and "plain" in runners:
        measured = ", ".join(f"{n} clients {(round_s[('ray', n)] - round_s[('plain', n)]) * 1e3:+.1f} ms" for n in clients)
        lines.append(f"- Ray overhead over the plain loop <= {TARGET_OVERHEAD_MS:g} ms/round; measured: {measured}")
    if len(clients) > 1:
        lo, hi = clients[0], clients[-1]
        measured = ", ".join(f"{r} {round_s[(r, hi)] / round_s[(r, lo)]:.2f}" for r in runners)
        lines.append(
            f"- round time within {TARGET_RATIO:.0%} between {lo} and {hi} registered clients "
            f"(ratio {1 - TARGET_RATIO:.2f}..{1 + TARGET_RATIO:.2f}); measured {hi}/{lo} ratio: {measured}"
        )
    return lines


# -- side by side with the peers: `fedcomp bench --peers` -------------------------------------------------
#
# Every runner is a subprocess started from benchmarks/peers/ (fedcomp's three in this virtualenv, pfl in
# this virtualenv with its packages on PYTHONPATH, Flower in its own virtualenv), so start-up and the memory
# of the whole process tree are measured the same way for all five.

PEER_RUNNERS = ("ray", "local", "plain", "pfl", "flower")
RUNNER_LABELS = {"ray": "fedcomp ray", "local": "fedcomp local", "plain": "plain PyTorch", "pfl": "pfl",
                 "flower": "Flower"}
SINGLE_PROCESS = ("local", "plain")
"""Runners that are one process whatever the worker count: run once per workload, shown at 1 worker."""
MODELS = {"small": (64,), "heavy": (1024, 1024)}
PEER_COHORT, PEER_LOCAL_STEPS = 10, 5
RAY_CPUS = 2
FLOWER_SPEC = ("flwr[simulation]==1.41.0", "flwr==1.42.0")
"""Flower 1.42.0 asks for a certifi newer than the registry has: 1.41.0 brings the dependencies, then
1.42.0 is installed over it without them."""
PFL_PACKAGES = ("pfl==0.6.0", "dp-accounting==0.5.1", "prv-accountant==0.2.0", "absl-py==1.4.0",
                "dm-tree==0.1.10", "attrs==23.2.0", "packaging==25.0", "dill==0.4.1", "multiprocess==0.70.19")
"""pfl 0.6 and the dependencies pip resolves for it here. ``pip install pfl`` into this virtualenv would
downgrade packaging (26 -> 25) and attrs (26 -> 23), which Ray and jsonschema share, so they go into
``<bench-dir>/pfl-site`` instead and only the pfl runner's PYTHONPATH sees them (torch, NumPy: ours)."""
TARGET_FLOWER_SPEEDUP = 10.0
TARGET_MEMORY_GIB = 2.0
MEMORY_INTERVAL_S = 0.2


@dataclass(frozen=True)
class Workload:
    """One FedAvg workload of the side-by-side benchmark (data, model, cohorts; not the worker count)."""

    model: str
    clients: int
    rounds: int
    cohort: int = PEER_COHORT
    local_steps: int = PEER_LOCAL_STEPS

    @property
    def hidden(self) -> tuple[int, ...]:
        return MODELS[self.model]

    @property
    def sizes(self) -> list[int]:
        return [FEATURES, *self.hidden, CLASSES]

    @property
    def key(self) -> str:
        return f"{self.model}-{self.clients}c-{self.rounds}r-{self.cohort}k-{self.local_steps}q"

    def config(self, backend: str = "local", actors: int = ACTORS) -> Config:
        return bench_config(self.clients, self.cohort, self.rounds, self.local_steps, self.hidden, backend, actors)


FULL_MATRIX: tuple[tuple[Workload, tuple[int, ...]], ...] = (
    (Workload("small", 100, 20), (1, 2)),
    (Workload("small", 1000, 20), (1, 2)),
    (Workload("small", 1000, 100), (2,)),
    (Workload("heavy", 100, 20), (1, 2)),
)
"""(workload, worker counts) of ``fedcomp bench --peers``."""
QUICK_MATRIX: tuple[tuple[Workload, tuple[int, ...]], ...] = ((Workload("small", 100, 5), (2,)),)
"""``--quick``: one small workload, 5 rounds, 2 workers (and one repeat unless ``--repeats`` says more)."""


def workload_arrays(workload: Workload) -> dict[str, Any]:
    """The workload's data as arrays, drawn with fedcomp's own keyed generators (deterministic).

    ``init``: the initial flat weights; ``cohorts[r]``: round r's clients (:func:`sample_cohort`); ``features``
    / ``labels[r, j]``: the ``local_steps * BATCH`` examples client ``cohorts[r, j]`` trains on in round r, in
    order -- exactly the batches fedcomp's runners and the plain loop draw (``("client-step", c, r * q + s)``).
    """
    import numpy as np

    from fedcomp.platform.federation import build_task
    from fedcomp.platform.rng import generator
    from fedcomp.platform.server import sample_cohort

    config = workload.config()
    task = build_task(config)
    q, size = workload.local_steps, config.federation.cohort_size
    cohorts = np.empty((workload.rounds, size), dtype=np.int64)
    features = np.empty((workload.rounds, size, q * BATCH, FEATURES), dtype=np.float32)
    labels = np.empty((workload.rounds, size, q * BATCH), dtype=np.int64)
    for r in range(workload.rounds):
        for j, client in enumerate(sample_cohort(SEED, r, workload.clients, size)):
            cohorts[r, j] = client
            for s in range(q):
                x, y = task.sample_batch(client, BATCH, generator(SEED, "client-step", client, r * q + s))
                features[r, j, s * BATCH:(s + 1) * BATCH] = x.numpy()
                labels[r, j, s * BATCH:(s + 1) * BATCH] = y.numpy()
    init = task.init_params(generator(SEED, "init"))["x"].numpy().astype(np.float32)
    return {"init": init, "cohorts": cohorts, "features": features, "labels": labels}


def write_workload(workload: Workload, workers: int, folder: Any) -> Any:
    """Write the workload's ``.npz`` (once per workload) and a spec for ``workers``; return the spec's path."""
    import json
    from pathlib import Path

    import numpy as np

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{workload.key}.npz"
    if not data.exists():
        tmp = folder / f"{workload.key}.tmp.npz"
        np.savez(tmp, **workload_arrays(workload))
        tmp.replace(data)
    spec = {"data": str(data.resolve()), "sizes": workload.sizes, "lr": LR, "local_steps": workload.local_steps,
            "batch": BATCH, "clients": workload.clients, "cohort": min(workload.cohort, workload.clients),
            "rounds": workload.rounds, "workers": workers, "seed": SEED}
    path = folder / f"{workload.key}-w{workers}.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


# process-tree memory ---------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def process_memory(pid: int) -> int:
    """Bytes of memory of one process: its PSS (shared pages split between their users), else its RSS; 0 if gone."""
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1]) * 1024
        except OSError:
            continue
    return 0


def process_name(pid: int) -> str:
    """A short name for a process: its title (Ray's workers set ``ray::Actor``) or its program and script."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not args:
        return "?"
    words = [os.path.basename(a) for a in args[:3] if not a.startswith("-")]
    return " ".join(words)[:60] if not args[0].startswith("ray::") else args[0].split()[0][:60]


class TreeMemory:
    """Samples the summed PSS of a process and all its descendants every ``interval`` s; keeps the peak.

    A process once seen in the tree stays counted while it lives, even if it is re-parented (Ray's daemons).
    """

    def __init__(self, root: int, interval: float = MEMORY_INTERVAL_S) -> None:
        import threading

        self.root, self.interval, self.peak, self.seen = root, interval, 0, {root}
        self.peak_detail: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> int:
        kids = _children()
        stack = [self.root, *self.seen]
        while stack:
            pid = stack.pop()
            for child in kids.get(pid, ()):
                if child not in self.seen:
                    self.seen.add(child)
                    stack.append(child)
        per = {pid: process_memory(pid) for pid in self.seen}
        total = sum(per.values())
        if total > self.peak:
            self.peak = total
            self.peak_detail = {pid: (process_name(pid), size) for pid, size in per.items() if size}
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# peers: locating and installing -------------------------------------------------------------------------


SECTION_MARK = "<!-- section written by benchmarks/"
"""Where the sections other scripts add to RESULTS.md begin (kept when the peers harness rewrites it)."""


def write_results(path: "os.PathLike[str] | str", text: str) -> None:
    """Write the harness's report to ``path``, keeping the sections other scripts published there."""
    from pathlib import Path

    path = Path(path)
    old = path.read_text() if path.exists() else ""
    kept = "\n" + old[old.index(SECTION_MARK):] if SECTION_MARK in old else ""
    path.write_text(text + "\n" + kept)


def repo_root() -> Any:
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


def peers_dir() -> Any:
    folder = repo_root() / "benchmarks" / "peers"
    if not (folder / "_peer_common.py").exists():
        raise PlatformError(f"--peers needs fedcomp's source checkout: {folder} is missing (the runners live there)")
    return folder


class PeerMissing(PlatformError):
    """A peer framework the benchmark needs is not installed and may not be installed now."""


def _pip(python: str, args: Sequence[str], what: str) -> None:
    import subprocess

    _progress(f"installing {what}: {python} -m pip install {' '.join(args)}")
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", *args], capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise PeerMissing(f"installing {what} failed (pip exit {done.returncode}): {tail}")


def ensure_pfl(bench_dir: Any, install: bool) -> Any:
    """The folder holding pfl 0.6 for the pfl runner's PYTHONPATH; installed there on demand."""
    site = bench_dir / "pfl-site"
    marker = site / ".fedcomp-bench"
    want = " ".join(PFL_PACKAGES)
    if marker.exists() and marker.read_text() == want:
        return site
    if not install:
        raise PeerMissing(f"pfl 0.6 is not installed under {site}; run without --no-install to install it there "
                          f"(pip install --no-deps --target {site} {want})")
    _pip(sys.executable, ["--no-deps", "--target", str(site), *PFL_PACKAGES], "pfl 0.6")
    marker.write_text(want)
    return site


def ensure_flower(bench_dir: Any, install: bool) -> Any:
    """The Python of the Flower 1.42 virtualenv (``<bench-dir>/flower-venv``); created on demand."""
    import subprocess

    venv = bench_dir / "flower-venv"
    python = venv / "bin" / "python"
    marker = venv / ".fedcomp-bench"
    torch_spec = f"torch=={torch.__version__.split('+')[0]}"
    want = " ".join((*FLOWER_SPEC, torch_spec))
    if python.exists() and marker.exists() and marker.read_text() == want:
        return python
    if not install:
        raise PeerMissing(f"Flower 1.42 is not installed in {venv}; run without --no-install to create that "
                          f"virtualenv ({want})")
    if not python.exists():
        _progress(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _pip(str(python), [FLOWER_SPEC[0], torch_spec], f"{FLOWER_SPEC[0]} and {torch_spec}")
    _pip(str(python), ["--no-deps", FLOWER_SPEC[1]], FLOWER_SPEC[1])
    marker.write_text(want)
    return python


# peers: running ------------------------------------------------------------------------------------------


@dataclass
class PeerRun:
    """One runner's run of one workload: times from its own clock, the process tree's peak memory, weights."""

    runner: str
    workload: Workload
    workers: int
    repeat: int
    startup_s: float
    round_s: list[float]
    peak_bytes: int
    final: Any
    versions: dict[str, str]
    peak_detail: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Process id -> (name, bytes) at the memory peak."""

    @property
    def median_round_s(self) -> float:
        return statistics.median(self.round_s)


def runner_command(runner: str, workers: int, spec: Any, out: Any, flower_python: Any = None) -> list[str]:
    peers = peers_dir()
    tail = ["--workload", str(spec), "--out", str(out)]
    if runner in ("ray", "local", "plain"):
        return [sys.executable, str(peers / "fedcomp_runner.py"), "--runner", runner, *tail]
    if runner == "pfl":
        if workers == 1:
            return [sys.executable, str(peers / "pfl_runner.py"), *tail]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}",
                str(peers / "pfl_runner.py"), *tail]
    return [str(flower_python), str(peers / "flower_runner.py"), *tail]


def runner_env(runner: str, pfl_site: Any = None) -> dict[str, str]:
    env = dict(os.environ)
    # every run starts its own Ray: a bare ray.init() would join a cluster someone started with `ray start`
    env["RAY_ADDRESS"] = "local"
    paths = [str(peers_dir())] + ([str(pfl_site)] if runner == "pfl" and pfl_site is not None else [])
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               FLWR_TELEMETRY_ENABLED="0", PYTHONUNBUFFERED="1")
    return env


def run_peer(runner: str, workload: Workload, workers: int, repeat: int, spec: Any, work: Any,
             flower_python: Any = None, pfl_site: Any = None, timeout_s: float = 1800) -> PeerRun:
    """Start one runner as a subprocess, sample its process tree's memory, read back its result."""
    import json
    import signal
    import subprocess

    import numpy as np

    name = f"{runner}-{workload.key}-w{workers}-{repeat}"
    out, log = work / f"{name}.json", work / f"{name}.log"
    out.unlink(missing_ok=True)
    cmd = runner_command(runner, workers, spec, out, flower_python)
    with open(log, "w") as log_file:
        launched = time.time()
        proc = subprocess.Popen(cmd, env=runner_env(runner, pfl_site), stdout=log_file, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        with TreeMemory(proc.pid) as memory:
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise PlatformError(f"{RUNNER_LABELS[runner]} on {workload.key} ran past {timeout_s:g} s; log: {log}")
    if rc != 0 or not out.exists():
        lines = log.read_text(errors="replace").strip().splitlines()
        errors = [ln.strip() for ln in lines if re.match(r"\s*[\w.]*(Error|Exception|Exit)\b", ln)]
        reason = errors[0] if errors else " | ".join(lines[-3:])
        raise PlatformError(f"{RUNNER_LABELS[runner]} on {workload.key} with {workers} worker(s) failed (exit {rc}): "
                            f"{reason} (log: {log})")
    result = json.loads(out.read_text())
    marks = [float(result["rounds_started_at"]), *map(float, result["round_ends"])]
    rounds = [b - a for a, b in zip(marks[:-1], marks[1:])]
    if len(rounds) != workload.rounds:
        raise PlatformError(f"{RUNNER_LABELS[runner]} on {workload.key} timed {len(rounds)} of {workload.rounds} rounds")
    final = np.load(out.with_suffix(".npy"))
    # start-up: launch until round 1 ended, less a typical round -- Flower starts its Ray backend while the
    # server loop already waits in round 1, so "until round 1 began" would miss it
    startup = marks[1] - launched - statistics.median(rounds)
    return PeerRun(runner, workload, workers, repeat, startup, rounds, memory.peak, final,
                   dict(result.get("runner_versions", {})), memory.peak_detail)


# peers: table --------------------------------------------------------------------------------------------


PEER_COLUMNS = ["model", "clients", "rounds", "runner", "workers", "start-up (s)", "round (ms)",
                "overhead vs plain (ms/round)", "client updates/s", "peak memory (MiB)", "final weights sha256",
                "max abs diff vs plain", "test acc"]


def _np_hash(x: Any) -> str:
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(x, dtype=np.float32).tobytes()).hexdigest()[:12]


def summarise_peers(runs: list[PeerRun], accuracy: Any = None) -> tuple[list[Row], dict[tuple[str, str, int], float]]:
    """Table rows (median over repeats) and the median round time (s) per (runner, workload key, workers).

    ``accuracy(workload, weights) -> float`` gives the test accuracy column (left out when None).
    """
    import numpy as np

    by: dict[tuple[str, str, int], list[PeerRun]] = {}
    order: list[Workload] = []
    for run in runs:
        by.setdefault((run.runner, run.workload.key, run.workers), []).append(run)
        if run.workload not in order:
            order.append(run.workload)
    round_s = {key: _median([r.median_round_s for r in rs]) for key, rs in by.items()}
    rows = []
    for w in order:
        plain = [rs for (r, k, _), rs in by.items() if r == "plain" and k == w.key]
        plain_round = _median([r.median_round_s for r in plain[0]]) if plain else None
        plain_final = plain[0][0].final if plain else None
        for runner in PEER_RUNNERS:
            for workers in sorted({n for (r, k, n) in by if r == runner and k == w.key}):
                rs = by[(runner, w.key, workers)]
                rt = round_s[(runner, w.key, workers)]
                hashes = {_np_hash(r.final) for r in rs}
                digest = _np_hash(rs[0].final) + ("" if len(hashes) == 1 else f" (+{len(hashes) - 1} other)")
                if runner == "plain" or plain_final is None:
                    diff = "—"
                else:
                    diff = f"{max(float(np.abs(r.final - plain_final).max()) for r in rs):.1e}"
                cells = {
                    "model": f"{w.model} {'-'.join(map(str, w.sizes))}",
                    "clients": str(w.clients),
                    "rounds": str(w.rounds),
                    "runner": RUNNER_LABELS[runner],
                    "workers": str(workers),
                    "start-up (s)": f"{_median([r.startup_s for r in rs]):.2f}",
                    "round (ms)": f"{rt * 1e3:.1f}",
                    "overhead vs plain (ms/round)": "—" if runner == "plain" or plain_round is None
                    else f"{(rt - plain_round) * 1e3:+.1f}",
                    "client updates/s": f"{min(w.cohort, w.clients) / rt:.0f}",
                    "peak memory (MiB)": f"{_median([r.peak_bytes for r in rs]) / 2**20:.0f}",
                    "final weights sha256": digest,
                    "max abs diff vs plain": diff,
                    "test acc": "—" if accuracy is None else f"{accuracy(w, rs[0].final):.3f}",
                }
                rows.append(Row(runner, w.clients, cells))
    return rows, round_s


def peer_target_lines(runs: list[PeerRun], round_s: dict[tuple[str, str, int], float]) -> list[str]:
    """The issue's targets next to what this run measured (information, never pass/fail)."""
    lines = ["targets (information only, not checked):"]
    keys = sorted({(r.workload, r.workers) for r in runs}, key=lambda t: (t[0].model, t[0].clients, t[0].rounds, t[1]))
    overhead = [f"{w.model}/{w.clients}c/{w.rounds}r/{n}w {(round_s[('ray', w.key, n)] - round_s[('plain', w.key, 1)]) * 1e3:+.1f} ms"
                for w, n in keys if ("ray", w.key, n) in round_s and ("plain", w.key, 1) in round_s]
    if overhead:
        lines.append(f"- fedcomp Ray overhead over the plain loop <= {TARGET_OVERHEAD_MS:g} ms/round: " + ", ".join(overhead))
    speedup = [f"{w.clients}c/{w.rounds}r/{n}w {round_s[('flower', w.key, n)] / round_s[('ray', w.key, n)]:.1f}x"
               for w, n in keys if w.model == "small" and ("flower", w.key, n) in round_s and ("ray", w.key, n) in round_s]
    if speedup:
        lines.append(f"- Flower's round time / fedcomp Ray's on the small workload >= {TARGET_FLOWER_SPEEDUP:g}x: "
                     + ", ".join(speedup))
    mem = [r for r in runs if r.runner == "ray" and r.workload.clients == 1000 and r.workers == 2]
    if mem:
        peak = _median([r.peak_bytes for r in mem]) / 2**30
        lines.append(f"- fedcomp Ray, 1000 clients in 2 client actors, whole process tree (driver, Ray's daemons, "
                     f"server and client actors) < {TARGET_MEMORY_GIB:g} GiB: peak {peak:.2f} GiB")
    return lines


def memory_lines(runs: list[PeerRun]) -> list[str]:
    """Where the peak memory sits, per process kind, for the multi-process runners' largest workload."""
    lines = []
    for runner in ("ray", "flower", "pfl"):
        mine = [r for r in runs if r.runner == runner and r.peak_detail]
        if not mine:
            continue
        top = max(mine, key=lambda r: (r.workload.clients, r.workers, r.workload.rounds, -r.repeat))
        kinds: dict[str, list[int]] = {}
        for name, size in top.peak_detail.values():
            kinds.setdefault(name, []).append(size)
        parts = sorted(kinds.items(), key=lambda kv: -sum(kv[1]))
        text = ", ".join(f"{name} {sum(v) / 2**20:.0f}" + (f" ({len(v)} processes)" if len(v) > 1 else "")
                         for name, v in parts)
        lines.append(f"- {RUNNER_LABELS[runner]}, {top.workload.model} {top.workload.clients} clients, {top.workers} "
                     f"worker(s), peak {top.peak_bytes / 2**20:.0f} MiB: {text}")
    return ["memory at the peak by process (MiB of PSS):", *lines] if lines else []


def _peer_plan(args: argparse.Namespace) -> tuple[tuple[tuple[Workload, tuple[int, ...]], ...], list[str], int]:
    matrix = QUICK_MATRIX if args.quick else FULL_MATRIX
    runners = list(args.runners or PEER_RUNNERS)
    unknown = [r for r in runners if r not in PEER_RUNNERS]
    if unknown:
        raise PlatformError(f"--runners {' '.join(unknown)}: unknown; allowed: {', '.join(PEER_RUNNERS)}")
    runners = [r for r in PEER_RUNNERS if r in runners]
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if repeats < 1:
        raise PlatformError(f"--repeats = {repeats}: must be >= 1")
    return matrix, runners, repeats


def peers_main(args: argparse.Namespace) -> int:
    """``fedcomp bench --peers``: every runner on every workload of the matrix; print and write RESULTS.md."""
    from pathlib import Path

    matrix, runners, repeats = _peer_plan(args)
    peers_dir()
    torch.set_num_threads(1)  # the harness draws the workloads and evaluates the final weights
    bench_dir = Path(args.bench_dir) if args.bench_dir else repo_root() / ".bench"
    results = Path(args.results) if args.results else repo_root() / "benchmarks" / "RESULTS.md"
    bench_dir.mkdir(parents=True, exist_ok=True)
    # fail before any work if a peer is missing (and --no-install forbids installing it)
    pfl_site = ensure_pfl(bench_dir, not args.no_install) if "pfl" in runners else None
    flower_python = ensure_flower(bench_dir, not args.no_install) if "flower" in runners else None

    load_before = load_average()
    work = bench_dir / "work"
    work.mkdir(exist_ok=True)
    specs = {(w, n): write_workload(w, n, work) for w, workers in matrix for n in workers}
    runs: list[PeerRun] = []
    for repeat in range(repeats):
        for w, workers in matrix:
            for runner in runners:
                for n in ((1,) if runner in SINGLE_PROCESS else workers):
                    spec = specs[(w, n)] if (w, n) in specs else write_workload(w, n, work)
                    _progress(f"repeat {repeat + 1}/{repeats}: {RUNNER_LABELS[runner]}, {w.key}, {n} worker(s)")
                    try:
                        runs.append(run_peer(runner, w, n, repeat, spec, work, flower_python, pfl_site))
                    except PlatformError as error:  # one retry: a crash at exit must not cost the whole matrix
                        _progress(f"retrying once after: {error}")
                        runs.append(run_peer(runner, w, n, repeat, spec, work, flower_python, pfl_site))

    tasks: dict[str, Any] = {}

    def accuracy(w: Workload, final: Any) -> float:
        from fedcomp.platform.federation import build_task

        if w.key not in tasks:
            tasks[w.key] = build_task(w.config()).evaluator()
        return float(tasks[w.key]({"x": torch.from_numpy(final)})["test_accuracy"])

    rows, round_s = summarise_peers(runs, accuracy)
    text = render_peer_report(args, runs, rows, round_s, load_before, matrix, repeats)
    print(text)
    if results.name != "-":
        results.parent.mkdir(parents=True, exist_ok=True)
        write_results(results, text)
        _progress(f"wrote {results}")
    return 0


def render_peer_report(args: argparse.Namespace, runs: list[PeerRun], rows: list[Row],
                       round_s: dict[tuple[str, str, int], float], load_before: str,
                       matrix: Any, repeats: int) -> str:
    versions: dict[str, str] = {}
    for run in runs:
        for name, version in run.versions.items():
            if name != "torch" or run.runner == "flower":
                label = f"{name} ({RUNNER_LABELS[run.runner]})" if run.runner == "flower" else name
                versions[label] = version
    command = "fedcomp bench --peers" + (" --quick" if args.quick else "") + (
        f" --repeats {args.repeats}" if args.repeats is not None else "") + (
        f" --runners {' '.join(args.runners)}" if args.runners else "")
    notes = [
        *machine_lines(None, None, load_before),
        "runners: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
        "workload: FedAvg, synthetic Gaussian-mixture classification with Dirichlet(0.5) label skew "
        f"({FEATURES} features, {CLASSES} classes), seed {SEED}; {PEER_COHORT} clients per round, "
        f"{PEER_LOCAL_STEPS} local SGD steps of batch {BATCH}, lr {LR:g}; models: "
        + ", ".join(f"{k} MLP {'-'.join(map(str, [FEATURES, *v, CLASSES]))}" for k, v in MODELS.items())
        + "; every runner trains on the same cohorts and batches (drawn once from the seed; the peers read "
        "them from an .npz) from the same initial weights",
        "workers: fedcomp ray = client actors (+ 1 server actor), Ray with 2 CPUs; pfl = processes (torchrun, "
        "gloo); Flower = Ray actors running ClientApps (2 CPUs, 2/workers each); fedcomp local and the plain "
        "loop are one process; one torch thread per process everywhere",
        f"timing: each run is its own process; start-up = process launch until round 1 ends, less the median "
        f"round (imports, Ray, actors, client registration, lazy initialisation); round = wall time per round seen by the server loop, median over the "
        f"rounds, then median over {repeats} run(s); client updates/s = clients per round / round time; "
        f"peak memory = peak of the summed PSS of the process and all its descendants (sampled every "
        f"{MEMORY_INTERVAL_S:g} s)",
        "weights: sha256 of the final float32 weights; fedcomp averages in float64 (bit-identical to the plain "
        "loop), pfl and Flower in float32, hence their tiny differences",
    ]
    notes = [ln + "  " for ln in notes]
    lines = ["# Side-by-side benchmark: fedcomp, plain PyTorch, pfl, Flower", "",
             f"Written by `{command}` from its own output (stdout, verbatim).", "", *notes, ""]
    lines += render(PEER_COLUMNS, rows, markdown=True)
    lines += ["", *peer_target_lines(runs, round_s)]
    breakdown = memory_lines(runs)
    if breakdown:
        lines += ["", *breakdown]
    return "\n".join(lines)


# -- entry point -------------------------------------------------------------------------------------------


BENCH_DEFAULTS = {"clients": [100, 1000], "cohort": 10, "rounds": 20, "local_steps": 5, "repeats": 3,
                  "hidden": list(DEFAULT_HIDDEN)}
"""Defaults of the in-process benchmark's workload flags (None on the parser, so that --peers can refuse them)."""
PEERS_ONLY = ("quick", "no_install", "bench_dir", "results")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_mode(args: argparse.Namespace) -> None:
    """Refuse flags of the other mode: --peers has its own fixed workload matrix."""
    if getattr(args, "peers", False):
        given = [n for n in ("clients", "cohort", "rounds", "local_steps", "hidden") if getattr(args, n, None) is not None]
        if given or getattr(args, "markdown", False):
            names = ", ".join(_flag(n) for n in given + (["markdown"] if getattr(args, "markdown", False) else []))
            raise PlatformError(f"{names}: not with --peers (its workloads are fixed: see `fedcomp bench --help`; "
                                f"--quick for a short run)")
        return
    given = [n for n in PEERS_ONLY if getattr(args, n, None) not in (None, False)]
    if given:
        raise PlatformError(f"{', '.join(_flag(n) for n in given)}: only with --peers")
    peers = [r for r in (getattr(args, "runners", None) or []) if r in ("pfl", "flower")]
    if peers:
        raise PlatformError(f"--runners {' '.join(peers)}: the peers run only with --peers")
    for name, value in BENCH_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def _check(args: argparse.Namespace) -> tuple[list[int], list[str], list[int]]:
    clients = sorted(set(args.clients))
    if not clients or clients[0] < 1:
        raise PlatformError(f"--clients {args.clients}: need at least one registered-client count >= 1")
    for name in ("cohort", "rounds", "local_steps", "repeats"):
        if getattr(args, name) < 1:
            raise PlatformError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be >= 1")
    runners = list(getattr(args, "runners", None) or RUNNERS)
    unknown = [r for r in runners if r not in RUNNERS]
    if unknown:
        raise PlatformError(f"--runners {' '.join(unknown)}: unknown; allowed: {', '.join(RUNNERS)}")
    runners = [r for r in RUNNERS if r in runners]  # fixed order, no duplicates
    hidden = list(getattr(args, "hidden", None) or DEFAULT_HIDDEN)
    if any(h < 1 for h in hidden):
        raise PlatformError(f"--hidden {hidden}: widths must be >= 1")
    return clients, runners, hidden


def _progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    _check_mode(args)
    if getattr(args, "peers", False):
        return peers_main(args)
    clients, runners, hidden = _check(args)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _bench(args, clients, runners, hidden)
    finally:
        torch.set_num_threads(threads)


def _bench(args: argparse.Namespace, clients: list[int], runners: list[str], hidden: list[int]) -> int:
    load_before = load_average()

    ray_cpus = ray_start = None
    if "ray" in runners:
        from fedcomp.actors.cluster import connect

        t0 = time.perf_counter()
        ray_cpus = float(connect().get("CPU", 0.0))
        ray_start = time.perf_counter() - t0

    measurements: list[Measurement] = []
    for repeat in range(args.repeats):
        for n in clients:
            for runner in runners:
                _progress(f"repeat {repeat + 1}/{args.repeats}, {n} clients, {runner}")
                backend = "local" if runner == "plain" else runner
                config = bench_config(n, args.cohort, args.rounds, args.local_steps, hidden, backend)
                if runner == "plain":
                    measurements.append(run_plain(config, repeat))
                else:
                    measurements.append(run_fedcomp(config, runner, repeat))

    columns, rows, round_s = summarise(measurements, runners, clients)
    cohort = ", ".join(f"{min(args.cohort, n)} of {n}" for n in clients)
    workload = (
        f"workload: FedAvg, synthetic-classification MLP {FEATURES}-{'-'.join(map(str, hidden))}-{CLASSES}, "
        f"clients per round {cohort}, {args.rounds} rounds, {args.local_steps} local steps of batch {BATCH}, "
        f"lr {LR:g}, seed {SEED}"
    ) + (f"; Ray: clients packed into {ACTORS} client actors + 1 server actor" if "ray" in runners else "")
    timing = (
        f"timing: start-up = server construction (Ray: incl. actor start); round = one run_round() call "
        f"seen by the driver, median over {args.rounds} rounds, then median over {args.repeats} repeat(s)"
    )
    lines = [*machine_lines(ray_cpus, ray_start, load_before), workload, timing]
    if "ray" in runners:
        lines.append("ray: clients of a round's cohort on the busier of the 2 actors (mean over rounds): " + ", ".join(
            f"{busier_share(n, args.cohort, args.rounds):.2f} of {min(args.cohort, n)} at {n} clients" for n in clients
        ))
    lines.append("")
    lines += render(columns, rows, args.markdown)
    lines += ["", *target_lines(runners, clients, round_s)]
    if args.markdown:
        # keep the notes as separate paragraphs/list items when rendered
        lines = [ln if not ln or ln.startswith(("|", "-", "targets")) else ln + "  " for ln in lines]
    print("\n".join(lines))
    return 0


def _parse(argv: Sequence[str]) -> Any:  # pragma: no cover - convenience for `python -m fedcomp.bench`
    from fedcomp.cli import build_parser

    return build_parser().parse_args(["bench", *argv])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(_parse(sys.argv[1:])))
