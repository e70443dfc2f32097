"""What one exchange of the client actors' group costs at a model's size, against the bare transfer of its bytes.

With ``federation.server: replicated`` (the default) every round ends with one exchange in the actors' group
(:meth:`fedcomp.actors.collective.Group.combined`): each actor sends its float64 partial sums to the other, and each
averages them in actor order (large sums are split: each actor averages half and sends the other its float32
means). This script times that exchange between two processes (the group is plain TCP on loopback, as between two
client actors on one node), for the partials of the small MLP 32-64-10, a 100k-float model and the heavy MLP
32-1024-1024-10, and side by side in the same processes the same bytes over the same connection with nothing else done: 8 bytes a float one way, then 4 back, read into
buffers allocated once (the same reference at every revision, whatever way the exchange takes). The ratio is what
the exchange pays over moving those bytes one way after the other; an exchange moves bytes both ways at once, and a
large one (``collective.SPLIT_FLOATS``) about half as many per actor, so it can come under that.

    python benchmarks/group_exchange.py [--exchanges 40] [--out benchmarks/GROUP_EXCHANGE.md]
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import socket
import statistics
import time
from typing import Any

import numpy as np
import torch

import common
from fedcomp.actors.collective import Group
from fedcomp.platform.federation import Layout, Partial

SIZES = {"small MLP 32-64-10": 2_762, "100k floats": 100_000, "heavy MLP 32-1024-1024-10": 1_093_642}
CLIENTS = 5
"""Cohort members per actor (10 clients per round over two actors, as in ``fedcomp bench``)."""
WARM_UP = 3


def _read_into(peer: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``peer`` (here, not the group's own helper, so that the floor is the same at every revision)."""
    while view:
        got = peer.recv_into(view)
        if not got:
            raise ConnectionError("the other member closed the connection")
        view = view[got:]


def _floor(group: Group, up: np.ndarray, down: np.ndarray) -> None:
    """The exchange's bytes and nothing else: 8 bytes a float to actor 0, 4 bytes a float back."""
    peer = group.peers[0]
    if group.rank != 0:
        peer.sendall(up.data.cast("B"))
        _read_into(peer, down.data.cast("B"))
    else:
        _read_into(peer, up.data.cast("B"))
        peer.sendall(down.data.cast("B"))


def _member(rank: int, rendezvous: Any, exchanges: int, sizes: list[int], out: Any) -> None:
    torch.set_num_threads(1)
    group = Group()
    if rank == 0:  # names the address, holding its port open until it joins (as the actors' rank 0 does)
        address = group.address()
        rendezvous.put(address)
    else:
        address = rendezvous.get(timeout=120.0)
    group.join(address, rank, 2, timeout_s=120.0)
    rng = np.random.default_rng(rank)
    times: dict[str, list[float]] = {}
    try:
        for size in sizes:
            layout = Layout.of({"x": torch.zeros(size)})
            partial = Partial(layout, rng.standard_normal(size), CLIENTS, 16 * CLIENTS, losses=(0.5,) * CLIENTS)
            up, down = np.ones(size, np.float64), np.ones(size, np.float32)
            ways = {"exchange": lambda: group.combined(partial, size), "floor": lambda: _floor(group, up, down)}  # noqa: B023
            for _ in range(WARM_UP):
                for run in ways.values():
                    run()
            for _ in range(exchanges):  # interleaved: the machine's load drifts alike for both
                for way, run in ways.items():
                    started = time.perf_counter()
                    run()
                    times.setdefault(f"{way} {size}", []).append(time.perf_counter() - started)
    finally:
        group.leave()
    out.put((rank, times))


def measure(exchanges: int, sizes: list[int]) -> dict[str, list[float]]:
    """Each timing's seconds, the slower member's per exchange (``"exchange SIZE"``, ``"floor SIZE"``)."""
    context = multiprocessing.get_context("spawn")
    out, rendezvous = context.Queue(), context.Queue()
    members = [context.Process(target=_member, args=(rank, rendezvous, exchanges, sizes, out)) for rank in (0, 1)]
    for member in members:
        member.start()
    results: dict[int, dict[str, list[float]]] = {}
    while len(results) < len(members):
        try:
            rank, times = out.get(timeout=1.0)
            results[rank] = times
        except queue.Empty:
            failed = [member.exitcode for member in members if member.exitcode]
            if failed:
                for member in members:
                    member.terminate()
                raise RuntimeError(f"a group member exited with {failed[0]} (its traceback is above)") from None
    for member in members:
        member.join()
    return {key: [max(a, b) for a, b in zip(results[0][key], results[1][key])] for key in results[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=40)
    parser.add_argument("--out", default=str(common.HERE / "GROUP_EXCHANGE.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as in the members, so that the report says what they ran with
    load_before = common.load_average()
    times = measure(args.exchanges, list(SIZES.values()))
    table = ["| partial | floats | exchange (ms, median) | bare transfer of its bytes (ms, median) | exchange / transfer |",
             "|---|---:|---:|---:|---:|"]
    for label, size in SIZES.items():
        exchange, floor = (statistics.median(times[f"{way} {size}"]) * 1e3 for way in ("exchange", "floor"))
        table.append(f"| {label} | {size:,} | {exchange:.2f} | {floor:.2f} | {exchange / floor:.2f}x |")
    intro = (
        f"{common.generated_by()}; load average before: {load_before}, after: {common.load_average()}. Two "
        f"processes in one group over loopback TCP, {CLIENTS} clients' partial each; median over {args.exchanges} "
        f"exchanges after {WARM_UP} warm-up ones, each the slower member's time, the exchange and the bare transfer "
        "interleaved. Bare transfer: the exchange's bytes (8 a float to actor 0, then 4 back) over the same "
        "connection into buffers allocated once; exchanges move bytes both ways at once, large ones about half as many "
        "per actor (split), so they can take less."
    )
    common.publish("\n".join(["# One exchange of the actors' group against the bare transfer of its bytes", "",
                              intro, "", *table]), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
