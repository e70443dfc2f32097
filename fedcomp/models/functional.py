"""Flat-parameter views of ``torch.nn`` models, with BatchNorm running statistics as explicit state.

Algorithms see a model's parameters as one flat float32 vector (what is averaged and what crosses the
wire); tasks call the model functionally on that vector through :class:`FlatModel`.

BatchNorm running statistics are module *buffers*, not parameters: no gradient step touches them, every
forward pass in training mode moves them (momentum rule), and evaluation normalises with them. A
``FlatModel`` keeps them as one flat float32 vector, :attr:`FlatModel.running`, outside the module:

* a forward pass in training mode normalises with the batch's statistics (so it is a pure function of the
  parameters, which ``torch.func`` transforms and double backward need) and moves ``running`` by
  BatchNorm's rule ``r <- (1 - m) r + m s`` with the batch mean and unbiased variance, outside the autograd
  graph: under plain autograd the BatchNorm kernels move a new copy of ``running`` as ``nn.BatchNorm`` moves
  its own buffers (the same kernel, so the same bits); inside a ``torch.func`` transform, where a kernel may not
  write a plain tensor, forward pre-hooks record each layer's batch statistics and the rule is applied in one
  go when ``running`` is next read;
* a forward pass in evaluation mode normalises with ``running``.

Whose statistics ``running`` holds is the caller's business: a client host swaps each client's in and out
around its programs and the server loads the global ones before evaluating (:mod:`fedcomp.platform.buffers`).
A module built without running statistics (``track_running_stats=False``) has none here either
(``buffer_dim == 0``) and always normalises with batch statistics.

In-place steps (:meth:`FlatModel.grad_pieces`): differentiating a loss with respect to a flat leaf vector
makes autograd concatenate the parameters' gradients into a new flat vector every step. ``grad_pieces``
instead differentiates per-parameter leaves that share the flat vector's storage and hands back their
gradients as they are -- the same kernels on the same operands, so the same bits, without the copy; a step
applies them to the flat state cut the same way (:meth:`FlatModel.pieces`). It applies when the loss calls the model once on the flat vector and uses it nowhere else, and
reports when it does not, so that the caller differentiates the flat leaf instead.

Fused SGD steps (:meth:`FlatModel.factored_grad_pieces`, ``federation.fused_sgd``): an ``nn.Linear`` layer's weight
gradient is ``g^T a`` -- the gradients at its outputs times its inputs, summed over the batch -- and forming it writes
a matrix the size of the weight that the step then reads back. ``factored_grad_pieces`` runs the same forward and
backward passes and keeps the two thin factors of each such gradient instead; a step applies them as one matrix
product into the weight (``W <- W - lr g^T a``) or into a momentum buffer (``b <- mu b + g^T a``), by ``addmm_``:
the same step, computed with different roundings (the product's epilogue), so not the bits of the exact step
(:meth:`grad_pieces` then ``x - lr grad``), but the same bits on every backend and packing. Every other parameter
takes the exact step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedcomp.models import mlp_gradient


class FlatModel:
    """Calls ``module`` with parameters taken from a flat vector (views, no copies) and running statistics from
    :attr:`running` (module docstring); the module's own buffers are never read or written."""

    kernel_statistics = True
    """Whether training forwards outside ``torch.func`` let the BatchNorm kernels move :attr:`running` (module
    docstring); False takes the hooks' path everywhere, as before (``benchmarks/bn_step.py`` compares the two)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.dim = sum(self.sizes)
        self.norms: list[tuple[str, nn.modules.batchnorm._BatchNorm]] = []
        for name, mod in module.named_modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.track_running_stats:
                if mod.momentum is None:
                    raise ValueError(f"BatchNorm {name!r} has momentum=None (a cumulative average); use a number")
                self.norms.append((name, mod))
        self.buffer_names = [f"{n}.{s}" for n, _ in self.norms for s in ("running_mean", "running_var")]
        self.buffer_sizes = [m.num_features for _, m in self.norms for _ in range(2)]
        self.buffer_dim = sum(self.buffer_sizes)
        """Entries of :attr:`running` (a mean and a variance per BatchNorm channel); 0 without running statistics."""
        self._untracked: dict[str, Any] = {n: None for n, b in module.named_buffers()}
        self._running = self.initial_buffers()
        self._pending: list[list[Tensor]] = []
        """Batch statistics of training forwards not yet folded into ``_running`` (folded when it is read)."""
        momenta: list[Any] = [m.momentum for _, m in self.norms for _ in range(2)]  # floats: None is refused above
        sizes = torch.tensor(self.buffer_sizes, dtype=torch.long)
        self._keep, self._rate = (torch.tensor(v).repeat_interleave(sizes) for v in ([1 - m for m in momenta], momenta))
        """(1 - m, m) per entry of ``_running`` (float32; 1 - m taken in float64 then rounded, as a Python number is
        in a kernel): the momentum rule over the whole flat vector at once."""
        self._seen: list[Tensor] | None = None
        self._direct: _Direct | None = None
        """While :meth:`grad_pieces` runs: the stand-in for the flat vector and the leaves to call the module with."""
        self.direct_ok = True
        """False once a loss used the flat vector other than by one call of this model (:meth:`grad_pieces`)."""
        buffers = [n for n, _ in module.named_buffers()]
        tied = len(list(module.named_parameters(remove_duplicate=False))) != len(self.names) or len(
            list(module.named_buffers(remove_duplicate=False))) != len(buffers)
        self._slots = None if tied else {n: _slot(module, n) for n in [*self.names, *buffers]}
        """Name -> (the dict holding that parameter or buffer in its submodule, its key there), for :meth:`_forward`
        (None: tied parameters or buffers)."""
        self._linears = [] if tied else [
            (mod, self.names.index(f"{name}.weight")) for name, mod in module.named_modules()
            if isinstance(mod, nn.Linear) and type(mod).forward is nn.Linear.forward and f"{name}.weight" in self.names
        ]
        """The plain ``nn.Linear`` layers with their weight's index among the parameters: the layers whose weight
        gradient :meth:`factored_grad_pieces` keeps as factors (none in a model with tied parameters)."""
        self._mlp = mlp_gradient.plan_of(module)
        """The perceptron's plan where the module is one :meth:`cross_entropy_grad` differentiates without a tape."""

    @property
    def running(self) -> Tensor:
        """The running statistics training forwards move and evaluation forwards read (module docstring).

        Each pending batch folds in as ``(1 - m) r + m s`` over the whole flat vector at once (per-entry m):
        three elementwise kernels and a concatenation, where one per BatchNorm buffer took 116 for ResNet20 --
        each a kernel launch on a GPU -- with the same roundings, so the same bits."""
        for batch in self._pending:
            device = batch[0].device
            if self._keep.device != device:  # moved once, not copied to a GPU at every fold
                self._keep, self._rate = self._keep.to(device), self._rate.to(device)
            self._running = self._keep * self._running.to(device) + self._rate * torch.cat(batch)
        self._pending = []
        return _plain(self._running)

    @running.setter
    def running(self, value: Tensor) -> None:
        if value.shape != (self.buffer_dim,):
            raise ValueError(f"running statistics of shape {tuple(value.shape)}: the model needs ({self.buffer_dim},)")
        self._running, self._pending = value, []

    def unflatten(self, x: Tensor) -> dict[str, Tensor]:
        return {n: v.view(s) for n, v, s in zip(self.names, x.split(self.sizes), self.shapes)}

    def flatten(self) -> Tensor:
        """The module's current parameters as a new flat float32 vector."""
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).float()

    def initial_buffers(self) -> Tensor:
        """Fresh running statistics, as ``nn.BatchNorm`` starts them: means 0, variances 1."""
        parts = [torch.zeros(m.num_features) if s == 0 else torch.ones(m.num_features) for _, m in self.norms for s in (0, 1)]
        return torch.cat(parts) if parts else torch.zeros(0)

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Forward passes in evaluation mode (with :attr:`running`, no gradients) inside the block."""
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.module.train(was_training)

    def __call__(self, x: Tensor, *inputs: Tensor) -> Tensor:
        """The module's output at parameters ``x``: in training mode with batch statistics (moving
        :attr:`running`), in evaluation mode with :attr:`running`."""
        direct = self._direct
        if direct is not None and x is direct.marker:
            direct.calls += 1
            params = dict(zip(self.names, direct.leaves))
        else:
            params = self.unflatten(x)
        if not self.buffer_dim:
            return self._forward(params, inputs)
        if not self.module.training:
            stats = dict(zip(self.buffer_names, self.running.to(x.device).split(self.buffer_sizes)))
            return self._forward({**params, **self._untracked, **stats}, inputs)
        if self.kernel_statistics and torch._C._functorch.peek_interpreter_stack() is None:
            return self._forward_moving_running(params, inputs, x.device)
        self._seen = []
        hooks = [mod.register_forward_pre_hook(self._record) for _, mod in self.norms]
        try:
            out = self._forward({**params, **self._untracked}, inputs)
            seen = self._seen
        finally:
            for hook in hooks:
                hook.remove()
            self._seen = None
        if len(seen) != 2 * len(self.norms):
            raise RuntimeError(f"the forward pass ran {len(seen) // 2} of the model's {len(self.norms)} BatchNorm layers")
        # folded in when `running` is next read: here we may be inside a torch.func transform, where any
        # arithmetic would give wrapped tensors
        self._pending.append(seen)
        return out

    def _forward_moving_running(self, params: dict[str, Tensor], inputs: tuple[Tensor, ...], device: torch.device) -> Tensor:
        """A training forward outside ``torch.func`` transforms: each BatchNorm kernel moves its share of a new
        copy of :attr:`running` as ``nn.BatchNorm`` moves its own buffers (the same kernel, so the same bits),
        where the recording hooks would add a mean and a variance per layer and the fold its arithmetic --
        for ResNet20 about a fifth of a step's kernels, each a launch on a GPU."""
        self._running = self.running.to(device, copy=True)  # a new tensor: one handed out earlier stays as it was
        stats = dict(zip(self.buffer_names, self._running.split(self.buffer_sizes)))
        return self._forward({**params, **self._untracked, **stats}, inputs)

    def _forward(self, tensors: dict[str, Any], inputs: tuple[Tensor, ...]) -> Tensor:
        """``functional_call(module, tensors, inputs)`` for a module without tied parameters or buffers: the same
        swap of each named slot (parameter or buffer; None empties a buffer) for the given tensor around the
        forward pass, without re-deriving on every call which submodule owns which name and which names are
        tied -- about 90 us a call for a small MLP, a quarter of its step, and more the more modules a network has."""
        slots = self._slots
        if slots is None or not tensors.keys() <= slots.keys():
            return functional_call(self.module, tensors, inputs)
        held = []
        try:
            for name, tensor in tensors.items():
                store, attr = slots[name]
                held.append((store, attr, store[attr]))
                store[attr] = tensor
            return self.module(*inputs)
        finally:
            for store, attr, tensor in reversed(held):
                store[attr] = tensor

    def pieces(self, x: Tensor) -> list[Tensor]:
        """The flat vector ``x`` cut into the parameters' shapes (views: writing them writes ``x``)."""
        return [v.view(s) for v, s in zip(x.split(self.sizes), self.shapes)]

    def cross_entropy_grad(self, x: Tensor, inputs: Tensor, labels: Tensor) -> tuple[list[Tensor], Tensor] | None:
        """The gradient at ``x`` of ``F.cross_entropy(self(x, inputs), labels)`` as the parameters' gradients (cut as
        :meth:`pieces` cuts ``x``) and the loss, computed without autograd's tape where the module is a perceptron
        (:mod:`fedcomp.models.mlp_gradient`): autograd's bits in less time; under ``vmap`` (lockstep clients) batched,
        with the bits of ``vmap`` over ``torch.func.grad_and_value``. ``None`` where it is not, inside any other
        ``torch.func`` transform (:func:`only_vmapped`), and under ``vmap`` where ``torch.func`` rounds otherwise
        (:attr:`~fedcomp.models.mlp_gradient.MlpPlan.matches_torch_func`): the caller differentiates by autograd."""
        plan = self._untaped_plan(x, inputs)
        if plan is None:
            return None
        stacked = _stacked_under_vmap(x, inputs, labels)
        if stacked is not None:  # every client at once by batched kernels: vmap's bits, without its per-operator cost
            levels, (states, features, targets) = stacked
            done = plan.batched_cross_entropy(
                [v.view(len(states), *s) for v, s in zip(states.split(self.sizes, 1), self.shapes)], features, targets)
            if done is not None:
                grads, loss = done
                return [_batched_at(g, levels) for g in grads], _batched_at(loss, levels)
        return plan.cross_entropy(self.pieces(x.detach()), inputs, labels)

    def cross_entropy_factors(
        self, x: Tensor, inputs: Tensor, labels: Tensor,
    ) -> tuple[list[Tensor | None], dict[int, list[tuple[Tensor, Tensor]]], Tensor] | None:
        """:meth:`factored_grad_pieces` of that cross-entropy without autograd's tape, the same bits (fused SGD
        steps); ``None`` where :meth:`cross_entropy_grad` declines or every parameter is a weight."""
        plan = self._untaped_plan(x, inputs)
        if plan is None or self._only_weights:
            return None
        return plan.cross_entropy_factors(self.pieces(x.detach()), inputs, labels)

    @property
    def _only_weights(self) -> bool:
        """Every parameter is a plain linear layer's weight: no factored gradient then (a step needs one gradient to
        apply as it is)."""
        return len(self._linears) == len(self.shapes)

    def _untaped_plan(self, x: Tensor, inputs: Tensor) -> mlp_gradient.MlpPlan | None:
        if self._mlp is None or x.shape != (self.dim,) or not (only_vmapped(x) and only_vmapped(inputs)):
            return None
        if not self._mlp.matches_torch_func and torch._C._functorch.peek_interpreter_stack() is not None:
            return None
        return self._mlp

    def grad_pieces(self, loss: Callable[[Tensor], Tensor], x: Tensor) -> tuple[list[Tensor], Tensor] | None:
        """d loss / dx at ``x`` as the parameters' gradients (one new tensor per parameter, cut as
        :meth:`pieces` cuts ``x``), and ``loss(x)`` (detached): the same bits as differentiating the flat leaf
        (module docstring), without concatenating them into a new flat vector.

        ``None`` (the running statistics untouched) when ``loss`` did not call this model exactly once with the
        vector it was given or used that vector otherwise: the caller then differentiates the flat leaf. From
        then on this model declines at once (:attr:`direct_ok`)."""
        done = self._differentiate(loss, x, None)
        if done is None:
            return None
        grads, value = done
        return [torch.zeros_like(p) if g is None else g for p, g in zip(self.pieces(x), grads)], value

    def factored_grad_pieces(
        self, loss: Callable[[Tensor], Tensor], x: Tensor,
    ) -> tuple[list[Tensor | None], dict[int, list[tuple[Tensor, Tensor]]], Tensor] | None:
        """:meth:`grad_pieces` with the plain ``nn.Linear`` layers' weight gradients kept as their factors (module
        docstring): ``(grads, factors, loss(x))`` where ``factors[i]`` lists ``(rows, inputs)``, one pair per call
        of the layer, so that parameter i's gradient is ``grads[i]`` (None where it has no other part) plus the sum
        of ``rows^T inputs`` over its pairs. Every other parameter's gradient is :meth:`grad_pieces`' (zeros for one
        the loss does not use).

        ``None``, ``x`` and the running statistics untouched, where :meth:`grad_pieces` declines, and where every
        parameter is such a weight (a step needs one gradient to apply as it is)."""
        if self._only_weights:
            return None
        factors: dict[int, list[tuple[Tensor, Tensor]]] = {}
        done = self._differentiate(loss, x, factors)
        if done is None:
            return None
        grads, value = done
        factors = {i: pairs for i, pairs in factors.items() if pairs}  # a layer the loss did not call: zeros, below
        return [g if g is not None or i in factors else torch.zeros_like(p)
                for i, (p, g) in enumerate(zip(self.pieces(x), grads))], factors, value

    def _differentiate(
        self, loss: Callable[[Tensor], Tensor], x: Tensor, factors: dict[int, list[tuple[Tensor, Tensor]]] | None,
    ) -> tuple[list[Tensor | None], Tensor] | None:
        """:meth:`grad_pieces`' gradients (None for a parameter the loss does not use) and value; with ``factors``
        (a dict to fill) the plain ``nn.Linear`` layers' weights get no gradient and their factors go to
        ``factors[index of the weight]`` instead, as (gradients at the outputs, inputs) per call of the layer
        (where it declines, ``factors`` holds whatever was recorded: the caller drops it)."""
        usable = x.shape == (self.dim,) and x.is_contiguous() and torch.is_grad_enabled()
        if not (self.direct_ok and usable) or torch._C._functorch.is_functorch_wrapped_tensor(x):
            return None
        leaves = [v.detach().requires_grad_(True) for v in self.pieces(x.detach())]
        direct = self._direct = _Direct(x.detach().requires_grad_(True), leaves)
        pending, running = len(self._pending), self._running
        linears = self._linears if factors is not None else []
        for mod, index in linears:
            mod.forward = _FactoredForward(mod, factors.setdefault(index, []))  # type: ignore[union-attr, method-assign]
        try:
            value = loss(direct.marker)
        finally:
            self._direct = None
            for mod, _ in linears:
                del mod.forward
        if direct.calls == 1 and value.requires_grad:
            marker_grad, *grads = torch.autograd.grad(value, [direct.marker, *leaves], allow_unused=True)
            if marker_grad is None:  # a parameter the loss does not use: autograd's flat gradient holds zeros there
                return grads, value.detach()
        self.direct_ok = False
        del self._pending[pending:]
        self._running = running
        return None

    def _record(self, _module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        """Forward pre-hook of each BatchNorm layer: the batch mean and unbiased variance per channel of its input."""
        assert self._seen is not None
        z = _plain(inputs[0])
        with torch.no_grad():
            dims = [d for d in range(z.dim()) if d != 1]
            self._seen += [_plain(z.mean(dims).float()), _plain(z.var(dims, correction=1).float())]


def _slot(module: nn.Module, name: str) -> tuple[dict[str, Any], str]:
    """The dict holding parameter or buffer ``name`` (dotted, as ``named_parameters`` / ``named_buffers`` give
    it) in its submodule -- ``_parameters`` or ``_buffers`` -- and its key there."""
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    return (owner._parameters if attr in owner._parameters else owner._buffers), attr


class _FactoredForward:
    """An ``nn.Linear`` layer's forward during :meth:`FlatModel.factored_grad_pieces`: ``F.linear`` as the layer computes it,
    whose backward hands back no weight gradient and appends its factors to ``factors`` (:class:`_FactoredLinear`)."""

    def __init__(self, layer: nn.Linear, factors: list[tuple[Tensor, Tensor]]) -> None:
        self.layer, self.factors = layer, factors

    def __call__(self, input: Tensor) -> Tensor:
        out: Tensor = _FactoredLinear.apply(input, self.layer.weight, self.layer.bias, self.factors)
        return out


class _FactoredLinear(torch.autograd.Function):
    """``F.linear(input, weight, bias)`` whose backward gives the input's and the bias's gradients as autograd
    would and, for the weight, appends the factors of its gradient ``rows^T inputs`` to ``factors`` in place of
    the gradient (which it leaves None)."""

    @staticmethod
    def forward(  # the classic signature (ctx first): apply then binds no arguments by inspection
        ctx: Any, input: Tensor, weight: Tensor, bias: Tensor | None, factors: list[tuple[Tensor, Tensor]],
    ) -> Tensor:
        ctx.save_for_backward(input, weight)
        ctx.factors = factors
        return F.linear(input, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None, None]:
        input, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        ctx.factors.append((rows, input.reshape(-1, input.shape[-1])))
        grad_input = None
        if ctx.needs_input_grad[0]:  # a 2-D input's gradient in autograd's order for its layout
            grad_input = mlp_gradient.input_grad(grad, input, weight) if input.dim() == 2 else grad.matmul(weight)
        grad_bias = rows.sum(0) if ctx.needs_input_grad[2] else None
        return grad_input, None, grad_bias, None


class _Direct:
    """One :meth:`FlatModel.grad_pieces` call's stand-in for the flat vector, the leaves it maps to, the calls seen."""

    def __init__(self, marker: Tensor, leaves: list[Tensor]) -> None:
        self.marker, self.leaves, self.calls = marker, leaves, 0


def only_vmapped(t: Tensor) -> bool:
    """Whether every ``torch.func`` transform wrapping ``t`` (none counts) is ``vmap``: the kernels an untaped
    gradient calls batch as autograd's backward kernels do, whereas under ``grad``, ``vjp`` or ``jvp`` an untaped
    gradient would be a constant to the transform, which must see the loss's operations to differentiate them."""
    return _vmap_layers(t) is not None


def _vmap_layers(t: Tensor) -> tuple[list[tuple[int, int, int]], Tensor] | None:
    """``t``'s ``vmap`` levels as (level, batch axis, size), outermost first, and the plain tensor underneath; None
    where a wrapper is another transform's."""
    functorch = torch._C._functorch
    layers = []
    while functorch.is_functorch_wrapped_tensor(t):
        if not functorch.is_batchedtensor(t):
            return None
        level, axis = functorch.maybe_get_level(t), functorch.maybe_get_bdim(t)
        t = functorch.get_unwrapped(t)
        layers.append((level, axis, t.shape[axis]))
    return layers[::-1], t


def _stacked_under_vmap(x: Tensor, inputs: Tensor, labels: Tensor) -> tuple[list[tuple[int, int]], list[Tensor]] | None:
    """Inside ``vmap`` on a CPU, with ``x`` batched at the innermost level and at any enclosing ``vmap`` levels,
    ``inputs`` and ``labels`` at some of those, each batch axis first and the tensors underneath stored contiguously
    -- as lockstep clients' stacked states and draws are, a sweep's configurations around them: the levels with their
    sizes, outermost first, and the plain tensors underneath with every level's axis merged into one leading axis
    (``inputs`` or ``labels`` repeated along the levels they lack). None otherwise (other layouts make ``vmap`` pick
    other kernels, with other roundings), and where a label is negative (``cross_entropy``'s ignored index, which
    :meth:`~fedcomp.models.mlp_gradient.MlpPlan.batched_cross_entropy` does not know)."""
    functorch = torch._C._functorch
    top = functorch.peek_interpreter_stack()
    if top is None or top.key() != functorch.TransformType.Vmap:
        return None
    peeled = _peeled(x)
    if peeled is None or not peeled[0] or peeled[0][-1][0] != top.level() or peeled[1].device.type != "cpu":
        return None
    levels, states = peeled
    plain = [states.view(-1, *states.shape[len(levels):])]
    for other in (inputs, labels):
        own_and_tensor = _peeled(other)
        if own_and_tensor is None or not set(own_and_tensor[0]) <= set(levels):
            return None
        own, t = own_and_tensor
        for axis, (level, size) in enumerate(levels):
            if (level, size) not in own:
                t = t.unsqueeze(axis).expand(*t.shape[:axis], size, *t.shape[axis:])
        plain.append(t.reshape(-1, *t.shape[len(levels):]))
    return None if bool((plain[2] < 0).any()) else (levels, plain)


def _peeled(t: Tensor) -> tuple[list[tuple[int, int]], Tensor] | None:
    """``t``'s ``vmap`` levels with their sizes, outermost first, and the contiguous plain tensor underneath, whose
    leading axes they are; None where a wrapper is another transform's, a batch axis is not first, or the tensor
    underneath is not contiguous."""
    found = _vmap_layers(t)
    if found is None or any(axis for _, axis, _ in found[0]) or not found[1].is_contiguous():
        return None
    return [(level, size) for level, _, size in found[0]], found[1]


def _batched_at(t: Tensor, levels: list[tuple[int, int]]) -> Tensor:
    """A result of the merged leading axis (:func:`_stacked_under_vmap`) as a tensor batched at ``levels`` again."""
    t = t.view(*(size for _, size in levels), *t.shape[1:])
    for level, _ in levels:
        t = torch._C._functorch._add_batch_dim(t, 0, level)
    return t


def _plain(t: Tensor) -> Tensor:
    """``t`` without ``torch.func`` wrappers: inside a transform every result is wrapped, and the statistics
    are values outside the autograd graph that must outlive the transform."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        if torch._C._functorch.is_batchedtensor(t):
            raise RuntimeError("BatchNorm running statistics cannot be tracked under vmap (clients in lockstep)")
        t = torch._C._functorch.get_unwrapped(t)
    return t
