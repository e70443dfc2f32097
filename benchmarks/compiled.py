"""What ``federation.torch_compile`` buys: the gradients eagerly and compiled, per call and per round, what the
first call costs, and how far the numbers move; writes ``benchmarks/COMPILED.md``.

    python benchmarks/compiled.py [--rounds 20] [--repeats 3] [--out benchmarks/COMPILED.md]

Workloads: ``fedcomp bench``'s FedAvg (synthetic-classification, 10 clients per round, 5 local SGD steps of batch 16,
lr 0.05, one torch thread) on the small MLP 32-64-10 and the heavy MLP 32-1024-1024-10, 100 clients.

* The oracle alone: :func:`fedcomp.platform.oracles.grad_and_loss` at the initial weights on one batch, eagerly (the
  exact step's autograd) and by the compiled graph, microseconds per call, best of ``repeats`` x 200 calls.
* The first compiled call in a fresh process (each in a subprocess of its own, ``--first-call``): with an empty
  inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a new folder: tracing, inductor's code generation and the C++
  compiler) and again with that folder filled (tracing, the compiled code from the cache).
* Rounds: the local backend's round time each way (median over rounds, the first round -- where the compiled run
  compiles -- left out), the two runs alternating within each repeat; and the final weights' largest difference.
* Other algorithms: the round time each way of algorithms whose steps take the other oracles -- both partial
  gradients (gradient descent-ascent), g's value with its vector-Jacobian product and grad f (the compositional
  kinds), FedNest's y-gradients and second-order products -- on the imbalanced-binary task (scikit-learn's
  breast-cancer data, an MLP 30-64-1, 4 clients) and on the papers' offline presets (FedNest's hyper-representation,
  loss tuning and quadratic minimax; the sinewave MAML of the Local-SCGDM slides; FedDRO's digits), their default
  hyperparameters; the first compiled round's seconds (it compiles there: in the first repeat with inductor's
  cache empty -- the whole script runs with a new one, ``TORCHINDUCTOR_CACHE_DIR`` -- and in the last with the
  graphs already in the process), then rounds timed without evaluation; and how far the eager run itself carries a
  difference of float32 rounding's size (its state nudged after the first round), to read the final state's
  difference against.
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

import torch

from common import HERE, generated_by, publish
from fedcomp.bench import bench_config, load_average, run_fedcomp
from fedcomp.platform import compiled
from fedcomp.platform.catalog import algorithms, load_builtins
from fedcomp.platform.federation import build_task
from fedcomp.platform.oracles import grad_and_loss
from fedcomp.platform.rng import generator

MODELS = {"small MLP 32-64-10": [64], "heavy MLP 32-1024-1024-10": [1024, 1024]}
OTHER_TASK = {"name": "imbalanced-binary", "dataset": "breast-cancer", "model": "mlp"}
OTHERS: dict[str, tuple[str, str | dict[str, object]]] = {
    **{f"{name}, breast-cancer MLP": (name, {"task": OTHER_TASK, "federation": {"clients": 4}})
       for name in ("local-sgdam", "coda-plus", "fedavg-s", "local-scgdam")},
    "fednest, preset fednest-hr-offline": ("fednest", "fednest-hr-offline"),
    "fednest, preset fednest-losstune-offline": ("fednest", "fednest-losstune-offline"),
    "fednest, preset fednest-minimax": ("fednest", "fednest-minimax"),
    "local-scgdm, preset maml-sinewave": ("local-scgdm", "maml-sinewave"),
    "local-scgd, preset maml-sinewave": ("local-scgd", "maml-sinewave"),
    "feddro, preset feddro-offline": ("feddro", "feddro-offline"),
}
"""The second table's workloads: descent-ascent on the AUC min-max game and LocalSCGDAM's compositional version
(4 clients), and the papers' offline presets of the bilevel and compositional kinds: label -> (algorithm, the
preset or the config it runs in)."""
CLIENTS, COHORT, LOCAL_STEPS, BATCH = 100, 10, 5, 16


def oracle_inputs(hidden: list[int]):
    config = bench_config(CLIENTS, COHORT, 1, LOCAL_STEPS, hidden, "local")
    task = build_task(config)
    problem = task.problem("plain")
    return problem, task.init_params(generator(0, "init"))["x"], problem.sample_batch(0, BATCH, generator(0, "batch"))


def oracle_us(hidden: list[int], repeats: int, calls: int = 200) -> tuple[float, float, float]:
    """Microseconds per call eagerly and compiled (best of ``repeats``), and the gradients' largest difference."""
    problem, x, batch = oracle_inputs(hidden)
    eager = grad_and_loss(problem, x, batch)[0]
    with compiled.enabled(set()):
        done = grad_and_loss(problem, x, batch)[0]  # compiles
    best = {}
    for on in (False, True):
        with compiled.enabled(set() if on else None):
            for _ in range(20):
                grad_and_loss(problem, x, batch)
            runs = []
            for _ in range(repeats):
                started = time.perf_counter()
                for _ in range(calls):
                    grad_and_loss(problem, x, batch)
                runs.append((time.perf_counter() - started) / calls * 1e6)
        best[on] = min(runs)
    return best[False], best[True], (done - eager).abs().max().item()


