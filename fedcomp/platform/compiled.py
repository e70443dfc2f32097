"""The first- and second-order oracles compiled by ``torch.compile`` (``federation.torch_compile``).

A small model's step is mostly the framework's own work per operator -- autograd's graph, the Python of the
forward, one kernel launch per operation -- rather than arithmetic: the MLP 32-64-10 at batch 16 took 0.20 ms per
gradient eagerly on one CPU thread and 0.07 ms compiled (``benchmarks/COMPILED.md``; the heavy MLP 32-1024-1024-10's
2.8 and 2.1 ms, and its in-place exact steps no slower than the compiled ones). Under ``federation.torch_compile``
every oracle of :mod:`fedcomp.platform.oracles` -- the loss gradient of SGD-type steps, both partial gradients of a
two-variable loss, FedNest's y-gradient and second-order products, the compositional kinds' grad f, grad h,
h + g.v's gradient, g's Jacobian and the DRO baselines' weighted per-example gradient -- is ``torch.func``'s
transform of the function it differentiates, traced by dynamo and compiled by inductor, one graph per oracle, function
and shape, in every process that runs clients. g's value with its vector-Jacobian product (the compositional kinds'
inner step; taken after g's value is used) is a compiled forward whose backward AOTAutograd compiles with it.

Numbers: the compiled kernels add and fuse in other orders than the eager ones, so a compiled run equals the eager
run up to float32 rounding, not bit for bit. Every process compiles the same graph into the same code (a fixed
shape, no dynamic shapes, inductor's code for the machine's CPU), so a run gives the same bits on every backend and
packing, on machines of one kind. A function that dynamo cannot capture in one graph (a network that keeps BatchNorm
running statistics, say) runs eagerly under that oracle for the rest of the run in every process alike, with a
warning, so the numbers still do not depend on where a client runs. Python numbers a function reads are constants
of its graph: a task whose "batch" were the client's index would compile a graph per client, until
:data:`RECOMPILE_LIMIT` (the exact-oracle tasks pass each client's function as tensors instead).
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

from fedcomp.platform.errors import first_line

ENABLED: ContextVar[set[object] | None] = ContextVar("torch_compile", default=None)
"""While a host runs client programs under ``federation.torch_compile`` (:func:`enabled`): its run's (oracle, function)
pairs that did not compile (they run eagerly); None otherwise."""
RECOMPILE_LIMIT = 64
"""Graphs one process keeps for each oracle (a function and shape each; dynamo's default is 8): runs that follow one
another in a kept actor or a notebook each may add theirs."""


@contextmanager
def enabled(eager: set[object] | None) -> Iterator[None]:
    """Client programs run inside take their gradients by the compiled oracles, unless ``eager`` is None: the set
    (kept by the run's host) of the (oracle, function) pairs found not to compile. Dynamo and inductor are set for it: graphs compiled
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


def _y_grad(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> Any:
    return torch.func.grad(loss, argnums=1)(x, y)


def _hvp_yy(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor, v: Tensor) -> Any:
    return torch.func.grad(lambda w: torch.func.grad(loss, argnums=1)(x, w) @ v)(y)


def _jvp_xy(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor, v: Tensor) -> Any:
    return torch.func.grad(lambda z: torch.func.grad(loss, argnums=1)(z, y) @ v)(x)


def _outer_grad(problem: Any, y: Tensor, *zeta: Any) -> tuple[Tensor, Tensor]:
    return torch.func.grad_and_value(lambda z: problem.outer(z, *zeta))(y)


def _plain_grad(problem: Any, x: Tensor, batch: Any) -> tuple[Tensor, Tensor]:
    return torch.func.grad_and_value(lambda z: problem.plain(z, batch))(x)


def _plain_inner_vjp(problem: Any, x: Tensor, batch: Any, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    def total(z: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        plain, inner = problem.plain(z, batch), problem.inner(z, batch)
        return plain + inner @ v, (plain, inner)

    grad, (plain, inner) = torch.func.grad(total, has_aux=True)(x)
    return grad, plain, inner


def _weighted_example_grad(problem: Any, x: Tensor, batch: Any, weights: Tensor) -> Any:
    return torch.func.grad(lambda z: weights @ problem.example_losses(z, batch).reshape(-1))(x)


def _inner_value(problem: Any, x: Tensor, xi: Any) -> Any:
    return problem.inner(x, xi)


def _inner_jacobian(problem: Any, x: Tensor, batch: Any) -> Any:
    def twice(z: Tensor) -> tuple[Tensor, Tensor]:
        value = problem.inner(z, batch)
        return value, value

    return torch.func.jacrev(twice, has_aux=True)(x)


_graphs: dict[Callable[..., Any], Callable[..., Any]] = {}
"""Each oracle's compiled function (dynamo keeps its graphs, one per function compiled and shape, with it)."""


def _compiled(oracle: Callable[..., Any], key: object, name: str, *args: Any) -> Any:
    """``oracle(*args)`` by its compiled function; None where the run has found ``oracle`` of the function ``key``
    not to compile, or finds it now (a warning names it: ``name``)."""
    eager = ENABLED.get()
    if eager is None or (oracle, key) in eager:
        return None
    graph = _graphs.get(oracle)
    if graph is None:
        graph = _graphs[oracle] = torch.compile(oracle, fullgraph=True, dynamic=False)
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException

    try:
        return graph(*args)
    except (TorchDynamoException, FailOnRecompileLimitHit) as error:
        eager.add((oracle, key))
        if isinstance(error, FailOnRecompileLimitHit):
            reason = f"this process would hold more than {RECOMPILE_LIMIT} of its graphs"
        else:
            reason = first_line(error)
        warnings.warn(f"federation.torch_compile: {name} does not compile into one graph ({reason}); "
                      "it runs eagerly", RuntimeWarning, stacklevel=4)
        return None


def _of_loss(oracle: Callable[..., Any], what: str, loss: Callable[..., Tensor], *args: Tensor) -> Any:
    """``oracle(loss, *args)`` compiled, for a two-variable loss known by its code (the same for each step's new
    lambda: dynamo's guards tell the closures apart) and named in a warning as ``what`` of it."""
    key = getattr(loss, "__code__", type(loss))
    name = f"{what} of {getattr(loss, '__qualname__', type(loss).__name__)}"
    return _compiled(oracle, key, name, loss, *(a.detach() for a in args))


def _of_problem(oracle: Callable[..., Any], method: str, problem: Any, x: Tensor, *rest: Any) -> Any:
    """``oracle(problem, x, *rest)`` compiled, for the problem's type (its ``method`` is what it differentiates)."""
    return _compiled(oracle, type(problem), f"the {method} of {type(problem).__name__}", problem, x, *rest)


def grad_and_loss(problem: Any, x: Tensor, *batch: Any) -> tuple[Tensor, Tensor] | None:
    """Gradient and value of ``problem.loss(x, *batch)`` by the compiled graph for the problem's type and the
    arguments' shapes (compiled at its first call: seconds); None where the loss does not compile (the caller's
    eager oracle then runs). So for each function below: the eager oracle of the same name in
    :mod:`fedcomp.platform.oracles` says what it computes."""
    done = _of_problem(_loss_grad, "loss", problem, x.detach(), *batch)
    return None if done is None else (done[0], done[1].detach())


def grad_xy_and_value(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """(d loss / dx, d loss / dy, loss) at (x, y) (zeros for a variable the loss does not use, as the eager oracle
    gives)."""
    done = _of_loss(_both_grads, "the gradient", loss, x, y)
    return None if done is None else (done[0][0], done[0][1], done[1].detach())


def grad_y(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> Tensor | None:
    done: Tensor | None = _of_loss(_y_grad, "the y-gradient", loss, x, y)
    return done


def hvp_yy(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor, v: Tensor) -> Tensor | None:
    done: Tensor | None = _of_loss(_hvp_yy, "the Hessian-vector product", loss, x, y, v)
    return done


def jvp_xy(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor, v: Tensor) -> Tensor | None:
    done: Tensor | None = _of_loss(_jvp_xy, "the mixed second-derivative product", loss, x, y, v)
    return done


def outer_grad(problem: Any, y: Tensor, *zeta: Any) -> tuple[Tensor, Tensor] | None:
    done = _of_problem(_outer_grad, "outer function", problem, y.detach(), *zeta)
    return None if done is None else (done[0], done[1].detach())


def plain_grad(problem: Any, x: Tensor, batch: Any) -> tuple[Tensor, Tensor] | None:
    done = _of_problem(_plain_grad, "plain part", problem, x.detach(), batch)
    return None if done is None else (done[0], done[1].detach())


def plain_inner_vjp(problem: Any, x: Tensor, batch: Any, v: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    done = _of_problem(_plain_inner_vjp, "plain and inner parts", problem, x.detach(), batch, v.detach())
    return None if done is None else (done[0], done[1].detach(), done[2].detach())


def weighted_example_grad(problem: Any, x: Tensor, batch: Any, weights: Tensor) -> Tensor | None:
    done: Tensor | None = _of_problem(_weighted_example_grad, "per-example losses", problem, x.detach(), batch,
                                      weights.detach())
    return done


def inner_value(problem: Any, x: Tensor, xi: Any) -> Tensor | None:
    """g(x; xi) by a compiled forward whose backward is compiled with it (AOTAutograd): ``x`` a leaf that requires
    grad, the value differentiable in it by autograd (the vector-Jacobian product of
    :func:`fedcomp.platform.oracles.inner_value_vjp`)."""
    done: Tensor | None = _of_problem(_inner_value, "inner function", problem, x, xi)
    return done


def inner_and_jacobian(problem: Any, x: Tensor, batch: Any) -> tuple[Tensor, Tensor] | None:
    done = _of_problem(_inner_jacobian, "Jacobian of the inner function", problem, x.detach(), batch)
    return None if done is None else (done[1].detach(), done[0])
