"""Side by side with the peers: one FedAvg workload matrix in fedcomp (Ray, local), a plain PyTorch loop, the
same loop with ``torch.optim.SGD`` stepping an ``nn.Module`` in place, pfl 0.6 and Flower 1.42 (Ray simulation),
each run in its own process; writes ``benchmarks/RESULTS.md`` (``--quick`` prints its report only).

    python benchmarks/peers.py [--quick] [--repeats N]
        [--runners ray ray-driver ray-home ray-graph ray-vmap ray-driver-vmap ray-replicated ray-replicated-vmap
                   ray-replicated-fused ray-replicated-compiled local local-vmap local-fused local-compiled plain optim
                   pfl flower] [--models small heavy]
                               [--no-install] [--bench-dir DIR] [--results PATH|-]

Every runner is a subprocess started from ``benchmarks/peers/`` (fedcomp's six in this virtualenv, pfl in
this virtualenv with its packages on PYTHONPATH, Flower in its own virtualenv), so start-up and the memory
of the whole process tree are measured the same way for all eight. Memory is measured in runs of its own, one
per configuration after the timed repeats: sampling a process tree's memory takes CPU (54 ms per sample of a
Ray run's ten processes), which the timed runs must not lose. The peers are installed under
``--bench-dir`` (default ``.bench/`` in the checkout) on first use; ``--no-install`` fails in one line
(exit 2) instead. The workload, the machine description and the table come from :mod:`fedcomp.bench`
(``fedcomp bench``), so both benchmarks measure the same thing and describe it the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from common import HERE, REPO, revision, write_report
from fedcomp.bench import (
    ACTORS,
    BATCH,
    CLASSES,
    FEATURES,
    LR,
    SEED,
    TARGET_OVERHEAD_MS,
    Row,
    bench_config,
    load_average,
    machine_lines,
    median,
    progress,
    render,
)
from fedcomp.platform.config import Config
from fedcomp.platform.errors import PlatformError
from fedcomp.platform.federation import build_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import sample_cohort

PEERS = HERE / "peers"
"""The runners' scripts."""
FEDCOMP_RUNNERS = ("ray", "ray-driver", "ray-home", "ray-graph", "ray-vmap", "ray-driver-vmap", "ray-replicated",
                   "ray-replicated-vmap", "ray-replicated-fused", "ray-replicated-compiled", "local", "local-vmap",
                   "local-fused", "local-compiled", "plain", "optim")
"""The runners of ``peers/fedcomp_runner.py``."""
RAY_RUNNERS = ("ray", "ray-driver", "ray-home", "ray-graph", "ray-vmap", "ray-driver-vmap", "ray-replicated",
               "ray-replicated-vmap", "ray-replicated-fused", "ray-replicated-compiled")
PEER_RUNNERS = (*FEDCOMP_RUNNERS, "pfl", "flower")
RUNNER_LABELS = {"ray": "fedcomp ray", "ray-driver": "fedcomp ray, server in driver",
                 "ray-home": "fedcomp ray, clients at home", "ray-graph": "fedcomp ray, compiled graph",
                 "ray-vmap": "fedcomp ray, vectorised clients",
                 "ray-driver-vmap": "fedcomp ray, server in driver, vectorised clients",
                 "ray-replicated": "fedcomp ray, server replicated on the client actors",
                 "ray-replicated-vmap": "fedcomp ray, server replicated, vectorised clients",
                 "ray-replicated-fused": "fedcomp ray, server replicated, fused SGD steps",
                 "ray-replicated-compiled": "fedcomp ray, server replicated, gradients compiled (torch.compile)",
                 "local": "fedcomp local",
                 "local-vmap": "fedcomp local, vectorised clients", "local-fused": "fedcomp local, fused SGD steps",
                 "local-compiled": "fedcomp local, gradients compiled (torch.compile)",
                 "plain": "plain PyTorch", "optim": "torch.optim loop", "pfl": "pfl", "flower": "Flower"}
