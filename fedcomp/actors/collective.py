"""Exchanges averaged among the client actors themselves (``federation.transport: collective``).

FedDRO's round answers every local step of its clients with the cohort mean of one small value
(``fed.exchange``). By calls, each step is a round trip from the server to the actors and back (a millisecond or
more of Ray's task machinery); through a compiled graph, its idle readers poll their channels, which costs the
clients' compute its cores where cores are few. Here the server sends the whole exchange to every client actor in
one call, and the actors, joined in one group (:class:`Group`: TCP connections to actor 0, so across nodes too),
answer each step among themselves: every actor's float64 partial sums go to actor 0 (a waiting actor blocks in a
socket read, it does not poll), which forms the cohort mean with the server's own function, in actor order
(:func:`~fedcomp.platform.federation.mean_of`), and sends it to every actor, so each actor's answer has the bits the
server's would have. Each actor returns its final partial sums and the means it formed at each step, which the
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

from fedcomp.platform.algorithms.base import Outcome
from fedcomp.platform.federation import MEAN_BLOCK, Averages, ClientHost, Layout, Partial, mean_of

JOIN_TIMEOUT_S = 20.0
"""How long the actors wait for each other at the group's rendezvous and for their connections (e.g. a cluster
whose firewall blocks the ports): the federation then makes its exchanges by calls."""
FAULT_JOIN = "FEDCOMP_FAULT_GROUP_JOIN"
"""Fault injection for the tests: when set in a client actor's environment, joining the group fails."""
HEADER = 7
"""Floats in front of each actor's row head in a gather: its clients, the floats in its body (the sums), and for a
whole partial (:meth:`Group.combined`) its samples, whether it kept private state, its layout's fingerprint, how
many clients' losses follow in the head and the seconds it worked on the call (zeros for a bare mean)."""

ANSWER = 5
"""Floats in front of actor 0's answer to a :meth:`Group.combined` (its header): the cohort's clients and samples,
the mean loss, the most seconds an actor worked on the call and the layout's fingerprint; then one float for each
actor, whether it kept private state; then, the first time a layout is answered, the layout, pickled."""

PIPELINED_FLOATS = 262_144
"""Sums from this many floats on (2 MiB of float64) are averaged as they arrive: actor 0 forms and sends the means
of each block of :data:`~fedcomp.platform.federation.MEAN_BLOCK` floats as soon as every actor's sums of that block
are in, while the rest are still on their way, and the other actors send their sums and read the means at once
(:func:`_duplex`). Smaller exchanges are a few messages each way, which blocking reads and writes make at the
least latency."""

Row = tuple[np.ndarray, np.ndarray, bytes]
"""One actor's contribution to an exchange as actor 0 sees it: head (counts, then losses), body (float64 sums; another
actor's sums averaged block by block as they arrived are :data:`NOT_KEPT`), extra."""
NOT_KEPT = np.zeros(0, np.float64)
Message = bytes | np.ndarray
"""What goes over a connection after its length: bytes, or an array's memory as it is."""
Plan = tuple[bytes, list[int], int, int]
"""What actor 0 makes of the rows' heads before their sums are in: an error (empty when none), which rows' sums make
the mean (in actor order), over how many clients, and how many floats it has."""
History = list[tuple[Layout, np.ndarray]]
"""Each step's cohort means as one actor formed them: their layout and the float32 values."""


class GroupBroken(RuntimeError):
    """A gather of the exchange failed: another actor of the group died or left it (after an error of its own)."""


