"""``fedcomp.actors.collective``'s group: in one process (a world of one), the rows it exchanges and the means formed
with the server's own function; across threads (a world of three, each member connected to every other), every
member's rows in member order, whole partials with layouts learnt once, a member that leaves failing the others' next exchange at once, and the
deadlines (the rendezvous', then the exchanges')."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from fedcomp.actors.collective import JOIN_TIMEOUT_S, SPLIT_FLOATS, Group, GroupBroken
from fedcomp.platform.federation import MEAN_BLOCK, Layout, Partial, combine, mean_of


def _address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def _joined(world: int, timeout_s: float = 30.0) -> list[Group]:
    """``world`` groups joined from threads of this process (the transport is plain sockets)."""
    groups = [Group() for _ in range(world)]
    address = groups[0].address()  # held open until member 0 joins: no other member's listener can take its port
    threads = [threading.Thread(target=g.join, args=(address, i, world, timeout_s)) for i, g in enumerate(groups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g.joined for g in groups)
    return groups


def _together(groups: list[Group], work) -> list:
    """``work(group, rank)`` on every member at once; each one's result (or the exception it raised)."""
    out: list = [None] * len(groups)

    def one(i: int) -> None:
        try:
            out[i] = work(groups[i], i)
        except BaseException as error:  # handed to the test
            out[i] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_a_group_of_one_forms_the_servers_mean():
    (group,) = _joined(1, timeout_s=77.0)
    try:
        sums = np.array([1.0, 3.0, -0.5])
        got = group.mean(3, sums)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, mean_of([sums], 3, 3))
        bigger = np.arange(5, dtype=np.float64)
        np.testing.assert_array_equal(group.mean(2, bigger), mean_of([bigger], 2, 5))
    finally:
        group.leave()
    assert not group.joined


def test_three_members_combine_whole_partials_in_member_order_as_the_server_does():
    groups = _joined(3)
    layout = Layout(("m", "x"), (2, 3))
    partials = [Partial(layout, np.arange(5.0) * (i + 1) + 0.1, 2 + i, 10 * i, has_private=i == 2,
                        losses=tuple(0.25 * k + i for k in range(2 + i))) for i in range(3)]
    try:
        expected = combine([partials[0], partials[2]], 7)
        for _ in range(2):  # the layout travels with the first exchange only
            mine = [partials[0], None, partials[2]]  # member 1 has no cohort members this time
            got = _together(groups, lambda g, i: g.combined(mine[i], 7, busy_s=0.5 * i))  # noqa: B023 (called at once)
            for outcome, private, slowest_s in got:
                assert private == [False, False, True]
                assert slowest_s == 1.0  # the most seconds any member said it worked, member 1's none included
                assert (outcome.clients, outcome.samples, outcome.loss, outcome.floats_up, outcome.floats_down) == (
                    expected.clients, expected.samples, expected.loss, expected.floats_up, 7)
                assert list(outcome.means) == ["m", "x"]
                for key in ("m", "x"):
                    np.testing.assert_array_equal(outcome.means[key].numpy(), expected.means[key].numpy())
        assert len(groups[0].layouts) == 1 and groups[2].sent == groups[0].sent and not groups[1].sent
        assert groups[1].layouts == groups[0].layouts == groups[2].layouts  # sent with the first rows
        assert all(len(g.peers) == 2 for g in groups)  # each member is connected to every other
        means = _together(groups, lambda g, i: g.mean(i, np.full(4, float(i)) if i else None))  # rows of any size
        for mean in means:
            np.testing.assert_array_equal(mean, mean_of([np.full(4, 1.0), np.full(4, 2.0)], 3, 4))
        late = _together(groups, lambda g, i: g.mean(1, np.ones(2 + i)))  # a program out of step with itself
        assert all(isinstance(e, RuntimeError) and "out of step" in str(e) for e in late), late
    finally:
        for g in groups:
            g.leave()


def test_model_sized_rows_arrive_whole_and_answers_do_not_share_the_members_buffers():
    """Rows far beyond a socket's buffers (written in parts) arrive whole -- also when both members send each other
    theirs at once (200,000 floats: under :data:`SPLIT_FLOATS`, every member gets every row); each member reads its share
    of large rows into buffers it keeps, so an answer handed out earlier must not change when the next exchange
    (larger, then smaller) reuses them. Members whose rows take different ways (one small, one large: out of step) fail alike,
    and the group carries on."""
    groups = _joined(2)
    rng = np.random.default_rng(0)
    try:
        mixed = _together(groups, lambda g, i: g.mean(1, np.ones(SPLIT_FLOATS + 1 if i else 10)))
        assert all(isinstance(e, RuntimeError) and "out of step" in str(e) for e in mixed), mixed
        answers, expected = [], []
        for size in (3_000_000, 200_000, 4_000_000, 1_000):
            rows = [rng.standard_normal(size) for _ in groups]
            answers.append(_together(groups, lambda g, i: g.mean(2 + i, rows[i])))  # noqa: B023 (called at once)
            expected.append(mean_of(rows, 5, size))
        for got, want in zip(answers, expected):
            for mean in got:
                assert mean.tobytes() == want.tobytes()
    finally:
        for g in groups:
            g.leave()
    assert not groups[0].buffers and not groups[1].buffers


