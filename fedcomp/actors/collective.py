"""Exchanges averaged among the client actors themselves (``federation.transport: collective``).

FedDRO's round answers every local step of its clients with the cohort mean of one small value
(``fed.exchange``). By calls, each step is a round trip from the server to the actors and back (a millisecond or
more of Ray's task machinery); through a compiled graph, its idle readers poll their channels, which costs the
clients' compute its cores where cores are few. Here the server sends the whole exchange to every client actor in
one call, and the actors, joined in one group (:class:`Group`: a TCP connection between every two actors, so across
nodes too), answer each step among themselves: every actor's float64 partial sums go to every other actor (a waiting
actor blocks in ``poll``, it does not spin), and each forms the cohort mean with the server's own function, in actor
order (:func:`~fedcomp.platform.federation.mean_of`), so each actor's answer has the bits the server's would have
(large sums go to actor 0 alone, which sends the means to all). Each actor returns its final partial sums and the means it formed at each step, which the
server counts as the exchange's steps. Actors without cohort members take part with nothing to add.

When an actor dies or raises mid-exchange, its process or its group is gone, and every other actor's next gather
fails at once (it reads the end of a socket) with :class:`GroupBroken`; the federation then replaces the dead
actors, rebuilds the group at its next use and runs again, by calls, what did not finish
(:meth:`fedcomp.actors.federation.RayFederation.exchange`). Actors that cannot meet at the rendezvous (a
firewall between nodes, say) make the run's exchanges by calls, after one warning.
"""

from __future__ import annotations

import functools
import os
import pickle
import select
import socket
import struct
import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import ray

from fedcomp.actors.group_terms import JOIN_TIMEOUT_S, GroupBroken
from fedcomp.platform.algorithms.base import Outcome
from fedcomp.platform.errors import shortened
from fedcomp.platform.federation import Averages, ClientHost, Layout, Partial, mean_of

FAULT_JOIN = "FEDCOMP_FAULT_GROUP_JOIN"
"""Fault injection for the tests: when set in a client actor's environment, joining the group fails."""
HEADER = 7
"""Floats in front of each actor's row head in an exchange: its clients, the floats in its body (the sums), and for a
whole partial (:meth:`Group.combined`) its samples, whether it kept private state, its layout's fingerprint, how
many clients' losses follow in the head and the seconds it worked on the call (zeros for a bare mean)."""

SPLIT_FLOATS = 262_144
"""Sums smaller than this many floats, counting every copy an actor sends (its floats times the other actors: 2 MiB of
float64 in all), go from every actor to every other with its row, and each actor forms the means itself: one
transfer on the call's critical path. Larger ones are split among the actors (a reduce-scatter, then an all-gather):
actor k receives the k-th share of every member's sums, forms their means and sends them to every other actor, so each
actor moves and adds about 1/world of the sums of each member instead of actor 0 all of them."""

Row = tuple[np.ndarray, np.ndarray, bytes]
"""One actor's contribution to an exchange: head (counts, then losses), body (float64 sums; :data:`NOT_KEPT` where they
are split among the actors) and extra (a pickled layout, the first time the actor sends it)."""
NOT_KEPT = np.zeros(0, np.float64)
History = list[tuple[Layout, np.ndarray]]
"""Each step's cohort means as one actor formed them: their layout and the float32 values."""
REFUSED_GRACE_S = 2.0
"""How long a member retries a connection its peer refuses: a listener that :meth:`Group.join` opens anew on the
held rendezvous port (after :meth:`Group.leave`) takes a moment; a peer that died refuses for ever."""


