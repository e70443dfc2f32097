"""Which client actor runs which cohort member of a federation call.

Every actor holds the whole task, so any actor can run any client; what ties a client to one actor is its
private state (control variates, a previous iterate, BatchNorm running statistics), which lives in the host
that last ran it. Routing a cohort by home actor alone leaves the actors unevenly loaded: a cohort of 10 drawn
from 100 clients in 2 actors puts 5.65 on the busier actor on average, and a round waits for its busiest
actor. So, with ``federation.routing: balanced``:

* a client whose private state is on record runs where that state is;
* a program is *free* once a call of it left no private state for any client (learned from the replies: the
  first call of each program goes by home actor, which is always safe);
* each other member of a free program's cohort goes to a least loaded actor, the first one from a cursor
  that goes round the actors across calls: the loads differ by at most one when nothing is pinned, and a
  cohort smaller than the number of actors does not always land on the same few actors (with one client per
  actor on a multi-node cluster those could all be on one node).

The numbers do not depend on the routing: every draw is keyed by (seed, client, step), a client's start is
its own private state or the broadcast, and the partial sums are exact float64 sums combined in actor order
-- the same property that makes the packing (``clients_per_actor``) invisible in the results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class Router:
    """Assigns cohort members to actors and tracks where each client's private state is."""

    def __init__(self, groups: Sequence[Sequence[int]], routing: str = "balanced") -> None:
        self.actors = len(groups)
        self.home = {c: i for i, group in enumerate(groups) for c in group}
        self.routing = routing
        self.holder: dict[int, int] = {}
        """Client -> the actor holding its private state (clients without private state are absent)."""
        self.free: set[str] = set()
        """Programs a call of which left no private state: their stateless members may run on any actor."""
        self.stateful: set[str] = set()
        """Programs a call of which left private state: their members run where their state will be."""
        self.next = 0
        """The actor the next free member goes to if it is among the least loaded (a cursor that goes round)."""

    def assign(self, program: str, cohort: Sequence[int]) -> dict[int, list[int]]:
        """Each actor's members of ``cohort`` (in cohort order) for a call of ``program``; moves the cursor on."""
        if self.routing == "home" or program not in self.free:
            return self._group({c: self.holder.get(c, self.home[c]) for c in cohort}, cohort)
        n = self.actors
        where = {c: self.holder[c] for c in cohort if c in self.holder}  # pinned: they cannot move
        if not where:  # the walk below when nothing is pinned, without its O(actors) scan per member
            start, self.next = self.next, (self.next + len(cohort)) % n
            return self._group({c: (start + k) % n for k, c in enumerate(cohort)}, cohort)
        load = [0] * n
        for i in where.values():
            load[i] += 1
        for c in cohort:
            if c not in where:
                least = min(load)
                i = next(j % n for j in range(self.next, self.next + n) if load[j % n] == least)
                where[c], self.next = i, (i + 1) % n
                load[i] += 1
        return self._group(where, cohort)

    @staticmethod
    def _group(where: Mapping[int, int], cohort: Sequence[int]) -> dict[int, list[int]]:
        members: dict[int, list[int]] = {}
        for c in cohort:
            members.setdefault(where[c], []).append(c)
        return members

    def learn(self, program: str, members: Mapping[int, Sequence[int]], left: Mapping[int, bool]) -> None:
        """Record a saving call's outcome: ``left[i]`` says whether actor ``i``'s members left private state there
        (then it holds them; else they have none anywhere now); ``program`` becomes free or stateful."""
        for i, clients in members.items():
            for c in clients:
                if left[i]:
                    self.holder[c] = i
                else:
                    self.holder.pop(c, None)
        if any(left.values()):
            self.stateful.add(program)
            self.free.discard(program)
        elif program not in self.stateful:
            self.free.add(program)

    def held_by(self, actor: int) -> list[int]:
        """The clients whose private state actor ``actor`` holds, in order."""
        return sorted(c for c, i in self.holder.items() if i == actor)

    def place(self, clients: Sequence[int]) -> dict[int, list[int]]:
        """Restored private states (all there are) go to their clients' home actors, which then hold them:
        actor -> clients."""
        self.holder = {}
        placed: dict[int, list[int]] = {}
        for c in sorted(clients):
            self.holder[c] = self.home[c]
            placed.setdefault(self.home[c], []).append(c)
        return placed
