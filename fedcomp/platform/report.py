"""``fedcomp report``: a PNG of a metric against communication rounds (one line per run) and a markdown table."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedcomp.platform.results import load_results


def summary_table(df: pd.DataFrame, metric: str) -> str:
    """Markdown table: one row per run with its final and best value of ``metric``."""
    lines = [
        f"| run | algorithm | task | seed | rounds | final {metric} | best {metric} | wall time (s) |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for run_id, g in df.groupby("run_id", sort=True):
        last = g.iloc[-1]
        lines.append(
            f"| {run_id} | {last['algorithm']} | {last['task']} | {last['seed']} | {int(last['round'])} | "
            f"{last[metric]:.4f} | {g[metric].max():.4f} | {last['wall_time']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def report(path: str | Path, metric: str = "test_accuracy", x: str = "comm_rounds", out: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.md`` for the run(s) at ``path``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = load_results(path)
    for column in (metric, x):
        if column not in df.columns:
            allowed = ", ".join(c for c in df.columns if c not in ("run_id", "algorithm", "task"))
            raise ValueError(f"column {column!r} is not in these results; allowed: {allowed}")
    out_dir = Path(out) if out else Path(path)
    out_dir.mkdir(parents=True, exist_ok=True)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for run_id, g in df.groupby("run_id", sort=True):
        ax.plot(g[x], g[metric], label=f"{g['algorithm'].iloc[0]} ({run_id})" if df["run_id"].nunique() > 1 else g["algorithm"].iloc[0])
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    png, md = out_dir / "report.png", out_dir / "report.md"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    md.write_text(f"# Results under `{path}`\n\n![{metric}](report.png)\n\n" + summary_table(df, metric))
    return png, md
