"""The linter and the type checker find nothing: ``ruff check`` over the repository and ``mypy`` over the
package, with the rules and options in pyproject.toml. Being tests, they run wherever the suite runs
(``make test``, CI); ``make check`` keeps the fast ruff test and leaves out the slow mypy one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` from the repository root with this interpreter (so its installed packages)."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=540)


def test_ruff_finds_nothing() -> None:
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, f"ruff check found problems:\n{result.stdout}{result.stderr}"


@pytest.mark.slow
def test_mypy_finds_nothing(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # mypy's incremental cache lives in pytest's cache folder (tmp_path without one), not in the tree: 35-60 s
    # cold on a busy 2-core machine, 3-4 s once warm.
    store = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache = store.mkdir("mypy") if store is not None else tmp_path / "mypy"
    result = _run("mypy", "--cache-dir", str(cache))
    assert result.returncode == 0, f"mypy found problems:\n{result.stdout}{result.stderr}"
