"""The offline Table 1 (LocalSCGDAM paper) and Table 2 (FCSG paper, AUPRC) sweeps, measured side by side with
the papers' numbers, and which of the papers' orderings hold on them.

    python benchmarks/auc_tables.py [--out results] [--only table1|table2] [--extend-edges [--edge-cap N]]
    python benchmarks/auc_tables.py --only table1 --datasets digits --periods 8   # one part of a preset
    python benchmarks/auc_tables.py --out results --reuse    # tabulate the finished sweeps under --out again

Runs the sweep presets ``auc-table1-offline`` and ``auprc-table2-offline`` through ``fedcomp.sweep`` on the local
Ray, exactly as ``fedcomp sweep auc-table1-offline [--extend-edges]`` would, then tabulates each sweep in its
paper's layout with :func:`fedcomp.sweeps.report.paper_table` (each cell: the best configuration of the preset's
grid, mean ± std of the final metric over the preset's seeds), the step (and beta) each cell's best used, which
cells still sit on an edge of a tuned axis (the sweep's own edge guard), and which of the papers' orderings hold.
The papers' numbers come from EXPERIMENTS.md (E3, E10); the offline datasets are stand-ins for the papers' (see
the presets), so the comparison is of orderings, not of values.

``--datasets`` / ``--periods`` run the preset's grid cut to those datasets / local periods p (a long preset in
parts; the part's table is printed, not written); ``--reuse`` tabulates each table cell (dataset, and p for Table 1)
from the newest finished sweep folder of the preset that ran that cell with the preset's current grid, and names the
folders it used. AUC_TABLES.md has a section per preset, each with the revision and command that made it: a run
rewrites the sections of the presets it tabulated and keeps the other as it was (``--only table1 --reuse``
re-tabulates Table 1 alone).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

import common
import fedcomp
from fedcomp.platform.config import Config
from fedcomp.sweeps.edges import missing
from fedcomp.sweeps.report import best_and_edges, extension_summary, paper_table
from fedcomp.sweeps.spec import SweepSpec, load_spec
from fedcomp.sweeps.tuner import SweepResult, load_sweep

PAPER_TABLE2 = {  # FCSG paper, Table 2: final averaged AP on test data
    "MNIST": {"fedavg": 0.9357, "coda-plus": 0.9733, "fcsg": 0.9868, "fcsg-m": 0.9878, "acc-fcsg-m": 0.9879},
    "CIFAR-10": {"fedavg": 0.5059, "coda-plus": 0.6039, "fcsg": 0.7130, "fcsg-m": 0.7157, "acc-fcsg-m": 0.7184},
}
PAPER_TABLE1 = {  # LocalSCGDAM paper, Table 1 (test AUC, mean across devices), two of its six datasets; p = 4, 8, 16
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
PAPER_PERIODS = (4, 8, 16)
TABLE1_METHODS = ("local-scgdam", "coda", "local-sgdam", "local-sgdm", "local-sgdm-rl")
TABLE2_METHODS = ("fedavg", "coda-plus", "fcsg", "fcsg-m", "acc-fcsg-m")
PREVIOUS = "0d1b87d"
"""The revision whose AUC_TABLES.md holds the last run of the earlier, narrower grids (x steps / lr 0.1, 0.3 and
0.03, 0.1, beta 0.1, 3 seeds)."""
PRESETS = {"auc-table1-offline": "table1", "auprc-table2-offline": "table2"}
"""The report's sections, in order, and the ``--only`` value of each."""
PAPERS = "Papers' numbers for reference (EXPERIMENTS.md E10 and E3):"
TABLE1_CELL = ["task.dataset", "algorithm.name", "algorithm.local_steps"]
TABLE2_CELL = ["task.dataset", "algorithm.name"]
TABLE1_PART = ["task.dataset", "algorithm.local_steps"]
TABLE2_PART = ["task.dataset"]
"""What one sweep folder contributes to a table: every cell of a (dataset, p) / a dataset, never half of one."""


# -- a preset in parts ------------------------------------------------------------------------------------------


def restrict(spec: SweepSpec, only: Mapping[str, Collection[Any]]) -> SweepSpec:
    """``spec`` with every grid's values of the keys in ``only`` cut to the allowed ones (joint axes value by
    value); grids left with an empty axis are dropped."""
    grids = []
    for grid in spec.grids:
        kept = {}
        for axis, values in grid.items():
            keys = axis.split(",")
            kept[axis] = [v for v in values if all((v[i] if len(keys) > 1 else v) in only[k]
                                                   for i, k in enumerate(keys) if k in only)]
        if all(kept.values()):
            grids.append(kept)
    if not grids:
        allowed = {k: sorted({p[k] for p in spec.points() if k in p}) for k in only}
        raise SystemExit(f"--datasets / --periods {dict(only)} leave no configuration of {spec.name}; allowed: {allowed}")
    return spec.model_copy(update={"grid": grids})


