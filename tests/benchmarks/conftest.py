"""The scripts under ``benchmarks/`` import their shared module as a sibling (``import common``), as Python
sets it up when a script runs; the tests import them the same way, from this checkout's ``benchmarks/``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
