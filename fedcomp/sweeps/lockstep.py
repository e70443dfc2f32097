"""Configurations in lockstep: runs that differ only in an algorithm's float hyperparameters (lr, beta, ...)
advance together in one process, their client steps batched with ``torch.func.vmap`` across configurations
(and across the cohort's clients).

Each configuration keeps its own :class:`~fedcomp.platform.server.Server` and is driven by the ordinary
:func:`~fedcomp.platform.runner.drive` in its own thread, so rounds, counters, evaluations, rows and
checkpoints are exactly those of a run alone; only the federation differs: :class:`MemberFederation` hands
each ``local_steps`` call to a shared :class:`Lockstep`, which waits until every configuration still
running has posted its call for the round, then runs them all at once:

* samples come from the clients' keyed generators (the data of a run alone), drawn once for all
  configurations when ``draw`` reads none of the swept fields (they share seed, task and batch sizes);
* the pure ``update`` runs under ``vmap`` over configurations and, inside, over the cohort's clients; the swept
  hyperparameters entering as float64 0-d tensors (the arithmetic a Python float gets: ``1 - beta`` in
  double, cast to float32 where it meets the state);
* private states, outputs and the partial sums go through the host's own bookkeeping, as in a run alone.

Tolerance: under ``vmap`` a reduction (matrix product, mean, the backward pass's sums) runs as one batched
kernel whose summation order depends on the batched shape, so numbers equal a run alone up to float32
rounding (see :mod:`fedcomp.platform.vectorised`); the measured differences on the FCSG Figure 1 grid are in
``benchmarks/SWEEP.md`` and the tested bound is :data:`TOLERANCE`. Calls that cannot be batched (another
program, a generator program, module buffers, draws of different shapes, an update that is not vmappable, on a
CPU a client state over ``LOCKSTEP_MAX_CPU_FLOATS`` or fewer than ``LOCKSTEP_MIN_CPU_CLIENTS`` clients in all) run
one configuration at a time, bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedcomp.platform.algorithms.base import LOCKSTEP, ClientContext, Outcome, StepInfo, Tensors
from fedcomp.platform.config import Config
from fedcomp.platform.federation import Layout, LocalFederation, combine
from fedcomp.platform.runner import RoundDone, drive
from fedcomp.platform.server import Server
from fedcomp.platform.vectorised import (
    NotStackable,
    equal_shape_runs,
    index_tree,
    lockstep_pays,
    stack_trees,
    steps_in_lockstep,
)

TOLERANCE = 1e-4
"""Largest difference (absolute, on metrics in [0, 1] and on the model) between a lockstep configuration and
the same configuration run alone that the tests accept."""


@dataclass
class _Call:
    federation: MemberFederation
    program: str
    round: int
    cohort: list[int]
    payload: Tensors
    sub: int


class MemberFederation(LocalFederation):
    """One configuration's in-process federation; its ``call``\\ s meet the group's in :class:`Lockstep`."""

    def __init__(self, config: Config, group: Lockstep, index: int) -> None:
        super().__init__(config)
        self.group, self.index = group, index

    def call(self, program: str, round: int, cohort: list[int], payload: Tensors, sub: int = 0) -> Outcome:
        return self.group.submit(self.index, _Call(self, program, round, list(cohort), payload, sub))

    def alone(self, call: _Call) -> Outcome:
        """The call as a run alone makes it."""
        return LocalFederation.call(self, call.program, call.round, call.cohort, call.payload, call.sub)


class Lockstep:
    """Where the configurations' federation calls meet: the last one to arrive runs them all."""

    def __init__(self, members: int, swept: Sequence[str]) -> None:
        self.swept = tuple(swept)
        """The float hyperparameters (algorithm field names) that differ between the configurations."""
        self._cond = threading.Condition()
        self._active = set(range(members))
        self._pending: dict[int, _Call] = {}
        self._done: dict[int, Outcome | BaseException] = {}
        self.batched_calls = 0
        """Calls run under ``vmap`` (counted per configuration), for tests and reports."""

    def federation(self, index: int) -> Callable[[Config], MemberFederation]:
        return lambda config: MemberFederation(config, self, index)

    def submit(self, index: int, call: _Call) -> Outcome:
        with self._cond:
            self._pending[index] = call
            self._maybe_run()
            while index not in self._done:
                self._cond.wait()
            out = self._done.pop(index)
        if isinstance(out, BaseException):
            raise out
        return out

    def leave(self, index: int) -> None:
        """Configuration ``index`` makes no more calls (its run ended or failed)."""
        with self._cond:
            self._active.discard(index)
            self._maybe_run()

    def _maybe_run(self) -> None:
        if not self._pending or set(self._pending) != self._active:
            return
        calls, self._pending = self._pending, {}
        try:
            ran, batched = run_calls(calls, self.swept)
            outcomes: dict[int, Outcome | BaseException] = dict(ran)
            self.batched_calls += len(calls) if batched else 0
        except BaseException as error:  # every waiting configuration fails with it
            outcomes = dict.fromkeys(calls, error)
        self._done.update(outcomes)
        self._cond.notify_all()


