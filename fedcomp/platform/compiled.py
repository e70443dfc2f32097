"""The first-order oracle compiled by ``torch.compile`` (``federation.torch_compile``).

A small model's SGD step is mostly the framework's own work per operator -- autograd's graph, the Python of the
forward, one kernel launch per operation -- rather than arithmetic: the MLP 32-64-10 at batch 16 took 0.30 ms per
gradient eagerly on one CPU thread and 0.08 ms compiled (``benchmarks/COMPILED.md``; the heavy MLP 32-1024-1024-10's
3.2 and 2.4 ms, and its in-place exact steps no slower than the compiled ones). Under
``federation.torch_compile`` the gradient and value of a problem's loss (:func:`fedcomp.platform.oracles.grad_and_loss`,
the oracle of every SGD-type local step) come from one graph per problem type and shape, traced through
``torch.func.grad_and_value`` and compiled by inductor, in every process that runs clients.

Numbers: the compiled kernels add and fuse in other orders than the eager ones, so a compiled run equals the eager
run up to float32 rounding, not bit for bit. Every process compiles the same graph into the same code (a fixed
shape, no dynamic shapes, inductor's code for the machine's CPU), so a run gives the same bits on every backend and
packing, on machines of one kind. A loss that dynamo cannot capture in one graph (a network that keeps BatchNorm
running statistics, say) runs eagerly in every process alike, with a warning, so the numbers still do not depend on
where a client runs.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

ENABLED: ContextVar[bool] = ContextVar("torch_compile", default=False)
"""True while a host runs client programs under ``federation.torch_compile`` (:func:`enabled`)."""
RECOMPILE_LIMIT = 64
"""Graphs one process keeps for the oracle (a problem and shape each; dynamo's default is 8): runs that follow one
another in a kept actor or a notebook each may add theirs."""

_compiled: Callable[..., tuple[Tensor, Tensor]] | None = None
_eager: weakref.WeakSet[Any] = weakref.WeakSet()
"""The models (or, for a problem without one, the problems) whose loss did not compile: their steps run eagerly from
then on. Every process decides alike, from the same code; a task built anew (the next run's) is tried anew."""


@contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Client programs run inside take their gradients by the compiled oracle (``on``), with dynamo and inductor set
    for it: graphs compiled in this process (no pool of compiler processes left behind an actor), and a process that
    would need more graphs than :data:`RECOMPILE_LIMIT` told so rather than running some steps eagerly unseen."""
    if not on:
        yield
        return
    from torch._dynamo import config as dynamo
    from torch._inductor import config as inductor

    _quiet_cuda_home()
    token = ENABLED.set(True)
    try:
        with ExitStack() as settings:
            settings.enter_context(dynamo.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True))
            settings.enter_context(inductor.patch(compile_threads=1))
            yield
    finally:
        ENABLED.reset(token)


def _no_cuda_runtime(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("No CUDA runtime is found")


def _quiet_cuda_home() -> None:
    """Keep inductor's C++ toolchain from saying, in every client process of a CPU run, that it found no CUDA runtime
    (``torch.utils.cpp_extension`` logs it as it is imported: where CUDA_HOME points, which a CPU graph never uses)."""
    log = logging.getLogger("torch.utils.cpp_extension")
    if _no_cuda_runtime not in log.filters:
        log.addFilter(_no_cuda_runtime)


def _grad_and_value(problem: Any, x: Tensor, *batch: Any) -> tuple[Tensor, Tensor]:
    return torch.func.grad_and_value(lambda z: problem.loss(z, *batch))(x)


def grad_and_loss(problem: Any, x: Tensor, *batch: Any) -> tuple[Tensor, Tensor] | None:
    """Gradient and value of ``problem.loss(x, *batch)`` by the compiled graph for the problem's type and the
    arguments' shapes (compiled at its first call: seconds); None where the loss does not compile (the caller's
    eager oracle then runs)."""
    model = getattr(problem, "model", None)
    owner = problem if model is None else model  # a step's wrapper of the task's problem shares its model
    if owner in _eager:
        return None
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_grad_and_value, fullgraph=True, dynamic=False)
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException

    try:
        grad, value = _compiled(problem, x.detach(), *batch)
    except (TorchDynamoException, FailOnRecompileLimitHit) as error:
        _eager.add(owner)
        if isinstance(error, FailOnRecompileLimitHit):
            reason = f"this process would hold more than {RECOMPILE_LIMIT} of its graphs"
        else:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        name = type(problem).__name__ + ("" if owner is problem else f"'s {type(owner).__name__}")
        warnings.warn(f"federation.torch_compile: the loss of {name} does not compile into one graph ({reason}); "
                      "its steps run eagerly", RuntimeWarning, stacklevel=2)
        return None
    return grad, value.detach()