SINGLE_PROCESS = ("local", "local-vmap", "local-fused", "local-compiled", "plain", "optim")
"""Runners that are one process whatever the worker count: run once per workload, shown at 1 worker."""
MODELS = {"small": (64,), "heavy": (1024, 1024)}
PEER_COHORT, PEER_LOCAL_STEPS = 10, 5
FLOWER_SPEC = ("flwr[simulation]==1.41.0", "flwr==1.42.0")
"""Flower 1.42.0 asks for a certifi newer than the registry has: 1.41.0 brings the dependencies, then
1.42.0 is installed over it without them."""
PFL_PACKAGES = ("pfl==0.6.0", "dp-accounting==0.5.1", "prv-accountant==0.2.0", "absl-py==1.4.0",
                "dm-tree==0.1.10", "attrs==23.2.0", "packaging==25.0", "dill==0.4.1", "multiprocess==0.70.19")
"""pfl 0.6 and the dependencies pip resolves for it here. ``pip install pfl`` into this virtualenv would
downgrade packaging (26 -> 25) and attrs (26 -> 23), which Ray and jsonschema share, so they go into
``<bench-dir>/pfl-site`` instead and only the pfl runner's PYTHONPATH sees them (torch, NumPy: ours)."""
TARGET_FLOWER_SPEEDUP = 20.0
TARGET_PFL_RATIO = 0.8
TARGET_MEMORY_GIB = 1.2
TARGET_OPTIM_RATIO = 1.05
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
"""(workload, worker counts) of ``python benchmarks/peers.py``."""
QUICK_MATRIX: tuple[tuple[Workload, tuple[int, ...]], ...] = ((Workload("small", 100, 5), (2,)),)
"""``--quick``: one small workload, 5 rounds, 2 workers (and one repeat unless ``--repeats`` says more)."""
QUICK_RUNNERS = ("ray-replicated", "local", "plain", "optim", "pfl", "flower")
"""``--quick``'s runners unless ``--runners`` names others: fedcomp's defaults (the Ray backend's, the local one), the
plain loops and the peers."""
MEMORY_MATRIX: tuple[tuple[Workload, tuple[int, ...]], ...] = ((Workload("small", 1000, 20), (2,)),)
"""``--memory``: the memory target's workload alone (1,000 clients, 2 workers), e.g. under another torch build."""


def workload_arrays(workload: Workload) -> dict[str, Any]:
    """The workload's data as arrays, drawn with fedcomp's own keyed generators (deterministic).

    ``init``: the initial flat weights; ``cohorts[r]``: round r's clients (:func:`sample_cohort`); ``features``
    / ``labels[r, j]``: the ``local_steps * BATCH`` examples client ``cohorts[r, j]`` trains on in round r, in
    order -- exactly the batches fedcomp's runners and the plain loop draw (``("client-step", c, r * q + s)``).
    """
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
        self.root, self.interval, self.peak, self.seen = root, interval, 0, {root}
        self.peak_detail: dict[int, tuple[str, int]] = {}
        self.names: dict[int, str] = {}
        """Each process's last name read: a process on its way out (an actor ending with its run) has no command
        line left while its memory still counts, so at the peak it keeps the name read before (it showed as "?")."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def name(self, pid: int) -> str:
        name = process_name(pid)
        if name != "?":
            self.names[pid] = name
        return self.names.get(pid, name)

    def sample(self) -> int:
        kids = _children()
        stack = [self.root, *self.seen]
        while stack:
            pid = stack.pop()
            for child in kids.get(pid, ()):
                if child not in self.seen:
                    self.seen.add(child)
                    self.name(child)
                    stack.append(child)
        per = {pid: process_memory(pid) for pid in self.seen}
        total = sum(per.values())
        if total > self.peak:
            self.peak = total
            self.peak_detail = {pid: (self.name(pid), size) for pid, size in per.items() if size}
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# peers: locating and installing -------------------------------------------------------------------------


class PeerMissing(PlatformError):
    """A peer framework the benchmark needs is not installed and may not be installed now."""


def _pip(python: str, args: Sequence[str], what: str) -> None:
    """``python -m pip install ARGS``; a failure is one line naming what and pip's last lines."""
    progress(f"installing {what}: {python} -m pip install {' '.join(args)}")
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
        progress(f"creating {venv}")
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
    sampled: bool = False
    """A memory run: its tree's memory sampled (``peak_bytes``, ``peak_detail``), its times not used. A timed
    run samples nothing (``peak_bytes`` 0)."""

    @property
    def median_round_s(self) -> float:
        return statistics.median(self.round_s)


