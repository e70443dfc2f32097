"""Exchanges averaged among the client actors themselves (``federation.transport: collective``).

FedDRO's round answers every local step of its clients with the cohort mean of one small value
(``fed.exchange``). By calls, each step is a round trip from the server to the actors and back (a millisecond or
more of Ray's task machinery); through a compiled graph, its idle readers poll their channels, which costs the
clients' compute its cores where cores are few. Here the server sends the whole exchange to every client actor in
one call, and the actors, joined in one group (:class:`Group`: TCP connections to actor 0, so across nodes too),
answer each step among themselves: every actor's float64 partial sums reach every other (a waiting actor blocks in
a socket read, it does not poll) and each forms the cohort mean itself with the server's own
function, in actor order (:func:`~fedcomp.platform.federation.mean_of`), so each actor's answer has the bits the
server's would have. Each actor returns its final partial sums and the means it formed at each step, which the
server counts as the exchange's steps. Actors without cohort members take part with nothing to add.

When an actor dies or raises mid-exchange, its process or its group is gone, and every other actor's next gather
fails at once (it reads the end of a socket) with :class:`GroupBroken`; the federation then replaces the dead
actors, rebuilds the group at its next use and runs again, by calls, what did not finish
(:meth:`fedcomp.actors.federation.RayFederation.exchange`). Actors that cannot meet at the rendezvous (a
firewall between nodes, say) make the run's exchanges by calls, after one warning.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import ray

from fedcomp.platform.federation import ClientHost, Layout, Partial, mean_of

JOIN_TIMEOUT_S = 20.0
"""How long the actors wait for each other at the group's rendezvous and for their connections (e.g. a cluster
whose firewall blocks the ports): the federation then makes its exchanges by calls."""
FAULT_JOIN = "FEDCOMP_FAULT_GROUP_JOIN"
"""Fault injection for the tests: when set in a client actor's environment, joining the group fails."""
HEADER = 6
"""Floats in front of each actor's row in a gather: its clients, the number of floats it sends after the header, and
for a whole partial (:meth:`Group.partials`) its samples, whether it kept private state, its layout's fingerprint
and how many of its floats are the clients' losses (zeros for a bare mean)."""

History = list[tuple[Layout, np.ndarray]]
"""Each step's cohort means as one actor formed them: their layout and the float32 values."""


class GroupBroken(RuntimeError):
    """A gather of the exchange failed: another actor of the group died or left it (after an error of its own)."""


