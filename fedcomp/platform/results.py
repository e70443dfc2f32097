"""Run results on disk: ``<out>/<run-id>/metrics.parquet`` + ``run.json`` (+ ``checkpoint.pt``), written
atomically (temporary file in the same folder, then ``os.replace``), and read back as pandas.

A write that fails (disk full, read-only folder) or a stored file that cannot be read back (truncated,
corrupt) is a one-line :class:`StorageError` naming the file, never an OS or unpickling traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from fedcomp.platform.errors import NoResults, StorageError, first_line, shortened

if TYPE_CHECKING:  # pandas (and pyarrow) load where frames are written or read, not in every actor process, and
    # torch where checkpoints are saved or read: a Ray run's driver writes the bytes its server saved
    import pandas as pd

METRICS = "metrics.parquet"
RUN_JSON = "run.json"
CHECKPOINT = "checkpoint.pt"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one.

    Raises:
        StorageError: the file cannot be written (no space left, read-only folder, ...); nothing is left
            half-written.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{path.name}.", dir=path.parent)
    except OSError as error:
        raise StorageError(f"cannot write {path}: {describe_os_error(error)}") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's file is the owner's only; results are read by others too
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        raise StorageError(f"cannot write {path}: {describe_os_error(error)}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


TEMPORARY_PREFIX = "."
""":func:`atomic_write`'s temporary file is ``.<name>.<random>`` beside the file it becomes."""


def _umask() -> int:
    """The process's umask, read without setting it (Linux's ``/proc``; elsewhere set and put back at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_temporaries(folder: Path, names: tuple[str, ...]) -> None:
    """Delete what :func:`atomic_write` left of ``names`` in ``folder`` when a kill cut a write short (one process
    writes a run folder at a time: the run, or the resume continuing it)."""
    for name in names:
        for stale in folder.glob(f"{TEMPORARY_PREFIX}{name}.*"):
            stale.unlink(missing_ok=True)


def describe_os_error(error: OSError) -> str:
    """``No space left on device`` rather than ``[Errno 28] No space left on device: '/x/.tmp1234'``."""
    return error.strerror or str(error)


def new_folder_name(parent: Path, prefix: str) -> str:
    """``<prefix>_<YYYYmmdd-HHMMSS>_<4 hex digits>``, naming no folder in ``parent`` yet: runs (and sweeps) started in
    the same second differ only by the random tail, and a tiny run's loop starts several a second (two of one test's
    three runs drew the same tail once, and the second failed with "it exists already"). Another process may take the
    name before this one creates its folder: :func:`claim_folder` creates it."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    while True:
        name = f"{prefix}_{stamp}_{_tail()}"
        if not os.path.lexists(parent / name):  # (a name too long for the file system is found where it is made)
            return name


def _tail() -> str:
    return secrets.token_hex(2)


def claim_folder(path: Path) -> Path:
    """Create the folder ``path`` (and its parents), named by :func:`new_folder_name`, and return it; where another
    process created a folder of that name since it was drawn -- runs of a job array started in the same second, two
    of which drew the same tail (among 100 such runs, 7 times in 100) -- the name with its tail drawn anew.

    Raises:
        StorageError: it cannot be created (a file in the way, read-only or full file system).
    """
    for _ in range(1000):
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            if not os.path.lexists(path):  # not a clash: a parent in the way (a link to nothing)
                raise StorageError(f"cannot create the folder {path}: a folder above it is a link to nothing, or a "
                                   f"file") from None
            path = path.with_name(f"{path.name.rsplit('_', 1)[0]}_{_tail()}")
        except OSError as error:
            raise StorageError(f"cannot create the folder {path}: {describe_os_error(error)}") from None
    raise StorageError(f"cannot create the folder {path}: 1,000 names drawn were all taken")


def missing_parents(path: Path) -> list[Path]:
    """The folders above ``path`` that are not there yet, nearest first: what :func:`claim_folder` makes with it, and
    :func:`unclaim` removes again."""
    return [p for p in path.parents if not os.path.lexists(p)]


def unclaim(path: Path, made: Sequence[Path]) -> None:
    """Remove the folder ``path`` and, where they are empty, the folders ``made`` for it (:func:`missing_parents`):
    a run or sweep that kept nothing leaves nothing (a parent another run has used since stays)."""
    shutil.rmtree(path, ignore_errors=True)
    for parent in made:
        with contextlib.suppress(OSError):
            parent.rmdir()