def runner_command(runner: str, workers: int, spec: Any, out: Any, flower_python: Any = None,
                   memory_run: bool = False) -> list[str]:
    """The command line that starts ``runner`` with ``workers`` workers on the workload ``spec`` (``memory_run``:
    fedcomp's runners leave the final model unread, which would make a Ray run's driver import torch)."""
    peers = PEERS
    tail = ["--workload", str(spec), "--out", str(out)]
    if runner in FEDCOMP_RUNNERS:
        return [sys.executable, str(peers / "fedcomp_runner.py"), "--runner", runner, *tail,
                *(["--memory-run"] if memory_run else [])]
    if runner == "pfl":
        if workers == 1:
            return [sys.executable, str(peers / "pfl_runner.py"), *tail]
        # torchrun's per-rank log folders go beside the output (its default is a new folder in /tmp, never removed)
        logs = Path(out).with_suffix(".torchrun")
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}",
                f"--log-dir={logs}", str(peers / "pfl_runner.py"), *tail]
    return [str(flower_python), str(peers / "flower_runner.py"), *tail]


def runner_env(runner: str, pfl_site: Any = None) -> dict[str, str]:
    """The runner's environment: its own Ray, one thread, the runners' folder (and pfl's) on PYTHONPATH."""
    env = dict(os.environ)
    # every run starts its own Ray: a bare ray.init() would join a cluster someone started with `ray start`
    env["RAY_ADDRESS"] = "local"
    paths = [str(PEERS)] + ([str(pfl_site)] if runner == "pfl" and pfl_site is not None else [])
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               FLWR_TELEMETRY_ENABLED="0", PYTHONUNBUFFERED="1")
    return env


def watch(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float,
          sample_memory: bool) -> tuple[int | None, TreeMemory]:
    """Run ``cmd`` in a session of its own, its output to ``log``; with ``sample_memory``, sample its process tree's
    memory meanwhile. Its exit code (None when it ran past ``timeout_s`` and was killed) and the samples."""
    with open(log, "w") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        memory = TreeMemory(proc.pid)
        with memory if sample_memory else contextlib.nullcontext():
            try:
                return proc.wait(timeout=timeout_s), memory
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return None, memory
            except BaseException:  # the harness stopped (Ctrl-C, SIGTERM): its runner and the Ray it started go too
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise


def run_peer(runner: str, workload: Workload, workers: int, repeat: int, spec: Any, work: Any,
             flower_python: Any = None, pfl_site: Any = None, timeout_s: float = 1800,
             sample_memory: bool = False) -> PeerRun:
    """Start one runner as a subprocess, read back its result; with ``sample_memory``, sample its process tree's
    memory meanwhile (a memory run)."""
    name = f"{runner}-{workload.key}-w{workers}-{'memory' if sample_memory else repeat}"
    out, log = work / f"{name}.json", work / f"{name}.log"
    out.unlink(missing_ok=True)
    cmd = runner_command(runner, workers, spec, out, flower_python, memory_run=sample_memory)
    launched = time.time()
    rc, memory = watch(cmd, runner_env(runner, pfl_site), log, timeout_s, sample_memory)
    if rc is None:
        raise PlatformError(f"{RUNNER_LABELS[runner]} on {workload.key} ran past {timeout_s:g} s; log: {log}")
    if rc != 0 or not out.exists():
        lines = log.read_text(errors="replace").strip().splitlines()
        errors = [ln.strip() for ln in lines if re.match(r"\s*[\w.]*(Error|Exception|Exit)\b", ln)]
        reason = errors[0] if errors else " | ".join(lines[-3:])
        raise PlatformError(f"{RUNNER_LABELS[runner]} on {workload.key} with {workers} worker(s) failed (exit {rc}): "
                            f"{reason} (log: {log})")
    result = json.loads(out.read_text())
    marks = [float(result["rounds_started_at"]), *map(float, result["round_ends"])]
    rounds = [b - a for a, b in pairwise(marks)]
    if len(rounds) != workload.rounds:
        raise PlatformError(f"{RUNNER_LABELS[runner]} on {workload.key} timed {len(rounds)} of {workload.rounds} rounds")
    final = np.load(out.with_suffix(".npy"))
    # start-up: launch until round 1 ended, less a typical round -- Flower starts its Ray backend while the
    # server loop already waits in round 1, so "until round 1 began" would miss it
    startup = marks[1] - launched - statistics.median(rounds)
    return PeerRun(runner, workload, workers, repeat, startup, rounds, memory.peak, final,
                   dict(result.get("runner_versions", {})), memory.peak_detail, sample_memory)