def _batchable(calls: Sequence[_Call]) -> bool:
    first = calls[0]
    for call in calls:
        host = call.federation.host
        if (
            (call.round, call.sub, call.cohort) != (first.round, first.sub, first.cohort) or host.model is not None
            or not steps_in_lockstep(host.algorithm, host.problem, call.program)
        ):  # fmt: skip
            return False
    return len(calls) > 1


def run_calls(calls: dict[int, _Call], swept: Sequence[str]) -> tuple[dict[int, Outcome], bool]:
    """Every configuration's call, and whether they ran batched under ``vmap`` (else one at a time)."""
    order = sorted(calls)
    if _batchable([calls[i] for i in order]):
        out = _batched([calls[i] for i in order], swept)
        if out is not None:
            return dict(zip(order, out)), True
    return {i: calls[i].federation.alone(calls[i]) for i in order}, False


def _batched(calls: Sequence[_Call], swept: Sequence[str]) -> list[Outcome] | None:
    """The calls' ``local_steps`` programs in one ``vmap`` per run of equally shaped steps; None if their
    draws or states differ in shape (then they run one at a time)."""
    started = time.perf_counter()

    def open_call(call: _Call) -> tuple[Any, ...]:
        host = call.federation.host
        layout = Layout.of(call.payload)
        broadcast = layout.receive(call.payload, host.device)  # as a run alone receives it in-process
        clients, starts, contexts, _ = host._open(call.cohort, broadcast, call.round, call.sub)
        return layout, broadcast, clients, starts, contexts

    opened = [open_call(calls[0])]
    if not lockstep_pays(opened[0][3], calls[0].federation.host.device, len(calls)):
        return None  # on a CPU, a large model or few clients: one at a time is faster (decided before opening the rest)
    opened += [open_call(call) for call in calls[1:]]
    template: Any = calls[0].federation.host.algorithm  # a LocalSteps algorithm (checked by _batchable)
    problem = calls[0].federation.host.problem
    q = template.hp.local_steps
    steps = [calls[0].round * q + s for s in range(q)]
    cohort = len(opened[0][2])
    shared, drawn = _draw(calls, opened, steps)  # drawn[step][member or 0][client] -> (batch, samples)
    try:
        stacked = {k: torch.stack([stack_trees(o[3])[k] for o in opened]) for k in opened[0][3][0]}  # [members, clients]
        hps = {  # the swept fields this algorithm has (FCSG has no beta)
            name: torch.tensor([float(getattr(c.federation.host.algorithm.hp, name)) for c in calls], dtype=torch.float64)
            for name in swept if name in type(template.hp).model_fields
        }
        per_step = [stack_trees([stack_trees([batch for batch, _ in member]) for member in row]) for row in drawn]  # [members or 1, clients, ...]
    except NotStackable:
        return None
    if shared:
        per_step = [index_tree(batch, 0) for batch in per_step]
    losses = []
    for run in equal_shape_runs(per_step):
        chunk = [steps[i] for i in run]
        batches = stack_trees([per_step[i] for i in run])  # [steps, (members,) clients, ...]

        def steps_of_one(hp: dict[str, torch.Tensor], state: Tensors, batch: Any, chunk: list[int] = chunk) -> Any:
            algorithm = copy.copy(template)
            algorithm.hp = template.hp.model_copy(update=hp)
            values = []
            for j, step in enumerate(chunk):
                state, loss = algorithm.update_tensors(problem, state, index_tree(batch, j), step)
                values.append(loss)
            return state, torch.stack(values)

        per_client = torch.func.vmap(steps_of_one, in_dims=(None, 0, 1))
        per_configuration = torch.func.vmap(per_client, in_dims=(0, 0, None if shared else 1))
        token = LOCKSTEP.set(True)
        try:
            stacked, run_losses = per_configuration(hps, stacked, batches)
        except (RuntimeError, TypeError, ValueError):
            return None  # not vmappable after all (data-dependent control flow, an in-place update, ...)
        finally:
            LOCKSTEP.reset(token)
        losses.append(run_losses)
    loss_table = torch.cat(losses, dim=2).tolist()  # [members, clients, q]
    per_member: list[list[tuple[Tensors, Tensors, StepInfo]]] = [[] for _ in calls]
    for m in range(len(calls)):
        for i in range(cohort):
            info = StepInfo()
            for s in range(q):
                info.samples += drawn[s][0 if shared else m][i][1]
                info.loss += loss_table[m][i][s] / q
            state = {k: v[m, i] for k, v in stacked.items()}
            per_member[m].append((state, {k: state[k] for k in template.averaged}, info))
    out = []
    for call, (layout, broadcast, clients, _, _), results in zip(calls, opened, per_member):
        fed = call.federation
        partial = fed.host._close(clients, results, broadcast, started)
        fed.private.update(partial.private)
        out.append(combine([partial], layout.total))
    return out