class Group:
    """This process's membership of the client actors' group: a star of TCP connections to actor 0.

    An exchange sends this actor's row (float64 partial sums) to actor 0, which forms the result from all of them in
    actor order, as the server would, and sends it to every actor. Each message is one blocking socket write and read
    on the caller's thread (TCP_NODELAY): a gloo
    ``all_gather`` between two actors, which hands every message to worker threads, took 0.7 ms idle on a 2-core
    machine (``benchmarks/RAY_DAG.md``). Large sums (:data:`PIPELINED_FLOATS`) are averaged block by block as they
    arrive, actor 0 sending each block's means at once, and the other actors write their sums and read the means
    at the same time: the means come back while the sums are still going up. A peer that dies or leaves closes its
    sockets, so the others' next read fails at once; every read waits at most the group's deadline."""

    def __init__(self) -> None:
        self.world = 0
        self.rank = 0
        self.peers: list[socket.socket] = []
        """Actor 0: its connections to actors 1, 2, ... in order; any other actor: its connection to actor 0."""
        self.layouts: dict[float, Layout] = {}
        """The layouts this actor knows since the group formed, by fingerprint: its own, and on actor 0 those the
        actors have sent it, elsewhere those actor 0 has told."""
        self.sent: set[float] = set()
        """The fingerprints of the layouts this actor has sent actor 0 since the group formed."""
        self.told: set[float] = set()
        """Actor 0: the fingerprints of the layouts its answers have carried to every actor since the group formed."""
        self.buffers: dict[int, np.ndarray] = {}
        """Actor 0: for each other actor, the buffer its rows' bodies are read into (kept: no fresh pages per call)."""

    def _scratch(self, peer: int, size: int) -> memoryview:
        """Actor 0's buffer for ``size`` bytes of the body of actor ``peer + 1``'s row (valid until the next gather)."""
        buffer = self.buffers.get(peer)
        if buffer is None or buffer.size < size:
            buffer = self.buffers[peer] = np.empty(size, np.uint8)
        return buffer.data[:size]

    @staticmethod
    def address() -> str:
        """A rendezvous address on this actor's node (a port free now) for the group's rank 0."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def join(self, address: str, rank: int, world: int, timeout_s: float) -> None:
        """Join the group of ``world`` actors as ``rank`` (leaving any group this process was in); returns once all
        have joined, or raises when they have not met at ``address`` within :data:`JOIN_TIMEOUT_S`. A gather waits
        at most ``timeout_s`` for the others."""
        self.leave()
        if os.environ.get(FAULT_JOIN):
            raise RuntimeError(f"{FAULT_JOIN} is set (fault injection)")
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        peers: list[socket.socket] = []
        try:
            if rank == 0:
                peers = _accept(int(port), world - 1, deadline)
            else:
                peers = [_connect(host, int(port), rank, deadline)]
            for peer in peers:
                peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if rank == 0:  # everyone is in: say so, so that no one starts before all have joined
                for peer in peers:
                    peer.sendall(b"J")
            elif _read(peers[0], 1) != b"J":
                raise ConnectionError("the group's rank 0 answered the rendezvous wrongly")
        except (OSError, ConnectionError) as error:
            for peer in peers:
                peer.close()
            raise RuntimeError(f"the actors did not meet at {address} within {JOIN_TIMEOUT_S:g}s ({error})") from None
        for peer in peers:
            peer.settimeout(timeout_s)
        self.world, self.rank, self.peers, self.layouts, self.sent, self.told = world, rank, peers, {}, set(), set()

    def leave(self) -> None:
        """Leave the group (the other actors' next read then fails at once)."""
        for peer in self.peers:
            peer.close()
        self.peers, self.world, self.buffers = [], 0, {}

    @property
    def joined(self) -> bool:
        return self.world > 0

    def mean(self, clients: int, sums: np.ndarray | None) -> np.ndarray:
        """The cohort mean (float32) of every actor's partial ``sums`` over its ``clients`` (0 and None for an actor
        without members this time), formed by actor 0 in actor order with the server's own function and sent to all.

        Raises:
            GroupBroken: another actor of the group is gone.
            RuntimeError: the actors' yields differ in size (a program out of step with itself).
        """
        size = 0 if sums is None else int(sums.size)
        head = _head((clients, size, 0, 0, 0, 0, 0), ())

        def plan(rows: list[Row]) -> Plan:
            members = [i for i, (h, _, _) in enumerate(rows) if h[0] > 0]
            widths = sorted({int(rows[i][0][1]) for i in members})
            if len(widths) > 1:
                return f"exchange out of step: the actors yielded {widths} floats".encode(), [], 0, 0
            return b"", members, int(sum(rows[i][0][0] for i in members)), widths[0]

        error, means = self._at_root(head, sums, b"", plan, lambda rows, means, error: error)
        if error:
            raise RuntimeError(error.decode())
        return means

    def combined(self, mine: Partial | None, floats_down: int, busy_s: float = 0.0) -> tuple[Outcome, list[bool], float]:
        """What the server's :func:`~fedcomp.platform.federation.combine` makes of every actor's partial (``mine``:
        this actor's, None without members this time): averaged by actor 0 in actor order
        (:class:`~fedcomp.platform.federation.Averages`) and sent to every actor, so all hold the same bits; with
        whether each actor kept private state, and the most seconds any actor says it worked on the call
        (``busy_s``: the slowest actor's compute, for the profile). A layout travels to actor 0 once (pickled, with
        the first partial of its shape each actor sends), and back to every actor with the first answer in it (so that
        actors without members can unpack the means), and is known by its fingerprint from then on: an answer's
        header is a few floats (:data:`ANSWER`), not a pickle.

        Raises:
            GroupBroken: another actor of the group is gone.
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
                layout = pickle.dumps(mine.layout) if self.rank else b""  # actor 0 knows its own
                self.sent.add(fingerprint)
                self.layouts[fingerprint] = mine.layout

        def plan(rows: list[Row]) -> Plan:
            members = [i for i, (h, _, _) in enumerate(rows) if h[0] > 0]
            return b"", members, int(sum(rows[i][0][0] for i in members)), int(rows[members[0]][0][1])

        def answer(rows: list[Row], means: np.ndarray, error: bytes) -> bytes:
            self.layouts.update({_fingerprint(lay): lay for lay in (pickle.loads(b) for _, _, b in rows if b)})
            members = [(h, body) for h, body, _ in rows if h[0] > 0]
            fingerprint = float(members[0][0][4])
            averages = Averages.of([_partial(h, body, self.layouts[float(h[4])]) for h, body in members], means)
            counts = [averages.clients, averages.samples, averages.loss, max(float(h[6]) for h, _, _ in rows),
                      fingerprint, *(h[3] for h, _, _ in rows)]
            told = b""
            if fingerprint not in self.told:
                told = pickle.dumps(averages.layout)
                self.told.add(fingerprint)
            return np.array(counts, np.float64).tobytes() + told

        header, means = self._at_root(head, body, layout, plan, answer)
        counts = np.frombuffer(header, np.float64, count=ANSWER + self.world)
        fingerprint = float(counts[4])
        if len(header) > counts.nbytes:
            self.layouts.setdefault(fingerprint, pickle.loads(header[counts.nbytes:]))
        averages = Averages(self.layouts[fingerprint], means, int(counts[0]), int(counts[1]), float(counts[2]))
        return averages.outcome(floats_down), [bool(f) for f in counts[ANSWER:]], float(counts[3])

    def _at_root(
        self, head: np.ndarray, body: np.ndarray | None, extra: bytes, plan: Callable[[list[Row]], Plan],
        answer: Callable[[list[Row], np.ndarray, bytes], bytes],
    ) -> tuple[bytes, np.ndarray]:
        """Every actor's row -- ``head``, ``extra`` bytes and ``body`` (float64 sums) -- goes to actor 0, which
        ``plan``s the mean from the heads, forms it (:func:`~fedcomp.platform.federation.mean_of`, in actor order) and
        sends every actor the float32 means, then the header ``answer`` encodes from the rows and the means. Sums of
        :data:`PIPELINED_FLOATS` or more are averaged block by block as they arrive. Nothing is copied on the way out
        (gathering writes); actor 0 reads each actor's sums into a buffer it keeps for that actor, and the means are
        read into a new array, since they become the caller's tensors.

        Raises:
            GroupBroken: another actor of the group is gone (or did not answer within the deadline); this one then
                leaves the group too.
        """
        body = np.zeros(0, np.float64) if body is None else np.ascontiguousarray(body, np.float64)
        try:
            if self.rank != 0:
                peer, row = self.peers[0], list[Message]([head, extra, body])
                if body.size >= PIPELINED_FLOATS:
                    values, told = _duplex(peer, row)
                else:
                    _send(peer, row)
                    values, told = _receive(peer, _fresh), _receive(peer)
                return bytes(told), np.frombuffer(values, np.float32)
            rows: list[Row] = [(head, body, extra)]
            sizes: list[int] = []
            for peer in self.peers:
                their_head, their_extra = np.frombuffer(_receive(peer), np.float64), bytes(_receive(peer))
                sizes.append(struct.unpack("<q", _read(peer, 8))[0])
                rows.append((their_head, NOT_KEPT, their_extra))
            error, members, clients, size = plan(rows)
            means = np.empty(0 if error else size, np.float32)
            answered: list[Message] = []  # what each actor still gets before the header
            if error or size < PIPELINED_FLOATS or any(n not in (0, 8 * size) for n in sizes):
                for i, (peer, n) in enumerate(zip(self.peers, sizes)):
                    view = self._scratch(i, n)
                    _read_into(peer, view)
                    rows[i + 1] = (rows[i + 1][0], np.frombuffer(view, np.float64), rows[i + 1][2])
                if not error:
                    mean_of((rows[i][1] for i in members), clients, size, means)
                answered = [means]  # in one write with the header: the others wake once
            else:  # each peer's blocks are read into the same few hundred kilobytes, still in cache when averaged
                blocks = [np.frombuffer(self._scratch(i, 8 * MEAN_BLOCK), np.float64) for i in range(len(self.peers))]
                for peer in self.peers:
                    peer.sendall(struct.pack("<q", means.nbytes))
                for start in range(0, size, MEAN_BLOCK):
                    end = min(start + MEAN_BLOCK, size)
                    for peer, n, block in zip(self.peers, sizes, blocks):
                        if n:
                            _read_into(peer, block[:end - start].data.cast("B"))
                    sums = (body[start:end] if i == 0 else blocks[i - 1][:end - start] for i in members)
                    mean_of(sums, clients, end - start, means[start:end])
                    for peer in self.peers:
                        peer.sendall(means[start:end].data.cast("B"))
            header = answer(rows, means, error)
            for peer in self.peers:
                _send(peer, [*answered, header])
            return header, means
        except (OSError, ConnectionError) as error:
            self.leave()  # so that the others' exchanges fail at once too
            reason = "timed out" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
            raise GroupBroken(f"an exchange of the actors' group failed: {reason[:160]}") from None


def _head(counts: tuple[float, ...], losses: Sequence[float]) -> np.ndarray:
    """An actor's row head: ``counts`` (:data:`HEADER` floats), then its clients' losses."""
    return np.array([*counts, *losses], np.float64)


def _partial(head: np.ndarray, body: np.ndarray, layout: Layout) -> Partial:
    """The partial an actor's row (from :meth:`Group.combined`) holds (its sums a view of ``body``)."""
    losses = int(head[5])
    return Partial(layout, body, int(head[0]), int(head[2]), has_private=bool(head[3]),
                   losses=tuple(head[HEADER:HEADER + losses].tolist()))


def _accept(port: int, peers: int, deadline: float) -> list[socket.socket]:
    """Actor 0's end of the rendezvous: a connection from each of the other actors, in their order."""
    with socket.create_server(("", port)) as listener:
        joined: dict[int, socket.socket] = {}
        while len(joined) < peers:
            listener.settimeout(max(deadline - time.monotonic(), 0.001))
            peer, _ = listener.accept()
            peer.settimeout(max(deadline - time.monotonic(), 0.001))
            joined[struct.unpack("<q", _read(peer, 8))[0]] = peer
    return [joined[rank] for rank in sorted(joined)]


def _connect(host: str, port: int, rank: int, deadline: float) -> socket.socket:
    """Another actor's end of the rendezvous: a connection to actor 0 (retried until it listens), naming its rank."""
    while True:
        try:
            peer = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    peer.sendall(struct.pack("<q", rank))
    return peer


def _send(peer: socket.socket, messages: Sequence[Message]) -> None:
    """Messages, each after its length (8 bytes), in gathering writes: no copy of a large message."""
    parts = _framed(messages)
    while parts:
        _advance(parts, peer.sendmsg(parts))


def _framed(messages: Sequence[Message]) -> list[memoryview]:
    """The messages' bytes, each after its length (8 bytes), as views for a gathering write."""
    parts: list[memoryview] = []
    for message in messages:
        view = (memoryview(message) if isinstance(message, bytes) else message.data).cast("B")
        parts += [memoryview(struct.pack("<q", view.nbytes)), view]
    return parts


def _advance(parts: list[memoryview], sent: int) -> None:
    """Drop the ``sent`` bytes from the front of ``parts``."""
    while parts and sent >= parts[0].nbytes:
        sent -= parts.pop(0).nbytes
    if sent:
        parts[0] = parts[0][sent:]


def _duplex(peer: socket.socket, messages: Sequence[Message]) -> tuple[memoryview, memoryview]:
    """Send ``messages`` (framed as :func:`_send` frames them) while reading the answer's two messages, the means
    (into a new buffer) and then the header: actor 0 sends a large exchange's means block by block while sums are still
    on their way (:data:`PIPELINED_FLOATS`), so neither end may wait for the other to finish. Each wait for the
    connection lasts at most its timeout, as a blocking read's would."""
    timeout = peer.gettimeout()
    parts, received = _framed(messages), list[memoryview]()
    length = bytearray(8)
    view = message = memoryview(length)
    in_length = True
    poller = select.poll()
    peer.setblocking(False)
    try:
        while parts or len(received) < 2:
            moved = False
            if parts:
                try:
                    _advance(parts, peer.sendmsg(parts))
                    moved = True
                except BlockingIOError:
                    pass
            while len(received) < 2:
                if not view:  # a length or a message is complete
                    if in_length:
                        (size,) = struct.unpack("<q", length)
                        message = _fresh(size) if not received else memoryview(bytearray(size))
                        view, in_length = message, False
                    else:
                        received.append(message)
                        view, in_length = memoryview(length), True
                    continue
                try:
                    got = peer.recv_into(view)
                except BlockingIOError:
                    break
                if got == 0:
                    raise ConnectionError("another actor left the group")
                view, moved = view[got:], True
            if not moved:
                poller.register(peer, (select.POLLOUT if parts else 0) | (select.POLLIN if len(received) < 2 else 0))
                if not poller.poll(None if timeout is None else timeout * 1000):
                    raise TimeoutError("timed out")
    finally:
        peer.settimeout(timeout)
    return received[0], received[1]


def _fresh(size: int) -> memoryview:
    return np.empty(size, np.uint8).data


def _receive(peer: socket.socket, buffer: Callable[[int], memoryview] | None = None) -> memoryview:
    """One message (after its length), read into ``buffer(size)`` (default: a new ``bytearray``)."""
    (size,) = struct.unpack("<q", _read(peer, 8))
    view = memoryview(bytearray(size)) if buffer is None else buffer(size)
    _read_into(peer, view)
    return view


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