def test_large_partials_split_among_the_members_are_the_servers_bits():
    """Partials of :data:`SPLIT_FLOATS` floats or more are split: each member averages a share of the floats (shares
    of unequal sizes; a member without cohort members averaging its share of the others'): every member holds what the server's
    ``combine`` makes of them, every time; then a program out of step (rows of different sizes) fails for all, and
    the group carries on."""
    groups = _joined(3)
    size = SPLIT_FLOATS + MEAN_BLOCK // 2 + 3
    layout = Layout(("w", "b"), (size - 10, 10))
    rng = np.random.default_rng(7)
    try:
        for round in range(2):
            partials = [Partial(layout, rng.standard_normal(size) * 10.0 ** (3 * i), 2 + i, 16 * (2 + i),
                                losses=tuple(rng.random(2 + i))) for i in range(3)]
            partials[0].sums[:4] = [-0.0, np.inf, -np.inf, np.nan]
            expected = combine([partials[0], partials[2]], size)
            mine = [partials[0], None, partials[2]]
            got = _together(groups, lambda g, i: g.combined(mine[i], size))  # noqa: B023 (called at once)
            for outcome, _, _ in got:
                assert (outcome.clients, outcome.samples, outcome.loss) == (expected.clients, expected.samples, expected.loss)
                for key in ("w", "b"):
                    assert outcome.means[key].numpy().tobytes() == expected.means[key].numpy().tobytes(), round
        for alone in range(3):  # one member's sums alone: the others average their shares of them
            mine = [partials[alone] if i == alone else None for i in range(3)]
            expected = combine([partials[alone]], size)
            for outcome, _, _ in _together(groups, lambda g, i: g.combined(mine[i], size)):  # noqa: B023
                assert outcome.means["w"].numpy().tobytes() == expected.means["w"].numpy().tobytes(), alone
        late = _together(groups, lambda g, i: g.mean(1, np.ones(size + i)))
        assert all(isinstance(e, RuntimeError) and "out of step" in str(e) for e in late), late
        rows = [rng.standard_normal(size) for _ in groups]
        for mean in _together(groups, lambda g, i: g.mean(1 + i, rows[i])):
            assert mean.tobytes() == mean_of(rows, 6, size).tobytes()
    finally:
        for g in groups:
            g.leave()


def test_a_large_exchange_fails_at_once_when_member_0_is_gone_and_at_the_deadline_when_it_is_silent():
    """A member sending a large partial fails as soon as member 0 has left, and waits no longer than the group's
    deadline for a member 0 that never answers."""
    big = np.ones(8 * SPLIT_FLOATS)  # beyond what the connection's buffers hold
    gone = _joined(2, timeout_s=60.0)
    try:
        gone[0].leave()
        with pytest.raises(GroupBroken):
            gone[1].mean(1, big)
    finally:
        gone[1].leave()
    silent = _joined(2, timeout_s=0.5)
    try:
        with pytest.raises(GroupBroken, match="timed out"):
            silent[1].mean(1, big)
        assert silent[1].peers == [] and all(p.gettimeout() == 0.5 for p in silent[0].peers)
    finally:
        for g in silent:
            g.leave()


def test_a_member_that_leaves_breaks_the_others_next_exchange_at_once():
    groups = _joined(3, timeout_s=60.0)
    try:
        groups[2].leave()
        got = _together(groups[:2], lambda g, i: g.mean(1, np.ones(2)))
        assert all(isinstance(e, GroupBroken) for e in got), got  # not after the 60 s deadline
    finally:
        for g in groups:
            g.leave()


def test_an_exchange_waits_the_deadline_and_the_rendezvous_its_own():
    groups = _joined(2, timeout_s=0.5)
    try:
        assert all(p.gettimeout() == 0.5 for g in groups for p in g.peers)
        with pytest.raises(GroupBroken, match="timed out"):
            groups[1].mean(1, np.ones(2))  # member 0 never answers
    finally:
        for g in groups:
            g.leave()
    assert JOIN_TIMEOUT_S < 120  # the rendezvous does not wait the (longer) deadline of a round
    lonely = Group()
    with pytest.raises(RuntimeError, match="did not meet"):
        import fedcomp.actors.collective as collective

        saved, collective.JOIN_TIMEOUT_S = collective.JOIN_TIMEOUT_S, 0.3
        try:
            lonely.join(_address(), 1, 2, 5.0)  # no member 0 listens
        finally:
            collective.JOIN_TIMEOUT_S = saved


def test_a_member_whose_peer_is_gone_gives_up_at_once_not_at_the_deadline():
    """Member 0 died as the group formed (its held rendezvous listener closed with its process): the others' connections
    are refused, and they gave up only at the rendezvous deadline (20 s), the federation waiting for them before it
    replaced the dead actor."""
    gone = Group()
    address = gone.address()
    gone.leave()  # the listener closed, as a dead process's is
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not meet at .*: a member's port refused the connection \(its process is gone, or a firewall"):
        Group().join(address, 1, 2, 5.0)
    assert time.monotonic() - started < JOIN_TIMEOUT_S / 4
