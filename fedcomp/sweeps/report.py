"""``fedcomp report SWEEP_DIR``: the best configuration per algorithm (mean ± std over seeds of the final
metric), a markdown table of every configuration, and a plot in the papers' style (metric against
communication rounds, one line per algorithm at its best configuration, a band of ± one std over seeds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from fedcomp.platform import results
from fedcomp.platform.report import report_folder, write_report
from fedcomp.sweeps.edges import (
    EXTEND_JSON,
    Edge,
    _plain,
    edge_column,
    edges_of,
    find_edges,
    matches,
    missing as _missing,
)
from fedcomp.sweeps.spec import SweepSpec


def _varying(trials: pd.DataFrame, spec: SweepSpec) -> list[str]:
    """Configuration columns that tell configurations apart: the sweep's axes except the seed, and the
    algorithm's name."""
    axes = [a for a in spec.axes() if a != "run.seed" and a in trials]
    return list(dict.fromkeys(["algorithm.name", *axes]))


def final_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """Each trial's last evaluation row; trials stopped early (ASHA) -- whose last round is short of their own
    ``run.rounds`` -- are left out when others ran on. A diverged trial (``status``) keeps its row with every metric
    nan: it ends no better than any configuration that ran to the end."""
    last = _last_rows(trials)
    diverged = last["status"] == "diverged" if "status" in last else pd.Series(False, index=last.index)
    if diverged.any():
        metrics = [c for c in last.columns if "." not in c and c not in ("trial", "status", "round")]
        last = last.copy()
        last.loc[diverged, metrics] = float("nan")
    full = last[~_short(last) | diverged]
    return full if not full.empty else last[last["round"] == last["round"].max()]


def _last_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """Each trial's last evaluation row."""
    return trials.sort_values("round").groupby("trial", sort=True).tail(1)


def _short(last: pd.DataFrame) -> pd.Series:
    """Which of the trials' last rows (:func:`_last_rows`) end short of the trial's own ``run.rounds`` (of the longest
    trial's last round, where ``run.rounds`` is not a column): a trial stopped early, or diverged."""
    planned = last["run.rounds"] if "run.rounds" in last else pd.Series(last["round"].max(), index=last.index)
    return last["round"] < planned


def outcome_counts(trials: pd.DataFrame, spec: SweepSpec) -> str:
    """``12 trials, 1 failed, 2 diverged (...), 3 stopped early by ASHA (...)``: the sweep's configurations by how
    they ended; for a packed grid also the Tune trials that ran them (a packed trial's configurations are
    ``<trial>-<k>``)."""
    runs = trials["trial"].nunique()
    failed = trials.loc[trials["status"] == "error", "trial"].nunique()
    diverged = trials.loc[trials["status"] == "diverged", "trial"].nunique()
    stopped = trials.loc[trials["status"] == "stopped", "trial"].nunique()
    if spec.scheduler == "asha" and "round" in trials:  # a sweep's trials.parquet from before 'stopped' was a status
        last = _last_rows(trials)
        stopped += int(((last["status"] == "completed") & _short(last)).sum())
    if spec.pack != "none" and spec.search == "grid":
        packs = trials["trial"].str.rsplit("-", n=1).str[0].nunique()
        counted = f"{runs} configurations in {packs} packed trial{'s' * (packs != 1)}"
    else:
        counted = f"{runs} trial{'s' * (runs != 1)}"
    return (f"{counted}, {failed} failed"
            + (f", {diverged} diverged (their rounds before it kept; final metrics nan)" if diverged else "")
            + (f", {stopped} stopped early by ASHA (their rounds kept; not in the tables of final values)"
               if stopped else ""))


def configurations(trials: pd.DataFrame, spec: SweepSpec, metric: str | None = None) -> pd.DataFrame:
    """Every configuration with the mean, std and count over seeds of its final ``metric``."""
    metric = metric or spec.resolved_metric()[0]
    if metric not in trials:
        allowed = ", ".join(c for c in trials.columns if "." not in c and c not in ("trial", "status"))
        raise ValueError(f"metric {metric!r} is not in this sweep's trials; allowed: {allowed}")
    keys = _varying(trials, spec)
    finals = final_rows(trials)
    table = (  # a seed whose final metric is nan (a diverged run) makes its configuration's mean nan
        finals.groupby(keys, dropna=False, sort=False)[metric]
        .agg(mean=lambda v: v.mean(skipna=False), std="std", seeds="size")
        .reset_index()
    )
    table["std"] = table["std"].fillna(0.0)
    return table


def best_and_edges(
    trials: pd.DataFrame, spec: SweepSpec, metric: str | None = None, by: list[str] | None = None
) -> tuple[pd.DataFrame, list[Edge]]:
    """:func:`best_configurations` and its edge optima (:mod:`fedcomp.sweeps.edges`)."""
    _, mode = spec.resolved_metric()
    by = by or [*spec.panels, "algorithm.name"]
    table = configurations(trials, spec, metric)
    ordered = table.sort_values("mean", ascending=(mode == "min"), kind="stable")
    best = ordered.groupby(by, sort=True, dropna=False).head(1)
    best = best.sort_values(by, kind="stable").reset_index(drop=True)
    edges = find_edges(table, best, spec, by)
    best["edge"] = edge_column(best, edges, by)
    return best, edges


