"""The driver's proxy to a server replicated on the client actors (``federation.server: replicated``).

The client actors join one process group and each builds a copy of the server (:mod:`fedcomp.actors.replicas`).
A run of rounds is one call to every actor; replica 0 streams each round's reply back as the round ends, and
the others answer once, at the end. Checkpoints gather the server state from replica 0 and each actor's clients'
private states; a restore goes to every replica.

Recovery is by chunks. The last checkpoint (or restore, or the start) is kept in the object store as the restore
point, put there by the driver -- its file content, which the driver holds anyway: an object a client actor made
lives on that actor's node, and would go with the node. When an actor dies mid-run, the others' next gather fails
at once (gloo reads the end of its socket); the dead actors are replaced, the group formed again, every replica
restored from the restore point, and the rounds since then run again -- the ones already handed to the caller
silently, without evaluations -- which gives the same numbers, since every random draw is keyed by (seed, client,
round, step).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from fedcomp.actors.cluster import connect, through_ray_client
from fedcomp.actors.federation import RayFederation, _cause, _death, unwrap
from fedcomp.actors.group_terms import GroupBroken
from fedcomp.platform.config import Config
from fedcomp.platform.errors import ClientFailure, first_line
from fedcomp.platform.server_like import RoundReply

T = TypeVar("T")


class GroupUnavailable(ClientFailure):
    """The server cannot be replicated on the client actors: they could not form their group (e.g. a firewall between
    nodes; they have been let go), or the driver reaches the cluster through a Ray Client (none started).
    :attr:`server` says where it runs instead."""

    def __init__(self, why: str, server: str = "driver") -> None:
        super().__init__(why)
        self.server = server
        """``driver`` (no process more to place: a Tune trial's bundles hold none for it), or ``actor`` for a Ray
        Client's driver: a server actor on the cluster runs the rounds without a round trip to the client (60 rounds
        of the quickstart 1.3-1.5x faster than in the driver through a loopback cluster's Ray Client)."""


class _Broken(Exception):
    """A run of rounds stopped because client actors died: actor -> how."""

    def __init__(self, dead: dict[int, str]) -> None:
        super().__init__(dead)
        self.dead = dead


class ReplicatedServer:
    """Driver-side proxy (:class:`~fedcomp.platform.server.ServerLike`) to the server replicated on the client actors."""

    def __init__(self, config: Config) -> None:
        connect(config.federation.ray_address, modules=config.modules())
        if through_ray_client():  # before any actor starts: the rounds come back as a stream, which it cannot wait on
            raise GroupUnavailable("a Ray Client connection (ray://) cannot wait on the replicas' streamed rounds", "actor")
        self.config = config
        self.actors = RayFederation(config)
        """The client actors (started, placed, replaced and closed as for the other Ray servers)."""
        self.round = 0
        """Rounds run and handed to the caller."""
        self.finite = True
        self.driver_s = 0.0
        self.round_seconds: list[float] = []
        """Each round's time in replica 0, from the end of the round before (its replies arrive in batches, so the
        time between two replies says little about one round)."""
        self.ahead = False
        """Whether the replicas may have run past :attr:`round`: a caller stopped taking a run's replies early, or the
        run failed. The next use brings them back (:meth:`_catch_up`)."""
        self.restore_point: Any = None
        """The object the replicas go back to after a failure: a checkpoint's file content or, after a restore, the
        checkpoint (never read here). The driver's own, in its node's object store: it outlives any worker node."""
        self.restore_round = 0
        try:
            self._form(range(len(self.actors.actors)))
            self._save({"rows": [], "wall_time": 0.0})
        except BaseException:
            self.actors.close()
            raise

    @property
    def timeout(self) -> float:
        return self.config.federation.actor_timeout_s

    def _form(self, new: Sequence[int]) -> None:
        """Join every actor in one process group, and build a replica of the server on the actors in ``new``.

        Raises:
            GroupUnavailable: the actors could not meet (:func:`fedcomp.backends.make_server` then runs a server actor).
            ClientFailure: an actor died while joining.
        """
        if not self.actors._join_group(warn=False):
            if self.actors.group_failed:
                raise GroupUnavailable(self.actors.group_failure)
            raise ClientFailure("federation.server = 'replicated': a client actor died while the actors formed their group")
        groups = self.actors.plan.groups
        self._get([self.actors.actors[i].replica_setup.remote(groups, i) for i in new])

    def _get(self, refs: list[Any]) -> list[Any]:
        """The actors' answers; an error one raised reaches the user as it was raised."""
        try:
            return list(ray.get(refs, timeout=self.timeout))
        except RayTaskError as error:
            raise unwrap(error) from None
        except RayActorError as error:
            raise ClientFailure(f"a client actor died ({first_line(error)})") from None
        except GetTimeoutError:
            raise ClientFailure(f"the client actors did not answer within {self.timeout:g}s") from None

    def run_round(self) -> dict[str, Any]:
        [(record, _, _)] = self.run_rounds([False])  # taken to the end: the other replicas' answers are read
        return record

    def run_rounds(self, evaluated: Sequence[bool]) -> Iterator[RoundReply]:
        """The rounds, every replica running them back to back; the replies as replica 0 sends them (every evaluated
        round, else every 0.1 s). The replicas run ahead of the caller; one that stops early finds the server at the
        round of the last reply it took when it next uses it (the replicas go back to the restore point and run the
        rounds since again: the same numbers)."""
        self._catch_up()
        evaluated = list(evaluated)
        done, skip, plan, retries = 0, 0, evaluated, 0
        try:
            while True:
                try:
                    for reply in self._stream(plan):
                        if skip:  # a round handed out before the retry, run again to catch up
                            skip -= 1
                            continue
                        done += 1
                        self.round += 1
                        yield self._take(reply)
                    return
                except _Broken as broken:
                    # a node that went took all its actors: the others' calls may have ended before they died
                    retries = self._recover({**self._dead(), **broken.dead}, retries)
                    skip = self.round - self.restore_round
                    plan = [False] * skip + evaluated[done:]
        finally:
            self.ahead = done < len(evaluated)  # stopped early (or failed): the replicas may be further on

    def _catch_up(self) -> None:
        """After a run the caller left early (:attr:`ahead`): every replica back to the restore point, and the rounds
        from there to :attr:`round` run again, unseen. The replicas' calls run in the order they were made, so the
        restore waits for the left run to end."""
        if not self.ahead:
            return
        self.ahead = False
        target, seconds = self.round, len(self.round_seconds)
        self._get([actor.replica_restore.remote(self.restore_point) for actor in self.actors.actors])
        self.round = self.restore_round
        try:
            for _ in self.run_rounds([False] * (target - self.round)):
                pass
        finally:  # failed: still ahead, and the caller's round is still the one it saw last
            self.round = target
            del self.round_seconds[seconds:]  # not rounds of the caller's

    def _stream(self, plan: list[bool]) -> Iterator[dict[str, Any]]:
        """Every replica runs ``plan``; replica 0's replies as they come (in batches: :data:`~fedcomp.actors.replicas.REPLY_EVERY_S`).

        Raises:
            _Broken: client actors died (the others' gathers failed).
            ClientFailure: no reply within the deadline, or the group broke with no actor dead.
        """
        lead, *others = self.actors.actors
        stream = lead.replica_rounds.remote(plan)
        rest = [actor.replica_follow.remote(plan) for actor in others]
        error: BaseException | None = None
        try:
            replied = 0
            while replied < len(plan):
                started = time.perf_counter()
                ready, _ = ray.wait([stream], timeout=self.timeout)
                if not ready:
                    raise ClientFailure(f"client actor 0 did not answer round {self.round + 1} within {self.timeout:g}s")
                batch = ray.get(next(stream))
                self.driver_s += time.perf_counter() - started
                replied += len(batch)
                yield from batch
        except (RayTaskError, RayActorError) as failed:
            error = failed
        outcomes: dict[int, BaseException | None] = {0: error}
        for i, ref in enumerate(rest, 1):
            try:
                ray.get(ref, timeout=self.timeout)
                outcomes[i] = None
            except (RayTaskError, RayActorError) as failed:
                outcomes[i] = failed
            except GetTimeoutError:
                raise ClientFailure(f"client actor {i} did not finish round {self.round + 1} within {self.timeout:g}s") from None
        self._raise_failures(outcomes)

    @staticmethod
    def _raise_failures(outcomes: dict[int, BaseException | None]) -> None:
        """Raise what the actors' runs met: an error a client program raised as it was raised; else the dead actors."""
        dead: dict[int, str] = {}
        for i, failure in sorted(outcomes.items()):
            if isinstance(failure, RayActorError):
                dead[i] = _death(failure)
            elif isinstance(failure, RayTaskError) and not isinstance(_cause(failure), GroupBroken):
                raise unwrap(failure) from None
        if dead:
            raise _Broken(dead)
        broken = [i for i, failure in outcomes.items() if failure is not None]
        if broken:
            raise ClientFailure(f"the client actors' group broke with no actor dead (actors {broken} stopped); see their errors above")

    def _recover(self, dead: dict[int, str], retries: int) -> int:
        """Replace the dead actors, form the group again and restore every replica from the restore point; an actor
        that dies meanwhile (one of the others, or a replacement as it starts) is replaced in turn. Each replacing
        counts against ``federation.max_retries`` (``retries`` of them spent already); returns those spent.

        Raises:
            ClientFailure: more deaths than ``federation.max_retries`` allows, or a failure with no actor dead.
        """
        first, replaced = len(self.actors.replacements), set[int]()
        while True:
            if retries == self.config.federation.max_retries:
                raise ClientFailure(f"client actors {sorted(dead)} died in round {self.round + 1}, after {retries} "
                                    f"replacing{'s' if retries != 1 else ''}; federation.max_retries = {retries}")
            retries += 1
            try:
                for i, reason in sorted(dead.items()):
                    self.actors._replace(i, self.round, reason)
                    replaced.add(i)
                self._form(sorted(replaced))
                self._get([actor.replica_restore.remote(self.restore_point) for actor in self.actors.actors])
                break
            except ClientFailure:
                dead = self._dead()
                if not dead:
                    raise
        for event in self.actors.replacements[first:]:
            event["rerun"] = f"restored every replica of the server to round {self.restore_round} and re-ran the rounds since"
        return retries

    def _dead(self) -> dict[int, str]:
        """The client actors whose process is gone, with why (each asked whether it is there)."""
        dead = {}
        for i, actor in enumerate(self.actors.actors):
            try:
                ray.get(actor.ready.remote(), timeout=self.timeout)
            except RayActorError as error:
                dead[i] = _death(error)
            except (RayTaskError, GetTimeoutError):
                continue  # there, if failing: not a death to replace
        return dead

    def _take(self, reply: dict[str, Any]) -> RoundReply:
        self.finite = reply["model_finite"]
        self.round_seconds.append(reply["round_s"])
        return reply["record"], reply["evaluation"], reply["evaluate_s"]

    def model_finite(self) -> bool:
        """Whether the global state was finite after the last round (checked in replica 0)."""
        return self.finite

    def take_replacements(self) -> list[dict[str, Any]]:
        return self.actors.take_replacements()

    def _surviving(self, read: Callable[[], T]) -> T:
        """``read()`` of the replicas' state at :attr:`round` (an evaluation, a checkpoint), done again where client
        actors died meanwhile -- between the rounds and the read, as a node that goes takes its actors and the calls
        that needed them: the dead are replaced, every replica restored to the restore point, and the rounds since
        run again before the read (the same numbers)."""
        retries = 0
        while True:
            try:
                self._catch_up()
                return read()
            except Exception:
                dead = self._dead()
                if not dead:
                    raise
                retries = self._recover(dead, retries)
                self.ahead = True  # the replicas are at the restore point: _catch_up runs the rounds since

    def evaluate(self) -> dict[str, float]:
        return self._surviving(lambda: self._get([self.actors.actors[0].replica_evaluate.remote()])[0])

    def _gather(self) -> tuple[Any, int]:
        """Replica 0's checkpoint with every actor's clients' private states, gathered on actor 0 and left in the
        object store, and its round (a Ray run's driver imports no torch)."""
        parts = [actor.replica_checkpoint.remote(i == 0) for i, actor in enumerate(self.actors.actors)]
        checkpoint, round = self.actors.actors[0].replica_merge.remote(*parts)
        try:
            return checkpoint, self._get([round])[0]
        except Exception:
            with contextlib.suppress(Exception):  # its error is the round's: read here, or Ray prints it when it goes
                ray.get(checkpoint, timeout=0)
            raise

    def checkpoint(self) -> dict[str, Any]:
        """Replica 0's checkpoint with every actor's clients' private states."""
        return self._surviving(lambda: self._get([self._gather()[0]])[0])

    def checkpoint_file(self, extra: dict[str, Any]) -> bytes:
        return self._surviving(lambda: self._save(extra))

    def _save(self, extra: dict[str, Any]) -> bytes:
        """A checkpoint file's content, saved by actor 0 and kept as the restore point."""
        checkpoint, round = self._gather()
        [content] = self._get([self.actors.actors[0].replica_save.remote(checkpoint, extra)])
        self.restore_point, self.restore_round = ray.put(content), round
        return content

    def restore(self, checkpoint: dict[str, Any]) -> None:
        point = ray.put(checkpoint)
        self.ahead = False  # whatever the replicas ran, they start again from the checkpoint (after it: calls keep order)
        self._get([actor.replica_restore.remote(point) for actor in self.actors.actors])
        self.restore_point, self.round = point, int(checkpoint["counters"]["round"])
        self.restore_round = self.round

    def restarts(self) -> int:
        return self.actors.restarts

    def profile(self) -> dict[str, float]:
        """Replica 0's phases (:meth:`~fedcomp.actors.replicas.Replica.profile`, the slowest actor's compute each call
        beside them) and the driver's wait beyond them."""
        from fedcomp.actors.replicas import SLOWEST_COMPUTE  # the actors' imports: profiling is a benchmark's

        phases = self._get([self.actors.actors[0].replica_profile.remote()])[0]
        spent = sum(seconds for phase, seconds in phases.items() if phase != SLOWEST_COMPUTE)
        phases["driver waiting for replica 0"] = self.driver_s - spent
        return phases

    def describe(self) -> dict[str, Any]:
        return {**self.actors.describe(), "server": "replicated", "transport": "collective"}  # as configured

    def placement(self) -> list[dict[str, Any]]:
        return list(self.actors.placement)

    def close(self) -> None:
        self.actors.close()
