"""A whole copy of Tune's experiment state in the sweep folder, so that a sweep killed at any instant resumes.

Tune writes its experiment state (``experiment_state-*.json``, the search algorithm's and the callbacks'
state) into a staging folder on the driver and copies it into the sweep folder in the background, file by
file and not atomically: a kill during the copy leaves a cut-off ``experiment_state-*.json``, and
``Tuner.restore`` then loses every trial it recorded. :class:`StateCopy` takes the staging files after each
controller step that wrote them -- the step has finished writing by then -- and stores them together in one
atomically written file; :func:`repair` puts that copy back before a resume when any of Tune's files in the
sweep folder cannot be read.
"""

from __future__ import annotations

import json
import pickle
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from ray.tune import Callback

from fedcomp.platform import results

COPY = "tune_state.pkl"
STATE_GLOB = "experiment_state-*.json"
TUNE_FILES = (STATE_GLOB, "basic-variant-state-*.json", "searcher-state-*.pkl", "search_gen_state-*.json",
              "callback-states-*.pkl", "tuner.pkl")
"""Tune's own state files (its controller's, search algorithm's, callbacks' and tuner's). A resumed sweep's
staging folder also holds the sweep folder's other files (``sweep.json``, ``extend.json``, this copy): those
are fedcomp's, written atomically where they are, and never copied back."""


class StateCopy(Callback):
    """After every controller step that saved Tune's experiment state, and after its final save, copy Tune's
    state files (:data:`TUNE_FILES`) from the staging folder into ``COPY`` in the sweep folder, in one atomic
    write."""

    def __init__(self) -> None:
        self._copied: int | None = None

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self._copy(trials)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self._copy(trials)

    def _copy(self, trials: list[Any]) -> None:
        if not trials:
            return
        storage = trials[0].storage
        staging = Path(storage.experiment_driver_staging_path)
        states = sorted(staging.glob(STATE_GLOB))
        if not states:
            return
        stamp = states[-1].stat().st_mtime_ns
        if stamp == self._copied:
            return
        files = {p.name: p.read_bytes() for p in staging.iterdir()
                 if p.is_file() and any(fnmatch(p.name, pattern) for pattern in TUNE_FILES)}
        results.atomic_write(Path(storage.experiment_fs_path) / COPY, pickle.dumps(files))
        self._copied = stamp


def _readable(path: Path) -> bool:
    """Whether a state file is whole: JSON that parses or a pickle that loads, whatever its name says (Tune's
    ``basic-variant-state-*.json`` is a pickle)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    for load in (json.loads, pickle.loads):
        try:
            load(data)
        except Exception:
            continue
        return True
    return False


def repair(path: Path) -> list[str]:
    """Put the whole copy of Tune's state back into the sweep folder ``path`` when any of the files it holds
    is missing or cannot be read there (a copy cut short by a kill); return those files' names (none: nothing
    was changed)."""
    copy = path / COPY
    if not copy.is_file():
        return []
    files: dict[str, bytes] = pickle.loads(copy.read_bytes())
    broken = sorted(name for name in files if not _readable(path / name))
    if broken:
        for name, data in files.items():
            results.atomic_write(path / name, data)
    return broken