def best_configurations(
    trials: pd.DataFrame, spec: SweepSpec, metric: str | None = None, by: list[str] | None = None
) -> pd.DataFrame:
    """Per value combination of ``by`` (default: the panels and the algorithm), the configuration with the best
    mean final metric (the spec's mode); its ``edge`` column names the tuned axes whose smallest (``↓``) or
    largest (``↑``) value tried it sits at, e.g. ``algorithm.lr ↑`` (empty if none)."""
    return best_and_edges(trials, spec, metric, by)[0]


def edge_warnings(edges: list[Edge]) -> list[str]:
    """One line per edge optimum (what the sweep prints and report.md opens with)."""
    return [edge.warning() for edge in edges]


def extension_summary(path: str | Path) -> list[str]:
    """The ``--extend-edges`` lines of a sweep folder (:mod:`fedcomp.sweeps.extend`): each extended axis, how far,
    and each edge that remains and why; empty for a sweep that did not extend."""
    meta = Path(path) / EXTEND_JSON
    return [str(line) for line in results.read_json(meta).get("summary", [])] if meta.is_file() else []


def paper_table(trials: pd.DataFrame, spec: SweepSpec, metric: str | None = None) -> str:
    """The sweep in the layout of ``spec.table`` as markdown: per cell, the configuration of the remaining axes
    with the best mean final ``metric``, shown as mean ± std over seeds; then one table per extra metric at the
    same configurations (e.g. Table 1's per-device variance)."""
    assert spec.table is not None
    metric = metric or spec.resolved_metric()[0]
    _, mode = spec.resolved_metric()
    rows, column = spec.table.rows, spec.table.columns
    keys = _varying(trials, spec)
    finals = final_rows(trials)
    shown = [metric, *(m for m in spec.table.metrics if m != metric)]
    missing = [m for m in shown if m not in finals]
    if missing:
        raise ValueError(f"table metric {missing[0]!r} is not in this sweep's trials")
    per_config = finals.groupby(keys, dropna=False, sort=False)[shown].agg(
        [("mean", lambda v: v.mean(skipna=False)), "std", "size"]).reset_index()
    per_config = per_config.sort_values((metric, "mean"), ascending=(mode == "min"), kind="stable")
    chosen = per_config.groupby([(k, "") for k in [*rows, column]], sort=False, dropna=False).head(1)
    _, edges = best_and_edges(trials, spec, metric, by=[*rows, column])
    marked: list[Edge] = []
    columns = list(dict.fromkeys(v for v in trials[column] if not _missing(v)))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in map(_plain, columns)):
        columns.sort(key=_plain)  # numeric columns (p = 4, 8, 16) in order, whatever order the trials ran in
    label = column.split(".", 1)[1]
    blocks = []
    for name in shown:
        header = "| " + " | ".join(r.split(".", 1)[1] for r in rows) + " | " + " | ".join(f"{label} = {v}" for v in columns) + " |"
        lines = [f"Final {name}, mean ± std over seeds" + (" (at the configurations chosen by " + metric + ")" if name != metric else ""),
                 "", header, "|" + "---|" * len(rows) + "---:|" * len(columns)]
        order = {r: {v: i for i, v in enumerate(dict.fromkeys(trials[r]))} for r in rows}  # the sweep's own order
        ranked = chosen.assign(_order=[tuple(order[r].get(row[(r, "")], 0) for r in rows) for _, row in chosen.iterrows()])
        for key, group in ranked.sort_values("_order", kind="stable").groupby([(r, "") for r in rows], sort=False, dropna=False):
            key = key if isinstance(key, tuple) else (key,)
            cells = []
            for value in columns:
                cell = group[group[(column, "")].astype(str) == str(value)]
                if cell.empty:
                    cells.append("–")
                    continue
                row = cell.iloc[0]
                mean, std = row[(name, "mean")], row[(name, "std")]
                if mean != mean:  # every configuration of the cell has a seed whose metric is nan
                    cells.append("diverged")
                    continue
                at_edge = edges_of(edges, pd.Series({k: row[(k, "")] for k in [*rows, column]}), [*rows, column])
                if name == metric:
                    marked += at_edge
                cells.append(f"{mean:.4f} ± {0.0 if std != std else std:.4f}" + (" †" if at_edge else ""))
            lines.append("| " + " | ".join(str(k) for k in key) + " | " + " | ".join(cells) + " |")
        if marked:
            lines += ["", "† the cell's best configuration lies on the edge of a tuned axis" + (
                ":" if name == metric else " (listed under the first table)")]
            lines += [f"- {edge.warning()}" for edge in marked] if name == metric else []
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _describe(row: pd.Series, keys: list[str], skip: tuple[str, ...] = (), edges: list[Edge] | None = None) -> str:
    """``lr=0.1, beta=0.9``; a value at an edge of its axis gets the edge's marker (``lr=0.1 ↑edge``)."""
    shown = [k for k in keys if k != "algorithm.name" and k not in skip and not _missing(row[k])]
    marker = {e.axis: f" {e.marker}" for e in edges or []}
    return ", ".join(f"{k.split('.', 1)[1]}={row[k]}{marker.get(k, '')}" for k in shown) or "(base)"