def check_writable(folder: str | Path, label: str | None = None) -> None:
    """Fail before any work when results could not be written under ``folder``: its nearest existing
    ancestor must be a writable folder (a file in the way or a read-only folder is found here, not after
    the run's start-up).

    Raises:
        StorageError: starting with ``label`` (default ``run.out = '<folder>'``), naming the obstacle.
    """
    folder = Path(folder)
    label = label or f"run.out = {str(folder)!r}"
    probe = folder
    try:
        while not os.path.lexists(probe) and probe.parent != probe:
            probe = probe.parent
        if probe.is_symlink() and not probe.exists():
            raise StorageError(f"{label}: {str(probe)!r} is a link to {os.readlink(probe)!r}, which is not there (or "
                               f"a loop of links)")
        if probe.exists() and not probe.is_dir():
            raise StorageError(f"{label}: {str(probe)!r} is a file, not a folder")
        if probe.is_dir() and not os.access(probe, os.W_OK | os.X_OK):
            raise StorageError(f"{label}: the folder {str(probe)!r} is not writable")
        limit = _longest_name(probe)
        for part in folder.parts:
            if (size := len(os.fsencode(part))) > limit:
                raise StorageError(f"{label}: the name {shortened(part, 40)!r} is {size} bytes long; "
                                   f"this file system's names are at most {limit}")
    except OSError as error:
        raise StorageError(f"{label}: {describe_os_error(error)}") from None


def _longest_name(folder: Path) -> int:
    """The longest file name (in bytes) the file system of ``folder`` takes (255 where it does not say)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_parquet(path: Path, frame: pd.DataFrame) -> None:
    """``frame`` as a Parquet file at ``path``, written atomically (no index)."""
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write(path, buf.getvalue())


def read_parquet(path: Path) -> pd.DataFrame:
    """The table stored at ``path`` (a run's metrics, a sweep's trials).

    Raises:
        StorageError: the file cannot be read (truncated, corrupt, not Parquet).
    """
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except Exception as error:  # pyarrow's ArrowInvalid, OSError, ... for a damaged file
        raise StorageError(f"{path} cannot be read (truncated or corrupt: {first_line(error)})") from None


def write_metrics(path: Path, rows: list[dict[str, Any]]) -> None:
    import pandas as pd

    write_parquet(path, pd.DataFrame(rows))


def checkpoint_bytes(checkpoint: dict[str, Any]) -> bytes:
    """A run checkpoint (``{"server": ..., "rows": ..., ...}``) as the content of its file (``torch.save``)."""
    import torch

    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    return buf.getvalue()


def write_checkpoint(path: Path, content: bytes) -> None:
    """A checkpoint's file content (:func:`checkpoint_bytes`) at ``path``, written atomically."""
    atomic_write(path, content)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint saved at ``path``.

    Raises:
        StorageError: the file cannot be read, is truncated, corrupt or not a fedcomp checkpoint.
    """
    try:
        content = path.read_bytes()
    except OSError as error:
        raise StorageError(f"{path} cannot be read: {first_line(error)}") from None
    return checkpoint_from_bytes(content, str(path))


def server_checkpoint(checkpoint: dict[str, Any] | bytes) -> dict[str, Any]:
    """A server's checkpoint: as given, or the one in a run checkpoint file's content (:func:`checkpoint_bytes`), the
    form a Ray run's driver holds and keeps for its actors' recovery (it imports no torch to read it)."""
    return checkpoint_from_bytes(checkpoint)["server"] if isinstance(checkpoint, bytes) else checkpoint


def checkpoint_from_bytes(content: bytes, where: str = "the checkpoint") -> dict[str, Any]:
    """A run checkpoint from its file content (:func:`checkpoint_bytes`); ``where`` names it in errors.

    Raises:
        StorageError: the content is truncated, corrupt or not a fedcomp checkpoint.
    """
    import torch

    try:
        checkpoint = torch.load(io.BytesIO(content), weights_only=False)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, ... on a damaged file
        raise StorageError(f"{where} cannot be read (truncated or corrupt: {first_line(error)})") from None
    valid = (
        isinstance(checkpoint, dict) and {"rows", "wall_time"} <= checkpoint.keys()
        and isinstance(checkpoint.get("server"), dict) and {"state", "counters"} <= checkpoint["server"].keys()
    )
    if not valid:
        raise StorageError(f"{where} is not a fedcomp run checkpoint")
    return cast(dict[str, Any], checkpoint)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object stored at ``path``.

    Raises:
        StorageError: the file cannot be read or is not a JSON object (truncated, corrupt).
    """
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StorageError(f"{path} cannot be read ({first_line(error)})") from None
    if not isinstance(obj, dict):
        raise StorageError(f"{path} is not a JSON object")
    return obj