class Group:
    """This process's membership of the client actors' group: a TCP connection to every other actor.

    An exchange sends every other actor this actor's row -- its head (counts, losses) and, when small, its float64
    partial sums -- and every actor forms the result from all rows in actor order, with the server's own function,
    so all hold the bits the server would: no answer has to come back from anyone, and the actor that finishes last
    finds the others' rows waiting. Large sums (:data:`SPLIT_FLOATS`) are split: each actor averages its share of
    the floats and sends the others those means. Messages are non-blocking writes and
    reads over all connections at once on the caller's thread (TCP_NODELAY, one ``poll`` when nothing moves): a gloo
    ``all_gather`` between two actors, which hands every message to worker threads, took 0.7 ms idle on a 2-core
    machine (``benchmarks/RAY_DAG.md``). A peer that dies or leaves closes its sockets, so the others' next read fails
    at once; every wait lasts at most the group's deadline."""

    def __init__(self) -> None:
        self.world = 0
        self.rank = 0
        self.peers: list[socket.socket] = []
        """The connections to the other actors, in their order (an actor other than 0 finds actor 0's first)."""
        self.layouts: dict[float, Layout] = {}
        """The layouts this actor knows since the group formed, by fingerprint: its own and those the others sent."""
        self.sent: set[float] = set()
        """The fingerprints of the layouts this actor has sent the others since the group formed."""
        self.buffers: dict[int, np.ndarray] = {}
        """For each other actor, the buffer its share of large sums is read into (kept: no fresh pages per call)."""
        self.rendezvous: socket.socket | None = None
        """The listener :meth:`address` opened for the group this actor is to form as rank 0 (until it joins)."""

    def _scratch(self, rank: int, size: int) -> memoryview:
        """The buffer for ``size`` bytes of actor ``rank``'s sums (valid until the next exchange)."""
        buffer = self.buffers.get(rank)
        if buffer is None or buffer.size < size:
            buffer = self.buffers[rank] = np.empty(size, np.uint8)
        return buffer.data[:size]

    def address(self) -> str:
        """A rendezvous address on this actor's node, for the group's rank 0 (this actor) to :meth:`join` at. Its port
        is held open from now on: a port only found free, then closed, was taken in between now and then by another
        member's own listener (every other actor listens on a port the system picks) -- "address already in use"."""
        self._close_rendezvous()
        self.rendezvous = socket.create_server(("", 0))
        return f"tcp://{ray.util.get_node_ip_address()}:{self.rendezvous.getsockname()[1]}"

    def _close_rendezvous(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.close()
            self.rendezvous = None

    def _listener(self, port: int) -> socket.socket:
        """Rank 0's rendezvous listener: the one :meth:`address` holds for ``port``, else a new one."""
        if self.rendezvous is not None and self.rendezvous.getsockname()[1] == port:
            held, self.rendezvous = self.rendezvous, None
            return held
        self._close_rendezvous()
        return socket.create_server(("", port))

    def join(self, address: str, rank: int, world: int, timeout_s: float) -> None:
        """Join the group of ``world`` actors as ``rank`` (leaving any group this process was in); returns once all
        are connected to all, or raises when they have not met within :data:`JOIN_TIMEOUT_S`. Every actor other than
        0 listens on a port of its own, tells actor 0 (at ``address``) where, learns the others' ports from it, and
        connects to the actors before it; the actors after it connect to it. An exchange waits at most ``timeout_s``
        for the others."""
        self._disconnect()
        if os.environ.get(FAULT_JOIN):
            raise RuntimeError(f"{FAULT_JOIN} is set (fault injection)")
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        peers: dict[int, socket.socket] = {}
        try:
            if rank == 0:
                with self._listener(int(port)) as listener:
                    heard = _accept(listener, world - 1, deadline)
                peers = {r: peer for r, (peer, _) in heard.items()}
                ports = ";".join(heard[r][1] for r in range(1, world)).encode()
                for peer in peers.values():
                    peer.sendall(_lengthed(ports))
                for peer in peers.values():  # each is connected to every other actor: start together
                    if _read(peer, 1) != b"M":
                        raise ConnectionError("an actor answered the rendezvous wrongly")
                for peer in peers.values():
                    peer.sendall(b"J")
            else:
                with socket.create_server(("", 0)) as listener:
                    peers[0] = _connect(host, int(port), deadline)
                    listening = f"{peers[0].getsockname()[0]}:{listener.getsockname()[1]}"
                    peers[0].sendall(struct.pack("<q", rank) + _lengthed(listening.encode()))
                    others = _read(peers[0], struct.unpack("<q", _read(peers[0], 8))[0]).decode().split(";")
                    for other in range(1, rank):
                        there, at = others[other - 1].rsplit(":", 1)
                        peers[other] = _connect(there, int(at), deadline)
                        peers[other].sendall(struct.pack("<q", rank) + _lengthed(b""))
                    peers.update({r: peer for r, (peer, _) in _accept(listener, world - 1 - rank, deadline).items()})
                peers[0].sendall(b"M")
                if _read(peers[0], 1) != b"J":
                    raise ConnectionError("the group's rank 0 answered the rendezvous wrongly")
        except (OSError, ConnectionError, ValueError) as error:
            for peer in peers.values():
                peer.close()
            if isinstance(error, ConnectionRefusedError):
                raise RuntimeError(f"the actors did not meet at {address}: a member's port refused the connection (its "
                                   f"process is gone, or a firewall rejects it) ({error})") from None
            raise RuntimeError(f"the actors did not meet at {address} within {JOIN_TIMEOUT_S:g}s ({error})") from None
        for peer in peers.values():
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer.settimeout(timeout_s)
        self.world, self.rank, self.peers = world, rank, [peers[r] for r in sorted(peers)]
        self.layouts, self.sent = {}, set()

    def leave(self) -> None:
        """Leave the group (the other actors' next read then fails at once), or give up forming one."""
        self._close_rendezvous()
        self._disconnect()

    def _disconnect(self) -> None:
        for peer in self.peers:
            peer.close()
        self.peers, self.world, self.buffers = [], 0, {}

    @property
    def joined(self) -> bool:
        return self.world > 0

    def mean(self, clients: int, sums: np.ndarray | None) -> np.ndarray:
        """The cohort mean (float32) of every actor's partial ``sums`` over its ``clients`` (0 and None for an actor
        without members this time), formed in actor order with the server's own function, the same on every actor.

        Raises:
            GroupBroken: another actor of the group is gone.
            RuntimeError: the actors' yields differ in size (a program out of step with itself).
        """
        size = 0 if sums is None else int(sums.size)
        return self._exchange(_head((clients, size, 0, 0, 0, 0, 0), ()), sums, b"")[1]

    def combined(self, mine: Partial | None, floats_down: int, busy_s: float = 0.0) -> tuple[Outcome, list[bool], float]:
        """What the server's :func:`~fedcomp.platform.federation.combine` makes of every actor's partial (``mine``:
        this actor's, None without members this time), formed by every actor from all partials in actor order
        (:class:`~fedcomp.platform.federation.Averages`), so all hold the same bits; with whether each actor kept
        private state, and the most seconds any actor says it worked on the call (``busy_s``: the slowest actor's
        compute, for the profile). A layout travels to the others once (pickled, with the first partial of its shape
        each actor sends), so that actors without members can unpack the means, and is known by its fingerprint from
        then on.

        Raises:
            GroupBroken: another actor of the group is gone.
            RuntimeError: the actors' partials differ in size.
        """
        layout = b""
        if mine is None:
            head, body = _head((0, 0, 0, 0, 0, 0, busy_s), ()), None
        else:
            fingerprint = _fingerprint(mine.layout)
            body = mine.sums
            head = _head((mine.clients, body.size, mine.samples, float(mine.has_private), fingerprint, len(mine.losses),
                          busy_s), mine.losses)
            if fingerprint not in self.sent:
                layout = pickle.dumps(mine.layout) if self.world > 1 else b""
                self.sent.add(fingerprint)
                self.layouts[fingerprint] = mine.layout
        rows, means = self._exchange(head, body, layout)
        for i, (_, _, extra) in enumerate(rows):
            if extra and i != self.rank:
                told: Layout = pickle.loads(extra)
                self.layouts.setdefault(_fingerprint(told), told)
        members = [(h, sums) for h, sums, _ in rows if h[0] > 0]
        averages = Averages.of([_partial(h, sums, self.layouts[float(h[4])]) for h, sums in members], means)
        return (averages.outcome(floats_down), [bool(h[3]) for h, _, _ in rows],
                max(float(h[6]) for h, _, _ in rows))

    def _exchange(self, head: np.ndarray, body: np.ndarray | None, extra: bytes) -> tuple[list[Row], np.ndarray]:
        """Every actor's row -- ``head``, ``extra`` bytes and ``body`` (float64 sums; from :data:`SPLIT_FLOATS` on, the
        body afterwards, split) -- to every other actor; every actor then plans the mean from the heads (which rows,
        over how many clients, how many floats) and forms it (:func:`~fedcomp.platform.federation.mean_of`, in actor
        order), or its share of it (:meth:`_split`). Returns the rows (this actor's included) and the float32 means (a
        new array: they become the caller's tensors). Nothing is copied on the way out (gathering writes).

        Raises:
            GroupBroken: another actor of the group is gone (or did not answer within the deadline); this one then
                leaves the group too.
            RuntimeError: the members' sums differ in size (every actor raises it; the group carries on).
        """
        body = np.zeros(0, np.float64) if body is None else np.ascontiguousarray(body, np.float64)
        try:
            shared = not self._splits(body.size)
            timeout = self.peers[0].gettimeout() if self.peers else None
            frames = _move({peer: _frame(head, extra, body if shared else NOT_KEPT) for peer in self.peers},
                           {peer: _Framed() for peer in self.peers}, timeout)
            rows = [_row(frames[peer].received()) for peer in self.peers]
            rows.insert(self.rank, (head, body, extra))
            members = [i for i, (h, _, _) in enumerate(rows) if h[0] > 0]
            widths = sorted({int(rows[i][0][1]) for i in members})
            if len(widths) > 1:
                out_of_step = f"exchange out of step: the actors yielded {widths} floats"
            else:
                clients, size = int(sum(rows[i][0][0] for i in members)), widths[0] if widths else 0
                means = np.empty(size, np.float32)
                if self._splits(size):
                    self._split(members, clients, body, means, timeout)
                else:  # every member sent every actor its sums
                    mean_of((rows[i][1] for i in members), clients, size, means)
                return rows, means
        except (OSError, ConnectionError) as error:
            self.leave()  # so that the others' exchanges fail at once too
            reason = "timed out" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
            raise GroupBroken(f"an exchange of the actors' group failed: {shortened(reason, 160)}") from None
        raise RuntimeError(out_of_step)

    def _splits(self, floats: int) -> bool:
        """Whether members' sums of ``floats`` floats are split among the actors (:data:`SPLIT_FLOATS`): decided from
        the size alone, so every actor decides alike, whoever sent what."""
        return floats * (self.world - 1) >= SPLIT_FLOATS

    def _split(self, members: list[int], clients: int, body: np.ndarray, means: np.ndarray, timeout: float | None) -> None:
        """Large sums' means, each actor forming a share: actor k receives the k-th share of every other member's sums
        (while sending each actor its own share of this actor's, if a member), forms that share's means and sends them
        to every other actor, while receiving the other shares' means from their actors."""
        cuts = [means.size * k // self.world for k in range(self.world + 1)]
        share = slice(cuts[self.rank], cuts[self.rank + 1])
        floats = share.stop - share.start
        peer = dict(zip((r for r in range(self.world) if r != self.rank), self.peers))
        sending = self.rank in members
        _move({p: [body[cuts[r]:cuts[r + 1]].data.cast("B")] for r, p in peer.items()} if sending else {},
              {peer[r]: _Into(self._scratch(r, 8 * floats)) for r in members if r != self.rank}, timeout)
        parts = (body[share] if r == self.rank else np.frombuffer(self._scratch(r, 8 * floats), np.float64)
                 for r in members)
        mean_of(parts, clients, floats, means[share])
        _move({p: [means[share].data.cast("B")] for p in self.peers},
              {p: _Into(means[cuts[r]:cuts[r + 1]].data.cast("B")) for r, p in peer.items()}, timeout)


def _head(counts: tuple[float, ...], losses: Sequence[float]) -> np.ndarray:
    """An actor's row head: ``counts`` (:data:`HEADER` floats), then its clients' losses."""
    return np.array([*counts, *losses], np.float64)


def _frame(head: np.ndarray, extra: bytes, body: np.ndarray) -> list[memoryview]:
    """A row as one message (gathering write, no copy of the body): its length, the lengths of the head and the extra,
    then head, extra (padded to 8 bytes, so that the body lands aligned) and body."""
    padded = extra + bytes(-len(extra) % 8)
    size = 16 + head.nbytes + len(padded) + body.nbytes
    return [memoryview(struct.pack("<qqq", size, head.nbytes, len(extra))), head.data.cast("B"),
            memoryview(padded), body.data.cast("B")]


def _row(frame: memoryview) -> Row:
    """The row in a message :func:`_frame` made (head and body views of it)."""
    head_bytes, extra_bytes = struct.unpack_from("<qq", frame)
    head = np.frombuffer(frame, np.float64, count=head_bytes // 8, offset=16)
    start = 16 + head_bytes + extra_bytes + (-extra_bytes % 8)
    body = np.frombuffer(frame, np.float64, offset=start) if frame.nbytes > start else NOT_KEPT
    return head, body, bytes(frame[16 + head_bytes:16 + head_bytes + extra_bytes])


def _partial(head: np.ndarray, body: np.ndarray, layout: Layout) -> Partial:
    """The partial an actor's row (from :meth:`Group.combined`) holds (its sums a view of ``body``)."""
    losses = int(head[5])
    return Partial(layout, body, int(head[0]), int(head[2]), has_private=bool(head[3]),
                   losses=tuple(head[HEADER:HEADER + losses].tolist()))


def _accept(listener: socket.socket, peers: int, deadline: float) -> dict[int, tuple[socket.socket, str]]:
    """A connection from each of ``peers`` actors, by rank, each with the address it says it listens on."""
    joined: dict[int, tuple[socket.socket, str]] = {}
    while len(joined) < peers:
        listener.settimeout(max(deadline - time.monotonic(), 0.001))
        peer, _ = listener.accept()
        peer.settimeout(max(deadline - time.monotonic(), 0.001))
        rank, size = struct.unpack("<qq", _read(peer, 16))
        joined[rank] = peer, _read(peer, size).decode()
    return joined


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """A connection to the actor listening at ``host:port``. Every member listens before its port is handed out
    (rank 0 from :meth:`Group.address` on), so a refused connection means that actor's process is gone (or a
    firewall rejects the port): the join fails after :data:`REFUSED_GRACE_S` of refusals, not at the group's
    deadline, and the federation replaces the dead actor (or makes its exchanges by calls) at once."""
    refused_until = min(time.monotonic() + REFUSED_GRACE_S, deadline)
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001))
        except ConnectionRefusedError:
            if time.monotonic() > refused_until:
                raise
            time.sleep(0.02)


def _lengthed(data: bytes) -> bytes:
    return struct.pack("<q", len(data)) + data


class _Framed:
    """One message to read from a connection: its length (8 bytes), then the message, into a new buffer."""

    def __init__(self) -> None:
        self.length = bytearray(8)
        self.view = memoryview(self.length)
        self.message: memoryview | None = None

    @property
    def done(self) -> bool:
        return self.message is not None and not self.view

    def received(self) -> memoryview:
        assert self.message is not None and self.done
        return self.message

    def read(self, peer: socket.socket) -> bool:
        """Read what has arrived (the connection is non-blocking); whether anything had."""
        moved = False
        while not self.done:
            if not self.view:  # the length is in
                (size,) = struct.unpack("<q", self.length)
                self.message = self.view = _fresh(size)
                continue
            try:
                got = peer.recv_into(self.view)
            except BlockingIOError:  # nothing more yet
                return moved
            if got == 0:
                raise ConnectionError("another actor left the group")
            self.view, moved = self.view[got:], True
        return moved


class _Into(_Framed):
    """Bytes to read from a connection into a given buffer (its size known to both ends)."""

    def __init__(self, into: memoryview) -> None:
        self.length = bytearray(0)
        self.message = self.view = into


def _move(
    outgoing: dict[socket.socket, list[memoryview]], incoming: dict[socket.socket, _Framed], timeout: float | None
) -> dict[socket.socket, _Framed]:
    """Write every connection its parts while reading what each is to bring (``incoming``), all at once: no end waits
    for another to finish writing, whatever the sizes (non-blocking writes and reads; one ``poll`` when nothing
    moved). Each wait lasts at most ``timeout``, as a blocking read's would. Returns ``incoming``, read."""
    sockets = list(dict.fromkeys([*outgoing, *incoming]))
    for peer in sockets:
        peer.setblocking(False)
    try:
        while True:
            moved = False
            for peer in sockets:
                parts = outgoing.get(peer)
                if parts:
                    try:
                        _advance(parts, peer.sendmsg(parts))
                        moved = True
                    except BlockingIOError:
                        pass
                reading = incoming.get(peer)
                if reading is not None and not reading.done:
                    moved = reading.read(peer) or moved
            waiting = {peer: (select.POLLOUT if outgoing.get(peer) else 0)
                       | (select.POLLIN if peer in incoming and not incoming[peer].done else 0) for peer in sockets}
            if not any(waiting.values()):
                return incoming
            if not moved:
                poller = select.poll()
                for peer, events in waiting.items():
                    if events:
                        poller.register(peer, events)
                if not poller.poll(None if timeout is None else timeout * 1000):
                    raise TimeoutError("timed out")
    finally:
        for peer in sockets:
            peer.settimeout(timeout)


def _advance(parts: list[memoryview], sent: int) -> None:
    """Drop the ``sent`` bytes from the front of ``parts``."""
    while parts and sent >= parts[0].nbytes:
        sent -= parts.pop(0).nbytes
    if sent:
        parts[0] = parts[0][sent:]


def _fresh(size: int) -> memoryview:
    return np.empty(size, np.uint8).data


def _read(peer: socket.socket, size: int) -> bytearray:
    """Exactly ``size`` bytes; a closed connection is a :class:`ConnectionError`."""
    data = bytearray(size)
    _read_into(peer, memoryview(data))
    return data


def _read_into(peer: socket.socket, view: memoryview) -> None:
    """Fill ``view`` (bytes) from ``peer``; a closed connection is a :class:`ConnectionError`."""
    got, size = 0, view.nbytes
    while got < size:
        n = peer.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("another actor left the group")
        got += n


def _fingerprint(layout: Layout) -> float:
    """A float that tells layouts apart (a CRC-32 of their names and sizes, exact in a float64 row)."""
    return _crc(layout.keys, layout.sizes)


@functools.lru_cache(maxsize=256)
def _crc(keys: tuple[str, ...], sizes: tuple[int, ...]) -> float:
    return float(zlib.crc32(repr((keys, sizes)).encode()))


def run_exchange(
    host: ClientHost, group: Group, program: str, round: int, cohort: Sequence[int], payload: np.ndarray,
    layout: Layout, sub: int, steps: int, at_step: Callable[[int], None],
) -> tuple[Partial | None, History]:
    """Run the generator program for this host's ``cohort`` (possibly none) through ``steps`` answers formed in
    ``group``; ``at_step(k)`` is called before step k (0: the start; for fault injection). Returns the final
    partial sums (None without members) and each step's means."""
    history: History = []
    partial: Partial | None = None
    if cohort:
        at_step(0)
        partial = host.begin(program, round, cohort, payload, layout, sub)
    for step in range(steps):
        if partial is None:  # no members here: this actor only takes part in the gathers
            group.mean(0, None)
            continue
        means = group.mean(partial.clients, partial.sums)
        history.append((partial.layout, means))
        at_step(step + 1)
        partial = host.resume(means, partial.layout, last=step == steps - 1)
    return partial, history
