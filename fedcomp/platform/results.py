"""Run results on disk: ``<out>/<run-id>/metrics.parquet`` + ``run.json`` (+ ``checkpoint.pt``), written
atomically (temporary file in the same folder, then ``os.replace``), and read back as pandas."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import torch

METRICS = "metrics.parquet"
RUN_JSON = "run.json"
CHECKPOINT = "checkpoint.pt"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_metrics(path: Path, rows: list[dict[str, Any]]) -> None:
    buf = io.BytesIO()
    pd.DataFrame(rows).to_parquet(buf, index=False)
    atomic_write(path, buf.getvalue())


def write_checkpoint(path: Path, checkpoint: dict[str, Any]) -> None:
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    atomic_write(path, buf.getvalue())


def read_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=False)


def run_dirs(path: str | Path) -> list[Path]:
    """The run folders at ``path``: the folder itself if it is a run, else the runs directly under it."""
    path = Path(path)
    if (path / RUN_JSON).is_file():
        return [path]
    return sorted(p for p in path.iterdir() if (p / RUN_JSON).is_file()) if path.is_dir() else []


def load_results(path: str | Path) -> pd.DataFrame:
    """Every evaluation row of the run(s) at ``path`` as one DataFrame.

    ``path`` is a run folder or a results root holding run folders. Columns: ``run_id``, ``algorithm``,
    ``task``, ``seed``, then the metrics columns (``round``, ``comm_rounds``, ..., the task's metrics).
    """
    frames = []
    for run in run_dirs(path):
        meta = json.loads((run / RUN_JSON).read_text())
        if not (run / METRICS).is_file():
            continue
        df = pd.read_parquet(run / METRICS)
        df.insert(0, "seed", meta["config"]["run"]["seed"])
        df.insert(0, "task", meta["config"]["task"]["name"])
        df.insert(0, "algorithm", meta["config"]["algorithm"]["name"])
        df.insert(0, "run_id", run.name)
        frames.append(df)
    if not frames:
        raise FileNotFoundError(f"no fedcomp run results under {str(path)!r}")
    return pd.concat(frames, ignore_index=True)
