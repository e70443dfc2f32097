"""``fedcomp verify RUN_DIR``: re-run a finished run from the config in its ``run.json`` and check that
every metric column of the re-run is bit-identical to the original's ``metrics.parquet``.

Determinism is a tested property of fedcomp (every draw keyed by seed, client, round and step; float64
partial sums added in actor order), so a verified run is a reproduction certificate. The re-run may
use another backend or packing of clients into actors (``--backend``, ``--set federation.clients_per_actor=``);
only settings that must leave the numbers unchanged may be changed. It runs in a temporary folder
(removed afterwards) or under ``--out``, never in the original's folder. ``wall_time`` is a measurement,
not a result, and is not compared. The environments recorded in both ``run.json`` files (package
versions, git revision, host, CPU, devices) are compared too, so a difference can be traced.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedcomp.platform import results
from fedcomp.platform.config import folder_of, load_config, placed_on, placement_only
from fedcomp.platform.environment import differences, summary
from fedcomp.platform.errors import ConfigError, Interrupted, to_continue

NOT_COMPARED = ("wall_time",)
NOT_RECORDED = "environment not recorded in the original run"


@dataclass(frozen=True)
class ColumnDifference:
    """A metric column that is not bit-identical: how many rows differ and by how much at most."""

    column: str
    rows: int
    max_abs_diff: float


@dataclass
class Verification:
    """The outcome of :func:`verify`."""

    run_dir: Path
    rerun_dir: Path | None
    """Where the re-run was written (None when it was a temporary folder, now removed)."""
    compared: list[str]
    rows: int
    differences: list[ColumnDifference] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Shape mismatches: missing columns, a different number of rows."""
    environment: list[str] = field(default_factory=list)
    """Differences between the recorded environments (``key: original -> re-run``)."""
    backend: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    rerun_environment: dict[str, Any] = field(default_factory=dict)
    original_backend: dict[str, Any] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return not self.differences and not self.problems

    def __repr__(self) -> str:
        """One line: the verdict, over what, and where the rest is (:meth:`report`); not the environments."""
        verdict = "identical" if self.identical else f"DIFFERENT in {len(self.differences)} columns"
        return (f"Verification({verdict}: {len(self.compared)} metric columns over {self.rows} rows of "
                f"{self.run_dir.name}, re-run in {self.seconds:.1f} s; .report() says all)")

    def report(self) -> str:
        """The lines ``fedcomp verify`` prints."""
        where, before = backend_text(self.backend, self.original_backend), backend_text(self.original_backend, self.backend)
        lines = [f"verify {self.run_dir.name}: re-ran on {where} in {self.seconds:.1f} s"
                 + (f" (the original ran on {before})" if before != where else "")]
        if self.identical:
            lines.append(f"identical: all {len(self.compared)} metric columns bit-identical over {self.rows} rows "
                         f"({', '.join(self.compared)}); not compared: {', '.join(NOT_COMPARED)}")
        else:
            lines.append(f"DIFFERENT: {len(self.differences)} of {len(self.compared)} metric columns differ"
                         + (f"; {'; '.join(self.problems)}" if self.problems else ""))
            lines += [f"  {d.column}: {d.rows} of {self.rows} rows differ, max abs diff {d.max_abs_diff:.3g}"
                      for d in self.differences]
        if self.environment == [NOT_RECORDED]:
            lines.append("environment: not recorded in the original run (written before fedcomp recorded it)")
        elif self.environment:
            lines.append("environment differs from the original's:")
            lines += [f"  {line}" for line in self.environment]
        else:
            lines.append(f"environment: same as the original's: {summary(self.rerun_environment)}")
        if self.rerun_dir is not None:
            lines.append(f"re-run: {self.rerun_dir}")
        return "\n".join(lines)


def backend_text(backend: Mapping[str, Any], against: Mapping[str, Any] | None = None) -> str:
    """``local`` or ``ray (4 client actors, clients_per_actor=4)``, from run.json's ``backend``; with its server,
    transport and routing where they differ from those of the Ray backend ``against`` (``server actor``)."""
    name: str = backend.get("name", "?")
    if name == "ray":
        other = against if against is not None and against.get("name") == "ray" else None
        placed = [f"{backend.get('client_actors')} client actors", f"clients_per_actor={backend.get('clients_per_actor')}",
                  *(f"{key} {backend[key]}" for key in ("server", "transport", "routing")
                    if other is not None and backend.get(key) and backend.get(key) != other.get(key))]
        name += f" ({', '.join(placed)})"
    return name


def _column_difference(column: str, a: pd.Series, b: pd.Series) -> ColumnDifference | None:
    if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
        x, y = a.to_numpy(dtype=np.float64), b.to_numpy(dtype=np.float64)
        both_nan = np.isnan(x) & np.isnan(y)
        same = both_nan | ((x == y) & (np.signbit(x) == np.signbit(y)))
        if same.all():
            return None
        with np.errstate(invalid="ignore"):
            gap = np.where(np.isnan(x) | np.isnan(y), np.inf, np.abs(x - y))
        return ColumnDifference(column, int((~same).sum()), float(gap[~same].max()))
    same = (a.astype(str) == b.astype(str)).to_numpy()
    return None if same.all() else ColumnDifference(column, int((~same).sum()), float("nan"))