# peers: table --------------------------------------------------------------------------------------------


PEER_COLUMNS = ["model", "clients", "rounds", "runner", "workers", "start-up (s)", "round (ms)",
                "overhead vs plain (ms/round)", "client updates/s", "peak memory (MiB)", "final weights sha256",
                "max abs diff vs plain", "test acc"]


def _np_hash(x: Any) -> str:
    """A short hash of the exact bytes of a weight array as float32 (as :func:`fedcomp.bench.weights_hash`)."""
    return hashlib.sha256(np.ascontiguousarray(x, dtype=np.float32).tobytes()).hexdigest()[:12]


def summarise_peers(runs: list[PeerRun], accuracy: Any = None) -> tuple[list[Row], dict[tuple[str, str, int], float]]:
    """Table rows (median over the timed repeats) and the median round time (s) per (runner, workload key,
    workers); the peak memory from the memory runs ("—" where there is none).

    ``accuracy(workload, weights) -> float`` gives the test accuracy column (left out when None).
    """

    by: dict[tuple[str, str, int], list[PeerRun]] = {}
    peaks: dict[tuple[str, str, int], list[int]] = {}
    order: list[Workload] = []
    for run in runs:
        key = (run.runner, run.workload.key, run.workers)
        if run.sampled:
            peaks.setdefault(key, []).append(run.peak_bytes)
            continue
        by.setdefault(key, []).append(run)
        if run.workload not in order:
            order.append(run.workload)
    round_s = {key: median([r.median_round_s for r in rs]) for key, rs in by.items()}
    rows = []
    for w in order:
        plain = [rs for (r, k, _), rs in by.items() if r == "plain" and k == w.key]
        plain_round = median([r.median_round_s for r in plain[0]]) if plain else None
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
                    "start-up (s)": f"{median([r.startup_s for r in rs]):.2f}",
                    "round (ms)": f"{rt * 1e3:.1f}",
                    "overhead vs plain (ms/round)": "—" if runner == "plain" or plain_round is None
                    else f"{(rt - plain_round) * 1e3:+.1f}",
                    "client updates/s": f"{min(w.cohort, w.clients) / rt:.0f}",
                    "peak memory (MiB)": f"{median(peaks[key]) / 2**20:.0f}" if (key := (runner, w.key, workers)) in peaks
                    else "—",
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
    against_pfl = [f"{runner} {w.model}/{w.clients}c/{w.rounds}r {round_s[(runner, w.key, 2)] / round_s[('pfl', w.key, 2)]:.2f}x"
                   for w, n in keys if n == 2 for runner in RAY_RUNNERS
                   if (runner, w.key, 2) in round_s and ("pfl", w.key, 2) in round_s]
    if against_pfl:
        lines.append(f"- fedcomp Ray's round time / pfl's at 2 workers <= {TARGET_PFL_RATIO:g}x: " + ", ".join(against_pfl))
    speedup = [f"{runner} {w.clients}c/{w.rounds}r/{n}w {round_s[('flower', w.key, n)] / round_s[(runner, w.key, n)]:.1f}x"
               for w, n in keys if w.model == "small"
               for runner in ("ray", "ray-vmap", "ray-driver-vmap", "ray-replicated", "ray-replicated-vmap",
                              "ray-replicated-compiled")
               if ("flower", w.key, n) in round_s and (runner, w.key, n) in round_s]
    if speedup:
        lines.append(f"- Flower's round time / fedcomp Ray's on the small workload >= {TARGET_FLOWER_SPEEDUP:g}x: "
                     + ", ".join(speedup))
    in_place = [f"{w.model}/{w.clients}c/{w.rounds}r {round_s[('local', w.key, 1)] / round_s[('optim', w.key, 1)]:.2f}x"
                for w, n in keys if n == 1 and ("local", w.key, 1) in round_s and ("optim", w.key, 1) in round_s]
    if in_place:
        lines.append(f"- fedcomp local's round time / an in-place torch.optim loop's <= {TARGET_OPTIM_RATIO:g}x (on the "
                     f"heavy MLP): " + ", ".join(in_place))
    for runner, where in (("ray", "server actor"), ("ray-driver", "the server in the driver"),
                          ("ray-replicated", "the server replicated on the client actors")):
        mem = [r for r in runs if r.sampled and r.runner == runner and r.workload.clients == 1000 and r.workers == 2]
        if mem:
            peak = median([r.peak_bytes for r in mem]) / 2**30
            lines.append(f"- {RUNNER_LABELS[runner]}, 1000 clients in 2 client actors, whole process tree (driver, "
                         f"Ray's daemons, {where} and client actors) < {TARGET_MEMORY_GIB:g} GiB: peak {peak:.2f} GiB")
    return lines


