"""A whole copy of Tune's experiment state in the sweep folder, so that a sweep killed at any instant resumes.

Tune writes its experiment state (``experiment_state-*.json``, the search algorithm's and the callbacks'
state) into a staging folder on the driver and copies it into the sweep folder in the background, file by
file and not atomically: a kill during the copy leaves a cut-off ``experiment_state-*.json``, and
``Tuner.restore`` then loses every trial it recorded. :class:`StateCopy` takes the staging files after each
controller step that wrote them -- the step has finished writing by then -- and stores them together in one
atomically written file; :func:`repair` puts that copy back before every resume.

Checkpoints are pruned here too, not by Tune (``CheckpointConfig.num_to_keep``): Tune deletes a trial's old
checkpoint the moment it registers a new one, before it saves the experiment state that names the new one,
so a sweep killed in between resumed that trial from a folder that no longer existed, and the trial failed.
:class:`StateCopy` deletes a trial's checkpoints only once the copy it has just written names a newer one.
"""

from __future__ import annotations

import json
import pickle
import posixpath
import re
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from pyarrow import fs
from ray.tune import Callback

from fedcomp.platform import results
from fedcomp.platform.errors import StorageError

COPY = "tune_state.pkl"
STATE_GLOB = "experiment_state-*.json"
TUNE_FILES = (STATE_GLOB, "basic-variant-state-*.json", "searcher-state-*.pkl", "search_gen_state-*.json",
              "callback-states-*.pkl", "tuner.pkl")
"""Tune's own state files (its controller's, search algorithm's, callbacks' and tuner's). A resumed sweep's
staging folder also holds the sweep folder's other files (``sweep.json``, ``extend.json``, this copy): those
are fedcomp's, written atomically where they are, and never copied back."""
CHECKPOINT_FOLDER = re.compile(r"checkpoint_(\d+)")
"""How Tune names a trial's checkpoint folders, numbered in the order they were taken."""


class StateCopy(Callback):
    """After every controller step that saved Tune's experiment state, and after its final save, copy Tune's
    state files (:data:`TUNE_FILES`) from the staging folder into ``COPY`` in the sweep folder, in one atomic
    write; then delete every trial's checkpoints older than its latest. As each checkpoint arrives, drop the older
    ones from Tune's own list of the trial's checkpoints, which every snapshot saves.

    The trials' latest checkpoints at that moment are the ones the copy names: the controller registers a
    trial's checkpoint, saves its state and only then ends the step, one event per step."""

    def __init__(self) -> None:
        self._copied: int | None = None
        self._pruned: dict[str, str] = {}  # trial id -> the checkpoint it was last pruned down to

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self._snapshot(trials)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self._snapshot(trials)

    def _snapshot(self, trials: list[Any]) -> None:
        if self._copy(trials):
            self._prune(trials)

    def _copy(self, trials: list[Any]) -> bool:
        """Copy the staging files if Tune saved them since the last copy; whether it did."""
        if not trials:
            return False
        storage = trials[0].storage
        staging = Path(storage.experiment_driver_staging_path)
        states = sorted(staging.glob(STATE_GLOB))
        if not states:
            return False
        stamp = states[-1].stat().st_mtime_ns
        if stamp == self._copied:
            return False
        files = {p.name: p.read_bytes() for p in staging.iterdir()
                 if p.is_file() and any(fnmatch(p.name, pattern) for pattern in TUNE_FILES)}
        results.atomic_write(Path(storage.experiment_fs_path) / COPY, pickle.dumps(files))
        self._copied = stamp
        return True

    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any) -> None:
        _forget_older(trial)  # called just before Tune registers ``checkpoint``: its list then holds two

    def _prune(self, trials: list[Any]) -> None:
        """Delete each trial's checkpoints older than its latest (which the copy just written names)."""
        for trial in trials:
            checkpoint = trial.checkpoint
            if checkpoint is not None and self._pruned.get(trial.trial_id) != checkpoint.path:
                _delete_older(checkpoint.filesystem, checkpoint.path)
                self._pruned[trial.trial_id] = checkpoint.path


def _forget_older(trial: Any) -> None:
    """Keep only the latest checkpoint in Tune's list of the trial's checkpoints (what is on disk besides it goes at
    the next prune). Tune keeps every checkpoint it was not told to delete (no ``num_to_keep``) and saves the list
    with the experiment state at every snapshot, about 2 KB each: 390 KB for two trials that checkpointed 100 times.
    The list is private to Tune's checkpoint manager; where a Ray version lacks it, nothing is dropped
    (``tests/sweeps/test_tune_state.py`` notices)."""
    metadata = trial.run_metadata
    manager = metadata.checkpoint_manager
    kept = getattr(manager, "_checkpoint_results", None)
    latest = None if manager is None else manager.latest_checkpoint_result
    if isinstance(kept, list) and len(kept) > 1 and latest is not None:
        manager._checkpoint_results = [latest]
        metadata.invalidate_cache()


def _delete_older(filesystem: fs.FileSystem, latest: str) -> None:
    """Delete the checkpoint folders beside ``latest`` that were taken before it. Pruning is housekeeping: a
    folder that cannot be deleted stays, and the sweep goes on."""
    folder, name = posixpath.split(latest)
    number = CHECKPOINT_FOLDER.fullmatch(name)
    if number is None:
        return
    for info in filesystem.get_file_info(fs.FileSelector(folder)):
        older = CHECKPOINT_FOLDER.fullmatch(info.base_name)
        if info.type == fs.FileType.Directory and older and int(older[1]) < int(number[1]):
            try:
                filesystem.delete_dir(info.path)
            except OSError:
                pass


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
    """Put the whole copy of Tune's state back into the sweep folder ``path``; return the names of the files
    it holds that were missing or could not be read there (a background copy cut short by a kill).

    Raises:
        StorageError: without a copy, one of Tune's own state files there cannot be read (nothing is changed).

    The copy goes back even when Tune's files are whole: Tune's may lag behind it, and name checkpoints that
    were pruned once the copy named newer ones; the copy never does."""
    copy = path / COPY
    if not copy.is_file():
        damaged = sorted(p.name for pattern in TUNE_FILES for p in path.glob(pattern) if not _readable(p))
        if damaged:  # Tune would restore what it could read of it -- a trial with an empty config -- and go on
            raise StorageError(f"{path / damaged[0]} cannot be read (cut short or damaged), and {path} holds no copy "
                               f"of Tune's state ({COPY}) to resume from; nothing was changed: start the sweep again")
        return []
    files = _read_copy(copy)
    broken = sorted(name for name in files if not _readable(path / name))
    for name, data in files.items():
        results.atomic_write(path / name, data)
    return broken


def _read_copy(copy: Path) -> dict[str, bytes]:
    """The state files held in fedcomp's copy.

    Raises:
        StorageError: the copy is not one (a damaged or foreign file); nothing has been changed.
    """
    try:
        files = pickle.loads(copy.read_bytes())
    except Exception as error:
        files, reason = None, f"{type(error).__name__}: {error}"
    else:
        reason = "not a copy of Tune's state files"
    if not (isinstance(files, dict) and files and all(isinstance(k, str) and isinstance(v, bytes) for k, v in files.items())):
        raise StorageError(f"{copy} cannot be read ({reason}); it is fedcomp's copy of Tune's state: delete it to resume "
                           "from Tune's own state files")
    return files