def compare(original: pd.DataFrame, rerun: pd.DataFrame) -> tuple[list[str], list[ColumnDifference], list[str]]:
    """Compare two metrics tables: (columns compared, columns that differ, shape problems)."""
    columns = [c for c in original.columns if c not in NOT_COMPARED]
    problems = []
    missing = [c for c in columns if c not in rerun.columns]
    extra = [c for c in rerun.columns if c not in original.columns and c not in NOT_COMPARED]
    if missing:
        problems.append(f"columns missing in the re-run: {', '.join(missing)}")
    if extra:
        problems.append(f"columns only in the re-run: {', '.join(extra)}")
    if len(original) != len(rerun):
        problems.append(f"{len(original)} rows in the original, {len(rerun)} in the re-run")
    n = min(len(original), len(rerun))
    found = []
    for column in columns:
        if column in rerun.columns:
            diff = _column_difference(column, original[column].iloc[:n].reset_index(drop=True),
                                      rerun[column].iloc[:n].reset_index(drop=True))
            if diff is not None:
                found.append(diff)
    return columns, found, problems


def read_run(run_dir: str | Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """A finished run's ``run.json`` and metrics; a folder that is not one fails with one line."""
    run_dir = Path(run_dir)
    meta_path, metrics_path = run_dir / results.RUN_JSON, run_dir / results.METRICS
    if not meta_path.is_file():
        raise ConfigError(f"verify {str(run_dir)!r}: no {results.RUN_JSON} there; not a fedcomp run folder")
    meta = results.read_json(meta_path)
    status = meta.get("status")
    if status != "completed":
        then = ("a diverged run stops there for good (run.on_divergence = continue runs on past it)"
                if status == "diverged" else f"finish it first with {to_continue('run', run_dir)}")
        raise ConfigError(f"verify {str(run_dir)!r}: the run's status is {status!r}, not 'completed'; {then}")
    if not metrics_path.is_file():
        raise ConfigError(f"verify {str(run_dir)!r}: no {results.METRICS} there")
    return meta, results.read_parquet(metrics_path)


def verify(
    run_dir: str | Path,
    backend: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    progress: str | None = None,
) -> Verification:
    """Re-run the finished run in ``run_dir`` and compare every metric bit for bit.

    Args:
        backend: ``local`` or ``ray`` (default: the run's own).
        overrides: ``{"federation.clients_per_actor": 2, ...}``; only the keys in
            :data:`~fedcomp.platform.config.PLACEMENT`.
        out: keep the re-run under this folder (default: a temporary folder, removed afterwards).
        progress: ``run.progress`` of the re-run (default: the run's own).

    Raises:
        ConfigError: not a finished run folder, or an override that could change the numbers.
    """
    run_dir = folder_of(run_dir, "run_dir")
    if out is not None:
        out = folder_of(out, "out")
    meta, original = read_run(run_dir)
    changes = placement_only(overrides, "verify --set")
    if backend is not None:
        changes["federation.backend"] = backend
    placed_on(changes, changes.get("federation.backend", meta["config"]["federation"].get("backend")), "verify --set")
    if out is not None and run_dir.resolve() in (out.resolve(), *out.resolve().parents):
        raise ConfigError(f"verify --out {str(out)!r}: lies in the run folder it verifies ({str(run_dir)!r}); a re-run "
                          f"goes beside a run, never into it (it would then hold another run)")
    target = out if out is not None else Path(tempfile.mkdtemp(prefix="fedcomp-verify-"))
    from fedcomp.api import make_server
    from fedcomp.platform.runner import execute

    started = time.perf_counter()
    try:
        config = load_config(meta["config"], {**changes, "run.out": str(target), "run.track": "none",
                                              **({} if progress is None else {"run.progress": progress})})
        try:
            result = execute(config, make_server, resumable=out is not None)
        except Interrupted:
            if out is not None:
                raise  # the re-run's folder under --out is kept: its message says how to continue it
            raise Interrupted("the re-run ran in a temporary folder, removed; nothing to continue: verify again") from None
        rerun_meta, rerun = read_run(result.run_dir)
    finally:
        if out is None:
            shutil.rmtree(target, ignore_errors=True)
    compared, found, problems = compare(original, rerun)
    return Verification(
        run_dir=run_dir,
        rerun_dir=result.run_dir if out is not None else None,
        compared=compared,
        rows=len(original),
        differences=found,
        problems=problems,
        environment=differences(meta.get("environment"), rerun_meta.get("environment")),
        backend=rerun_meta.get("backend", {}),
        seconds=time.perf_counter() - started,
        rerun_environment=rerun_meta.get("environment", {}),
        original_backend=meta.get("backend", {}),
    )
