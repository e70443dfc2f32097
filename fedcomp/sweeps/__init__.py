"""Sweeps: Ray Tune (grid search, or Optuna's TPE) over whole federated runs.

A trial is one federated run in its own placement group (:mod:`fedcomp.sweeps.trial`); a sweep's spec
(:mod:`fedcomp.sweeps.spec`) names the base experiment, the axes and the repeats; :mod:`fedcomp.sweeps.tuner`
launches, resumes and collects it into ``trials.parquet``; :mod:`fedcomp.sweeps.report` picks the best
configuration per algorithm and draws the papers' curves, marking a best configuration on the edge of a tuned
numeric axis (:mod:`fedcomp.sweeps.edges`); ``--extend-edges [--edge-cap N]`` (``sweep(..., extend_edges=True,
edge_cap=N)``) then runs the next grid value past each such edge until the optimum is interior, the cap or the
bound (:mod:`fedcomp.sweeps.extend`; grid search only), in the same folder and ``trials.parquet``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedcomp.sweeps.spec import SweepSpec, load_spec
    from fedcomp.sweeps.tuner import SweepResult, load_sweep, resume_sweep, sweep

_HOME = {"SweepSpec": "fedcomp.sweeps.spec", "load_spec": "fedcomp.sweeps.spec", "SweepResult": "fedcomp.sweeps.tuner",
         "load_sweep": "fedcomp.sweeps.tuner", "resume_sweep": "fedcomp.sweeps.tuner", "sweep": "fedcomp.sweeps.tuner"}
"""Where each public name lives, imported on first use: reading a spec (``fedcomp list``) imports neither Ray nor
torch."""


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'fedcomp.sweeps' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


__all__ = ["SweepResult", "SweepSpec", "load_spec", "load_sweep", "resume_sweep", "sweep"]
