"""``fedcomp bench``: time the Ray and local backends against a plain single-process PyTorch loop.

One workload -- FedAvg on ``synthetic-classification`` (an MLP on Gaussian-mixture client streams),
``--cohort`` clients per round out of ``--clients`` registered, ``--local-steps`` SGD steps of batch
:data:`BATCH` per client per round -- is run by four runners in one invocation:

* ``ray``: a Ray server actor with the registered clients packed into 2 client actors
  (``federation.clients_per_actor = ceil(clients / 2)``);
* ``local``: the in-process backend (every client in one in-process host);
* ``plain``: a hand-written loop doing the same arithmetic with nothing of fedcomp's machinery -- the same
  cohorts (:func:`~fedcomp.platform.server.sample_cohort`), the same keyed generators, the same task
  object's ``sample_batch`` and ``loss``, plain SGD on a flat parameter vector, and the same float64
  averaging -- so its final weights are the reference the other runners' weights are compared with;
* ``optim``: the usual PyTorch way -- the same cohorts and batches, each client's steps taken by
  ``torch.optim.SGD`` on an ``nn.Module``'s own parameters in place (``zero_grad``, ``backward``, ``step``),
  the float64 average accumulated from the parameters. Its step ``param += -lr * grad`` is the fused
  multiply-add fedcomp's SGD step takes, so its final weights are the others' bit for bit: the same
  arithmetic, done the usual way.

fedcomp's runners are driven through :func:`fedcomp.api.make_server` (no result folders are written), so
start-up (server construction, including the Ray actors' start) is timed apart from the rounds. Ray itself
is started once per invocation and reused. The output is a table of measurements with the targets printed
next to them for information; the command never passes or fails on them.

The side-by-side benchmark against pfl and Flower (which installs them and runs every runner in its own
process) is not part of the package: it is ``python benchmarks/peers.py`` in a source checkout, and it
reuses this module's workload, machine description and table.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import math
import os
import platform as _stdlib_platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fedcomp.platform.config import Config, load_config
from fedcomp.platform.errors import PlatformError

if TYPE_CHECKING:  # imported where a runner computes: a Ray run's driver measured for memory imports none
    import torch

RUNNERS = ("ray", "local", "plain", "optim")
DEFAULT_RUNNERS = ("ray", "local", "plain")
"""What runs without ``--runners``: ``optim`` (the same weights, the usual PyTorch way) is asked for by name."""
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
    actors: int = ACTORS, server: str = "replicated", routing: str = "balanced", transport: str = "calls",
    vectorise: bool = False, fused_sgd: bool = False, torch_compile: bool = False,
) -> Config:
    """The benchmark workload as a validated fedcomp config (Ray: clients packed into ``actors`` actors, the
    round program ``server`` as ``federation.server`` -- replicated on the client actors, the default, in a server
    actor or in the driver's process; cohort members spread evenly over the actors or, ``routing="home"``, run by the
    actor hosting them; ``transport`` as ``federation.transport`` (not with the server replicated); ``vectorise`` and
    ``fused_sgd`` and ``torch_compile`` as ``federation.vectorise``, ``federation.fused_sgd`` and
    ``federation.torch_compile``)."""
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
                "server": server,
                "routing": routing,
                **({} if server == "replicated" else {"transport": transport}),  # replicated: every call by the group
                "vectorise": vectorise,
                "fused_sgd": fused_sgd,
                "torch_compile": torch_compile,
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
    final: torch.Tensor | None
    """The final model (None where the run was measured for its memory only, not to read it)."""
    test_accuracy: float
    rounds_started_at: float = 0.0
    """Wall-clock time (``time.time()``) when the first round began (start-up seen from outside)."""
    faults_per_round: float = math.nan
    """Minor page faults of this process per round (NaN where not counted): memory the rounds took fresh from
    the system, a cost the neighbours' load does not move (the other processes' faults are not counted)."""

    @property
    def median_round_s(self) -> float:
        return statistics.median(self.round_s)

    @property
    def model(self) -> torch.Tensor:
        """The final model (``ValueError`` for a run that did not read it)."""
        if self.final is None:
            raise ValueError(f"the {self.runner} run was measured for its memory: its final model was not read")
        return self.final


def run_fedcomp(config: Config, runner: str, repeat: int, final_model: bool = True) -> Measurement:
    """Drive a fedcomp server (local or Ray) directly: construct it, run the rounds as the runner does (each round's
    time is the time between two replies; with the server replicated on the client actors, whose replies come in
    batches, the time between two round ends in replica 0), read the final model (unless ``final_model`` is false:
    reading it makes a Ray run's driver import torch, which a run measured for its memory does not)."""
    from fedcomp.api import make_server

    t0 = time.perf_counter()
    server = make_server(config)
    startup = time.perf_counter() - t0
    try:
        times = []
        started, faults = time.time(), minor_faults()
        t = time.perf_counter()
        for _ in server.run_rounds([False] * config.run.rounds):  # as the runner drives them: pipelined on Ray
            now = time.perf_counter()
            times.append(now - t)
            t = now
        faults = (minor_faults() - faults) / config.run.rounds
        in_replica = getattr(server, "round_seconds", None)
        if in_replica is not None:  # the server replicated on the client actors: its replies come in batches
            times = in_replica[-config.run.rounds:]
        final = server.checkpoint()["state"]["x"].detach().cpu() if final_model else None
        accuracy = float(server.evaluate()["test_accuracy"])
    finally:
        server.close()
    return Measurement(runner, config.federation.clients, repeat, startup, times, final, accuracy, started, faults)


def run_plain(config: Config, repeat: int) -> Measurement:
    """The same FedAvg rounds as a plain single-process PyTorch loop on a flat parameter vector."""
    import torch

    from fedcomp.platform.federation import build_task
    from fedcomp.platform.kinds import PLAIN
    from fedcomp.platform.problems import PlainProblem
    from fedcomp.platform.rng import generator
    from fedcomp.platform.server import sample_cohort

    seed, clients, cohort_size = config.run.seed, config.federation.clients, config.federation.cohort_size
    q, batch_size, lr = config.algorithm.local_steps, config.algorithm.outer_batch, config.algorithm.lr  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    task = build_task(config)
    problem: PlainProblem = task.problem(PLAIN)
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
                batch = problem.sample_batch(client, batch_size, generator(seed, "client-step", client, step))
                xg = xc.detach().requires_grad_(True)
                loss = problem.loss(xg, batch)
                (grad,) = torch.autograd.grad(loss, xg)
                xc = torch.add(xc, grad, alpha=-lr)  # x - lr g rounded once, as fedcomp's and torch.optim's step
                loss_sum += float(loss.detach()) / q
            total += xc.double()
        x = (total / len(cohort)).float()
        times.append(time.perf_counter() - t)
    accuracy = float(task.evaluator()({"x": x})["test_accuracy"])
    return Measurement("plain", clients, repeat, startup, times, x, accuracy, started)


def run_optim(config: Config, repeat: int) -> Measurement:
    """The same FedAvg rounds with ``torch.optim.SGD`` stepping an ``nn.Module``'s parameters in place."""
    import torch

    from fedcomp.platform.federation import build_task
    from fedcomp.platform.rng import generator
    from fedcomp.platform.server import sample_cohort

    seed, clients, cohort_size = config.run.seed, config.federation.clients, config.federation.cohort_size
    q, batch_size, lr = config.algorithm.local_steps, config.algorithm.outer_batch, config.algorithm.lr  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    task = build_task(config)
    assert task.model is not None, "the optim runner needs a task with a network"
    module = copy.deepcopy(task.model.module)  # the task's network, as an nn.Module
    params: list[torch.Tensor] = list(module.parameters())
    optimizer = torch.optim.SGD(params, lr=lr)
    x = task.init_params(generator(seed, "init"))["x"]
    sizes = [p.numel() for p in params]
    startup = time.perf_counter() - t0

    times = []
    started, faults = time.time(), minor_faults()
    total = torch.zeros(x.numel(), dtype=torch.float64)
    for r in range(config.run.rounds):
        t = time.perf_counter()
        cohort = sample_cohort(seed, r, clients, cohort_size)
        total.zero_()
        sources = [v.view_as(p) for v, p in zip(x.split(sizes), params)]
        for client in cohort:
            with torch.no_grad():
                torch._foreach_copy_(params, sources)
            for s in range(q):
                features, labels = task.sample_batch(client, batch_size, generator(seed, "client-step", client, r * q + s))  # type: ignore[attr-defined]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(module(features), labels).backward()
                optimizer.step()
            for part, p in zip(total.split(sizes), params):
                part.add_(p.detach().view(-1))
        x = (total / len(cohort)).float()
        times.append(time.perf_counter() - t)
    faults = (minor_faults() - faults) / config.run.rounds
    accuracy = float(task.evaluator()({"x": x})["test_accuracy"])
    return Measurement("optim", clients, repeat, startup, times, x, accuracy, started, faults)


def minor_faults() -> float:
    """This process's minor page faults so far (``getrusage``; NaN where the platform has none)."""
    try:
        import resource
    except ImportError:  # not on Unix
        return math.nan
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def weights_hash(x: torch.Tensor) -> str:
    """A short hash of the exact bytes of a float32 parameter vector."""
    return hashlib.sha256(x.detach().cpu().float().contiguous().numpy().tobytes()).hexdigest()[:12]


def busier_share(clients: int, cohort: int, rounds: int, routing: str = "balanced") -> float:
    """Mean over the rounds of the cohort members run by the busiest Ray client actor (load balance), as the
    Ray backend's router assigns them (FedAvg leaves no private state: after round 0, ``balanced`` spreads them)."""
    from fedcomp.actors.routing import Router
    from fedcomp.platform.server import sample_cohort

    per = math.ceil(clients / ACTORS)
    router = Router([range(i, min(i + per, clients)) for i in range(0, clients, per)], routing)
    shares = []
    for r in range(rounds):
        members = router.assign("local_steps", sample_cohort(SEED, r, clients, min(cohort, clients)))
        router.learn("local_steps", members, dict.fromkeys(members, False))
        shares.append(max(len(m) for m in members.values()))
    return statistics.fmean(shares)


# -- machine ---------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _stdlib_platform.processor() or _stdlib_platform.machine() or "unknown"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages as ``a/b/c`` (other work on a shared machine skews timings)."""
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def machine() -> str:
    """The processor, its cores (and how many this process may use), the OS and the architecture."""
    cores = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = cores
    return f"{cpu_model()}, {cores} cores ({usable} usable), {_stdlib_platform.system()} {_stdlib_platform.machine()}"


def versions() -> str:
    """Python's, torch's and (when it is loaded) Ray's versions."""
    from fedcomp.platform.environment import torch_build

    names = [f"python {sys.version.split()[0]}", f"torch {torch_build()}"]
    if "ray" in sys.modules:
        names.append(f"ray {sys.modules['ray'].__version__}")
    return ", ".join(names)


def machine_lines(ray_cpus: float | None, ray_start_s: float | None, load_before: str) -> list[str]:
    """The machine, the versions and the load around a measurement (what its numbers depend on)."""
    import torch

    lines = [
        f"machine: {machine()}",
        f"versions: {versions()}; driver torch threads: {torch.get_num_threads()}",
        f"load average (1/5/15 min) before: {load_before}, after: {load_average()} "
        f"(other work on the machine inflates the times)",
    ]
    if ray_cpus is not None:
        lines.append(f"ray: cluster with {ray_cpus:g} CPUs, started (or joined) once in {ray_start_s:.2f} s, not counted in start-up")
    return lines


# -- table -----------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One table row: the runner and client count it is about, and its cells by column."""

    runner: str
    clients: int
    cells: dict[str, str] = field(default_factory=dict)


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(values) if values else float("nan")


def summarise(
    measurements: list[Measurement], runners: Sequence[str], clients: Sequence[int]
) -> tuple[list[str], list[Row], dict[tuple[str, int], float]]:
    """Table columns, rows and the median round time (s) per (runner, clients)."""
    base = clients[0]
    by: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        by.setdefault((m.runner, m.clients), []).append(m)
    round_s = {key: median([m.median_round_s for m in ms]) for key, ms in by.items()}
    plain_final = {m.clients: m.model for m in measurements if m.runner == "plain" and m.repeat == 0}

    ratio_col = f"round time / round time at {base} clients"
    columns = ["runner", "clients", "actors", "start-up (s)", "round (ms, median)", "overhead vs plain (ms/round)",
               ratio_col, "test acc", "final weights sha256", "max abs diff vs plain"]
    rows = []
    for runner in runners:
        for n in clients:
            ms = by[(runner, n)]
            hashes = {weights_hash(m.model) for m in ms}
            digest = weights_hash(ms[0].model) + ("" if len(hashes) == 1 else f" (+{len(hashes) - 1} other across repeats)")
            plain = round_s.get(("plain", n))
            overhead = "—" if runner == "plain" or plain is None else f"{(round_s[(runner, n)] - plain) * 1e3:+.1f}"
            ratio = "—" if n == base else f"{round_s[(runner, n)] / round_s[(runner, base)]:.2f}"
            if runner == "plain" or n not in plain_final:
                diff = "—"
            else:
                diff = f"{max(float((m.model - plain_final[n]).abs().max()) for m in ms):.1e}"
            actors = str(math.ceil(n / math.ceil(n / ACTORS))) if runner == "ray" else "—"
            cells = {
                "runner": runner,
                "clients": str(n),
                "actors": actors,
                "start-up (s)": f"{median([m.startup_s for m in ms]):.2f}",
                "round (ms, median)": f"{round_s[(runner, n)] * 1e3:.1f}",
                "overhead vs plain (ms/round)": overhead,
                ratio_col: ratio,
                "test acc": f"{median([m.test_accuracy for m in ms]):.3f}",
                "final weights sha256": digest,
                "max abs diff vs plain": diff,
            }
            rows.append(Row(runner, n, cells))
    return columns, rows, round_s


def render(columns: list[str], rows: list[Row], markdown: bool) -> list[str]:
    """The rows as a markdown table or as aligned plain text (runner and hash columns left, numbers right)."""
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


# -- entry point -------------------------------------------------------------------------------------------


FIXED_BY_FLAGS = ("federation.backend", "federation.clients", "federation.clients_per_round")
"""Federation options ``--set`` may not change: the runner (``--runners``) and the workload's (``--clients``,
``--cohort``) set them."""
BENCH_DEFAULTS = {"clients": [100, 1000], "cohort": 10, "rounds": 20, "local_steps": 5, "repeats": 3,
                  "hidden": list(DEFAULT_HIDDEN)}
"""Defaults of the workload flags (the parser leaves them None: they live here, next to the workload)."""


def _check(args: argparse.Namespace) -> tuple[list[int], list[str], list[int]]:
    """Refuse bad flags in one line naming the flag; return the sorted client counts, runners and widths."""
    peers = getattr(args, "peers", None)
    if peers is not None:
        command = " ".join(["python benchmarks/peers.py", *peers])
        raise PlatformError("--peers: the benchmark against pfl and Flower is not part of the installed package; "
                            f"from a source checkout, run `{command}`")
    for name, value in BENCH_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    clients = sorted(set(args.clients))
    if not clients or clients[0] < 1:
        raise PlatformError(f"--clients {args.clients}: need at least one registered-client count >= 1")
    for name in ("cohort", "rounds", "local_steps", "repeats"):
        if getattr(args, name) < 1:
            raise PlatformError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be >= 1")
    runners = list(getattr(args, "runners", None) or DEFAULT_RUNNERS)
    unknown = [r for r in runners if r not in RUNNERS]
    if unknown:
        raise PlatformError(f"--runners {' '.join(unknown)}: unknown; allowed: {', '.join(RUNNERS)}")
    runners = [r for r in RUNNERS if r in runners]  # fixed order, no duplicates
    hidden = list(args.hidden)
    if any(h < 1 for h in hidden):
        raise PlatformError(f"--hidden {hidden}: widths must be >= 1")
    overrides = getattr(args, "overrides", None) or {}
    for key in overrides:
        if not key.startswith("federation.") or key in FIXED_BY_FLAGS:
            raise PlatformError(f"--set {key}: the workload is the benchmark's; allowed: federation options other than "
                                f"{', '.join(sorted(FIXED_BY_FLAGS))}")
    if overrides:  # a bad value: one line naming it, before any run
        bench_config(clients[0], args.cohort, 1, 1, hidden, "local").replace(**overrides)
    args.overrides = overrides
    return clients, runners, hidden


def _server_text(overrides: dict[str, object]) -> str:
    """Where the Ray runner's server runs (``federation.server``: the benchmark's default, or as ``--set``)."""
    server = overrides.get("federation.server", "replicated")
    return {"replicated": "the server replicated on them", "actor": "+ 1 server actor"}.get(str(server),
                                                                                           "the server in the driver")


def progress(text: str) -> None:
    """A progress line on stderr (stdout carries only the table)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    """``fedcomp bench``: every runner on every client count, ``--repeats`` times; print the table."""
    import torch

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
                progress(f"repeat {repeat + 1}/{args.repeats}, {n} clients, {runner}")
                backend = "local" if runner in ("plain", "optim") else runner
                config = bench_config(n, args.cohort, args.rounds, args.local_steps, hidden, backend)
                if args.overrides and runner not in ("plain", "optim"):
                    config = config.replace(**args.overrides)
                if runner == "plain":
                    measurements.append(run_plain(config, repeat))
                elif runner == "optim":
                    measurements.append(run_optim(config, repeat))
                else:
                    measurements.append(run_fedcomp(config, runner, repeat))

    columns, rows, round_s = summarise(measurements, runners, clients)
    cohort = ", ".join(f"{min(args.cohort, n)} of {n}" for n in clients)
    workload = (
        f"workload: FedAvg, synthetic-classification MLP {FEATURES}-{'-'.join(map(str, hidden))}-{CLASSES}, "
        f"clients per round {cohort}, {args.rounds} rounds, {args.local_steps} local steps of batch {BATCH}, "
        f"lr {LR:g}, seed {SEED}"
    ) + (f"; Ray: clients packed into {ACTORS} client actors, {_server_text(args.overrides)}" if "ray" in runners else "")
    if args.overrides:
        workload += "; fedcomp's runners with " + ", ".join(f"{k}={v}" for k, v in args.overrides.items())
    timing = (
        f"timing: start-up = server construction (Ray: incl. actor start); round = time between two rounds' replies "
        f"as the runner drives them (Ray: the next round's call queued before this one's reply is taken), median over {args.rounds} rounds, then median over {args.repeats} repeat(s)"
    )
    lines = [*machine_lines(ray_cpus, ray_start, load_before), workload, timing]
    if "ray" in runners:
        lines.append("ray: clients of a round's cohort on the busier of the 2 actors (mean over rounds; by home actor "
                     "in brackets): " + ", ".join(
            f"{busier_share(n, args.cohort, args.rounds):.2f} ({busier_share(n, args.cohort, args.rounds, 'home'):.2f}) "
            f"of {min(args.cohort, n)} at {n} clients" for n in clients
        ))
    lines.append("")
    lines += render(columns, rows, args.markdown)
    lines += ["", *target_lines(runners, clients, round_s)]
    if args.markdown:
        # keep the notes as separate paragraphs/list items when rendered
        lines = [ln if not ln or ln.startswith(("|", "-", "targets")) else ln + "  " for ln in lines]
    print("\n".join(lines))
    return 0
