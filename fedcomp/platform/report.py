"""``fedcomp report``: a PNG of each task's headline metric (or a chosen one) against communication rounds, one
line per run, and a markdown table of every run's final and best value."""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from fedcomp.platform import catalog, results
from fedcomp.platform.errors import StorageError, command
from fedcomp.platform.tracking import flat_config

MINIMISED = ("loss", "dist", "grad_norm", "violation", "gap", "objective")
"""Words in a metric's name that make lower better (when it is not its task's headline, whose direction the
task declares)."""


def metric_mode(task: str, metric: str) -> Literal["min", "max"]:
    """Whether ``metric`` of ``task`` is better lower or higher: the task's own direction for its headline
    metric, else ``min`` for losses, distances, gradient norms and violations and ``max`` otherwise."""
    declared = catalog.tasks().get(task)
    if declared is not None and metric == declared.metrics[0]:
        return declared.mode
    return "min" if any(word in metric for word in MINIMISED) else "max"


def headline(task: str) -> str:
    """The task's headline metric (the first it reports); ``train_loss``, which every run reports, for a task this
    process does not know (a user's, whose module :func:`import_tasks` could not import)."""
    declared = catalog.tasks().get(task)
    return declared.metrics[0] if declared is not None else "train_loss"


def import_tasks(path: str | Path) -> None:
    """Import the modules of the user's tasks that the runs at ``path`` ran (their configs' ``task.module``), so
    that their metrics are known by name; a module that cannot be imported (moved, broken) is passed over."""
    for run in results.run_dirs(path):
        try:
            task = results.read_json(run / results.RUN_JSON)["config"]["task"]
            if task["name"] not in catalog.tasks() and isinstance(task.get("module"), str):
                catalog.import_source(task["module"])
        except Exception:  # the report then shows train_loss for that run (headline)
            continue


def _metric_per_run(df: pd.DataFrame, metric: str | None) -> dict[str, str]:
    """Run id -> the metric shown for it: ``metric`` for every run, or by default its task's headline."""
    tasks = df.groupby("run_id", sort=True)["task"].first()
    return {run: metric or headline(task) for run, task in tasks.items()}


NOT_SETTINGS = ("task.name", "algorithm.name", "run.seed", "run.out", "run.name", "run.progress", "run.track",
                "task.module", "algorithm.module")
"""Config keys a report does not list as a run's settings: shown in columns of their own, or saying only where a run
wrote and how it spoke."""