def cli_memory(workload: Workload, work: Path, timeout_s: float = 1800) -> TreeMemory:
    """``fedcomp run`` of the workload on Ray as a user runs it (2 client actors, the server replicated on them:
    the defaults; its metrics, TensorBoard events and checkpoints written), its process tree's memory sampled.
    What the benchmark's runner measures leaves out what the run writes; this is the product's whole tree."""
    config = workload.config("ray")
    spec = work / f"cli-{workload.key}.yaml"
    spec.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    cmd = [sys.executable, "-m", "fedcomp", "run", str(spec), "--set", f"run.out={work / 'cli-runs'}"]
    log = work / f"cli-{workload.key}.log"
    rc, memory = watch(cmd, runner_env("ray"), log, timeout_s, sample_memory=True)
    if rc != 0:
        raise PlatformError(f"fedcomp run of {workload.key} failed (exit {rc}); log: {log}")
    return memory


def cli_memory_lines(workload: Workload, memory: TreeMemory) -> list[str]:
    """Where the peak of :func:`cli_memory` sits, per process kind."""
    return [f"- `fedcomp run` (the CLI, writing its results), server replicated on the client actors, {workload.model} "
            f"{workload.clients} clients, 2 worker(s), peak {memory.peak / 2**20:.0f} MiB: {by_kind(memory.peak_detail)}"]


def by_kind(peak_detail: dict[int, tuple[str, int]]) -> str:
    """The processes at a memory peak summed by name, largest first: ``"name MiB (n processes), ..."``."""
    kinds: dict[str, list[int]] = {}
    for name, size in peak_detail.values():
        kinds.setdefault(name, []).append(size)
    parts = sorted(kinds.items(), key=lambda kv: -sum(kv[1]))
    return ", ".join(f"{name} {sum(v) / 2**20:.0f}" + (f" ({len(v)} processes)" if len(v) > 1 else "") for name, v in parts)


def memory_lines(runs: list[PeerRun]) -> list[str]:
    """Where the peak memory sits, per process kind, for the multi-process runners' largest workload."""
    lines = []
    for runner in ("ray", "ray-driver", "ray-replicated", "flower", "pfl"):
        mine = [r for r in runs if r.sampled and r.runner == runner and r.peak_detail]
        if not mine:
            continue
        top = max(mine, key=lambda r: (r.workload.clients, r.workers, r.workload.rounds, -r.repeat))
        lines.append(f"- {RUNNER_LABELS[runner]}, {top.workload.model} {top.workload.clients} clients, {top.workers} "
                     f"worker(s), peak {top.peak_bytes / 2**20:.0f} MiB: {by_kind(top.peak_detail)}")
    return ["memory at the peak by process (MiB of PSS):", *lines] if lines else []


def _plan(args: argparse.Namespace) -> tuple[tuple[tuple[Workload, tuple[int, ...]], ...], list[str], int]:
    """The workload matrix, the runners (in table order) and the repeats the flags ask for."""
    if args.quick and args.memory:
        raise PlatformError("--quick and --memory each pick the workloads: give one of them")
    matrix = QUICK_MATRIX if args.quick else MEMORY_MATRIX if args.memory else FULL_MATRIX
    if args.models:
        matrix = tuple((w, workers) for w, workers in matrix if w.model in args.models)
        if not matrix:
            raise PlatformError(f"--models {' '.join(args.models)}: none of this run's workloads has that model")
    runners = [r for r in PEER_RUNNERS if r in (args.runners or (QUICK_RUNNERS if args.quick else PEER_RUNNERS))]
    repeats = args.repeats if args.repeats is not None else (1 if args.quick or args.memory else 3)
    if repeats < 1:
        raise PlatformError(f"--repeats = {repeats}: must be >= 1")
    return matrix, runners, repeats


