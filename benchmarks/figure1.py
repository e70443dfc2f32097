"""Reproduce the FCSG paper's Figure 1 (invariant logistic regression) through the public API.

The paper's Figure 1 is a 3x3 grid -- inner batch m in {1, 10, 100} (rows) x noise ratio sigma2/sigma1 in
{1, 1.5, 2} (columns) -- of test accuracy vs communication rounds, FCSG vs FCSG-M, 16 clients, q = 50 local
steps, outer batch 1. This script runs every panel for both algorithms and several seeds via
``fedcomp.run("fig1-fcsg[-m]", {...})`` on the in-process backend (same numbers as Ray, less overhead for
many small runs), then writes

* a markdown report (default ``benchmarks/FIGURE1.md``): the exact command, machine and wall time, the
  optional pilot used to choose lr and beta, the per-panel table (final test accuracy mean +- std over seeds
  and a curve-variability measure) and the verdicts on the paper's qualitative claims, all computed here;
* a figure (default ``benchmarks/figure1.png``): the 3x3 grid of mean test accuracy (+- std band) vs rounds.

One lr (from the paper's grid {0.01, 0.005, 0.001}, widened past its edge when the best lr sits there) and one
beta (from {0.001, 0.01, 0.1, 0.5, 0.9}, likewise) are used for every panel. ``--pilot`` picks them first from a
small grid search on a seed that is not used by the main runs (see ``pilot`` below); ``--lr``/``--beta`` fix them
by hand instead.

Usage (from the repository root)::

    python benchmarks/figure1.py --pilot                 # pilot, then the 54 runs, ~12 min on 2 CPU cores
    python benchmarks/figure1.py --lr 0.01 --beta 0.1 --rounds 40 --seeds 3
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import common
import fedcomp

LR_GRID = (0.01, 0.005, 0.001)
BETA_GRID = (0.001, 0.01, 0.1, 0.5, 0.9)
INNER_BATCHES = (1, 10, 100)
NOISE_RATIOS = (1.0, 1.5, 2.0)
ALGORITHMS = ("fcsg", "fcsg-m")
LABELS = {"fcsg": "FCSG", "fcsg-m": "FCSG-M"}
LR_UP = (0.02, 0.05, 0.1, 0.2, 0.5)  # past the paper's lr grid, tried while the best lr is the largest so far
LR_DOWN = (0.0005, 0.0002)
BETA_UP = (1.0,)  # beta = 1 is FCSG
BETA_DOWN = (0.0001,)
PILOT_PANELS = ((1, 2.0), (10, 1.5))  # (m, noise ratio): the hardest panel and the centre panel
PILOT_SEED = 1000  # disjoint from the main runs' seeds 0..S-1


# -- running ---------------------------------------------------------------------------------------------
def run_one(algo: str, m: int, ratio: float, seed: int, lr: float, beta: float, rounds: int, out: str) -> np.ndarray:
    """One run; returns the test-accuracy curve indexed by round 0..rounds (round 0 = the initial model)."""
    overrides = {
        "federation.backend": "local",
        "algorithm.inner_batch": m,
        "algorithm.lr": lr,
        "task.noise_ratio": ratio,
        "run.seed": seed,
        "run.rounds": rounds,
        "run.eval_every": 1,
        "run.checkpoint_every": rounds,
        "run.out": out,
        "run.progress": "none",
        "run.on_divergence": "continue",
    }
    if algo == "fcsg-m":
        overrides["algorithm.beta"] = beta
    result = fedcomp.run(f"fig1-{algo}", overrides)
    metrics = result.metrics.sort_values("round")
    rounds_seen = metrics["round"].to_numpy()
    if not np.array_equal(rounds_seen, np.arange(rounds + 1)):
        raise RuntimeError(f"expected an evaluation every round 0..{rounds}, got rounds {rounds_seen.tolist()}")
    return metrics["test_accuracy"].to_numpy(dtype=float)


def second_half(curve: np.ndarray) -> np.ndarray:
    """The curve over the second half of the rounds (rounds > R/2)."""
    rounds = len(curve) - 1
    return curve[rounds // 2 + 1 :]


def variability(curve: np.ndarray) -> float:
    """Std of the round-to-round changes of test accuracy over the second half of the run.

    The changes into rounds R/2+1 .. R (R/2 of them), i.e. ``diff(curve[R/2:])``.
    """
    rounds = len(curve) - 1
    return float(np.std(np.diff(curve[rounds // 2 :])))


def pilot(rounds: int, out: str, log) -> tuple[float, float, list[str]]:
    """Grid-search lr (shared by both algorithms) and beta (FCSG-M) on PILOT_PANELS with PILOT_SEED.

    Score of a run = mean test accuracy over the second half of its rounds (less noisy than the last point),
    averaged over the pilot panels. lr = argmax over the lr grid of (FCSG score + best FCSG-M score over
    beta) / 2; beta = the best FCSG-M beta at that lr. A best lr on an edge of the paper's grid adds the next
    value past it (LR_UP / LR_DOWN) until it is interior; a best beta on an edge of its grid likewise
    (BETA_UP / BETA_DOWN, at the chosen lr only), so neither choice is an artefact of the grid's ends.
    """
    score: dict[tuple, float] = {}
    lrs: list[float] = []
    betas = list(BETA_GRID)

    def run(algo: str, lr: float, beta: float | None) -> None:
        values = [float(second_half(run_one(algo, m, ratio, PILOT_SEED, lr, beta or 1.0, rounds, out)).mean())
                  for m, ratio in PILOT_PANELS]
        score[(algo, lr, beta)] = float(np.mean(values))
        log(f"pilot {algo:7s} lr={lr:<6} beta={beta!s:<6} score={score[(algo, lr, beta)]:.4f}")

    def add_lr(lr: float) -> None:
        lrs.append(lr)
        for algo, beta in [("fcsg", None), *(("fcsg-m", b) for b in BETA_GRID)]:
            run(algo, lr, beta)

    def best_beta(lr: float) -> float:
        return max((b for b in betas if ("fcsg-m", lr, b) in score), key=lambda b: score[("fcsg-m", lr, b)])

    def combined(lr: float) -> float:
        return (score[("fcsg", lr, None)] + score[("fcsg-m", lr, best_beta(lr))]) / 2

    for lr in LR_GRID:
        add_lr(lr)
    lr = common.extend_past_edges(lambda: max(lrs, key=combined), lambda: lrs, add_lr, LR_UP, LR_DOWN)
    assert lr is not None

    def add_beta(beta: float) -> None:
        betas.append(beta)
        run("fcsg-m", lr, beta)

    def tried_betas() -> list[float]:
        return [b for b in betas if ("fcsg-m", lr, b) in score]

    beta = common.extend_past_edges(lambda: best_beta(lr), tried_betas, add_beta, BETA_UP, BETA_DOWN)
    assert beta is not None
    edges = [f"{name} = {value:g} is the {'largest' if value == max(values) else 'smallest'} value tried"
             for name, value, values in (("lr", lr, lrs), ("beta", beta, tried_betas())) if value in (min(values), max(values))]

    panels = ", ".join(f"m = {m}, sigma2/sigma1 = {r:g}" for m, r in PILOT_PANELS)
    shown = sorted(set(betas))
    lines = [
        f"Pilot: seed {PILOT_SEED} (not one of the main runs' seeds), {rounds} rounds, panels ({panels}). "
        "Score = mean test accuracy over the second half of the rounds, averaged over the pilot panels. "
        "lr (shared by both algorithms) = argmax of (FCSG score + best FCSG-M score) / 2; "
        f"beta = best FCSG-M beta at that lr. The paper's grids are lr {{{', '.join(f'{v:g}' for v in LR_GRID)}}} and beta "
        f"{{{', '.join(f'{v:g}' for v in BETA_GRID)}}}; a best value on a grid's edge added the next value past it "
        f"(lr: {', '.join(f'{v:g}' for v in LR_UP)} upward, {', '.join(f'{v:g}' for v in LR_DOWN)} downward; "
        f"beta at the chosen lr: {', '.join(f'{v:g}' for v in BETA_UP)} upward, "
        f"{', '.join(f'{v:g}' for v in BETA_DOWN)} downward) until the best was interior.",
        "",
        "| lr | FCSG | " + " | ".join(f"FCSG-M beta={b:g}" for b in shown) + " | combined |",
        "|---|---|" + "---|" * len(shown) + "---|",
    ]
    for v in sorted(lrs, reverse=True):
        cells = [f"{score[('fcsg', v, None)]:.4f}"]
        for b in shown:
            text = f"{score[('fcsg-m', v, b)]:.4f}" if ("fcsg-m", v, b) in score else "–"
            cells.append(f"**{text}**" if (v, b) == (lr, beta) else text)
        lines.append(f"| {v:g} | " + " | ".join(cells) + f" | {combined(v):.4f} |")
    where = ("both interior to the values tried" if not edges
             else "still on an edge (the ladder ran out): " + "; ".join(edges))
    lines += ["", f"Chosen: **lr = {lr:g}, beta = {beta:g}** ({where})."]
    return lr, beta, lines


# -- reporting -------------------------------------------------------------------------------------------
def draw(curves: dict, rounds: int, lr: float, beta: float, seeds: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"fcsg": "tab:blue", "fcsg-m": "tab:red"}
    fig, axes = plt.subplots(3, 3, figsize=(13, 10.5), sharex=True)
    x = np.arange(rounds + 1)
    for i, m in enumerate(INNER_BATCHES):
        for j, ratio in enumerate(NOISE_RATIOS):
            ax = axes[i, j]
            low = 1.0
            for algo in ALGORITHMS:
                runs = np.stack(curves[(algo, m, ratio)])
                mean, std = runs.mean(axis=0), runs.std(axis=0)
                label = LABELS[algo] + (f" (beta={beta:g})" if algo == "fcsg-m" else "")
                ax.plot(x, mean, color=colours[algo], label=label, lw=1.4)
                ax.fill_between(x, mean - std, mean + std, color=colours[algo], alpha=0.2, lw=0)
                low = min(low, float(mean[1:].min()))
            ax.set_ylim(max(0.5, low - 0.02), 1.0)
            ax.set_title(f"m = {m}, sigma2/sigma1 = {ratio:g}", fontsize=10)
            ax.grid(alpha=0.3)
            if i == 2:
                ax.set_xlabel("communication rounds")
            if j == 0:
                ax.set_ylabel("test accuracy")
    axes[0, 0].legend(loc="lower right", fontsize=9)
    fig.suptitle(
        f"Invariant logistic regression (FCSG paper Fig. 1): 16 clients, q = 50, b = 1, lr = {lr:g}; "
        f"mean +- std over {seeds} seeds",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=None, help=f"step size for every run, from {LR_GRID} (default 0.01, or the pilot's choice)")
    parser.add_argument("--beta", type=float, default=None, help=f"FCSG-M momentum weight, from {BETA_GRID} (default 0.1, or the pilot's choice)")
    parser.add_argument("--rounds", type=int, default=40, help="communication rounds per run (the paper does not state its budget)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per (panel, algorithm): run.seed = 0..N-1")
    parser.add_argument("--pilot", action="store_true", help="choose lr and beta by a small grid search first (unless given)")
    parser.add_argument("--out", default=None, help="results root for the runs' folders (default: a temporary folder, deleted)")
    parser.add_argument("--md", default=str(common.HERE / "FIGURE1.md"), help="markdown report path")
    parser.add_argument("--png", default=str(common.HERE / "figure1.png"), help="figure path")
    args = parser.parse_args()

    clock = common.Stopwatch()
    started, log = clock.start, clock.log

    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="figure1-")
        out = tmp.name
    else:
        out = args.out

    pilot_lines: list[str] = []
    pilot_seconds = 0.0
    lr, beta = args.lr, args.beta
    if args.pilot and (lr is None or beta is None):
        chosen_lr, chosen_beta, pilot_lines = pilot(args.rounds, out, log)
        pilot_seconds = time.time() - started
        lr = chosen_lr if lr is None else lr
        beta = chosen_beta if beta is None else beta
        log(f"pilot chose lr={chosen_lr:g} beta={chosen_beta:g}; using lr={lr:g} beta={beta:g}")
    lr = 0.01 if lr is None else lr
    beta = 0.1 if beta is None else beta

    # -- the grid --------------------------------------------------------------------------------------
    main_started = time.time()
    curves: dict[tuple, list[np.ndarray]] = {}
    grid = list(itertools.product(NOISE_RATIOS, INNER_BATCHES, ALGORITHMS, range(args.seeds)))
    for k, (ratio, m, algo, seed) in enumerate(grid, 1):
        curve = run_one(algo, m, ratio, seed, lr, beta, args.rounds, out)
        curves.setdefault((algo, m, ratio), []).append(curve)
        log(f"run {k}/{len(grid)} {algo:7s} m={m:<3} ratio={ratio:g} seed={seed}: final acc {curve[-1]:.4f}")
    main_seconds = time.time() - main_started
    if tmp is not None:
        tmp.cleanup()

    final = {key: [float(c[-1]) for c in runs] for key, runs in curves.items()}
    var = {key: float(np.mean([variability(c) for c in runs])) for key, runs in curves.items()}
    acc = {key: float(np.mean(v)) for key, v in final.items()}

    # -- table -----------------------------------------------------------------------------------------
    table = [
        "| sigma2/sigma1 | m | algorithm | final test accuracy (mean ± std) | curve variability |",
        "|---|---|---|---|---|",
    ]
    for ratio, m, algo in itertools.product(NOISE_RATIOS, INNER_BATCHES, ALGORITHMS):
        key = (algo, m, ratio)
        table.append(f"| {ratio:g} | {m} | {LABELS[algo]} | {common.mean_std(final[key])} | {var[key]:.4f} |")

    # -- claims ----------------------------------------------------------------------------------------
    verdicts = []
    claim_a = {}
    for algo in ALGORITHMS:
        a1, a10, a100 = (acc[(algo, m, 2.0)] for m in INNER_BATCHES)
        holds = a100 > a10 > a1
        claim_a[algo] = holds
        sd = max(np.std(final[(algo, m, 2.0)]) for m in INNER_BATCHES)
        verdicts.append(
            f"- (a) {LABELS[algo]}, sigma2/sigma1 = 2: acc(m=100) = {a100:.4f}, acc(m=10) = {a10:.4f}, "
            f"acc(m=1) = {a1:.4f}; gaps m=100 - m=10 = {a100 - a10:+.4f}, m=10 - m=1 = {a10 - a1:+.4f} "
            f"(largest seed std {sd:.4f}) -> **{'holds' if holds else 'does not hold'}**"
        )
    claim_b = {}
    for ratio in NOISE_RATIOS:
        vm, vf = var[("fcsg-m", 1, ratio)], var[("fcsg", 1, ratio)]
        holds = vm < vf
        claim_b[ratio] = holds
        verdicts.append(
            f"- (b) m = 1, sigma2/sigma1 = {ratio:g}: variability FCSG-M = {vm:.4f} vs FCSG = {vf:.4f} "
            f"(ratio {vm / vf if vf else float('nan'):.2f}) -> **{'holds' if holds else 'does not hold'}**"
        )
    extra = []
    for ratio in NOISE_RATIOS:
        gap = acc[("fcsg-m", 100, ratio)] - acc[("fcsg", 100, ratio)]
        extra.append(f"{ratio:g}: {gap:+.4f}")
    summary = [
        "- Claim (a) -- at sigma2/sigma1 = 2 a larger m gives higher accuracy (acc(100) > acc(10) > acc(1)): "
        + ", ".join(f"{LABELS[a]} **{'holds' if claim_a[a] else 'does not hold'}**" for a in ALGORITHMS)
        + ".",
        f"- Claim (b) -- at m = 1 FCSG-M's curve varies less than FCSG's: holds at "
        f"{sum(claim_b.values())} of {len(NOISE_RATIOS)} noise ratios"
        + (
            " (fails at " + ", ".join(f"{r:g}" for r, h in claim_b.items() if not h) + ")."
            if not all(claim_b.values())
            else "."
        ),
        "- For reference (the paper's third remark, 'at m = 100 the two methods are similar'): final accuracy "
        "FCSG-M minus FCSG at m = 100, by noise ratio: " + ", ".join(extra) + ".",
    ]

    total_seconds = time.time() - started
    png = Path(args.png)
    png.parent.mkdir(parents=True, exist_ok=True)
    draw(curves, args.rounds, lr, beta, args.seeds, png)
    total_seconds = time.time() - started

    n_runs = len(grid)
    md = [
        "# Figure 1 of the FCSG paper: invariant logistic regression",
        "",
        "Generated by `benchmarks/figure1.py`; every number below was computed by the script from the runs' "
        "metrics.",
        "",
        "## How it was run",
        "",
        f"- Command (from the repository root): `{common.command()}`",
        f"- Started {clock.started_at}; code revision {common.revision()}.",
        f"- Machine: {common.machine()}; no GPU used.",
        f"- Wall time: {total_seconds / 60:.1f} min in all"
        + (f" (pilot {pilot_seconds / 60:.1f} min, " if pilot_lines else " (")
        + f"{n_runs} main runs {main_seconds / 60:.1f} min, {main_seconds / n_runs:.1f} s per run).",
        f"- Setting: presets `fig1-fcsg` and `fig1-fcsg-m` (16 clients, q = 50 local steps, outer batch 1, "
        f"first estimate from 32 outer samples, paper objective with the inner mean inside the logistic loss, "
        f"independent client streams, test accuracy of the server-averaged model on 50,000 fresh clean "
        f"samples), run through `fedcomp.run` with `federation.backend: local`. "
        f"lr = {lr:g} for both algorithms, beta = {beta:g} for FCSG-M, {args.rounds} communication rounds "
        f"(our budget; the paper does not state one), evaluated every round, seeds 0..{args.seeds - 1}.",
        "- Curve variability = standard deviation of the round-to-round changes of test accuracy over the "
        f"second half of the run (the {args.rounds - args.rounds // 2} changes from round {args.rounds // 2} "
        f"to round {args.rounds}), averaged over seeds. Final accuracy = test accuracy after "
        f"round {args.rounds}; ± is the standard deviation over seeds.",
        "",
    ]
    if pilot_lines:
        md += ["## Choosing lr and beta (pilot)", "", *pilot_lines, ""]
    md += [
        "## Results",
        "",
        *table,
        "",
        *common.claims_section(summary, verdicts),
        "## Figure",
        "",
        f"![Figure 1 reproduction]({os.path.relpath(png, Path(args.md).parent)})",
        "",
        f"Rows: inner batch m = 1, 10, 100; columns: sigma2/sigma1 = 1, 1.5, 2. Lines: mean over {args.seeds} "
        "seeds; bands: ± one standard deviation.",
        "",
    ]
    Path(args.md).parent.mkdir(parents=True, exist_ok=True)
    Path(args.md).write_text("\n".join(md))

    print()
    print("\n".join(table))
    print()
    print("\n".join(summary))
    print("\n".join(verdicts))
    print(f"\nwrote {args.md} and {png}; total {total_seconds / 60:.1f} min")


if __name__ == "__main__":
    main()