def _same_grid(a: SweepSpec, b: SweepSpec, part: Mapping[str, Any]) -> bool:
    """Whether two specs run the same configurations (and seeds) for one table part."""
    only = {k: [v] for k, v in part.items()}
    try:
        cut_a, cut_b = restrict(a, only), restrict(b, only)
    except SystemExit:
        return False
    def fixed(spec: SweepSpec) -> dict[str, Any]:
        return {k: v for k, v in spec.set.items() if k != "run.out"}  # where the folders go changes no number

    return (cut_a.grids, fixed(cut_a), cut_a.base, cut_a.seeds) == (cut_b.grids, fixed(cut_b), cut_b.base, cut_b.seeds)


def merged(out: Path, preset: str, part_keys: list[str]) -> tuple[SweepResult, list[Path]] | None:
    """Every table part of ``preset`` from the newest finished sweep folder under ``out`` that ran it with the
    preset's current grid: one result over them all (the full preset's spec), and the folders used (newest
    first); None if no folder has any part."""
    current = load_spec(preset)
    folders = sorted((f for f in out.glob(f"{preset}_*") if (f / "trials.parquet").is_file()),
                     key=lambda f: f.stat().st_mtime, reverse=True)
    taken: set[tuple[Any, ...]] = set()
    pieces, used = [], []
    for folder in folders:
        result = load_sweep(folder)
        parts = {tuple(v.item() if hasattr(v, "item") else v for v in row)
                 for row in result.trials[part_keys].drop_duplicates().itertuples(index=False)}
        fresh = {p for p in parts - taken if _same_grid(current, result.spec, dict(zip(part_keys, p)))}
        if not fresh:
            continue
        keep = [tuple(v.item() if hasattr(v, "item") else v for v in row) in fresh
                for row in result.trials[part_keys].itertuples(index=False)]
        pieces.append(result.trials[keep])
        used.append(folder)
        taken |= fresh
    if not pieces:
        return None
    return SweepResult(used[0], current, pd.concat(pieces, ignore_index=True)), used


# -- the configurations behind each cell ------------------------------------------------------------------------


def cell_config(result: SweepResult, row: pd.Series) -> Config:
    """The full configuration of a best-configuration row (its sweep axes applied to the preset's base)."""
    axes = [a for a in result.spec.axes() if a != "run.seed" and a in row.index]
    point = {k: (row[k].item() if hasattr(row[k], "item") else row[k]) for k in axes if not missing(row[k])}
    return result.spec.base_config(**point)


def x_step(config: Config) -> float:
    """How far a method moves x per unit of its (averaged) gradient estimate: gamma_x * eta for LocalSCGDAM and
    LocalSGDAM, lr / (1 - mu) for heavy-ball LocalSGDM(-RL) at equilibrium, lr (the first stage's) for the rest."""
    hp = config.algorithm
    if hasattr(hp, "gamma_x"):
        return float(hp.gamma_x * hp.lr)
    if hasattr(hp, "momentum"):
        return float(hp.lr / (1.0 - hp.momentum))
    return float(hp.lr)


def cells(result: SweepResult, by: list[str]) -> pd.DataFrame:
    """Per value combination of ``by``: the best configuration's mean, std, its full config and its edge axes."""
    best, _ = best_and_edges(result.trials, result.spec, by=by)
    best["config"] = [cell_config(result, row) for _, row in best.iterrows()]
    return best


def _edge_mark(edge: str) -> str:
    """The arrows of a best's edge column (``algorithm.lr ↑``): what a cell prints after its value."""
    arrows = sorted({part.rsplit(" ", 1)[-1] for part in edge.split(", ") if part})
    return f" {''.join(arrows)}edge" if arrows else ""


