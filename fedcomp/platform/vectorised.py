"""Lockstep local steps: the clients one host holds take their ``q`` local steps together, their states
stacked along a leading client axis and the algorithm's pure ``update`` batched with ``torch.func.vmap``.

Only the update is batched. Each client's samples are still drawn one client at a time from its own keyed
generator (``algorithm.draw``), so the data are exactly those of the one-at-a-time path, and a task declares
``vmappable = True`` when its oracles are pure tensor functions (no BatchNorm in training mode, no in-place
updates, no data-dependent Python control flow). Clients whose draws differ in shape fall back to one at a
time.

The numbers equal the one-at-a-time path's up to float32 rounding, not bit for bit: under ``vmap`` a
reduction (a matrix product, a mean, the sum over broadcast dimensions in a backward pass) runs as one
batched kernel whose summation order depends on the batched shape -- measured differences are a few units
in the last place (about 6e-8) per gradient, and they also depend on how many clients a host runs
together. That is why ``federation.vectorise`` is off by default: with it off, every backend and every
packing of clients into actors gives bitwise the same numbers; with it on, a run is still bitwise
reproducible for a fixed packing.

Nothing here names a device: the states and the drawn batches are on the host's device (a task holds its
data there), so on a GPU actor the lockstep steps are batched kernels on its GPU, and the only copy to the
host is the table of the clients' losses, once per call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from fedcomp.platform.algorithms.base import LOCKSTEP, Algorithm, ClientContext, LocalSteps, StepInfo, Tensors


def can_lockstep(algorithm: Algorithm[Any, Any], problem: Any, program: str, clients: int) -> bool:
    """Whether ``program`` may run these clients in lockstep: :func:`steps_in_lockstep`, two clients or more."""
    return clients > 1 and steps_in_lockstep(algorithm, problem, program)


def steps_in_lockstep(algorithm: Algorithm[Any, Any], problem: Any, program: str) -> bool:
    """Whether ``program``'s steps may be batched under ``vmap``: the default ``local_steps`` program of a
    :class:`~fedcomp.platform.algorithms.base.LocalSteps` algorithm (draw + pure update) on a vmappable problem."""
    return (
        program == "local_steps"
        and algorithm.vectorisable
        and isinstance(algorithm, LocalSteps)
        and type(algorithm).local_steps is LocalSteps.local_steps
        and bool(getattr(problem, "vmappable", False))
    )


def why_not_lockstep(algorithm: Algorithm[Any, Any], problem: Any) -> str | None:
    """Why no call of this algorithm on this problem can step its clients in lockstep (the checks of
    :func:`steps_in_lockstep`), in words; None where some can. Said once per run that asks for it
    (``federation.vectorise``), which then steps one client at a time."""
    if not isinstance(algorithm, LocalSteps) or type(algorithm).local_steps is not LocalSteps.local_steps:
        return "the algorithm runs a client program of its own, not LocalSteps' draw + update"
    if not algorithm.vectorisable:
        return "the algorithm's update cannot be batched under torch.func.vmap (with these hyperparameters)"
    if not getattr(problem, "vmappable", False):
        return "the task's oracles are not pure tensor functions (its vmappable is False: BatchNorm in training mode, " \
               "data-dependent control flow, ...)"
    return None


LOCKSTEP_MAX_CPU_FLOATS = 100_000
"""Largest client state (floats) a CPU host steps in lockstep; larger ones go one at a time, where the local-steps
family steps in place from the same size on (``IN_PLACE_MIN_FLOATS``). On one CPU thread a batched matrix product
costs what the clients' separate products cost, so lockstep saves only per-call overhead -- which a large model does
not have -- and pays for [clients x weights] gradients and states allocated afresh every step
(benchmarks/VECTORISED.md: an MLP of 2,762 weights 1.4-2.6x faster in lockstep in two runs; ``python benchmarks/vectorised.py
--profile``: one of 1.1 million weights 2-3x slower). A GPU host, not measured, steps any size in lockstep."""


LOCKSTEP_MIN_CPU_CLIENTS = 3
"""Fewest clients a CPU host steps in lockstep; fewer go one at a time. Lockstep pays a fixed cost per call (entering
``vmap``, batching each operator) that its shared operators repay only over several clients
(``python benchmarks/vectorised.py --crossover``, benchmarks/LOCKSTEP_CROSSOVER.md: with two clients a call lockstep
took 1.00-1.20x the time of one at a time on the five workloads measured, with three 0.71-0.85x). A GPU host, not
measured, steps any number in lockstep."""


def lockstep_pays(states: Sequence[Tensors], device: str, configurations: int = 1) -> bool:
    """Whether stepping these client states in lockstep on ``device`` -- the clients of ``configurations`` equally
    shaped runs at once, in a sweep -- is expected to be faster than one at a time: on a CPU, states of at most
    :data:`LOCKSTEP_MAX_CPU_FLOATS` and at least :data:`LOCKSTEP_MIN_CPU_CLIENTS` clients stepped together."""
    if not str(device).startswith("cpu"):
        return True
    floats = sum(int(t.numel()) for t in states[0].values()) if states else 0
    return floats <= LOCKSTEP_MAX_CPU_FLOATS and len(states) * configurations >= LOCKSTEP_MIN_CPU_CLIENTS


def stack_trees(trees: Sequence[Any]) -> Any:
    """Stack equally shaped batches (tensors in tuples, lists, dicts or dataclasses) leaf by leaf; raises
    :class:`NotStackable` where leaves differ in shape or dtype or an item is none of those."""
    first = trees[0]
    if isinstance(first, torch.Tensor):
        if any(t.shape != first.shape or t.dtype != first.dtype for t in trees):
            raise NotStackable("leaves differ in shape or dtype")
        return torch.stack(list(trees))
    if isinstance(first, (tuple, list)):
        return type(first)(stack_trees([t[i] for t in trees]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: stack_trees([t[k] for t in trees]) for k in first}
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return type(first)(*(stack_trees([getattr(t, f.name) for t in trees]) for f in dataclasses.fields(first)))
    raise NotStackable(f"cannot stack a batch item of type {type(first).__name__}")


class NotStackable(TypeError):
    """Batches that cannot be stacked into one: the caller steps them one at a time."""


def lockstep_local_steps(
    algorithm: Any, problem: Any, states: Sequence[Tensors], contexts: Sequence[ClientContext]
) -> list[tuple[Tensors, Tensors, StepInfo]] | None:
    """Run :meth:`Algorithm.local_steps` for every client at once; ``None`` if their draws or states differ in
    shape (a client that joins late holds an empty field -- :func:`~fedcomp.platform.state.unsent` -- where the
    others hold its value).

    Samples never depend on the state, so the round's draws are made first (client by client, step by step,
    each from its keyed generator: the one-at-a-time data). Consecutive steps whose draws have the same shapes
    then run inside ONE ``vmap`` call that loops over them, so the cost of entering and leaving ``vmap`` is
    paid once per run of equal shapes (twice in a round whose first step draws a larger first batch) rather
    than once per step.

    Returns what the one-at-a-time program returns, per client and in order: the new state, its ``synced``
    outputs and the step info (loss summed in the same order, so the floats match too).
    """
    try:
        stacked = stack_trees(list(states))
    except NotStackable:
        return None
    q = algorithm.hp.local_steps
    steps = [contexts[0].round * q + s for s in range(q)]
    drawn = [[algorithm.draw(problem, ctx.client, step, ctx.rng(step)) for ctx in contexts] for step in steps]
    try:
        per_step = [stack_trees([batch for batch, _ in clients]) for clients in drawn]
    except NotStackable:
        return None
    losses: list[torch.Tensor] = []
    for run in equal_shape_runs(per_step):
        chunk = [steps[i] for i in run]
        batches = stack_trees([per_step[i] for i in run])  # [steps, clients, ...] -> vmapped over dim 1

        def steps_of_one_client(state: Tensors, batch: Any, chunk: list[int] = chunk) -> tuple[Tensors, torch.Tensor]:
            values = []
            for j, step in enumerate(chunk):
                state, loss = algorithm.update_tensors(problem, state, index_tree(batch, j), step)
                values.append(loss)
            return state, torch.stack(values)

        token = LOCKSTEP.set(True)
        try:
            stacked, run_losses = torch.func.vmap(steps_of_one_client, in_dims=(0, 1))(stacked, batches)
        finally:
            LOCKSTEP.reset(token)
        losses.append(run_losses)
    loss_table = torch.cat(losses, dim=1).tolist()  # [clients, q]
    out = []
    for i in range(len(states)):
        info = StepInfo()
        for s in range(q):
            info.samples += drawn[s][i][1]
            info.loss += loss_table[i][s] / q
        state = {k: v[i] for k, v in stacked.items()}
        out.append((state, {k: state[k] for k in algorithm.averaged}, info))
    return out


def tree_shapes(tree: Any) -> Any:
    """The shapes of a batch's leaves, in its structure (equal for batches :func:`stack_trees` can stack)."""
    if isinstance(tree, torch.Tensor):
        return tuple(tree.shape)
    if isinstance(tree, (tuple, list)):
        return tuple(tree_shapes(t) for t in tree)
    if isinstance(tree, dict):
        return tuple((k, tree_shapes(v)) for k, v in tree.items())
    return tuple(tree_shapes(getattr(tree, f.name)) for f in dataclasses.fields(tree))


def equal_shape_runs(batches: Sequence[Any]) -> list[list[int]]:
    """Indices of ``batches`` grouped into maximal runs of consecutive items with the same shapes."""
    runs: list[list[int]] = []
    for i, batch in enumerate(batches):
        if runs and tree_shapes(batches[runs[-1][0]]) == tree_shapes(batch):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def index_tree(tree: Any, j: int) -> Any:
    """Item ``j`` of every leaf of a stacked batch (one position of what :func:`stack_trees` made)."""
    if isinstance(tree, torch.Tensor):
        return tree[j]
    if isinstance(tree, (tuple, list)):
        return type(tree)(index_tree(t, j) for t in tree)
    if isinstance(tree, dict):
        return {k: index_tree(v, j) for k, v in tree.items()}
    return type(tree)(*(index_tree(getattr(tree, f.name), j) for f in dataclasses.fields(tree)))
