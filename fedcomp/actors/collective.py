"""Exchanges averaged among the client actors themselves (``federation.transport: collective``).

FedDRO's round answers every local step of its clients with the cohort mean of one small value
(``fed.exchange``). By calls, each step is a round trip from the server to the actors and back (a millisecond or
more of Ray's task machinery); through a compiled graph, its idle readers poll their channels, which costs the
clients' compute its cores where cores are few. Here the server sends the whole exchange to every client actor in
one call, and the actors, joined in one torch.distributed process group (gloo, over TCP, so across nodes too),
answer each step among themselves: every actor sends its float64 partial sums to every other (``all_gather``; a
waiting actor blocks in a socket read, it does not poll) and forms the cohort mean itself with the server's own
function, in actor order (:func:`~fedcomp.platform.federation.mean_of`), so each actor's answer has the bits the
server's would have. Each actor returns its final partial sums and the means it formed at each step, which the
server counts as the exchange's steps. Actors without cohort members take part with nothing to add.

When an actor dies or raises mid-exchange, its process or its group is gone, and every other actor's next gather
fails at once (gloo reads the end of its socket) with :class:`GroupBroken`; the federation then replaces the dead
actors, rebuilds the group at its next use and runs again, by calls, what did not finish
(:meth:`fedcomp.actors.federation.RayFederation.exchange`). Actors that cannot meet at the rendezvous (a
firewall between nodes, say) make the run's exchanges by calls, after one warning.
"""

from __future__ import annotations

import datetime
import os
import socket
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import ray
import torch

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
    """This process's membership of the client actors' process group, and the buffers its gathers reuse."""

    def __init__(self) -> None:
        self.world = 0
        self.layouts: dict[float, Layout] = {}
        """Layouts of partials gathered since the group formed, by fingerprint (the same on every actor)."""
        self._resize(0)

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
        import torch.distributed as dist

        self.leave()
        if os.environ.get(FAULT_JOIN):
            raise RuntimeError(f"{FAULT_JOIN} is set (fault injection)")
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        store = dist.TCPStore(  # type: ignore[attr-defined]  # exported by torch.distributed, untyped there
            host, int(port), world, rank == 0, timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
        # connecting every pair waits as long as the rendezvous (a node whose hostname resolves to a loopback
        # address advertises one the others cannot reach: set GLOO_SOCKET_IFNAME there); gathers, the deadline
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
        dist.distributed_c10d.set_timeout(datetime.timedelta(seconds=timeout_s))
        self.world = world
        self.layouts = {}
        self._resize(0)

    def leave(self) -> None:
        """Leave the group (the other actors' gathers then fail at once)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self.world = 0

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
        members = rows[rows[:, 0] > 0]
        width = int(members[0, 1])
        if (members[:, 1] != width).any():
            raise RuntimeError(f"exchange out of step: the actors yielded {sorted(set(members[:, 1].astype(int)))} floats")
        return mean_of(members[:, HEADER:HEADER + width], int(members[:, 0].sum()), width)

    def partials(self, mine: Partial | None) -> list[Partial | None]:
        """Every actor's whole partial -- sums, clients, samples, each client's loss, whether it kept private state --
        in actor order (None for an actor without members this time, as ``mine`` is then), so that every actor can
        :func:`~fedcomp.platform.federation.combine` them as the server would. One gather; a layout no actor has
        seen since the group formed travels once more, by pickle, and is known by its fingerprint from then on (the
        decision is made from gathered rows alone, so every actor makes it alike).

        Raises:
            GroupBroken: another actor of the group is gone.
        """
        head: tuple[float, ...] = (0, 0, 0, 0, 0, 0)
        body = None
        if mine is not None:
            body = np.concatenate([np.asarray(mine.losses, np.float64), mine.sums])
            head = (mine.clients, body.size, mine.samples, float(mine.has_private), _fingerprint(mine.layout), len(mine.losses))
        rows = self._rows(head, body)
        members = np.flatnonzero(rows[:, 0] > 0)
        if any(rows[i, 4] not in self.layouts for i in members):
            self._learn_layouts(None if mine is None else mine.layout)
        out: list[Partial | None] = [None] * len(rows)
        for i in members.tolist():
            row = rows[i]
            width, losses = int(row[1]), int(row[5])
            out[i] = Partial(
                self.layouts[float(row[4])], row[HEADER + losses:HEADER + width].copy(), int(row[0]), int(row[2]),
                has_private=bool(row[3]), losses=tuple(row[HEADER:HEADER + losses].tolist()),
            )
        return out

    def _learn_layouts(self, mine: Layout | None) -> None:
        """Every actor's layout of this gather (pickled; None from those without members), kept by fingerprint."""
        import torch.distributed as dist

        layouts: list[Layout | None] = [None] * self.world
        try:
            dist.all_gather_object(layouts, mine)
        except RuntimeError as error:
            raise GroupBroken(f"a gather of layouts failed: {str(error).strip().splitlines()[0][:160]}") from None
        self.layouts.update({_fingerprint(lay): lay for lay in layouts if lay is not None})

    def _rows(self, head: tuple[float, ...], body: np.ndarray | None) -> np.ndarray:
        """Every actor's row, in actor order (gathered again, with room for the largest, when one outgrew them)."""
        size = int(head[1])
        rows = self._gather(head, body, size)
        largest = int(rows[:, 1].max())
        if largest > self.capacity:  # every actor sees it and gathers again with room for the largest
            self._resize(largest)
            rows = self._gather(head, body, size)
        return rows

    def _resize(self, capacity: int) -> None:
        """Rows (and this actor's own row) with room for ``capacity`` floats of partial sums (grown, for every actor
        at once, when a yield is larger)."""
        self.capacity = capacity
        self.rows = torch.zeros(self.world, HEADER + capacity, dtype=torch.float64)
        self.outputs = list(self.rows.unbind(0))
        self.mine = torch.zeros(HEADER + capacity, dtype=torch.float64)

    def _gather(self, head: tuple[float, ...], body: np.ndarray | None, size: int) -> np.ndarray:
        """Every actor's row (``head``, then ``body`` padded to the capacity), in actor order: a view of the buffer
        the next gather overwrites."""
        import torch.distributed as dist

        mine = self.mine.numpy()
        mine[:] = 0.0
        mine[:HEADER] = head
        if body is not None and size <= self.capacity:
            mine[HEADER:HEADER + size] = body
        try:
            dist.all_gather(self.outputs, self.mine)
        except RuntimeError as error:
            raise GroupBroken(f"an exchange's gather failed: {str(error).strip().splitlines()[0][:160]}") from None
        return self.rows.numpy()


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
