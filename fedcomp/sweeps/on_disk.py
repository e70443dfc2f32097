"""A trial's checkpoints on disk that Tune does not know of: what a killed sweep's trials wrote after Tune's last
save of its experiment state (Tune saves it at most every ``TUNE_GLOBAL_CHECKPOINT_S``, 10 s by default).

Resumed, Tune hands a trial the checkpoint its saved state names (``tune.get_checkpoint()``), or none; a trial that
had checkpointed since, or finished, would run those rounds again. So a trial first looks for a checkpoint further
on: in its own folder, and in the sweep's other trial folders one written by a trial of the same Tune config -- Tune
creates the trials it had not saved again on resume, in new folders (a grid's with the same trial id, an Optuna
search's with a new one), and leaves the old folders where they are. Every checkpoint folder holds its trial's Tune
config (:data:`TRIAL_JSON`) for that; a folder whose files do not all read back (cut short by the kill) is passed
over. The runs are deterministic, so a checkpoint of the same config at a later round is the one the trial would
have written.

What this relies on of Tune beyond its public API: the trial's storage folder (``StorageContext.trial_fs_path``, a
local path: fedcomp's sweeps store on a local or shared file system) with the other trials' folders beside it, its
checkpoint folders named ``checkpoint_<n>`` (:data:`fedcomp.sweeps.tune_state.CHECKPOINT_FOLDER`), and the storage's
``current_checkpoint_index``, the number of the folder the next reported checkpoint goes to, less one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from ray import tune

from fedcomp.platform import results
from fedcomp.platform.errors import StorageError
from fedcomp.sweeps.tune_state import CHECKPOINT_FOLDER

if TYPE_CHECKING:
    from fedcomp.sweeps.failures import Reports

T = TypeVar("T")

PLACEMENT_JSON = "placement.json"
"""A checkpoint folder's record of the run's actors (their processes), where the run has actors."""
TRIAL_JSON = "trial.json"
"""A checkpoint folder's record of its trial's Tune config (what the trainable is called with)."""


def trial_key(trial: Mapping[str, Any]) -> str:
    """A trial's Tune config as one canonical string (as :data:`TRIAL_JSON` holds it)."""
    return json.dumps(trial, sort_keys=True, default=str)


@dataclass(frozen=True)
class Found:
    """A one-run trial's whole checkpoint on disk: its file's content (as stored and read back) and the run's
    placement."""

    data: bytes
    content: dict[str, Any]
    placement: list[dict[str, Any]] | None

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The run's evaluation rows up to the checkpoint (what its ``metrics.parquet`` holds)."""
        return cast(list[dict[str, Any]], self.content["rows"])

    @property
    def round(self) -> int:
        """The round the checkpoint was taken at."""
        return int(self.content["server"]["counters"]["round"])


@dataclass(frozen=True)
class Far(Generic[T]):
    """A checkpoint found on disk further on than Tune's: its folder, whether that is the trial's own (else an
    earlier folder of the same config), and what it holds (:class:`Found`, or a pack's)."""

    folder: Path
    own: bool
    value: T


def folder_number(name: str) -> int:
    """The ``n`` of a checkpoint folder's name ``checkpoint_<n>``; -1 for another name."""
    match = CHECKPOINT_FOLDER.fullmatch(name)
    return int(match[1]) if match else -1


def own_folder() -> Path:
    """This trial's storage folder (the trainable's)."""
    return Path(tune.get_context().get_storage().trial_fs_path)


def number_on(at_least: int) -> None:
    """Number this trial's next checkpoint folder past ``at_least`` (where Tune would number it lower)."""
    storage = tune.get_context().get_storage()
    storage.current_checkpoint_index = max(storage.current_checkpoint_index, at_least)


def of_this_config(trial: Mapping[str, Any]) -> list[tuple[Path, bool]]:
    """The checkpoint folders of this trial (``trial``: its Tune config) and of the sweep's other trial folders
    written for the same config, as (folder, in the trial's own), its own first."""
    own = own_folder()
    key = trial_key(trial)
    folders = [p for p in own.parent.glob("*/checkpoint_*") if folder_number(p.name) >= 0]
    return [(folder, folder.parent == own) for folder in sorted(folders, key=lambda p: (p.parent != own, p))
            if folder.parent == own or _stored_key(folder) == key]


def furthest(trial: Mapping[str, Any], beyond: int, read: Callable[[Path], T], progress: Callable[[T], int]) -> Far[T] | None:
    """Of this trial's checkpoints on disk (``trial``: its Tune config; :func:`of_this_config`), the whole one --
    ``read(folder)`` raises ``OSError``, ``ValueError`` or ``StorageError`` on one cut short -- that came furthest by
    ``progress``, past ``beyond`` (that of the checkpoint Tune handed the trial); None where none did."""
    best: Far[T] | None = None
    for folder, own in of_this_config(trial):
        try:
            value = read(folder)
        except (OSError, ValueError, StorageError):
            continue
        if progress(value) > (progress(best.value) if best else beyond):
            best = Far(folder, own, value)
    return best


def further_on(trial: Mapping[str, Any], known_round: int) -> Far[Found] | None:
    """The whole checkpoint of this (one-run) trial taken at the latest round after ``known_round`` (the round of the
    checkpoint Tune handed it; -1 for none), or None."""
    return furthest(trial, known_round, _read, lambda found: found.round)


def numbered_after(restored: tune.Checkpoint | None) -> None:
    """Number this trial's next checkpoint folder after the one Tune handed it, where there is one."""
    if restored is not None:
        number_on(folder_number(Path(restored.path).name))


def report_found(far: Far[Any], rows: list[dict[str, Any]], reports: Reports,
                 save: Callable[[Path], tune.Checkpoint]) -> None:
    """Report a checkpoint found on disk as the trial reported it: ``rows`` (what Tune has not been told), the last
    one with the checkpoint ``save`` writes -- into its own folder where it is the trial's (Tune, told of it, then
    prunes the older ones), else as the trial's next."""
    if far.own:
        number_on(folder_number(far.folder.name) - 1)
    reports.report_saved(rows, save)


def _stored_key(folder: Path) -> str | None:
    try:
        return trial_key(json.loads((folder / TRIAL_JSON).read_text()))
    except (OSError, ValueError):
        return None


def _read(folder: Path) -> Found:
    """The checkpoint in ``folder`` (its rows are in it: ``metrics.parquet`` is written again from them).

    Raises:
        OSError, ValueError, StorageError: its file is missing or does not read back whole.
    """
    data = (folder / results.CHECKPOINT).read_bytes()
    content = results.checkpoint_from_bytes(data, str(folder / results.CHECKPOINT))
    placement = json.loads((folder / PLACEMENT_JSON).read_text()) if (folder / PLACEMENT_JSON).exists() else None
    return Found(data, content, placement)