def report_path(args: argparse.Namespace) -> Path:
    """Where the report goes: ``--results``, else RESULTS.md -- but for ``--quick``, a check whose report is printed
    only (it wrote over the full matrix's RESULTS.md, which README cites) -- ``-`` naming none."""
    return Path(args.results) if args.results else Path("-") if args.quick else HERE / "RESULTS.md"


def run_all(args: argparse.Namespace) -> int:
    """Every runner on every workload of the matrix; print the report and write it to ``--results``."""
    matrix, runners, repeats = _plan(args)
    torch.set_num_threads(1)  # the harness draws the workloads and evaluates the final weights
    bench_dir = Path(args.bench_dir) if args.bench_dir else REPO / ".bench"
    results = report_path(args)
    bench_dir.mkdir(parents=True, exist_ok=True)
    # fail before any work if a peer is missing (and --no-install forbids installing it)
    pfl_site = ensure_pfl(bench_dir, not args.no_install) if "pfl" in runners else None
    flower_python = ensure_flower(bench_dir, not args.no_install) if "flower" in runners else None

    load_before = load_average()
    work = bench_dir / "work"
    work.mkdir(exist_ok=True)
    specs = {(w, n): write_workload(w, n, work) for w, workers in matrix for n in workers}
    runs: list[PeerRun] = []
    cells = [(w, runner, n) for w, workers in matrix for runner in runners
             for n in ((1,) if runner in SINGLE_PROCESS else workers)]
    passes = [(f"repeat {repeat + 1}/{repeats}", repeat, False) for repeat in range(repeats)]
    for what, repeat, sample_memory in [*passes, ("memory run", repeats, True)]:
        for w, runner, n in cells:
            spec = specs[(w, n)] if (w, n) in specs else write_workload(w, n, work)
            progress(f"{what}: {RUNNER_LABELS[runner]}, {w.key}, {n} worker(s)")
            try:
                runs.append(run_peer(runner, w, n, repeat, spec, work, flower_python, pfl_site,
                                     sample_memory=sample_memory))
            except PlatformError as error:  # one retry: a crash at exit must not cost the whole matrix
                progress(f"retrying once after: {error}")
                runs.append(run_peer(runner, w, n, repeat, spec, work, flower_python, pfl_site,
                                     sample_memory=sample_memory))

    cli: list[str] = []
    if args.memory:  # the product's own tree on the memory target's workload, beside the runners'
        for w, _ in matrix:
            progress(f"memory run: fedcomp run (the CLI), {w.key}, 2 worker(s)")
            cli += cli_memory_lines(w, cli_memory(w, work))

    tasks: dict[str, Any] = {}

    def accuracy(w: Workload, final: Any) -> float:
        if w.key not in tasks:
            tasks[w.key] = build_task(w.config()).evaluator()
        return float(tasks[w.key]({"x": torch.from_numpy(final)})["test_accuracy"])

    rows, round_s = summarise_peers(runs, accuracy)
    text = render_peer_report(args, runs, rows, round_s, load_before, matrix, repeats, cli)
    print(text)
    if results.name != "-":
        results.parent.mkdir(parents=True, exist_ok=True)
        write_report(results, text)
        progress(f"wrote {results}")
    return 0