def _cell_text(hit: pd.DataFrame, setting: Callable[[pd.Series], str]) -> str:
    """A best-per-cell table's cell: mean ± std (or ``diverged``), the best's ``setting`` and its edge arrows;
    ``–`` where the sweep has no such cell."""
    if hit.empty:
        return "–"
    cell = hit.iloc[0]
    value = "diverged" if cell["mean"] != cell["mean"] else f"{cell['mean']:.4f} ± {cell['std']:.4f}"
    return f"{value} {setting(cell)}{_edge_mark(cell['edge'])}"


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def _within_noise(a: pd.Series, b: pd.Series) -> bool:
    """Whether two cells differ by less than the larger of their across-seed stds."""
    return abs(a["mean"] - b["mean"]) < max(a["std"], b["std"])


def _compare(a: pd.Series, b: pd.Series) -> str:
    """``yes`` / ``no`` for a > b, with ``(noise)`` when the gap is smaller than the larger seed std."""
    if a["mean"] != a["mean"] or b["mean"] != b["mean"]:
        return "yes" if b["mean"] != b["mean"] and a["mean"] == a["mean"] else "no"
    return ("yes" if a["mean"] > b["mean"] else "no") + (" (noise)" if _within_noise(a, b) else "")


def _ranks(values: dict[str, float]) -> dict[str, int]:
    """Rank 1 = the highest, ties sharing the better rank; nan (diverged) after every number."""
    key = {k: v if v == v else float("-inf") for k, v in values.items()}
    return {k: 1 + sum(other > v for other in key.values()) for k, v in key.items()}


def edge_lines(best: pd.DataFrame, label: Callable[[pd.Series], str]) -> list[str]:
    """How many cells' best sits on an edge of a tuned axis, and which (from the sweep's edge guard)."""
    on_edge = best[best["edge"] != ""]
    head = f"Cells whose best configuration still sits on an edge of a tuned axis: {len(on_edge)} of {len(best)}."
    return [head, *(f"- {label(row)}: {row['edge']}" for _, row in on_edge.iterrows()), ""]


# -- Table 1 ----------------------------------------------------------------------------------------------------


def table1_sections(result: SweepResult) -> list[str]:
    best = cells(result, TABLE1_CELL)
    best["step"] = [x_step(c) for c in best["config"]]
    periods = sorted(best["algorithm.local_steps"].unique())
    datasets = list(dict.fromkeys(result.trials["task.dataset"]))
    lines = ["Best per cell and its effective x step (gamma_x * eta; CoDA: lr; LocalSGDM(-RL): lr / (1 - mu));",
             "↑edge / ↓edge: the step (or another tuned axis) is the largest / smallest the sweep tried for it.", "",
             "| dataset | method | " + " | ".join(f"p = {p}" for p in periods) + " |", "|---|---|" + "---:|" * len(periods)]
    for dataset in datasets:
        for method in TABLE1_METHODS:
            row = [_cell_text(best[(best["task.dataset"] == dataset) & (best["algorithm.name"] == method)
                                  & (best["algorithm.local_steps"] == p)], lambda c: f"@ {_fmt(c['step'])}")
                   for p in periods]
            lines.append(f"| {dataset} | {method} | " + " | ".join(row) + " |")
    lines += ["", *edge_lines(best, lambda r: f"{r['task.dataset']}, {r['algorithm.name']}, p = {r['algorithm.local_steps']}")]
    lines += table1_orderings(best, datasets, periods)
    lines += table1_side_by_side(best, datasets, periods)
    return lines


def table1_orderings(best: pd.DataFrame, datasets: Sequence[str], periods: Sequence[int]) -> list[str]:
    """Per (dataset, p): the ranking, and LocalSCGDAM against each baseline (the paper: above every one, in every
    cell); then the counts."""
    others = [m for m in TABLE1_METHODS if m != "local-scgdam"]
    lines = ["| dataset | p | ranking by mean final AUROC | " + " | ".join(f"LocalSCGDAM > {m}" for m in others) + " |",
             "|---|---:|---|" + "---|" * len(others)]
    wins, total = 0, 0
    beats, noise, compared = dict.fromkeys(others, 0), dict.fromkeys(others, 0), dict.fromkeys(others, 0)
    for dataset in datasets:
        for p in periods:
            group = best[(best["task.dataset"] == dataset) & (best["algorithm.local_steps"] == p)].set_index("algorithm.name")
            if "local-scgdam" not in group.index:
                continue
            total += 1
            ranks = _ranks(group["mean"].to_dict())
            order = sorted(ranks, key=ranks.get)
            wins += ranks["local-scgdam"] == 1
            ranking = " > ".join(f"{m} {group.loc[m, 'mean']:.4f}" for m in order)
            pairs = []
            for m in others:
                if m not in group.index:
                    pairs.append("–")
                    continue
                verdict = _compare(group.loc["local-scgdam"], group.loc[m])
                compared[m] += 1
                beats[m] += verdict.startswith("yes")
                noise[m] += verdict.endswith("(noise)")
                pairs.append(verdict)
            lines.append(f"| {dataset} | {p} | {ranking} | " + " | ".join(pairs) + " |")
    counts = ", ".join(f"{m} in {beats[m]} of {compared[m]} ({noise[m]} gaps within seed noise)" for m in others)
    head = [f"LocalSCGDAM has the best mean AUROC in {wins} of {total} (dataset, p) cells (the paper: all 18, one tie). "
            f"It is above {counts}. \"(noise)\": the gap is smaller than the larger of the two cells' across-seed std.", ""]
    return head + lines + [""]


