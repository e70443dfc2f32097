"""``fedcomp.actors.collective``'s group in one process (a world of one): the rows it gathers, a yield that outgrows
the rows, the means formed with the server's own function, and the deadlines (the join's, then the gathers')."""

from __future__ import annotations

import datetime

import numpy as np
import torch
import torch.distributed as dist

from fedcomp.actors.collective import JOIN_TIMEOUT_S, Group
from fedcomp.platform.federation import mean_of


def test_a_group_of_one_forms_the_servers_mean_and_grows_its_rows():
    group = Group()
    group.join(Group.address(), 0, 1, timeout_s=77.0)
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert backend.options._timeout == datetime.timedelta(seconds=77)  # gathers wait the deadline ...
        assert JOIN_TIMEOUT_S < 77  # ... connecting only the rendezvous' time
        sums = np.array([1.0, 3.0, -0.5])
        got = group.mean(3, sums)
        assert got.dtype == np.float32 and group.capacity == 3
        np.testing.assert_array_equal(got, mean_of([sums], 3, 3))
        bigger = np.arange(5, dtype=np.float64)
        np.testing.assert_array_equal(group.mean(2, bigger), mean_of([bigger], 2, 5))  # gathered again, wider
        assert group.capacity == 5
        np.testing.assert_array_equal(group.mean(3, sums), mean_of([sums], 3, 3))  # a narrower yield in wide rows
    finally:
        group.leave()
    assert not group.joined and not dist.is_initialized()
