"""The sweep's data check (:mod:`fedcomp.sweeps.data_check`) on the session's Ray: the task's own line where files are
missing, and a sweep that goes on where no CPU is free to check on."""

from __future__ import annotations

import pytest

from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.sweeps.data_check import check_data

pytestmark = pytest.mark.ray


def test_missing_files_are_the_tasks_line_and_a_cluster_without_a_free_cpu_skips_the_check(ray_session, tmp_path,
                                                                                           capsys):
    config = load_config("auc-table1", {"task.root": str(tmp_path)})

    @ray_session.remote(num_cpus=1)
    class Holder:
        def ready(self) -> bool:
            return True

    holders = [Holder.remote() for _ in range(2)]  # both of the session's CPUs, as another job's trials would
    try:
        ray_session.get([h.ready.remote() for h in holders])
        capsys.readouterr()
        check_data([config], timeout=1.0)  # no error: the sweep goes on, its trials queued by Tune
        assert capsys.readouterr().err.splitlines() == [
            "fedcomp: the check of the trials' data files found no free CPU within 1 s; the sweep goes on without it"]
    finally:
        for holder in holders:
            ray_session.kill(holder)
    with pytest.raises(ConfigError, match=f"^task.dataset = 'cifar10': cifar10 not found: {tmp_path}/cifar-10-batches-py"):
        check_data([config])