def table1_side_by_side(best: pd.DataFrame, datasets: Sequence[str], periods: Sequence[int]) -> list[str]:
    """Each method's value and rank among the five, the paper's (FashionMNIST, CIFAR10) beside ours, per p."""
    shown = [p for p in PAPER_PERIODS if p in periods]
    paper_ranks = {(d, p): _ranks({m: PAPER_TABLE1[(d, m)][PAPER_PERIODS.index(p)] for m in TABLE1_METHODS})
                   for d in ("FashionMNIST", "CIFAR10") for p in shown}
    ours = {(d, p): best[(best["task.dataset"] == d) & (best["algorithm.local_steps"] == p)].set_index("algorithm.name")["mean"].to_dict()
            for d in datasets for p in shown}
    our_ranks = {key: _ranks(values) for key, values in ours.items()}
    head = ["Side by side at the periods both ran (value (rank among the five)); the paper's data are not ours, so "
            "read the ranks:", "",
            "| method | p | " + " | ".join(f"{d} (paper)" for d in ("FashionMNIST", "CIFAR10")) + " | "
            + " | ".join(datasets) + " |", "|---|---:|" + "---:|" * (2 + len(datasets))]
    lines = []
    for method in TABLE1_METHODS:
        for p in shown:
            paper = [f"{PAPER_TABLE1[(d, method)][PAPER_PERIODS.index(p)]:.3f} ({paper_ranks[(d, p)][method]})"
                     for d in ("FashionMNIST", "CIFAR10")]
            mine = []
            for d in datasets:
                if method not in ours[(d, p)]:
                    mine.append("–")
                    continue
                value = ours[(d, p)][method]
                mine.append(("diverged" if value != value else f"{value:.4f}") + f" ({our_ranks[(d, p)][method]})")
            lines.append(f"| {method} | {p} | " + " | ".join(paper + mine) + " |")
    return head + lines + [""]


# -- Table 2 ----------------------------------------------------------------------------------------------------


def _table2_setting(config: Config) -> str:
    hp = config.algorithm
    beta = getattr(hp, "beta", None)
    return f"lr {_fmt(hp.lr)}" + (f", β {_fmt(beta)}" if beta is not None and config.algorithm_name in ("fcsg-m", "acc-fcsg-m") else "")


def table2_sections(result: SweepResult) -> list[str]:
    best = cells(result, TABLE2_CELL)
    datasets = list(dict.fromkeys(result.trials["task.dataset"]))
    lines = ["Best per cell and its setting (↑edge / ↓edge: a tuned axis at the largest / smallest value tried):", "",
             "| dataset | " + " | ".join(TABLE2_METHODS) + " |", "|---|" + "---:|" * len(TABLE2_METHODS)]
    for dataset in datasets:
        row = [_cell_text(best[(best["task.dataset"] == dataset) & (best["algorithm.name"] == method)],
                          lambda c: f"({_table2_setting(c['config'])})") for method in TABLE2_METHODS]
        lines.append(f"| {dataset} | " + " | ".join(row) + " |")
    lines += ["", *edge_lines(best, lambda r: f"{r['task.dataset']}, {r['algorithm.name']}")]
    lines += table2_orderings(best, datasets)
    return lines


