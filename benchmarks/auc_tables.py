"""The offline Table 1 (LocalSCGDAM paper) and Table 2 (FCSG paper, AUPRC) sweeps, measured side by side with
the papers' numbers, and which of the papers' orderings hold on them.

    python benchmarks/auc_tables.py [--out results] [--only table1|table2]   # writes benchmarks/AUC_TABLES.md
    python benchmarks/auc_tables.py --out results --reuse    # tabulate the newest finished sweeps under --out again

Runs the sweep presets ``auc-table1-offline`` (270 trials) and ``auprc-table2-offline`` (60 trials) through
``fedcomp.sweep`` on the local Ray (2 trials at a time on a 2-core machine), exactly as
``fedcomp sweep auc-table1-offline`` would, then tabulates each sweep in its paper's layout with
:func:`fedcomp.sweeps.report.paper_table` (each cell: the better of the preset's two step sizes, mean ± std of
the final metric over 3 seeds). The papers' numbers come from EXPERIMENTS.md (E3, E10); the offline datasets are
stand-ins for the papers' (see the presets), so the comparison is of orderings, not of values.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import common
import fedcomp
from fedcomp.sweeps.report import best_configurations, paper_table
from fedcomp.sweeps.tuner import SweepResult, load_sweep

PAPER_TABLE2 = {  # FCSG paper, Table 2: final averaged AP on test data
    "MNIST": {"fedavg": 0.9357, "coda-plus": 0.9733, "fcsg": 0.9868, "fcsg-m": 0.9878, "acc-fcsg-m": 0.9879},
    "CIFAR-10": {"fedavg": 0.5059, "coda-plus": 0.6039, "fcsg": 0.7130, "fcsg-m": 0.7157, "acc-fcsg-m": 0.7184},
}
PAPER_TABLE1 = {  # LocalSCGDAM paper, Table 1 (test AUC, mean across devices), two of its six datasets
    ("FashionMNIST", "local-scgdam"): (0.980, 0.980, 0.980),
    ("FashionMNIST", "coda"): (0.976, 0.976, 0.976),
    ("FashionMNIST", "local-sgdam"): (0.977, 0.977, 0.976),
    ("FashionMNIST", "local-sgdm"): (0.963, 0.956, 0.955),
    ("FashionMNIST", "local-sgdm-rl"): (0.980, 0.957, 0.962),
    ("CIFAR10", "local-scgdam"): (0.914, 0.914, 0.916),
    ("CIFAR10", "coda"): (0.890, 0.886, 0.883),
    ("CIFAR10", "local-sgdam"): (0.893, 0.880, 0.880),
    ("CIFAR10", "local-sgdm"): (0.883, 0.871, 0.874),
    ("CIFAR10", "local-sgdm-rl"): (0.890, 0.904, 0.883),
}
MATCHED_STEP = {
    # The AUC methods' x step at LocalSGDM's effective step: heavy-ball momentum mu = 0.9 moves x by lr/(1 - mu),
    # 10x the nominal 0.1 / 0.3 the Table 1 sweep gives every method; LocalSCGDAM's and LocalSGDAM's u and CoDA
    # have no such amplification. Same protocol as auc-table1-offline on mnist5k, p = 4.
    "name": "auc-matched-step",
    "base": "auc-table1-offline",
    "set": {"federation.backend": "local", "run.eval_every": 4},
    "grid": [
        {"task.dataset,task.model": [["mnist5k", "fashion-conv"]], "algorithm.name": ["local-scgdam", "local-sgdam"],
         "algorithm.gamma_x,algorithm.gamma_y": [[10.0, 10.0], [30.0, 30.0]]},
        {"task.dataset,task.model": [["mnist5k", "fashion-conv"]], "algorithm.name": ["coda"], "algorithm.lr": [1.0, 3.0],
         "algorithm.stage_steps": [64]},
    ],
    "seeds": 3,
    "metric": "test_auroc",
    "mode": "max",
    "table": {"rows": ["algorithm.name"], "columns": "task.dataset"},
}
TABLE1_METHODS = ("local-scgdam", "coda", "local-sgdam", "local-sgdm", "local-sgdm-rl")
TABLE2_METHODS = ("fedavg", "coda-plus", "fcsg", "fcsg-m", "acc-fcsg-m")


def table1_orderings(result: SweepResult) -> list[str]:
    cells = best_configurations(result.trials, result.spec, by=["task.dataset", "algorithm.name", "algorithm.local_steps"])
    lines, wins, total = [], 0, 0
    for (dataset, p), group in cells.groupby(["task.dataset", "algorithm.local_steps"], sort=True):
        ranking = group.sort_values("mean", ascending=False)
        order = " > ".join(f"{r['algorithm.name']} {r['mean']:.4f}" for _, r in ranking.iterrows())
        top = ranking.iloc[0]["algorithm.name"]
        wins += top == "local-scgdam"
        total += 1
        lines.append(f"| {dataset} | {p} | {'yes' if top == 'local-scgdam' else 'no'} | {order} |")
    head = [f"LocalSCGDAM has the best mean AUROC in {wins} of {total} (dataset, p) cells (the paper: all 18, one tie).",
            "", "| dataset | p | LocalSCGDAM best | ranking by mean final AUROC |", "|---|---:|---|---|"]
    return head + lines


def table2_orderings(result: SweepResult) -> list[str]:
    """Per dataset: the ranking, and for each FCSG-family method whether it is above FedAvg and above CODA+
    (the paper: every one is above both, and CODA+ is above FedAvg, on MNIST and CIFAR-10)."""
    cells = best_configurations(result.trials, result.spec, by=["task.dataset", "algorithm.name"])
    family = ("fcsg", "fcsg-m", "acc-fcsg-m")
    lines = ["| dataset | ranking by mean final AP | " + " | ".join(f"{m} > fedavg / > coda-plus" for m in family)
             + " | coda-plus > fedavg |", "|---|---|" + "---|" * (len(family) + 1)]
    for dataset, group in cells.groupby("task.dataset", sort=True):
        mean = dict(zip(group["algorithm.name"], group["mean"]))
        ranking = " > ".join(f"{k} {v:.4f}" for k, v in sorted(mean.items(), key=lambda kv: -kv[1]))
        yes = lambda flag: "yes" if flag else "no"  # noqa: E731
        pairs = [f"{yes(mean[m] > mean['fedavg'])} / {yes(mean[m] > mean['coda-plus'])}" for m in family]
        lines.append(f"| {dataset} | {ranking} | " + " | ".join(pairs) + f" | {yes(mean['coda-plus'] > mean['fedavg'])} |")
    return lines


def paper_tables() -> list[str]:
    lines = ["Papers' numbers for reference (EXPERIMENTS.md E10 and E3):", "",
             "| LocalSCGDAM Table 1 (AUC) | method | p = 4 | p = 8 | p = 16 |", "|---|---|---:|---:|---:|"]
    lines += [f"| {d} | {m} | " + " | ".join(f"{v:.3f}" for v in values) + " |" for (d, m), values in PAPER_TABLE1.items()]
    lines += ["", "| FCSG Table 2 (AP) | " + " | ".join(TABLE2_METHODS) + " |", "|---|" + "---:|" * len(TABLE2_METHODS)]
    lines += [f"| {d} | " + " | ".join(f"{row[m]:.4f}" for m in TABLE2_METHODS) + " |" for d, row in PAPER_TABLE2.items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="where the sweeps write their folders")
    parser.add_argument("--only", choices=["table1", "table2", "matched"])
    parser.add_argument("--reuse", action="store_true", help="load the newest sweep of each preset under --out instead of running it")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sections, timings = [], {}
    for key, preset, orderings in (("table1", "auc-table1-offline", table1_orderings),
                                   ("table2", "auprc-table2-offline", table2_orderings),
                                   ("matched", "auc-matched-step", lambda result: [])):
        if args.only and args.only != key:
            continue
        started = time.time()
        if args.reuse:
            folders = sorted(Path(args.out).glob(f"{preset}_*"), key=lambda f: f.stat().st_mtime)
            if not folders:
                raise SystemExit(f"--reuse: no {preset}_* sweep folder under {args.out}")
            result = load_sweep(folders[-1])
            timings[preset] = common.trials_seconds(result.trials) if "wall_time" in result.trials else 0.0
        else:
            result = fedcomp.sweep(MATCHED_STEP if key == "matched" else preset, overrides={"run.out": args.out})
            timings[preset] = time.time() - started
        trials = result.trials["trial"].nunique()
        took = (f"trials' own wall times summed: {timings[preset] / 60:.1f} min" if args.reuse
                else f"sweep wall time {timings[preset] / 60:.1f} min")
        sections += [f"## `{preset}` ({trials} trials, {took}, sweep folder `{result.path.name}`)", "",
                     paper_table(result.trials, result.spec), *orderings(result), ""]
        print(f"{preset}: {trials} trials in {timings[preset]:.0f} s", flush=True)
    text = [
        "# Imbalanced classification offline: Table 1 (LocalSCGDAM) and Table 2 (FCSG, AUPRC)",
        "",
        (f"{common.generated_by('Tabulated')}, from the sweep folders named below (run earlier with the same "
         "presets) " if args.reuse else f"{common.generated_by()} ")
        + "(settings in the presets' comments; every number below comes from these runs). Cells: the better of the "
        "preset's two step sizes, mean ± std over 3 seeds of the final metric.",
        "",
        *sections,
        *paper_tables(),
        "",
    ]
    target = common.HERE / "AUC_TABLES.md"
    if args.only and target.exists():  # keep the other table's section from the last full run
        print(f"--only: not overwriting {target}; printing instead")
        print("\n".join(text))
        return
    target.write_text("\n".join(text))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
