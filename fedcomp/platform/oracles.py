"""First- and second-order oracles of two-variable losses by automatic differentiation.

Each takes the loss as a function of explicit flat parameters ``(x, y)`` and returns detached tensors.
The compositional kinds' oracles are here too: :func:`inner_value_vjp` (g_k(x; xi) and v -> (dg_k/dx)^T v on
the same draw; second order for MAML unless first-order), :func:`outer_grad` (grad f_k(y; zeta), or grad f(y)
for FedDRO's deterministic f), and FedDRO's problem kind h + f(g) on one batch: :func:`plain_inner_vjp`,
:func:`plain_grad`, :func:`inner_and_jacobian`.
Second-order products use double backpropagation: H_yy v = d/dy <d/dy l, v> and H_xy v = d/dx <d/dy l, v>
(the mixed second derivative applied to a vector in y-space gives a vector in x-space).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

import torch
from torch import Tensor
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

from fedcomp.platform import compiled

Loss2 = Callable[[Tensor, Tensor], Tensor]

LOCKSTEP: ContextVar[bool] = ContextVar("lockstep", default=False)
"""True while a host runs clients in lockstep under ``vmap`` (set by :mod:`fedcomp.platform.vectorised`)."""

FUSED_SGD: ContextVar[bool] = ContextVar("fused_sgd", default=False)
"""True while a host runs client programs under ``federation.fused_sgd``: SGD steps taken in place (plain, with
momentum or FedProx's; :func:`grad_and_loss_factors`) apply the model's linear layers' gradients by their factors
(:meth:`fedcomp.models.functional.FlatModel.factored_grad_pieces`)."""


P = ParamSpec("P")
R = TypeVar("R")


def _compiled_first(fast: Callable[P, R | None]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The oracle answers by ``fast``, its twin in :mod:`fedcomp.platform.compiled`, while a host runs client programs
    under ``federation.torch_compile`` (:data:`fedcomp.platform.compiled.ENABLED`; not in lockstep) and the function it
    differentiates compiles; by its own (eager) code otherwise."""

    def wrap(eager: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(eager)
        def oracle(*args: P.args, **kwargs: P.kwargs) -> R:
            if compiled.ENABLED.get() is not None and not LOCKSTEP.get():
                done = fast(*args, **kwargs)
                if done is not None:
                    return done
            return eager(*args, **kwargs)

        return oracle

    return wrap


@_compiled_first(compiled.grad_and_loss)
def grad_and_loss(problem: Any, x: Tensor, *batch: Any) -> tuple[Tensor, Tensor]:
    """Gradient and value of ``problem.loss(x, *batch)`` at ``x``.

    By the problem's own untaped gradient where it has one (:func:`untaped`; batched under ``vmap`` too); otherwise
    under ``vmap`` (lockstep clients) by ``torch.func.grad_and_value``, and eagerly by plain autograd, which costs
    less than half as much per call for small models and gives the same bits but where ``torch.func`` decomposes a
    derivative (SiLU's: :attr:`~fedcomp.models.mlp_gradient.MlpPlan.matches_torch_func`)."""
    done = untaped(problem, x, batch)
    if done is not None:
        grads, value = done
        return _joined(grads), value
    if LOCKSTEP.get():
        return torch.func.grad_and_value(lambda z: problem.loss(z, *batch))(x)
    x = x.detach().requires_grad_(True)
    value = problem.loss(x, *batch)
    (grad,) = torch.autograd.grad(value, x)
    return grad, value.detach()


_AGREES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
"""Per problem that declares ``classifier_inputs``: whether its model's untaped gradient gave autograd's answer."""


def untaped(problem: Any, x: Tensor, batch: tuple[Any, ...], factored: bool = False) -> Any:
    """The problem's loss gradient at ``x`` computed without autograd's tape -- ``(grads, loss)`` as the model's
    parameter gradients, or with ``factored`` ``(grads, factors, loss)`` as
    :meth:`~fedcomp.models.functional.FlatModel.factored_grad_pieces` gives them -- where the problem declares its
    loss the mean cross-entropy of its model (``problem.classifier_inputs(*batch) -> (features, labels)``) and the
    model is a perceptron (:mod:`fedcomp.models.mlp_gradient`): autograd's bits, faster; batched under ``vmap``
    (lockstep clients) too, with the bits of ``vmap`` over ``torch.func.grad_and_value``. None otherwise.

    A declaration is taken on trust only once it has been seen to hold: at a problem's first call, the untaped
    gradient and loss are compared with autograd's differentiation of ``problem.loss`` itself -- under ``vmap`` on the
    first client's state and batch, the transforms set aside while autograd runs (``torch.func.grad`` would do, but
    imports ``torch._dynamo``: 150 MiB a process) -- and any difference (a loss that is not what it declares) leaves
    that problem to autograd for good."""
    declared = getattr(problem, "classifier_inputs", None)
    model: Any = getattr(problem, "model", None)
    if declared is None or not hasattr(model, "cross_entropy_grad"):
        return None
    try:
        agrees = _AGREES.get(problem)
    except TypeError:  # a problem that cannot be a weak dictionary's key (unhashable): autograd, every time
        return None
    if agrees is None:
        agrees = _untaped_agrees(problem, model, x, batch)
        if agrees is None:  # not decidable here (inputs inside a transform other than vmap)
            return None
        _AGREES[problem] = agrees
    if not agrees:
        return None
    features, labels = declared(*batch)
    return (model.cross_entropy_factors if factored else model.cross_entropy_grad)(x, features, labels)


def _untaped_agrees(problem: Any, model: Any, x: Tensor, batch: tuple[Any, ...]) -> bool | None:
    """Whether the untaped gradient and loss at ``x`` on ``batch`` are autograd's differentiation of ``problem.loss``
    (:func:`untaped`). Inside ``vmap`` the first client's, unbatched, with the transforms set aside while autograd
    runs; None where that cannot be told: a tensor under another transform (:func:`_first_instance` peels ``vmap``
    off tensors, tuples, lists and dicts only)."""
    transformed = torch._C._functorch.peek_interpreter_stack() is not None
    if transformed:
        x, batch = _first_instance(x), _first_instance(batch)
    features, labels = problem.classifier_inputs(*batch)
    if any(map(_wrapped, (x, features, labels))):
        return None
    with temporarily_clear_interpreter_stack() if transformed else contextlib.nullcontext():
        done = model.cross_entropy_grad(x, features, labels)
        if done is None:
            return False
        leaf = x.detach().requires_grad_(True)
        value = problem.loss(leaf, *batch)
        (expected,) = torch.autograd.grad(value, leaf)
    grads, loss = done
    return torch.equal(_joined(grads), expected) and torch.equal(loss, value.detach())


def _first_instance(tree: Any) -> Any:
    """``tree`` (a tensor, or tuples, lists and dicts of them) with each tensor's ``vmap`` levels peeled off, keeping
    the first item of each batch: what the first client sees, as plain tensors (a tensor under another transform
    keeps that wrapper)."""
    if isinstance(tree, Tensor):
        while torch._C._functorch.is_batchedtensor(tree):
            tree = torch._C._functorch.get_unwrapped(tree).select(torch._C._functorch.maybe_get_bdim(tree), 0)
        return tree
    if isinstance(tree, (tuple, list)):
        return type(tree)(_first_instance(t) for t in tree)
    if isinstance(tree, dict):
        return {k: _first_instance(v) for k, v in tree.items()}
    return tree


def _wrapped(t: Tensor) -> bool:
    return bool(torch._C._functorch.is_functorch_wrapped_tensor(t))


def _joined(grads: list[Tensor]) -> Tensor:
    """The parameters' gradients as one flat vector, the bits autograd gives for a flat leaf."""
    return torch.cat([g.reshape(-1) for g in grads])


class Pieces(list[Tensor]):
    """A flat gradient as pieces the caller owns (the model's parameter gradients, or the one flat gradient);
    :meth:`of` cuts a flat vector of the same layout the same way, so that ``torch._foreach_*`` ops apply
    the gradient to the state in place.

    From :func:`grad_and_loss_factors`, some of the model's linear weights' gradients may be held as factors
    instead (``factors[i]``: ``(rows, inputs)`` pairs, parameter i's gradient being the sum of ``rows^T inputs``
    plus its piece here, if it has one): the list then holds the other pieces, :meth:`of` cuts a flat vector into
    those, and :meth:`add_factors_` adds the factored part where it goes."""

    def __init__(self, grads: list[Tensor], cut: Callable[[Tensor], list[Tensor]] | None = None,
                 factors: dict[int, list[tuple[Tensor, Tensor]]] | None = None, dense: list[int] | None = None) -> None:
        super().__init__(grads)
        self.cut = cut
        self.factors = factors or {}
        self.dense = dense  # the parameters the list holds, where some are factored only
        assert dense is None or len(dense) == len(grads)

    def of(self, flat: Tensor) -> list[Tensor]:
        """``flat`` cut like this gradient (views: writing them writes ``flat``)."""
        return self.select(self.whole(flat))

    def select(self, whole: list[Tensor]) -> list[Tensor]:
        """Of a list cut like :meth:`whole`, the pieces this list holds (all where there are no factors)."""
        return whole if self.dense is None else [whole[i] for i in self.dense]

    def whole(self, flat: Tensor) -> list[Tensor]:
        """``flat`` cut into every piece, the factored ones included (as :meth:`of` where there are none)."""
        return [flat] if self.cut is None else self.cut(flat)

    def add_factors_(self, flat: Tensor, alpha: float, beta: float = 1.0) -> None:
        """``p <- beta p + alpha (rows^T inputs summed over the pairs)`` on each of ``flat``'s pieces with factors, by
        ``addmm_``; ``beta`` (0 ignores p, as a copy does) only where the piece is factored only: the caller's
        step has scaled the others with their dense parts. Nothing where there are no factors."""
        if not self.factors:
            return
        scaled = set(self.dense or ())
        with torch.no_grad():  # the pieces are views that autograd would otherwise refuse to write
            whole = self.whole(flat)
            for index, pairs in self.factors.items():
                first = 1.0 if index in scaled else beta
                for rows, inputs in pairs:
                    whole[index].addmm_(rows.t(), inputs, beta=first, alpha=alpha)
                    first = 1.0

    def flat(self) -> Pieces:
        """The same gradient as one flat vector (the bits autograd gives for a flat leaf); not for factors."""
        assert not self.factors
        return self if self.cut is None else Pieces([_joined(self)])


def grad_and_loss_pieces(problem: Any, x: Tensor, *batch: Any) -> tuple[Pieces, Tensor]:
    """:func:`grad_and_loss` for in-place steps, the same bits: the parameters' gradients as autograd makes
    them where the problem's model can (:meth:`fedcomp.models.functional.FlatModel.grad_pieces`: no flat
    vector assembled per call), otherwise (and under ``federation.torch_compile``) the one flat gradient. The caller
    may overwrite them."""
    model = getattr(problem, "model", None)
    if not LOCKSTEP.get() and compiled.ENABLED.get() is None:
        done = untaped(problem, x, batch)
        if done is not None:
            return Pieces(done[0], model.pieces), done[1]  # type: ignore[union-attr]
    pieces = getattr(model, "grad_pieces", None)
    if pieces is not None and not LOCKSTEP.get() and compiled.ENABLED.get() is None:
        done = pieces(lambda z: problem.loss(z, *batch), x)
        if done is not None:
            return Pieces(done[0], model.pieces), done[1]  # type: ignore[union-attr]
    grad, value = grad_and_loss(problem, x, *batch)
    return Pieces([grad]), value


def grad_and_loss_factors(problem: Any, x: Tensor, *batch: Any) -> tuple[Pieces, Tensor]:
    """:func:`grad_and_loss_pieces`, except that under ``federation.fused_sgd`` (:data:`FUSED_SGD`, not in
    lockstep) the model's plain linear weights' gradients come as factors where it can
    (:meth:`fedcomp.models.functional.FlatModel.factored_grad_pieces`, or :func:`untaped`'s factors, the same bits):
    the caller's step applies the pieces as they are and then :meth:`Pieces.add_factors_`. The same step, other
    roundings in those weights."""
    model = getattr(problem, "model", None)
    factored = getattr(model, "factored_grad_pieces", None)
    if factored is not None and FUSED_SGD.get() and not LOCKSTEP.get():
        done = untaped(problem, x, batch, factored=True) or factored(lambda z: problem.loss(z, *batch), x)
        if done is not None:
            grads, factors, value = done
            dense = [i for i, g in enumerate(grads) if g is not None]
            return Pieces([grads[i] for i in dense], model.pieces, factors, dense), value  # type: ignore[union-attr]
    return grad_and_loss_pieces(problem, x, *batch)


def _leaves(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    return x.detach().requires_grad_(True), y.detach().requires_grad_(True)


def grad_x(loss: Loss2, x: Tensor, y: Tensor) -> Tensor:
    """d loss / dx at (x, y)."""
    return grad_xy(loss, x, y)[0]


@_compiled_first(compiled.grad_y)
def grad_y(loss: Loss2, x: Tensor, y: Tensor) -> Tensor:
    """d loss / dy at (x, y)."""
    x, y = _leaves(x, y)
    return torch.autograd.grad(loss(x, y), y)[0]


def grad_xy(loss: Loss2, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Both partial gradients from one backward pass."""
    gx, gy, _ = grad_xy_and_value(loss, x, y)
    return gx, gy


@_compiled_first(compiled.grad_xy_and_value)
def grad_xy_and_value(loss: Loss2, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(d loss / dx, d loss / dy, loss) at (x, y) from one forward and one backward pass; a variable the loss
    does not use gets a zero gradient. Under lockstep clients by ``torch.func.grad_and_value``."""
    if LOCKSTEP.get():
        (gx, gy), value = torch.func.grad_and_value(loss, argnums=(0, 1))(x, y)
        return gx, gy, value
    x, y = _leaves(x, y)
    value = loss(x, y)
    gx, gy = torch.autograd.grad(value, (x, y), allow_unused=True)
    return (torch.zeros_like(x) if gx is None else gx), (torch.zeros_like(y) if gy is None else gy), value.detach()


@_compiled_first(compiled.hvp_yy)
def hvp_yy(loss: Loss2, x: Tensor, y: Tensor, v: Tensor) -> Tensor:
    """The Hessian-vector product (d^2 loss / dy^2) v."""
    x, y = _leaves(x, y)
    (gy,) = torch.autograd.grad(loss(x, y), y, create_graph=True)
    return torch.autograd.grad(gy @ v, y)[0]


@_compiled_first(compiled.jvp_xy)
def jvp_xy(loss: Loss2, x: Tensor, y: Tensor, v: Tensor) -> Tensor:
    """The mixed product (d^2 loss / dx dy) v: d/dx of <d loss/dy, v>, a vector in x-space."""
    x, y = _leaves(x, y)
    (gy,) = torch.autograd.grad(loss(x, y), y, create_graph=True)
    (gx,) = torch.autograd.grad(gy @ v, x, allow_unused=True)
    return torch.zeros_like(x) if gx is None else gx


# -- the compositional problem kinds' oracles (g's value with its vector-Jacobian product on the same draw;
# grad f) -- under lockstep clients by torch.func transforms, otherwise plain autograd (fewer operations); each
# compiled under federation.torch_compile.


def inner_value_vjp(problem: Any, x: Tensor, xi: Any) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """(g_k(x; xi), v -> (dg_k(x; xi)/dx)^T v); the product may be taken once. Under ``federation.torch_compile``
    g's forward is compiled with its backward, where it compiles."""
    if LOCKSTEP.get():
        value, pullback = torch.func.vjp(lambda z: problem.inner(z, xi), x)  # type: ignore[misc]  # (a 3-tuple only with has_aux)
        return value, lambda v: pullback(v)[0]
    x = x.detach().requires_grad_(True)
    value = compiled.inner_value(problem, x, xi) if compiled.ENABLED.get() is not None else None
    if value is None:
        value = problem.inner(x, xi)

    def vjp(v: Tensor) -> Tensor:
        if not value.requires_grad:  # g does not depend on x
            return torch.zeros_like(x)
        (grad,) = torch.autograd.grad(value, x, v, allow_unused=True)
        return torch.zeros_like(x) if grad is None else grad.detach()

    return value.detach(), vjp


@_compiled_first(compiled.outer_grad)
def outer_grad(problem: Any, y: Tensor, *zeta: Any) -> tuple[Tensor, Tensor]:
    """(grad f_k(y; zeta), f_k(y; zeta)) at the point ``y``; without ``zeta``, grad f(y) of a deterministic f
    (FedDRO's ``problem.outer(z)``)."""
    if LOCKSTEP.get():
        return torch.func.grad_and_value(lambda z: problem.outer(z, *zeta))(y)
    y = y.detach().requires_grad_(True)
    value = problem.outer(y, *zeta)
    (grad,) = torch.autograd.grad(value, y)
    return grad.detach(), value.detach()


@_compiled_first(compiled.plain_inner_vjp)
def plain_inner_vjp(problem: Any, x: Tensor, batch: Any, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """grad h_k(x; b) + (dg_k(x; b)/dx)^T v -- the gradient of h_k(x; b) + g_k(x; b).v, one backward pass --
    with h_k(x; b) and g_k(x; b) (detached). With v = grad f(y) it is the compositional direction at x."""
    x = x.detach().requires_grad_(True)
    plain, inner = problem.plain(x, batch), problem.inner(x, batch)
    (grad,) = torch.autograd.grad(plain + inner @ v, x)
    return grad, plain.detach(), inner.detach()


@_compiled_first(compiled.plain_grad)
def plain_grad(problem: Any, x: Tensor, batch: Any) -> tuple[Tensor, Tensor]:
    """(grad h_k(x; b), h_k(x; b)); a zero gradient for a problem without a plain part."""
    x = x.detach().requires_grad_(True)
    value = problem.plain(x, batch)
    grad = torch.autograd.grad(value, x)[0] if value.requires_grad else torch.zeros_like(x)
    return grad, value.detach()


@_compiled_first(compiled.weighted_example_grad)
def weighted_example_grad(problem: Any, x: Tensor, batch: Any, weights: Tensor) -> Tensor:
    """grad_x sum_i w_i l_i(x) over the batch's per-example losses (``problem.example_losses``), the weights
    constants: the robust DRO baselines' gradient."""
    x = x.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(weights.detach() @ problem.example_losses(x, batch).reshape(-1), x)
    return grad


@_compiled_first(compiled.inner_and_jacobian)
def inner_and_jacobian(problem: Any, x: Tensor, batch: Any) -> tuple[Tensor, Tensor]:
    """g_k(x; b) [d_g] and its Jacobian [d_g, d] (one backward pass per row; d_g is small)."""
    x = x.detach().requires_grad_(True)
    value = problem.inner(x, batch)
    rows = [
        torch.autograd.grad(value[i], x, retain_graph=True)[0] if value.requires_grad else torch.zeros_like(x)
        for i in range(value.numel())
    ]
    return value.detach(), torch.stack(rows)