def table2_orderings(best: pd.DataFrame, datasets: Sequence[str]) -> list[str]:
    """Per dataset: the ranking, and for each FCSG-family method whether it is above FedAvg and above CODA+
    (the paper: every one is above both, and CODA+ is above FedAvg, on MNIST and CIFAR-10), with the paper's
    ranks beside ours."""
    family = ("fcsg", "fcsg-m", "acc-fcsg-m")
    lines = ["| dataset | ranking by mean final AP | " + " | ".join(f"{m} > fedavg / > coda-plus" for m in family)
             + " | coda-plus > fedavg |", "|---|---|" + "---|" * (len(family) + 1)]
    for dataset in datasets:
        group = best[best["task.dataset"] == dataset].set_index("algorithm.name")
        ranks = _ranks(group["mean"].to_dict())
        ranking = " > ".join(f"{m} {group.loc[m, 'mean']:.4f}" for m in sorted(ranks, key=ranks.get))
        if not set(TABLE2_METHODS) <= set(group.index):
            lines.append(f"| {dataset} | {ranking} |" + " – |" * (len(family) + 1))
            continue
        pairs = [f"{_compare(group.loc[m], group.loc['fedavg'])} / {_compare(group.loc[m], group.loc['coda-plus'])}" for m in family]
        lines.append(f"| {dataset} | {ranking} | " + " | ".join(pairs) + f" | {_compare(group.loc['coda-plus'], group.loc['fedavg'])} |")
    paper = {d: _ranks(v) for d, v in PAPER_TABLE2.items()}
    ours = {d: _ranks(best[best["task.dataset"] == d].set_index("algorithm.name")["mean"].to_dict()) for d in datasets}
    side = ["", "Ranks (1 = best AP), the paper's beside ours:", "",
            "| method | " + " | ".join(f"{d} (paper)" for d in PAPER_TABLE2) + " | " + " | ".join(datasets) + " |",
            "|---|" + "---:|" * (len(PAPER_TABLE2) + len(datasets))]
    side += [f"| {m} | " + " | ".join(str(paper[d][m]) for d in PAPER_TABLE2) + " | "
             + " | ".join(str(ours[d].get(m, "–")) for d in datasets) + " |" for m in TABLE2_METHODS]
    return ["\"(noise)\": the gap is smaller than the larger of the two cells' across-seed std.", "", *lines, *side, ""]


def paper_tables() -> list[str]:
    lines = [PAPERS, "",
             "| LocalSCGDAM Table 1 (AUC) | method | p = 4 | p = 8 | p = 16 |", "|---|---|---:|---:|---:|"]
    lines += [f"| {d} | {m} | " + " | ".join(f"{v:.3f}" for v in values) + " |" for (d, m), values in PAPER_TABLE1.items()]
    lines += ["", "| FCSG Table 2 (AP) | " + " | ".join(TABLE2_METHODS) + " |", "|---|" + "---:|" * len(TABLE2_METHODS)]
    lines += [f"| {d} | " + " | ".join(f"{row[m]:.4f}" for m in TABLE2_METHODS) + " |" for d, row in PAPER_TABLE2.items()]
    return lines


# -- running and writing ----------------------------------------------------------------------------------------


def coverage(preset: str, result: SweepResult, part_keys: list[str]) -> list[str]:
    """A line naming the preset's table parts that no sweep ran with its current grid."""
    wanted = list(dict.fromkeys(tuple(point[k] for k in part_keys) for point in load_spec(preset).points()))
    ran = {tuple(v.item() if hasattr(v, "item") else v for v in row)
           for row in result.trials[part_keys].drop_duplicates().itertuples(index=False)}
    left = [p for p in wanted if p not in ran]
    if not left:
        return []
    names = "; ".join(", ".join(f"{k.split('.')[-1]} {v}" for k, v in zip(part_keys, p)) for p in left)
    return [f"Not run with the preset's current grid (budget): {names}. Cells of the earlier two-step grid are in "
            f"`git show {PREVIOUS}:benchmarks/AUC_TABLES.md`.", ""]


