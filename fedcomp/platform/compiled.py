"""The first-order oracles compiled by ``torch.compile`` (``federation.torch_compile``).

A small model's step is mostly the framework's own work per operator -- autograd's graph, the Python of the
forward, one kernel launch per operation -- rather than arithmetic: the MLP 32-64-10 at batch 16 took 0.20 ms per
gradient eagerly on one CPU thread and 0.07 ms compiled (``benchmarks/COMPILED.md``; the heavy MLP 32-1024-1024-10's
2.8 and 2.1 ms, and its in-place exact steps no slower than the compiled ones). Under ``federation.torch_compile``
the gradient and value of a problem's loss (:func:`fedcomp.platform.oracles.grad_and_loss`, the oracle of every
SGD-type local step) and both partial gradients of a two-variable loss (:func:`~fedcomp.platform.oracles.grad_xy`
and its kin: the minimax steps', FedNest's outer steps') come from one graph per loss and shape, ``torch.func.grad_and_value`` traced by
dynamo and compiled by inductor, in every process that runs clients.

Numbers: the compiled kernels add and fuse in other orders than the eager ones, so a compiled run equals the eager
run up to float32 rounding, not bit for bit. Every process compiles the same graph into the same code (a fixed
shape, no dynamic shapes, inductor's code for the machine's CPU), so a run gives the same bits on every backend and
packing, on machines of one kind. A loss that dynamo cannot capture in one graph (a network that keeps BatchNorm
running statistics, say) runs eagerly for the rest of the run in every process alike, with a warning, so the numbers
still do not depend on where a client runs.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

ENABLED: ContextVar[set[object] | None] = ContextVar("torch_compile", default=None)
"""While a host runs client programs under ``federation.torch_compile`` (:func:`enabled`): its run's losses that did
not compile (they run eagerly); None otherwise."""
RECOMPILE_LIMIT = 64
"""Graphs one process keeps for each oracle (a loss and shape each; dynamo's default is 8): runs that follow one
another in a kept actor or a notebook each may add theirs."""


@contextmanager
def enabled(eager: set[object] | None) -> Iterator[None]:
    """Client programs run inside take their gradients by the compiled oracles, unless ``eager`` is None: the set
    (kept by the run's host) of the losses found not to compile. Dynamo and inductor are set for it: graphs compiled
    in this process (no pool of compiler processes left behind an actor), and a process that would need more graphs
    than :data:`RECOMPILE_LIMIT` told so rather than running some steps eagerly unseen."""
    if eager is None:
        yield
        return
    from torch._dynamo import config as dynamo
    from torch._inductor import config as inductor

    _quiet_cuda_home()
    token = ENABLED.set(eager)
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


def _loss_grad(problem: Any, x: Tensor, *batch: Any) -> tuple[Tensor, Tensor]:
    return torch.func.grad_and_value(lambda z: problem.loss(z, *batch))(x)


def _both_grads(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> tuple[tuple[Tensor, Tensor], Tensor]:
    return torch.func.grad_and_value(loss, argnums=(0, 1))(x, y)


_graphs: dict[Callable[..., Any], Callable[..., Any]] = {}
"""Each oracle's compiled function (dynamo keeps its graphs, one per loss and shape, with it)."""


def _compiled(oracle: Callable[..., Any], key: object, name: str, *args: Any) -> Any:
    """``oracle(*args)`` by its compiled function; None where the run has found the loss ``key`` not to compile, or
    finds it now (a warning names it: ``name``)."""
    eager = ENABLED.get()
    if eager is None or key in eager:
        return None
    graph = _graphs.get(oracle)
    if graph is None:
        graph = _graphs[oracle] = torch.compile(oracle, fullgraph=True, dynamic=False)
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException

    try:
        return graph(*args)
    except (TorchDynamoException, FailOnRecompileLimitHit) as error:
        eager.add(key)
        if isinstance(error, FailOnRecompileLimitHit):
            reason = f"this process would hold more than {RECOMPILE_LIMIT} of its graphs"
        else:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        warnings.warn(f"federation.torch_compile: the loss of {name} does not compile into one graph ({reason}); "
                      "its steps run eagerly", RuntimeWarning, stacklevel=3)
        return None


def grad_and_loss(problem: Any, x: Tensor, *batch: Any) -> tuple[Tensor, Tensor] | None:
    """Gradient and value of ``problem.loss(x, *batch)`` by the compiled graph for the problem's type and the
    arguments' shapes (compiled at its first call: seconds); None where the loss does not compile (the caller's
    eager oracle then runs)."""
    done = _compiled(_loss_grad, type(problem), type(problem).__name__, problem, x.detach(), *batch)
    return None if done is None else (done[0], done[1].detach())


def grad_xy_and_value(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """(d loss / dx, d loss / dy, loss) at (x, y) by the compiled graph for the loss's code and the shapes (zeros for
    a variable the loss does not use, as the eager oracle gives); None where the loss does not compile."""
    key = getattr(loss, "__code__", type(loss))  # a function's code: the same for each step's new lambda
    done = _compiled(_both_grads, key, getattr(loss, "__qualname__", type(loss).__name__), loss, x.detach(), y.detach())
    return None if done is None else (done[0][0], done[0][1], done[1].detach())
