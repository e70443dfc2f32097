"""Where a trial puts a checkpoint on its way to Tune's storage.

``tune.report`` copies a checkpoint folder into the sweep's storage; the folder itself is the reporter's to remove.
A trial process killed while it holds one -- a sweep killed as a checkpoint is written, a trial's process dying --
would leave it in the temporary folder for good. So each is named after its process, and the first checkpoint of
every trial process on a machine removes those whose process is gone.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "fedcomp-checkpoint-"


@contextmanager
def staging_folder() -> Iterator[Path]:
    """An empty temporary folder named after this process, removed when left."""
    _remove_orphans()
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-") as folder:
        yield Path(folder)


@functools.cache
def _remove_orphans() -> None:
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name.removeprefix(PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True