def section(preset: str, result: SweepResult, folders: Sequence[Path], wall: float | None, part_keys: list[str],
            tabulate: Callable[[SweepResult], list[str]], provenance: str) -> list[str]:
    trials = result.trials["trial"].nunique()
    took = f"trials' own wall times summed: {common.trials_seconds(result.trials) / 60:.1f} min"
    if wall is not None:
        took += f", sweep wall time {wall / 60:.1f} min"
    parts = []
    for folder in folders:
        rows = result.trials[result.trials["trial"].isin(load_sweep(folder).trials["trial"].unique())]
        what = sorted({", ".join(f"{k.split('.')[-1]} {v}" for k, v in zip(part_keys, row))
                       for row in rows[part_keys].drop_duplicates().itertuples(index=False)})
        parts.append(f"- `{folder.name}`: {'; '.join(what)}")
    extended = [line for folder in folders for line in extension_summary(folder)]
    return [f"## `{preset}` ({trials} trials, {took})", "",
            f"{provenance}; mean ± std over {result.spec.seeds} seeds.", "",
            "Sweep folders, each giving the cells listed:", "", *parts, "",
            *coverage(preset, result, part_keys), paper_table(result.trials, result.spec), *tabulate(result),
            *(["`--extend-edges` (the sweeps' own records):", "", *(f"- {line}" for line in extended), ""] if extended else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="where the sweeps write their folders")
    parser.add_argument("--only", choices=sorted(PRESETS.values()))
    parser.add_argument("--reuse", action="store_true", help="load the newest sweep of each preset under --out instead of running it")
    parser.add_argument("--extend-edges", action="store_true", help="run the sweeps with --extend-edges")
    parser.add_argument("--edge-cap", type=int, default=None, help="with --extend-edges: extensions per axis and cell")
    parser.add_argument("--datasets", nargs="+", help="run only these datasets of the presets' grids")
    parser.add_argument("--periods", nargs="+", type=int, help="Table 1: run only these local periods p")
    args = parser.parse_args()
    only: dict[str, list[Any]] = {}
    if args.datasets:
        only["task.dataset"] = args.datasets
    if args.periods:
        only["algorithm.local_steps"] = args.periods
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sections: dict[str, list[str]] = {}
    for preset, part_keys, tabulate in (("auc-table1-offline", TABLE1_PART, table1_sections),
                                        ("auprc-table2-offline", TABLE2_PART, table2_sections)):
        if args.only and args.only != PRESETS[preset]:
            continue
        started, wall = time.time(), None
        if args.reuse:
            found = merged(Path(args.out), preset, part_keys)
            if found is None:
                print(f"{preset}: no finished `{preset}_*` sweep under {args.out}; its section stays as it was")
                continue
            result, folders = found
        else:
            spec = restrict(load_spec(preset), only) if only else preset
            result = fedcomp.sweep(spec, overrides={"run.out": args.out}, extend_edges=args.extend_edges, edge_cap=args.edge_cap)
            wall, folders = time.time() - started, [result.path]
        provenance = (f"{common.generated_by('Tabulated')}, from the sweep folders named below (run with the same preset)"
                      if args.reuse else common.generated_by())
        sections[preset] = section(preset, result, folders, wall, part_keys, tabulate, provenance)
        print(f"{preset}: {result.trials['trial'].nunique()} trials, {common.trials_seconds(result.trials):.0f} s of trials", flush=True)
    target = common.HERE / "AUC_TABLES.md"
    if only and not args.reuse:  # a part of a preset: its table is incomplete, so it is shown, not published
        print("--datasets / --periods: not writing AUC_TABLES.md (tabulate the parts with --reuse); printing instead")
        print("\n".join(line for lines in sections.values() for line in lines))
        return
    target.write_text(report(sections, target.read_text() if target.exists() else ""))
    print(f"wrote {target}")


HEADER = [
    "# Imbalanced classification offline: Table 1 (LocalSCGDAM) and Table 2 (FCSG, AUPRC)",
    "",
    "Each section is one preset's sweep (settings and grids in the presets' comments; every number comes from the "
    "runs its section names). Cells: the best configuration of the preset's grid, mean ± std over seeds of the final "
    "metric; † (and ↑edge / ↓edge) marks a best configuration on the edge of a tuned axis.",
    "",
]


def report(sections: Mapping[str, list[str]], old: str = "") -> str:
    """AUC_TABLES.md with these presets' sections; every other preset's section is kept from ``old`` (the report
    as it was), so ``--only table1`` re-tabulates Table 1 and leaves Table 2 as its own run wrote it."""
    kept = {preset: _old_section(old, preset) for preset in PRESETS}
    body = [line for preset in PRESETS for line in (sections.get(preset) or kept[preset])]
    return "\n".join([*HEADER, *body, *paper_tables(), ""])


def _old_section(old: str, preset: str) -> list[str]:
    """The lines of ``preset``'s section in the report ``old`` (from its heading to the next heading or the
    papers' numbers), or a line saying it has none."""
    lines = old.splitlines()
    heading = f"## `{preset}`"
    starts = [i for i, line in enumerate(lines) if line.startswith(heading)]
    if not starts:
        return [heading, "", f"Not tabulated yet: run `python benchmarks/auc_tables.py --only {PRESETS[preset]}`.", ""]
    end = next((i for i, line in enumerate(lines) if i > starts[0] and (line.startswith("## ") or line == PAPERS)), len(lines))
    return lines[starts[0]:end]


if __name__ == "__main__":
    main()