def first_call(hidden: list[int], cache: str) -> float:
    """Seconds of the first compiled call in a fresh process whose inductor cache is ``cache``."""
    script = [sys.executable, __file__, "--first-call", json.dumps(hidden)]
    out = subprocess.run(script, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}, capture_output=True,
                         text=True, check=True, cwd=HERE)
    return float(out.stdout.strip().splitlines()[-1])


def rounds_ms(hidden: list[int], rounds: int, repeats: int) -> tuple[dict[bool, list[float]], float]:
    """Each repeat's median round time (ms) eagerly and compiled, alternating; the final weights' largest difference."""
    times: dict[bool, list[float]] = {False: [], True: []}
    finals = {}
    for repeat in range(repeats):
        for on in (False, True):
            print(f"compiled: {hidden}, repeat {repeat + 1}/{repeats}, torch_compile={on}", file=sys.stderr, flush=True)
            config = bench_config(CLIENTS, COHORT, rounds + 1, LOCAL_STEPS, hidden, "local", torch_compile=on)
            m = run_fedcomp(config, "local", 0)
            times[on].append(statistics.median(m.round_s[1:]) * 1e3)
            finals[on] = m.final
    return times, (finals[True] - finals[False]).abs().max().item()


def paired(times: dict[bool, list[float]]) -> str:
    """Table cells for each repeat's round times eagerly (False) and compiled (True): the two medians, and the median
    (range) of the compiled / eager ratio within each repeat."""
    ratios = [c / e for e, c in zip(times[False], times[True])]
    return (f"{statistics.median(times[False]):.2f} | {statistics.median(times[True]):.2f} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")


def other_rounds(rounds: int, repeats: int) -> list[str]:
    """The second table's rows: each workload's first round (compiled: the seconds it compiles in), its round time
    eagerly and compiled (median over rounds, then over repeats, alternating), paired ratio, and the final global
    state's largest difference."""
    from fedcomp.platform.config import load_config
    from fedcomp.platform.federation import LocalFederation
    from fedcomp.platform.server import Server

    rows = []
    for label, (name, workload) in OTHERS.items():
        times: dict[bool, list[float]] = {False: [], True: []}
        first: dict[bool, list[float]] = {False: [], True: []}
        finals = {}
        for repeat in range(repeats):
            for on in (False, True):
                print(f"compiled: {label}, repeat {repeat + 1}/{repeats}, torch_compile={on}", file=sys.stderr, flush=True)
                config = load_config(workload, {"algorithm.name": name, "federation.backend": "local",
                                                "federation.torch_compile": on, "run.progress": "none"})
                server = Server(config, LocalFederation)
                seconds = []
                for _ in range(rounds + 1):
                    started = time.perf_counter()
                    server.run_round()
                    seconds.append(time.perf_counter() - started)
                first[on].append(seconds[0])
                times[on].append(statistics.median(seconds[1:]) * 1e3)
                finals[on] = server.tensors()
        diff = max((finals[True][k] - finals[False][k]).abs().max().item() for k in finals[False])
        nudged = perturbed_run(load_config(workload, {"algorithm.name": name, "federation.backend": "local"}), rounds)
        sensitivity = max((nudged[k] - finals[False][k]).abs().max().item() for k in finals[False])
        kind = algorithms()[name].kind
        rows.append(f"| {label} | {kind} | {config.federation.clients} | {first[True][0]:.1f} / {first[True][-1]:.1f} "
                    f"| {paired(times)} | {diff:.1e} | {sensitivity:.1e} |")
    return rows


