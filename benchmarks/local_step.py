"""A local step at the speed of an in-place optimiser? fedcomp's local backend before and after in-place
steps, against ``torch.optim.SGD`` stepping an ``nn.Module``'s parameters in place; writes
``benchmarks/LOCAL_STEP.md``.

    python benchmarks/local_step.py [--rounds 10] [--repeats 3] [--out benchmarks/LOCAL_STEP.md]

Workload: ``fedcomp bench``'s (FedAvg on synthetic-classification, 10 clients per round, 5 local SGD steps of
batch 16, lr 0.05, one torch thread) on the heavy MLP 32-1024-1024-10 with 100 clients and the small MLP
32-64-10 with 1,000 clients. Runners, all in this process on the same cohorts and batches:

* ``before``: the local backend with in-place steps switched off (``LocalSteps.in_place`` -> False): every
  step differentiates a flat leaf and builds the new state out of place -- the code path of the previous
  revision, still the one ``vmap`` lockstep and algorithms without ``update_`` run;
* ``taped``: the local backend with the gradient taken by autograd (:func:`fedcomp.platform.oracles.untaped`
  switched off): the code path of the revision before the untaped gradient (``fedcomp/models/mlp_gradient.py``);
* ``after``: the local backend as it is (``update_``: the parameters' gradients applied in place, computed without
  autograd's tape);
* ``optim``: :func:`fedcomp.bench.run_optim` (``zero_grad``, ``backward``, ``SGD.step`` on the module);
* ``fused``: the local backend with ``federation.fused_sgd`` (the linear layers' weights stepped by their
  gradients' factors in one matrix product; equal to the others up to float32 rounding).

A second table runs the same heavy workload with LocalSGDM (momentum 0.9, x and the buffer averaged) and FedProx
(mu 0.01) in place, exact against ``federation.fused_sgd`` (LocalSGDM's factors go into its momentum buffer,
``b <- 0.9 b + g^T a``; FedProx's into the weights after the pull).

The runners alternate within every repeat; a round's time is the median over rounds, then over repeats. ms
per local step = round time / (clients per round x local steps), so it includes the round's share of
sampling, averaging and the backend's bookkeeping. On a shared machine the neighbours' load drifts between
repeats, so the report also gives after / optim paired within each repeat (median and range over repeats)
and best of the repeats over best: the ratio least disturbed by load that comes and goes.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable

import torch

from common import HERE, generated_by, publish
from fedcomp.bench import bench_config, load_average, run_fedcomp, run_optim, weights_hash
from fedcomp.platform import oracles
from fedcomp.platform.algorithms.base import LocalSteps

WORKLOADS = {"heavy MLP 32-1024-1024-10, 100 clients": ([1024, 1024], 100),
             "small MLP 32-64-10, 1,000 clients": ([64], 1000)}
COHORT, LOCAL_STEPS = 10, 5
TARGET = 1.05


def run(runner: str, hidden: list[int], clients: int, rounds: int,
        algorithm: dict[str, object] | None = None) -> tuple[float, torch.Tensor, float]:
    """Median round time (s), the final weights and the minor page faults per round of one runner (FedAvg, or the
    ``algorithm`` given: its name and hyperparameters over the workload's)."""
    config = bench_config(clients, COHORT, rounds, LOCAL_STEPS, hidden, "local", fused_sgd=runner == "fused")
    if algorithm:
        config = config.replace(**{f"algorithm.{key}": value for key, value in algorithm.items()})
    if runner == "optim":
        m = run_optim(config, 0)
    else:
        in_place, untaped = LocalSteps.in_place, oracles.untaped
        if runner == "before":
            LocalSteps.in_place = lambda self: False  # type: ignore[method-assign]
        if runner == "taped":
            oracles.untaped = lambda *args, **kwargs: None
        try:
            m = run_fedcomp(config, "local", 0)
        finally:
            LocalSteps.in_place, oracles.untaped = in_place, untaped  # type: ignore[method-assign]
    return m.median_round_s, m.final, m.faults_per_round


def alternate(runners: list[str], repeats: int, label: str,
              run_one: Callable[[str], tuple[float, torch.Tensor, float]]) -> tuple[dict[str, list[float]], dict[str, torch.Tensor], dict[str, list[float]]]:
    """Each runner once per repeat, in turn: its round times, its last final weights and its page faults per round."""
    times: dict[str, list[float]] = {r: [] for r in runners}
    finals: dict[str, torch.Tensor] = {}
    faults: dict[str, list[float]] = {r: [] for r in runners}
    for repeat in range(repeats):
        for runner in runners:
            print(f"local_step: {label}, repeat {repeat + 1}/{repeats}, {runner}", file=sys.stderr, flush=True)
            seconds, finals[runner], per_round = run_one(runner)
            times[runner].append(seconds)
            faults[runner].append(per_round)
    return times, finals, faults


OTHERS = {"LocalSGDM, momentum 0.9": {"name": "local-sgdm", "momentum": 0.9},
          "FedProx, mu 0.01": {"name": "fedprox", "mu": 0.01}}
"""The second table's algorithms (x and LocalSGDM's buffer averaged), in place, exact against fused."""


def other_rows(rounds: int, repeats: int) -> list[str]:
    """The second table: each of :data:`OTHERS` exact (``after``) and fused, alternating within each repeat, on the
    first workload (the heavy MLP)."""
    workload = next(iter(WORKLOADS))
    hidden, clients = WORKLOADS[workload]
    rows = []
    for label, algorithm in OTHERS.items():
        times, finals, _ = alternate(["after", "fused"], repeats, f"{label}, {workload}",
                                     lambda r: run(r, hidden, clients, rounds, algorithm))  # noqa: B023 (called at once)
        ms = {r: statistics.median(t) * 1e3 for r, t in times.items()}
        rows.append(f"| {label} | {workload} | {ms['after']:.1f} | {ms['fused']:.1f} | "
                    f"{ms['after'] / (COHORT * LOCAL_STEPS):.2f} | {ms['fused'] / (COHORT * LOCAL_STEPS):.2f} | "
                    f"{paired_ratio(times, 'fused', 'after')} | {(finals['fused'] - finals['after']).abs().max().item():.1e} |")
    return rows


KERNEL_SHAPE = (16, 1024, 1024)
"""Batch, inputs and outputs of the heavy MLP's middle layer: the weight update the fused step changes."""


def kernel_times(repeats: int = 5, calls: int = 200) -> dict[str, float]:
    """Milliseconds per call (best of ``repeats``) of the middle layer's weight update taken each way: the exact
    step forms the gradient ``g^T a`` (``mm``) and adds it into the weights; the fused step is one ``addmm_``."""
    batch, fan_in, fan_out = KERNEL_SHAPE
    gen = torch.Generator().manual_seed(0)
    g, a = torch.randn(batch, fan_out, generator=gen), torch.randn(batch, fan_in, generator=gen)
    weight = torch.randn(fan_out, fan_in, generator=gen)
    grad = torch.mm(g.t(), a)
    ways = {
        "form the gradient, mm(g^T, a)": lambda: torch.mm(g.t(), a),
        "add it into the weights, add_(grad, alpha=-lr)": lambda: weight.add_(grad, alpha=-1e-9),
        "fused: addmm_(g^T, a, alpha=-lr)": lambda: weight.addmm_(g.t(), a, alpha=-1e-9),
    }
    best = {}
    for name, call in ways.items():
        call()
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(calls):
                call()
            runs.append((time.perf_counter() - started) / calls * 1e3)
        best[name] = min(runs)
    return best


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> str:
    """Runner ``a``'s time over ``b``'s within each repeat: median (range) over the repeats."""
    ratios = [x / y for x, y in zip(times[a], times[b])]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "LOCAL_STEP.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = load_average()
    rows = []
    for label, (hidden, clients) in WORKLOADS.items():
        times, finals, faults = alternate(["before", "taped", "after", "optim", "fused"], args.repeats, label,
                                          lambda r: run(r, hidden, clients, args.rounds))  # noqa: B023 (called at once)
        ms = {r: statistics.median(t) * 1e3 for r, t in times.items()}
        per_step = {r: v / (COHORT * LOCAL_STEPS) for r, v in ms.items()}
        paired = functools.partial(paired_ratio, times)

        rows.append(
            f"| {label} | {' | '.join(f'{ms[r]:.1f}' for r in times)} | {' | '.join(f'{per_step[r]:.2f}' for r in times)} "
            f"| {ms['before'] / ms['after']:.2f}x | {paired('after', 'taped')} | {paired('after', 'optim')} | "
            f"{min(times['after']) / min(times['optim']):.2f} | {paired('fused', 'after')} | {paired('fused', 'optim')} | "
            f"{' / '.join(f'{statistics.median(faults[r]):.0f}' for r in times)} | "
            f"{' / '.join(weights_hash(finals[r]) for r in times)} | "
            f"{(finals['fused'] - finals['after']).abs().max().item():.1e} |"
        )
    lines = [
        "# Local step: fedcomp's local backend vs an in-place torch.optim loop", "",
        generated_by() + f"; load average before: {load_before}, after: {load_average()} (a shared 2-core "
        "machine: other work inflates every column alike, the runners alternate within each repeat).", "",
        f"FedAvg, {COHORT} clients per round, {LOCAL_STEPS} local SGD steps of batch 16, lr 0.05, {args.rounds} "
        f"rounds, median over rounds then over {args.repeats} repeats; one torch thread. `before` = in-place "
        "steps switched off (the pure, out-of-place step), `taped` = the gradient by autograd (the untaped "
        "gradient switched off), `after` = as built, `optim` = `torch.optim.SGD` on "
        "the module's parameters, `fused` = as built with `federation.fused_sgd: true`. Hashes: final weights (the "
        "first four agree bit for bit: fedcomp's step is torch.optim's fused `p += -lr g`, rounded once; `fused` "
        "steps each linear layer's weight by `addmm_`, which rounds otherwise: its largest difference from `after` "
        "is the last column). Paired: the ratio within each repeat, median (range) over repeats. Page faults: this "
        "process's minor page faults per round (`getrusage`), median over repeats -- memory a round takes fresh from "
        "the system, which the neighbours' load does not move.", "",
        "| workload | before (ms/round) | taped (ms/round) | after (ms/round) | optim (ms/round) | fused (ms/round) "
        "| before (ms/step) | taped (ms/step) | after (ms/step) | optim (ms/step) | fused (ms/step) | speed-up "
        "| after / taped paired | after / optim paired | best / best | fused / after paired | fused / optim paired "
        "| page faults per round (before / taped / after / optim / fused) "
        "| final weights sha256 (before / taped / after / optim / fused) | fused vs after, max abs diff |",
        "|:---|" + "---:|" * 17 + ":---|---:|",
        *rows, "",
        f"Target (issue #16): after / optim <= {TARGET} on the heavy MLP.", "",
        "Other algorithms on the same rounds in place (lr 0.05), `exact` against `fused` (`federation.fused_sgd`): "
        "LocalSGDM adds each linear weight's gradient factors into its momentum buffer in one `addmm_(beta=mu)` "
        "(`b <- mu b + g^T a`), FedProx steps the weight by its pull `mu (x - x_g)` and then by the factors "
        "(`addmm_(alpha=-lr)`):", "",
        "| algorithm | workload | exact (ms/round) | fused (ms/round) | exact (ms/step) | fused (ms/step) "
        "| fused / exact paired | fused vs exact, max abs diff |", "|:---|:---|---:|---:|---:|---:|---:|---:|",
        *other_rows(args.rounds, args.repeats), "",
        f"The middle layer's weight update ({' x '.join(map(str, KERNEL_SHAPE))}: batch, inputs, outputs), each way in "
        "isolation, ms per call, best of 5 x 200 calls (the exact step's two kernels against the fused step's one):", "",
        "| kernel | ms per call |", "|:---|---:|",
        *(f"| {name} | {ms:.3f} |" for name, ms in kernel_times().items()),
    ]
    publish("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