class Group:
    """This process's membership of the client actors' group: a star of TCP connections to actor 0.

    An exchange sends this actor's row (float64) to actor 0, which sends every actor the rows of all, in actor
    order. Each message is one blocking socket write and read on the caller's thread (TCP_NODELAY): a gloo
    ``all_gather`` between two actors, which hands every message to worker threads, took 0.7 ms idle on a 2-core
    machine (``benchmarks/RAY_DAG.md``). A peer that dies or leaves closes its sockets, so the others' next read
    fails at once; every read waits at most the group's deadline."""

    def __init__(self) -> None:
        self.world = 0
        self.rank = 0
        self.peers: list[socket.socket] = []
        """Actor 0: its connections to actors 1, 2, ... in order; any other actor: its connection to actor 0."""
        self.layouts: dict[float, Layout] = {}
        """Layouts of partials gathered since the group formed, by fingerprint (the same on every actor)."""

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
        self.world, self.rank, self.peers, self.layouts = world, rank, peers, {}

    def leave(self) -> None:
        """Leave the group (the other actors' next read then fails at once)."""
        for peer in self.peers:
            peer.close()
        self.peers, self.world = [], 0

    @property
    def joined(self) -> bool:
        return self.world > 0

    def mean(self, clients: int, sums: np.ndarray | None) -> np.ndarray:
        """The cohort mean (float32) of every actor's partial ``sums`` over its ``clients`` (0 and None for an actor
        without members this time), formed in actor order.

        Raises:
            GroupBroken: another actor of the group is gone.
            RuntimeError: the actors' yields differ in size (a program out of step with itself).
        """
        size = 0 if sums is None else int(sums.size)
        rows = self._rows((clients, size, 0, 0, 0, 0), sums)
        members = [row for row in rows if row[0] > 0]
        widths = sorted({int(row[1]) for row in members})
        if len(widths) > 1:
            raise RuntimeError(f"exchange out of step: the actors yielded {widths} floats")
        width = widths[0]
        return mean_of((row[HEADER:HEADER + width] for row in members), int(sum(row[0] for row in members)), width)

    def partials(self, mine: Partial | None) -> list[Partial | None]:
        """Every actor's whole partial -- sums, clients, samples, each client's loss, whether it kept private state --
        in actor order (None for an actor without members this time, as ``mine`` is then), so that every actor can
        :func:`~fedcomp.platform.federation.combine` them as the server would. One exchange; a layout no actor has
        seen since the group formed travels once more, by pickle, and is known by its fingerprint from then on (the
        decision is made from exchanged rows alone, so every actor makes it alike).

        Raises:
            GroupBroken: another actor of the group is gone.
        """
        head: tuple[float, ...] = (0, 0, 0, 0, 0, 0)
        body = None
        if mine is not None:
            body = np.concatenate([np.asarray(mine.losses, np.float64), mine.sums])
            head = (mine.clients, body.size, mine.samples, float(mine.has_private), _fingerprint(mine.layout), len(mine.losses))
        rows = self._rows(head, body)
        if any(row[0] > 0 and row[4] not in self.layouts for row in rows):
            self._learn_layouts(None if mine is None else mine.layout)
        out: list[Partial | None] = []
        for row in rows:
            if row[0] <= 0:
                out.append(None)
                continue
            width, losses = int(row[1]), int(row[5])
            out.append(Partial(
                self.layouts[float(row[4])], row[HEADER + losses:HEADER + width], int(row[0]), int(row[2]),
                has_private=bool(row[3]), losses=tuple(row[HEADER:HEADER + losses].tolist()),
            ))
        return out

    def _learn_layouts(self, mine: Layout | None) -> None:
        """Every actor's layout of this exchange (pickled; None from those without members), kept by fingerprint."""
        layouts = [pickle.loads(blob) for blob in self._exchange(pickle.dumps(mine))]
        self.layouts.update({_fingerprint(lay): lay for lay in layouts if lay is not None})

    def _rows(self, head: tuple[float, ...], body: np.ndarray | None) -> list[np.ndarray]:
        """Every actor's row (``head``, then ``body``), in actor order: float64 arrays of their own."""
        row = np.empty(HEADER + (0 if body is None else body.size), np.float64)
        row[:HEADER] = head
        if body is not None:
            row[HEADER:] = body
        return [np.frombuffer(blob, np.float64) for blob in self._exchange(row.data.cast("B"))]

    def _exchange(self, message: bytes | memoryview) -> list[bytearray]:
        """Every actor's ``message``, in actor order: sent to actor 0, which sends all of them to everyone.

        Raises:
            GroupBroken: another actor of the group is gone (or did not answer within the deadline); this one then
                leaves the group too.
        """
        try:
            if self.rank != 0:
                _send(self.peers[0], [message])
                return [_receive(self.peers[0]) for _ in range(self.world)]
            messages = [bytearray(message), *(_receive(peer) for peer in self.peers)]
            for peer in self.peers:
                _send(peer, messages)
            return messages
        except (OSError, ConnectionError) as error:
            self.leave()  # so that the others' exchanges fail at once too
            reason = "timed out" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
            raise GroupBroken(f"an exchange of the actors' group failed: {reason[:160]}") from None


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


def _send(peer: socket.socket, messages: Sequence[bytes | bytearray | memoryview]) -> None:
    """Messages, each after its length (8 bytes)."""
    parts: list[bytes | bytearray | memoryview] = []
    for message in messages:
        parts += [struct.pack("<q", len(message)), message]
    if sum(len(p) for p in parts) < 65536:
        peer.sendall(b"".join(parts))  # one segment: a small copy, not one write per part
        return
    for part in parts:  # no copy of a large message
        peer.sendall(part)


def _receive(peer: socket.socket) -> bytearray:
    """One message (after its length)."""
    (size,) = struct.unpack("<q", _read(peer, 8))
    return _read(peer, size)


def _read(peer: socket.socket, size: int) -> bytearray:
    """Exactly ``size`` bytes; a closed connection is a :class:`ConnectionError`."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = peer.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("another actor left the group")
        got += n
    return data


def _fingerprint(layout: Layout) -> float:
    """A float that tells layouts apart (a CRC-32 of their names and sizes, exact in a float64 row)."""
    return float(zlib.crc32(repr((layout.keys, layout.sizes)).encode()))


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