def markdown(trials: pd.DataFrame, spec: SweepSpec, metric: str | None = None, warnings: bool = True) -> str:
    """The report's tables (with ``warnings``: opened by one ``- edge: ...`` line per edge optimum of the best
    configurations)."""
    metric = metric or spec.resolved_metric()[0]
    _, mode = spec.resolved_metric()
    keys = _varying(trials, spec)
    by = [*spec.panels, "algorithm.name"]
    best, edges = best_and_edges(trials, spec, metric, by)
    every = configurations(trials, spec, metric).sort_values(["algorithm.name", "mean"], ascending=[True, mode == "min"])
    lines = [
        *([*(f"- {line}" for line in edge_warnings(edges)), ""] if edges and warnings else []),
        f"Final {metric} ({'higher' if mode == 'max' else 'lower'} is better), mean ± std over seeds.",
        "",
        *(["### In the paper's layout", "", paper_table(trials, spec, metric)] if spec.table else []),
        "### Best configuration per algorithm" + (f" and {', '.join(spec.panels)}" if spec.panels else ""),
        "",
        "| " + "".join(f"{p} | " for p in spec.panels) + f"algorithm | configuration | final {metric} | seeds |",
        "|" + "---|" * len(spec.panels) + "---|---|---:|---:|",
    ]
    for _, row in best.iterrows():
        panel = "".join(f"{row[p]} | " for p in spec.panels)
        lines.append(
            f"| {panel}{row['algorithm.name']} | {_describe(row, keys, tuple(spec.panels), edges_of(edges, row, by))} | "
            f"{_mean_std(row)} | {row['seeds']} |"
        )
    lines += ["", "### Every configuration", "", f"| algorithm | configuration | final {metric} | seeds |", "|---|---|---:|---:|"]
    for _, row in every.iterrows():
        lines.append(f"| {row['algorithm.name']} | {_describe(row, keys)} | {_mean_std(row)} | {row['seeds']} |")
    return "\n".join(lines) + "\n"


def _mean_std(row: pd.Series) -> str:
    """``mean ± std``, or ``diverged`` where a seed's final metric is nan (a diverged run's)."""
    return "diverged" if row["mean"] != row["mean"] else f"{row['mean']:.4f} ± {row['std']:.4f}"


def best_curve(trials: pd.DataFrame, keys: list[str], row: pd.Series, x: str, metric: str) -> pd.DataFrame:
    """The mean and std over seeds of ``metric`` against ``x`` for the configuration ``row`` (its values of
    ``keys``; a missing value, e.g. FCSG's beta, matches the trials where the axis is missing)."""
    mask = pd.Series(True, index=trials.index)
    for k in keys:
        mask &= matches(trials[k], row[k])
    return trials[mask].groupby(x)[metric].agg(["mean", "std"]).fillna(0.0)


def sweep_report(result: Any, metric: str | None = None, x: str = "comm_rounds", out: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.md`` for a loaded sweep (a :class:`~fedcomp.sweeps.tuner.SweepResult`:
    ``path``, ``spec``, ``trials``) into its folder or ``out``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials, spec, path = result.trials, result.spec, result.path
    out_dir = report_folder(path, out)
    metric = metric or spec.resolved_metric()[0]
    if x not in trials:
        raise ValueError(f"column {x!r} is not in this sweep's trials; allowed: comm_rounds, round, local_steps, samples, wall_time")
    text = markdown(trials, spec, metric, warnings=False)
    keys = _varying(trials, spec)
    best, edges = best_and_edges(trials, spec, metric)

    panels = list(best.groupby(spec.panels, sort=True, dropna=False)) if spec.panels else [((), best)]
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, (panel, chosen) in zip(axes.flat, panels):
        for _, row in chosen.iterrows():
            curve = best_curve(trials, keys, row, x, metric)
            ax.plot(curve.index, curve["mean"], label=f"{row['algorithm.name']} ({_describe(row, keys, tuple(spec.panels))})")
            ax.fill_between(curve.index, curve["mean"] - curve["std"], curve["mean"] + curve["std"], alpha=0.2)
        if spec.panels:
            values = panel if isinstance(panel, tuple) else (panel,)
            ax.set_title(", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in zip(spec.panels, values)), fontsize=9)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(metric.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    warned = "".join(f"- {line}\n" for line in edge_warnings(edges)) + ("\n" if edges else "")
    extended = extension_summary(path)
    if extended:
        warned += "## Edge extension (--extend-edges)\n\n" + "".join(f"- {line}\n" for line in extended) + "\n"
    return write_report(out_dir, fig, f"# Sweep `{Path(path).name}`\n\n{warned}![{metric}](report.png)\n\n{text}")