def run_dirs(path: str | Path) -> list[Path]:
    """The run folders at ``path``: the folder itself if it is a run, else the runs directly under it."""
    path = Path(path)
    if (path / RUN_JSON).is_file():
        return [path]
    return sorted(p for p in path.iterdir() if (p / RUN_JSON).is_file()) if path.is_dir() else []


def load_results(path: str | Path) -> pd.DataFrame:
    """Every evaluation row of the run(s) at ``path`` as one DataFrame.

    ``path`` is a run folder or a results root holding run folders (a sweep's folder under it is not one:
    :func:`fedcomp.load_sweep`). Columns: ``run_id``, ``algorithm``, ``task``, ``seed``, then the metrics columns
    (``round``, ``comm_rounds``, ..., the task's metrics).

    Raises:
        StorageError: a run's ``run.json`` or ``metrics.parquet`` cannot be read (:func:`read_runs` passes over it).
        NoResults: there are no run results at ``path`` (a ``FileNotFoundError``).
    """
    rows, _, unreadable = read_runs(path)
    if unreadable:
        raise StorageError(next(iter(unreadable.values())))
    return rows


def _no_runs(path: str | Path) -> str:
    """Why there are no run results at ``path``: nothing there, or it is a sweep's folder, whose trials are read
    otherwise."""
    if (Path(path) / "sweep.json").is_file():
        return (f"{str(path)!r} is a sweep's folder, not a run's: its trials are in fedcomp.load_sweep({str(path)!r})"
                f".trials (trials.parquet)")
    return f"no fedcomp run results under {str(path)!r}"


def read_runs(path: str | Path) -> tuple[pd.DataFrame, dict[str, dict[str, Any]], dict[str, str]]:
    """What a report of the runs under ``path`` shows: their rows (as :func:`load_results`), each run's ``run.json``
    (its status, its config) and, for each run whose files cannot be read (a damaged ``run.json`` or ``metrics.parquet``),
    why -- such a run is passed over, so that one damaged run does not hide the others.

    Raises:
        StorageError: ``path`` is one run folder whose files cannot be read, or every run under it is such.
        NoResults: there are no run results at ``path`` (a ``FileNotFoundError``).
    """
    import pandas as pd

    from fedcomp.platform.config import folder_of

    path = folder_of(path, "path")
    frames, metas, unreadable = [], {}, {}
    for run in run_dirs(path):
        try:
            meta = read_json(run / RUN_JSON)
            frame = _run_rows(run, meta)
        except StorageError as error:
            unreadable[run.name] = str(error)
            continue
        metas[run.name] = meta
        if frame is not None:
            frames.append(frame)
    if unreadable and not frames:
        raise StorageError(next(iter(unreadable.values())) if len(unreadable) == 1 else
                           f"no run under {str(path)!r} can be read ({len(unreadable)} runs); the first: "
                           f"{next(iter(unreadable.values()))}")
    if not frames:
        raise NoResults(_no_runs(path))
    return pd.concat(frames, ignore_index=True), metas, unreadable


def _run_rows(run: Path, meta: dict[str, Any]) -> pd.DataFrame | None:
    """One run's evaluation rows with its id, algorithm, task and seed in front; None before its first metrics write.

    Raises:
        StorageError: ``metrics.parquet`` cannot be read, or ``meta`` (its ``run.json``) lacks the run's config.
    """
    if not (run / METRICS).is_file():
        return None
    df = read_parquet(run / METRICS)
    if "round" not in df.columns:
        raise StorageError(f"{run / METRICS} has no round column: not a fedcomp run's metrics (columns: "
                           f"{', '.join(map(str, df.columns[:8]))})")
    try:
        config = meta["config"]
        seed, task, algorithm = config["run"]["seed"], config["task"]["name"], config["algorithm"]["name"]
    except (KeyError, TypeError) as error:
        raise StorageError(f"{run / RUN_JSON} lacks the run's config ({error})") from None
    df.insert(0, "seed", seed)
    df.insert(0, "task", task)
    df.insert(0, "algorithm", algorithm)
    df.insert(0, "run_id", run.name)
    return df