def render_peer_report(args: argparse.Namespace, runs: list[PeerRun], rows: list[Row],
                       round_s: dict[tuple[str, str, int], float], load_before: str,
                       matrix: Any, repeats: int, cli: Sequence[str] = ()) -> str:
    """The report: how it was run (machine, runners, workload, definitions), the table, the targets, memory (and
    ``cli``: :func:`cli_memory_lines` of ``--memory``)."""
    versions: dict[str, str] = {}
    for run in runs:
        for name, version in run.versions.items():
            if name != "torch" or run.runner == "flower":
                label = f"{name} ({RUNNER_LABELS[run.runner]})" if run.runner == "flower" else name
                versions[label] = version
    command = "python benchmarks/peers.py" + (" --quick" if args.quick else "") + (" --memory" if args.memory else "") + (
        f" --repeats {args.repeats}" if args.repeats is not None else "") + (
        f" --runners {' '.join(args.runners)}" if args.runners else "") + (
        f" --models {' '.join(args.models)}" if args.models else "")
    notes = [
        *machine_lines(None, None, load_before),
        "runners: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
        "workload: FedAvg, synthetic Gaussian-mixture classification with Dirichlet(0.5) label skew "
        f"({FEATURES} features, {CLASSES} classes), seed {SEED}; {PEER_COHORT} clients per round, "
        f"{PEER_LOCAL_STEPS} local SGD steps of batch {BATCH}, lr {LR:g}; models: "
        + ", ".join(f"{k} MLP {'-'.join(map(str, [FEATURES, *v, CLASSES]))}" for k, v in MODELS.items())
        + "; every runner trains on the same cohorts and batches (drawn once from the seed; the peers read "
        "them from an .npz) from the same initial weights",
        "workers: fedcomp ray = client actors (+ 1 server actor, but for ray-driver* and ray-replicated*), Ray with 2 CPUs; pfl = processes (torchrun, "
        "gloo); Flower = Ray actors running ClientApps (2 CPUs, 2/workers each); fedcomp local and the plain "
        "loop are one process; one torch thread per process everywhere",
        f"timing: each run is its own process; start-up = process launch until round 1 ends, less the median "
        f"round (imports, Ray, actors, client registration, lazy initialisation); round = wall time per round seen by the server loop (fedcomp: "
        f"between two rounds' replies as its runner drives them, the next round queued before this one's reply "
        f"is taken; with the server replicated on the client actors, between two round ends in replica 0, whose "
        f"replies come in batches), median over the rounds, then median over {repeats} run(s); client updates/s = clients per round / round time; "
        f"peak memory = peak of the summed PSS of the process and all its descendants, sampled every "
        f"{MEMORY_INTERVAL_S:g} s in one more run of each configuration whose times are not used (the timed runs "
        f"sample nothing: sampling takes CPU; fedcomp's runners leave the final model unread in that run, as reading "
        f"it would make a Ray run's driver import torch)",
        "weights: sha256 of the final float32 weights; fedcomp averages in float64 (bit-identical to the plain "
        "loop), pfl and Flower in float32, hence their tiny differences",
    ]
    notes = [ln + "  " for ln in notes]
    lines = ["# Side-by-side benchmark: fedcomp, plain PyTorch, pfl, Flower", "",
             f"Written by `{command}` from its own output (stdout, verbatim), at revision {revision()}.", "",
             *notes, ""]
    lines += render(PEER_COLUMNS, rows, markdown=True)
    lines += ["", *peer_target_lines(runs, round_s)]
    breakdown = memory_lines(runs)
    if breakdown or cli:
        lines += ["", *(breakdown or ["memory at the peak by process (MiB of PSS):"]), *cli]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/peers.py", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true",
                        help=f"one small workload, 5 rounds, 1 repeat, runners {' '.join(QUICK_RUNNERS)} unless --runners "
                             f"says; the report printed only, unless --results names a file")
    parser.add_argument("--memory", action="store_true",
                        help="the memory target's workload alone (small MLP, 1,000 clients, 2 workers), 1 repeat and its memory run, and `fedcomp run` of it")
    parser.add_argument("--repeats", type=int, help="runs per configuration (default: 3; 1 with --quick)")
    parser.add_argument("--runners", nargs="+", choices=PEER_RUNNERS, help="which runners to time (default: all)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS),
                        help="only the workloads of these models (default: all; e.g. heavy for more repeats of it)")
    parser.add_argument("--no-install", action="store_true",
                        help="fail (one line, exit 2) instead of installing a missing peer")
    parser.add_argument("--bench-dir", help="peers' installs and work files (default: .bench in the checkout)")
    parser.add_argument("--results", help="where to write the report (default: benchmarks/RESULTS.md, with --quick "
                                           "none; - for none)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    before = signal.signal(signal.SIGTERM, _stopped)  # as Ctrl-C: the runner running then is stopped with the harness
    try:
        return run_all(args)
    except PlatformError as error:
        print(f"peers: error: {error}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, before)


def _stopped(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
