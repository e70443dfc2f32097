"""The client actor: a thin Ray shell around :class:`ClientHost` (the clients' data, task and private state).

What the clients compute with (torch, the task, the group's exchanges, the server's replica) is imported where
it is built, in the actor: the driver defines the actor class (``ray.remote``) without importing torch.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ray

from fedcomp.actors.cluster import adopt_env, config_here
from fedcomp.actors.quiet_exit import drop_lost_exits_in_a_worker

if TYPE_CHECKING:
    import numpy as np

    from fedcomp.actors.collective import History
    from fedcomp.actors.replicas import Replica
    from fedcomp.platform.algorithms.base import Tensors
    from fedcomp.platform.federation import Layout, Partial

drop_lost_exits_in_a_worker()  # a client actor stopped with SIGTERM, even before its constructor ran, goes without a traceback


class ClientActor:
    """Hosts ``clients`` on the GPU Ray assigned to it, if any, else on the CPU."""

    def __init__(self, config: Mapping[str, Any], clients: Sequence[int], incarnation: int = 0,
                 env: Mapping[str, str] | None = None) -> None:
        self.setup(config, clients, incarnation, env)

    def setup(self, config: Mapping[str, Any], clients: Sequence[int], incarnation: int = 0,
              env: Mapping[str, str] | None = None) -> None:
        """Build the clients of a run (the constructor, and a kept actor's rebuild for the next run:
        :mod:`fedcomp.actors.kept`) from the run's config as its dict (:func:`~fedcomp.actors.cluster.config_here`),
        with the driver's ``FEDCOMP_*`` variables ``env`` (:func:`~fedcomp.actors.cluster.adopt_env`)."""
        import torch

        from fedcomp.actors.collective import Group
        from fedcomp.platform.accelerator import configure
        from fedcomp.platform.federation import ClientHost

        adopt_env(env)
        torch.set_num_threads(1)
        self.error: Exception | None = None
        """An error building the clients (e.g. a missing data root), raised by :meth:`ready`: an exception
        leaving an actor's constructor reaches the driver only as text, after Ray has printed its traceback."""
        self.flags: dict[str, Any] = {}
        """The determinism flags set for CUDA (``run.deterministic``; empty on the CPU)."""
        try:
            loaded = config_here(config)
            device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
            self.flags = configure(device, loaded.run.deterministic)
            self.host = ClientHost(loaded, clients, device)
        except Exception as error:
            self.error = error
        self.incarnation = incarnation
        if not hasattr(self, "group"):
            self.group = Group()
            """This actor's membership of the client actors' group (the server replicated on them, or ``federation.transport:
            collective``)."""
        self.group.leave()  # a kept actor joins the next run's group afresh
        self.replica: Replica | None = None
        """This actor's copy of the server (``federation.server: replicated``; built by :meth:`replica_setup`)."""
        self.graph_reply_kept: tuple[int, Partial] | None = None
        """The last reply through the compiled graph and its call number (:meth:`graph_reply`)."""
        # Fault injection for the reliability tests: FEDCOMP_FAULT_KILL="<round>:<first client of the actor>"
        # (or "<round>:<client>:<sub>", or "<round>:<client>:<sub>:<step>" for a step of an exchange: 0 =
        # begin, k = the k-th answer) makes the first incarnation of that actor die (a real process exit) there;
        # "join<n>:<client>" at its n-th joining of the actors' group (2: as the group forms again after a death);
        # "ckpt<n>:<client>" as it hands its replica's part of the n-th checkpoint (after the rounds before it).
        # Several faults: comma-separated.
        self._kill = set(os.environ.get("FEDCOMP_FAULT_KILL", "").split(","))
        self._joins = self._checkpoints = 0

    def ready(self) -> dict[str, Any]:
        """Where this actor landed: its clients, node, process id, assigned GPU ids, the torch device it computes on
        and the CUDA determinism flags it set."""
        if self.error is not None:
            raise self.error
        return {
            "clients": list(self.host.clients),
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "device": self.host.device,
            "cuda_flags": self.flags,
            **({"lockstep_off": self.host.lockstep_off} if self.host.lockstep_off else {}),
        }

    def load_private(self, states: dict[int, Tensors]) -> None:
        self.host.load_private(states)

    def _die_at(self, *where: int) -> None:
        """Exit the process if this is the first incarnation and ``where`` is the fault to inject."""
        first = self.host.clients[0]
        spec = ":".join(str(w) for w in (where[0], first, *where[1:]))
        if self.incarnation == 0 and not self._kill.isdisjoint((spec, f"{where[0]}:{first}")):
            os._exit(1)

    @staticmethod
    def _split(partial: Partial) -> tuple[Partial, dict[int, Tensors]]:
        """The partial sums, and (as a separate object) copies of the clients' private state."""
        private, partial.private = partial.private, {}
        return partial, private

    @ray.method(num_returns=2)
    def step(self, message: bytes, payload: np.ndarray | None, cohort: list[int]) -> tuple[Partial, dict[int, Tensors]]:
        """One federation call as the server sends it: ``message`` is ``(method, arguments)`` pickled once for
        every actor (with the payload when small), ``payload`` the large payload from the object store (else
        None), ``cohort`` this actor's members of the call's cohort (unused by ``resume``)."""
        return self._dispatch(message, payload, cohort)

    @staticmethod
    def _unpack(message: bytes, payload: np.ndarray | None) -> tuple[str, dict[str, Any]]:
        """A call's method and arguments from its message, the large payload (from the object store) put in."""
        method, args = pickle.loads(message)
        if payload is not None:
            args["payload"] = payload
        return method, args

    def _dispatch(
        self, message: bytes, payload: np.ndarray | None, cohort: list[int]
    ) -> tuple[Partial, dict[int, Tensors]]:
        method, args = self._unpack(message, payload)
        if method == "resume":
            return self.resume(**args)
        if method not in ("run", "begin"):
            raise ValueError(f"ClientActor.step: unknown method {method!r} (allowed: run, begin, resume)")
        return getattr(self, method)(cohort=cohort, **args)

    def graph_step(self, sent: tuple[bytes, dict[int, list[int]], int], index: int) -> Partial | None:
        """One federation call through the federation's compiled graph (``federation.transport: graph``), on the
        graph's thread: ``sent`` is ``(message, each actor's members, call number)`` as the graph's input, the same
        for every actor, and ``index`` this actor's place in the graph. Runs :meth:`step` if this actor has members
        (else None) and keeps the reply, private state inside it, for :meth:`graph_reply`."""
        message, members, number = sent
        if index not in members:
            return None
        partial, private = self._dispatch(message, None, members[index])
        partial.private = private
        self.graph_reply_kept = (number, partial)
        return partial

    def graph_reply(self, number: int) -> Partial | None:
        """The reply of graph call ``number`` if this actor ran it, else None: when another actor of the graph dies,
        reading the graph fails for every actor, and the federation takes the survivors' replies from here."""
        kept = self.graph_reply_kept
        return kept[1] if kept is not None and kept[0] == number else None

    @contextlib.contextmanager
    def _in_group(self) -> Iterator[None]:
        """Work with the actors' group: on any error this actor leaves it first, so that the others' exchanges fail at
        once instead of waiting for it."""
        try:
            yield
        except BaseException:
            self.group.leave()
            raise

    def group_address(self) -> str:
        """A rendezvous address for the process group, on this actor's node (asked of the group's rank 0)."""
        return self.group.address()

    def join_group(self, address: str, rank: int, world: int, timeout_s: float) -> None:
        self._joins += 1
        if self.incarnation == 0 and f"join{self._joins}:{self.host.clients[0]}" in self._kill:
            os._exit(1)
        self.group.join(address, rank, world, timeout_s)

    def leave_group(self) -> None:
        self.group.leave()

    @ray.method(num_returns=2)
    def collective(
        self, message: bytes, payload: np.ndarray | None, cohort: list[int]
    ) -> tuple[tuple[Partial | None, History], dict[int, Tensors]]:
        """A whole exchange with its answers formed in the actors' group (:mod:`fedcomp.actors.collective`):
        ``message`` is ``("exchange", arguments)`` pickled once for every actor, as for :meth:`step`, ``cohort``
        this actor's members (none: it only takes part in the gathers). Returns the final partial sums (None
        without members) with each step's means, and the clients' private state."""
        method, args = self._unpack(message, payload)
        if method != "exchange":
            raise ValueError(f"ClientActor.collective: unknown method {method!r} (allowed: exchange)")
        from fedcomp.actors.collective import run_exchange

        round, sub = args["round"], args["sub"]
        with self._in_group():
            partial, history = run_exchange(
                self.host, self.group, args["program"], round, cohort, args["payload"], args["layout"], sub,
                args["steps"], lambda step: self._die_at(round, sub, step),
            )
        if partial is None:
            return (None, history), {}
        partial, private = self._split(partial)
        return (partial, history), private

    @ray.method(num_returns=2)
    def run(
        self, program: str, round: int, cohort: Sequence[int], payload: np.ndarray, layout: Layout, sub: int = 0
    ) -> tuple[Partial, dict[int, Tensors]]:
        self._die_at(round, sub)
        return self._split(self.host.run(program, round, cohort, payload, layout, sub))

    @ray.method(num_returns=2)
    def begin(
        self, program: str, round: int, cohort: Sequence[int], payload: np.ndarray, layout: Layout, sub: int = 0,
        last: bool = False,
    ) -> tuple[Partial, dict[int, Tensors]]:
        self._die_at(round, sub, 0)
        return self._split(self.host.begin(program, round, cohort, payload, layout, sub, last))

    @ray.method(num_returns=2)
    def resume(self, payload: np.ndarray, layout: Layout, last: bool = False) -> tuple[Partial, dict[int, Tensors]]:
        session = self.host.session
        if session is not None:
            self._die_at(session.round, session.sub, session.step + 1)
        return self._split(self.host.resume(payload, layout, last))

    # ------------------------------------------------------------------ the replicated server (fedcomp.actors.replicas)

    def replica_setup(self, groups: Sequence[Sequence[int]], rank: int) -> None:
        """Build this actor's copy of the server, as replica ``rank`` of the group it has joined."""
        from fedcomp.actors.replicas import Replica

        self.replica = Replica(self.host.config, self.host, self.group, rank, groups, self._die_at)

    def _replica(self) -> Replica:
        if self.replica is None:
            raise RuntimeError("ClientActor: no replica of the server here (replica_setup first)")
        return self.replica

    def replica_rounds(self, evaluated: Sequence[bool]) -> Iterator[list[dict[str, Any]]]:
        """Replica 0: run the rounds, yielding their replies in batches as they end (a Ray streaming generator)."""
        with self._in_group():
            yield from self._replica().rounds(evaluated)

    def replica_follow(self, evaluated: Sequence[bool]) -> None:
        """The other replicas: run the same rounds."""
        with self._in_group():
            for _ in self._replica().rounds(evaluated):
                pass

    def replica_evaluate(self) -> dict[str, float]:
        return self._replica().server.evaluate()

    def replica_checkpoint(self, with_state: bool) -> dict[str, Any]:
        self._checkpoints += 1
        if self.incarnation == 0 and f"ckpt{self._checkpoints}:{self.host.clients[0]}" in self._kill:
            os._exit(1)
        return self._replica().checkpoint(with_state)

    @ray.method(num_returns=2)
    def replica_merge(self, *parts: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Replica 0: the server's checkpoint with every actor's clients' private states (``parts``: each actor's
        :meth:`replica_checkpoint`, in actor order) and its round, as two objects: the driver keeps the checkpoint in
        the object store as its restore point and reads the round alone (never a tensor)."""
        checkpoint = self._replica().merged(parts)
        return checkpoint, int(checkpoint["counters"]["round"])

    def replica_save(self, checkpoint: dict[str, Any], extra: dict[str, Any]) -> bytes:
        """A run checkpoint's file content: ``checkpoint`` (what :meth:`replica_merge` made) with ``extra`` (the
        rows, ...), saved here so that the driver handles bytes."""
        from fedcomp.platform.results import checkpoint_bytes

        return checkpoint_bytes({"server": checkpoint, **extra})

    def replica_restore(self, checkpoint: dict[str, Any] | bytes) -> None:
        """Back to ``checkpoint``: the server's, or a checkpoint file's content (:meth:`replica_save`)."""
        from fedcomp.platform.results import server_checkpoint

        self._replica().server.restore(server_checkpoint(checkpoint))

    def replica_profile(self) -> dict[str, float]:
        return self._replica().profile()
