"""Wire types and the client host: packing, pickling, and sums that do not depend on packing."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from fedcomp.backends import make_server
from fedcomp.platform.accelerator import one_thread
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import MEAN_BLOCK, ClientHost, Layout, combine, mean_of
from tests.conftest import small


def test_layout_packs_in_key_order_and_unpacks_copies():
    state = {"x": torch.arange(3.0), "u": torch.tensor([9.0])}
    layout = Layout.of(state)
    flat = layout.pack(state)
    assert layout.keys == ("u", "x") and flat.dtype == np.float32 and flat.tolist() == [9, 0, 1, 2]
    flat.setflags(write=False)  # object-store buffers are read-only
    back = layout.unpack(flat)
    back["x"] += 1  # must not touch the buffer
    assert flat.tolist() == [9, 0, 1, 2]


def test_unpacked_tensors_are_each_in_memory_of_their_own_and_compute_like_the_in_process_copies():
    """A piece split out of one buffer at an offset is aligned differently, and BLAS then adds in another order: on
    the wire side the model at d = 26,600 gave a matrix-vector product other last bits than the in-process copy."""
    generator = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(1, generator=generator), "x": torch.randn(26_600, generator=generator)}
    layout = Layout.of(state)
    unpacked, copied = layout.unpack(layout.pack(state)), layout.copy(state)
    assert unpacked["a"].untyped_storage().data_ptr() != unpacked["x"].untyped_storage().data_ptr()
    assert unpacked["x"].storage_offset() == 0
    matrix = torch.randn(3, 26_600, generator=generator)
    assert torch.equal(matrix @ unpacked["x"], matrix @ copied["x"])


def test_messages_and_config_pickle():
    config = load_config("quickstart", small())
    assert pickle.loads(pickle.dumps(config)) == config
    host = ClientHost(config, [0, 1])
    payload = {"x": torch.zeros(11), "u": torch.zeros(11)}
    layout = Layout.of(payload)
    partial = host.run("local_steps", 0, [0, 1], layout.pack(payload), layout)
    again = pickle.loads(pickle.dumps(partial))
    np.testing.assert_array_equal(again.sums, partial.sums)
    assert again.layout == partial.layout and again.clients == 2


def test_the_cohort_mean_is_each_elements_float64_sum_in_order_divided_and_rounded_once():
    """``mean_of`` forms its blocks in cache, but each element is ``((0.0 + s_1) + s_2 + ...) / clients`` in float64,
    rounded once to float32: across block boundaries, for -0.0, infinities, NaN and sums beyond float32's range, into
    a given array or a new one, and zeros without any partial."""
    rng = np.random.default_rng(11)
    size = 2 * MEAN_BLOCK + 17
    sums = [rng.standard_normal(size) * 10.0 ** rng.integers(-40, 300, size) for _ in range(3)]
    for k, special in enumerate([-0.0, np.inf, -np.inf, np.nan, 1e300]):
        sums[0][MEAN_BLOCK - 1 + k] = special
    sums[1][MEAN_BLOCK + 1] = sums[2][MEAN_BLOCK + 1] = sums[0][MEAN_BLOCK + 1] = -0.0
    want = np.empty(size, np.float32)
    for i in range(size):
        total = 0.0
        for part in sums:
            total += float(part[i])
        with np.errstate(over="ignore", invalid="ignore"):
            want[i] = np.float32(np.float64(total) / 7)
    out = np.full(size, 5.0, np.float32)
    with np.errstate(invalid="ignore"):
        got = mean_of(iter(sums), 7, size, out)
        assert got is out and got.tobytes() == want.tobytes()
        assert mean_of(sums, 7, size).tobytes() == want.tobytes()
    assert not np.signbit(got[MEAN_BLOCK + 1])  # -0.0 sums to 0.0, as if added to zeros
    assert mean_of([], 3, 4).tolist() == [0.0] * 4


def test_partial_sums_do_not_depend_on_packing():
    config = load_config("quickstart", small(**{"federation.clients": 6}))
    payload = {"x": torch.linspace(-1, 1, 11), "u": torch.zeros(11)}
    layout = Layout.of(payload)
    flat = layout.pack(payload)
    whole = combine([ClientHost(config, range(6)).run("local_steps", 0, range(6), flat, layout)], 22)
    for groups in ([[0, 1, 2], [3, 4, 5]], [[0], [1, 2, 3, 4], [5]]):
        parts = [ClientHost(config, g).run("local_steps", 0, g, flat, layout) for g in groups]
        packed = combine(parts, 22)
        for key in whole.means:
            torch.testing.assert_close(packed.means[key], whole.means[key], rtol=0, atol=0)
        assert packed.samples == whole.samples and packed.clients == 6


def test_a_host_counts_each_clients_outputs_before_the_next_client_runs():
    """The host sums a client's outputs as soon as its program returns (its model is let go before the next
    client's program runs: a cohort of large models is never held at once), in cohort order."""
    config = load_config("quickstart", small(**{"federation.clients": 3, "federation.vectorise": False}))
    host = ClientHost(config, range(3))
    payload = {"x": torch.linspace(-1, 1, 11), "u": torch.zeros(11)}
    layout = Layout.of(payload)
    counted_before = []
    program = host.algorithm.program("local_steps")

    def watched(problem, state, ctx):
        counted_before.append((ctx.client, host.sums.added))
        return program(problem, state, ctx)

    host.algorithm.program = lambda name: watched
    partial = host.run("local_steps", 0, [2, 0, 1], layout.pack(payload), layout)
    assert counted_before == [(0, 0), (1, 1), (2, 2)] and partial.clients == 3


def test_clients_compute_with_one_thread_whatever_the_process_has():
    """A host runs its clients' programs with one intra-op thread, as every client actor does, and puts the process's
    setting back: FedDRO's step at d = 26,600 ended a round in other last bits with 2 threads than with 1 on an Intel
    Xeon (torch splits some float reductions across threads), so the local backend would differ from Ray there."""
    raw = {"task": {"name": "heterogeneous-composition", "dim": 26_600, "heterogeneity": 1.0},
           "algorithm": {"name": "feddro", "local_steps": 3, "lr": 0.3, "beta": 0.4},
           "federation": {"clients": 4, "backend": "local"}, "run": {"rounds": 2, "progress": "none"}}
    before = torch.get_num_threads()
    rows = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            server = make_server(load_config(raw))
            rows[threads] = [server.run_round() for _ in range(2)], server.checkpoint()["state"]["x"]
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert rows[2][0] == rows[1][0]
    torch.testing.assert_close(rows[2][1], rows[1][1], rtol=0, atol=0)


def test_one_thread_under_run_deterministic_only_and_the_setting_comes_back():
    """``run.deterministic: false`` leaves the local backend's clients the process's threads (faster for large models
    on many cores); the process's setting is back after every client program either way, also after an error."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with one_thread():
            assert torch.get_num_threads() == 1
        with one_thread(enabled=False):
            assert torch.get_num_threads() == 2
        try:
            with one_thread():
                raise ValueError("a client program's error")
        except ValueError:
            pass
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
