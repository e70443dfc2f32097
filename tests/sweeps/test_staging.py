"""A checkpoint's staging folder: named after its process, removed when left; folders of processes that are gone
(killed while they held one) are removed by the next trial process, those of running processes are not."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from fedcomp.sweeps import staging


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    staging._remove_orphans.cache_clear()
    yield tmp_path
    staging._remove_orphans.cache_clear()


def test_a_staging_folder_is_named_after_its_process_and_removed_when_left(scratch):
    with staging.staging_folder() as folder:
        assert folder.parent == scratch and folder.name.startswith(f"{staging.PREFIX}{os.getpid()}-")
        (folder / "checkpoint.pt").write_bytes(b"x")
    assert list(scratch.iterdir()) == []


def test_folders_of_processes_that_are_gone_are_removed_and_others_kept(scratch):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    orphan = scratch / f"{staging.PREFIX}{dead_pid}-abc"
    orphan.mkdir()
    (orphan / "metrics.parquet").write_bytes(b"x")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held = scratch / f"{staging.PREFIX}{live.pid}-def"
        held.mkdir()
        other = scratch / "someone-elses"
        other.mkdir()
        with staging.staging_folder():
            pass
        assert sorted(p.name for p in scratch.iterdir()) == sorted([held.name, other.name])
    finally:
        live.kill()
        live.wait()