class _Watch:
    """Hyperparameters that note which fields are read (to tell whether ``draw`` reads a swept one)."""

    def __init__(self, hp: Any) -> None:
        self._hp = hp
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._hp, name)


def _draw(calls: Sequence[_Call], opened: Sequence[Any], steps: Sequence[int]) -> tuple[bool, list[list[list[Any]]]]:
    """Every configuration's samples for the round, ``[step][member][client] -> (batch, samples)``.

    The configurations share the seed, the task and every hyperparameter but the swept floats, and the
    clients' generators are keyed by (seed, client, step); so when ``draw`` reads no swept field the samples
    of the first configuration are everyone's, drawn once (``shared``: ``[step][0][client]``)."""
    first = calls[0].federation.host
    probe: Any = copy.copy(first.algorithm)  # a LocalSteps algorithm (checked by _batchable)
    watch = probe.hp = _Watch(first.algorithm.hp)
    contexts: list[ClientContext] = opened[0][4]
    drawn = [[[probe.draw(first.problem, ctx.client, step, ctx.rng(step)) for ctx in contexts]] for step in steps]
    swept = {n for n in first.algorithm.hp.model_fields if any(
        getattr(c.federation.host.algorithm.hp, n) != getattr(first.algorithm.hp, n) for c in calls)}
    if not watch.read & swept:
        return True, drawn
    for row, step in zip(drawn, steps):
        for call, o in zip(calls[1:], opened[1:]):
            host = call.federation.host
            algorithm: Any = host.algorithm
            row.append([algorithm.draw(host.problem, ctx.client, step, ctx.rng(step)) for ctx in o[4]])
    return False, drawn


_END = object()


def _check_shape(configs: Sequence[Config], swept: Sequence[str]) -> None:
    """Configurations in lockstep must be one run but for the swept algorithm fields (and run in-process)."""
    def shape(config: Config) -> dict[str, Any]:
        out = config.to_dict()
        out["algorithm"] = {k: v for k, v in out["algorithm"].items() if k not in swept}
        return out

    first = shape(configs[0])
    for config in configs:
        if config.federation.backend != "local":
            raise ValueError("lockstep configurations run in-process: federation.backend must be 'local'")
        if shape(config) != first:
            raise ValueError(f"lockstep configurations may differ only in algorithm fields {list(swept)}")


def _snapshot(step: RoundDone) -> RoundDone:
    """``step`` with its own copy of the rows (``drive`` keeps appending to its list as the thread runs on)."""
    return dataclasses.replace(step, rows=list(step.rows))


def run_together(
    configs: Sequence[Config], swept: Sequence[str], checkpoints: Sequence[dict[str, Any] | None]
) -> Iterator[list[tuple[int, RoundDone]]]:
    """Drive every configuration (from its checkpoint, if any) in lockstep; yield, round by round, each
    running configuration's :class:`RoundDone` as ``(index, step)`` in index order."""
    _check_shape(configs, swept)
    group = Lockstep(len(configs), swept)
    outputs: list[queue.Queue[Any]] = [queue.Queue() for _ in configs]

    def work(index: int) -> None:
        try:
            server = Server(configs[index], group.federation(index))
            try:
                for step in drive(configs[index], server, checkpoints[index]):
                    outputs[index].put(_snapshot(step))
            finally:
                server.close()
        except BaseException as error:  # handed to the driving thread
            outputs[index].put(error)
        finally:
            group.leave(index)
            outputs[index].put(_END)

    threads = [threading.Thread(target=work, args=(i,), daemon=True, name=f"lockstep-{i}") for i in range(len(configs))]
    for thread in threads:
        thread.start()
    alive = list(range(len(configs)))
    while alive:
        batch = []
        for index in list(alive):
            item = outputs[index].get()
            if item is _END:
                alive.remove(index)
            elif isinstance(item, BaseException):
                raise item
            else:
                batch.append((index, item))
        if batch:
            yield batch
    for thread in threads:
        thread.join()