def differing_settings(metas: Mapping[str, Mapping[str, Any]], run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Run id -> the settings (``section.key``, from its ``run.json``, ``metas``) that tell apart runs of one
    algorithm and task among the runs ``run_ids`` (``algorithm.lr``): those in which two such runs differ. A setting
    that differs only between algorithms or tasks is theirs, not shown; one a run lacks (another algorithm's) shows
    as ``-``."""
    configs = {run: flat_config(metas[run]["config"]) for run in run_ids}
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for config in configs.values():
        groups.setdefault((config.get("algorithm.name"), config.get("task.name")), []).append(config)
    keys = [k for k in dict.fromkeys(k for c in configs.values() for k in c) if k not in NOT_SETTINGS
            and any(len({repr(c.get(k)) for c in group}) > 1 for group in groups.values())]
    return {run: {k: config.get(k, "-") for k in keys} for run, config in configs.items()}


def summary_table(df: pd.DataFrame, metric: str | None = None, statuses: dict[str, str] | None = None,
                  settings: dict[str, dict[str, Any]] | None = None) -> str:
    """Markdown table: one row per run with the ``settings`` that tell it from the others
    (:func:`differing_settings`), its status (``run.json``'s: completed, diverged, interrupted by Ctrl-C or SIGTERM,
    failed on an error, running), its metric's final and best value (best in the metric's direction)."""
    shown = _metric_per_run(df, metric)
    keys = list(next(iter(settings.values()))) if settings else []
    lines = [
        "| run | algorithm | task | seed | " + "".join(f"{k} | " for k in keys)
        + "status | rounds | metric | final | best | wall time (s) |",
        "|---|---|---|---|" + "---|" * len(keys) + "---|---:|---|---:|---:|---:|",
    ]
    for run_id, g in df.groupby("run_id", sort=True):
        last, name = g.iloc[-1], shown[run_id]
        values = g[name] if name in g else pd.Series(dtype=float)
        best = values.min() if metric_mode(last["task"], name) == "min" else values.max()
        final = values.iloc[-1] if len(values) else float("nan")
        own = (settings or {}).get(run_id, {})
        lines.append(
            f"| {run_id} | {last['algorithm']} | {last['task']} | {last['seed']} | "
            + "".join(f"{own.get(k, '-')} | " for k in keys)
            + f"{(statuses or {}).get(run_id, '?')} | {int(last['round'])} | {name} | "
            f"{final:.4f} | {best:.4f} | {last['wall_time']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def report(path: str | Path, metric: str | None = None, x: str = "comm_rounds", out: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.md`` for the run(s) at ``path``; return their paths.

    ``metric`` None shows each run's task headline metric (one panel per metric when the runs' tasks differ). A run
    under a results root whose files cannot be read is left out with a warning, and listed below the table.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df, metas, unreadable = results.read_runs(path)
    for run, error in unreadable.items():
        print(f"fedcomp: warning: run {run} left out of the report: {error}", file=sys.stderr)
    sweeps = sorted(p for p in Path(path).iterdir() if (p / "sweep.json").is_file()) if Path(path).is_dir() else []
    if sweeps:
        print(f"fedcomp: {len(sweeps)} sweep folder{'s' if len(sweeps) > 1 else ''} under {path} not in this report, "
              f"each reported on its own: {command('report', sweeps[0])}", file=sys.stderr)
    import_tasks(path)
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]
    for column in (metric, x):
        if column is not None and column not in numeric:
            what = "holds text, not numbers" if column in df.columns else "is not in these results"
            raise ValueError(f"column {column!r} {what}; allowed: {', '.join(numeric)}")
    out_dir = report_folder(path, out)

    shown = _metric_per_run(df, metric)
    settings = differing_settings(metas, list(shown))
    panels = list(dict.fromkeys(shown.values()))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.2), squeeze=False)
    several = df["run_id"].nunique() > 1
    for ax, name in zip(axes.flat, panels):
        for run_id, g in df.groupby("run_id", sort=True):
            if shown[run_id] == name:
                told = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in settings.get(run_id, {}).items())
                label = " ".join(filter(None, (g["algorithm"].iloc[0], told, f"({run_id})"))) if several else g["algorithm"].iloc[0]
                ax.plot(g[x], g[name], label=label)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(name.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    title = " / ".join(panels)
    left_out = "".join(f"- {run}: {error}\n" for run, error in unreadable.items())
    return write_report(out_dir, fig, f"# Results under `{path}`\n\n![{title}](report.png)\n\n"
                        + summary_table(df, metric, {run: str(meta.get("status", "?")) for run, meta in metas.items()},
                                        settings)
                        + (f"\nRuns left out, their files unreadable:\n\n{left_out}" if left_out else ""))


def report_folder(path: str | Path, out: str | Path | None) -> Path:
    """Where a report goes (``out``, else the results folder at ``path``), checked before any plotting.

    Raises:
        StorageError: naming ``--out`` and what is in the way (a file, a read-only folder).
    """
    folder = Path(out) if out else Path(path)
    results.check_writable(folder, f"--out {str(folder)!r}" if out else None)
    return folder


def write_report(folder: Path, fig: Any, text: str) -> tuple[Path, Path]:
    """``report.png`` (``fig``, then closed) and ``report.md`` (``text``) written atomically into ``folder``, made
    if missing; returns their paths.

    Raises:
        StorageError: the folder cannot be made or the files cannot be written.
    """
    import matplotlib.pyplot as plt

    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StorageError(f"cannot create the folder {folder}: {results.describe_os_error(error)}") from None
    png, md = folder / "report.png", folder / "report.md"
    results.atomic_write(png, image.getvalue())
    results.atomic_write(md, text.encode())
    return png, md