def perturbed_run(config, rounds: int):
    """The eager run's final global state when its state after the first round is moved by float32 rounding's size
    (each element by 6e-8 of its magnitude times standard normal noise, seeded): how far the run itself carries such
    a difference."""
    from fedcomp.platform.federation import LocalFederation
    from fedcomp.platform.server import Server

    server = Server(config, LocalFederation)
    server.run_round()
    checkpoint, noise = server.checkpoint(), torch.Generator().manual_seed(0)
    checkpoint["state"] = {k: v + 6e-8 * v.abs() * torch.randn(v.shape, generator=noise)
                           for k, v in checkpoint["state"].items()}
    server.restore(checkpoint)
    for _ in range(rounds):
        server.run_round()
    return server.tensors()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "COMPILED.md"))
    parser.add_argument("--first-call", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_builtins()
    if args.first_call:
        problem, x, batch = oracle_inputs(json.loads(args.first_call))
        started = time.perf_counter()
        with compiled.enabled(set()):
            assert compiled.grad_and_loss(problem, x, batch) is not None
        print(time.perf_counter() - started)
        return 0
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # every graph of this process compiled afresh once
        return report(args)


def report(args: argparse.Namespace) -> int:
    load_before = load_average()
    rows = []
    for label, hidden in MODELS.items():
        eager_us, compiled_us, grad_diff = oracle_us(hidden, args.repeats)
        with tempfile.TemporaryDirectory() as cache:
            cold, warm = first_call(hidden, cache), first_call(hidden, cache)
        times, weights_diff = rounds_ms(hidden, args.rounds, args.repeats)
        rows.append(f"| {label} | {eager_us:.0f} | {compiled_us:.0f} | {compiled_us / eager_us:.2f}x | {grad_diff:.1e} "
                    f"| {cold:.1f} | {warm:.1f} | {paired(times)} | {weights_diff:.1e} |")
    lines = [
        "# The gradients compiled (`federation.torch_compile`)", "",
        generated_by() + f"; load average before: {load_before}, after: {load_average()}.", "",
        f"Oracle: `grad_and_loss` at the initial weights on one batch of {BATCH}, best of {args.repeats} x 200 calls. "
        "First call: a fresh process's first compiled call, with an empty inductor cache (cold) and with the cache "
        f"that call filled (warm). Rounds: FedAvg on the local backend, {CLIENTS} clients, {COHORT} per round, "
        f"{LOCAL_STEPS} local steps, {args.rounds} rounds after the first, median over rounds and then over "
        f"{args.repeats} repeats (eager and compiled alternating; paired: compiled / eager within each repeat, median "
        "(range)). Differences: the largest absolute difference from the eager numbers (gradient at the initial "
        "weights; final weights).", "",
        "| model | oracle eager (us) | oracle compiled (us) | compiled / eager | gradient diff | first call, cold (s) "
        "| first call, warm (s) | round eager (ms) | round compiled (ms) | compiled / eager paired | final weights diff |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows, "",
        f"Other algorithms and the papers' offline presets, default hyperparameters, local backend: the first "
        "compiled round in the first and in the last repeat (seconds: it compiles, with inductor's cache empty, then "
        f"with the graphs already in the process), then {args.rounds} rounds after the first, no evaluation. The last "
        "column: the eager run's own sensitivity, its final state's largest difference when each element of its state "
        "after the first round is moved by 6e-8 of its magnitude times standard normal noise (float32 rounding's "
        "size):", "",
        "| workload | problem kind | clients | first round compiled (s) | round eager (ms) | round compiled (ms) "
        "| compiled / eager paired | final state diff | eager, nudged after round 1: diff |",
        "|:---|:---|---:|---:|---:|---:|---:|---:|---:|",
        *other_rounds(args.rounds, args.repeats),
    ]
    publish("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
