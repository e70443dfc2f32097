"""The gradient of a multilayer perceptron's mean cross-entropy, computed without autograd's tape: the kernels
autograd's backward pass runs, called directly, so the same bits in less time.

For a small model a step is mostly bookkeeping: autograd records every forward operator, then its engine walks
the recorded graph; without them the 32-64-10 MLP's FedAvg step takes 0.21 ms instead of 0.30
(``benchmarks/LOCAL_STEP.md``). The backward pass of ``Linear -> activation -> ... -> Linear -> cross_entropy`` is
short enough to write down: for each layer, from the last,

    cross-entropy:  g = _log_softmax_backward_data(nll_loss_backward(1, logp, labels, mean), logp)
    Linear:         grad W = g^T a (an ``mm``),  grad b = g summed over the batch,  g <- g W (``mm``; each product
                    in the order autograd picks from its operands' strides)
    ReLU:           g <- threshold_backward(g, out, 0)   (Tanh, Sigmoid, GELU, LeakyReLU, SiLU: their own
                                                          *_backward kernels, on the output or the input)

each written exactly as autograd's derivative formulas compute it (``addmm``'s backward on the transposed weight
view ``F.linear`` passes it, with that view's strides), so every gradient has autograd's bits: tested on many
shapes against ``torch.autograd.grad`` (``tests/models/test_mlp_gradient.py``), and the benchmark harness's
runners still end on its plain PyTorch loop's weights bit for bit (``tests/test_bench.py``).

:func:`plan_of` accepts an ``nn.Sequential`` (nested ones flattened) of plain ``nn.Linear`` layers (with or
without bias), ``nn.ReLU`` (in place too), ``nn.Tanh``, ``nn.Sigmoid``, ``nn.GELU`` (either approximation),
``nn.LeakyReLU``, ``nn.SiLU``, ``nn.Identity`` and a leading ``nn.Flatten``; any other
module -- BatchNorm, dropout, a subclass with its own ``forward`` -- gives ``None``, and the caller differentiates
by autograd as before. Inputs must reach the first ``Linear`` as a 2-D batch and labels be class indices.

Lockstep clients (``torch.func.vmap``, :mod:`fedcomp.platform.vectorised`) can run the same plan under ``vmap``, which
batches each kernel; :meth:`MlpPlan.batched_cross_entropy` instead runs every client at once by batched kernels
written as ``vmap``'s batching rules run the plan (``addmm`` as the bias plus a ``bmm``), so the same bits at a
fraction of ``vmap``'s per-operator cost (``tests/models/test_mlp_gradient.py``); nested ``vmap`` levels (a lockstep
sweep's configurations around the clients) merged into its one batch axis give nested ``vmap``'s bits too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LINEAR = "linear"
_ACTIVATIONS: dict[type[nn.Module], str] = {
    nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.GELU: "gelu", nn.LeakyReLU: "leaky_relu", nn.SiLU: "silu",
}
_FORWARD: dict[str, Callable[[Tensor, Any], Tensor]] = {
    "relu": lambda z, _: torch.relu(z),
    "tanh": lambda z, _: torch.tanh(z),
    "sigmoid": lambda z, _: torch.sigmoid(z),
    "gelu": lambda z, approximate: F.gelu(z, approximate=approximate),
    "leaky_relu": lambda z, slope: F.leaky_relu(z, slope),
    "silu": lambda z, _: F.silu(z),
}
_BACKWARD: dict[str, Callable[[Tensor, Tensor, Tensor, Any], Tensor]] = {  # (g, the input, the output, the option)
    "relu": lambda g, _, out, __: torch.ops.aten.threshold_backward(g, out, 0),  # ReLU's derivative reads its output
    "tanh": lambda g, _, out, __: torch.ops.aten.tanh_backward(g, out),
    "sigmoid": lambda g, _, out, __: torch.ops.aten.sigmoid_backward(g, out),
    "gelu": lambda g, z, _, approximate: torch.ops.aten.gelu_backward(g, z, approximate=approximate),
    "leaky_relu": lambda g, z, _, slope: torch.ops.aten.leaky_relu_backward(g, z, slope, False),
    "silu": lambda g, z, _, __: torch.ops.aten.silu_backward(g, z),
}
_TORCH_FUNC_ROUNDS_OTHERWISE = {"silu"}
"""Activations whose derivative ``torch.func.grad`` computes by a decomposition that rounds otherwise than autograd's
kernel (:attr:`MlpPlan.matches_torch_func`)."""
_OPTION = {"gelu": "approximate", "leaky_relu": "negative_slope"}
"""The activation's module attribute its kernels take (GELU's approximation, LeakyReLU's slope)."""


@dataclass(frozen=True)
class Layer:
    """One step of the plan: a linear layer (the indices of its weight and bias among the model's parameters;
    bias None without one) or an activation by name."""

    kind: str  # LINEAR or an activation's name
    weight: int = -1
    bias: int | None = None
    option: Any = None
    """An activation's setting its kernels take (:data:`_OPTION`: GELU's approximation, LeakyReLU's slope)."""


@dataclass(frozen=True)
class MlpPlan:
    """A perceptron's layers in order, with where each linear layer's parameters sit in ``named_parameters``."""

    layers: tuple[Layer, ...]
    flatten_input: bool
    parameters: int
    """How many parameters the model has (each belongs to one linear layer of the plan)."""
    first_linear: int
    """The first linear layer's place in :attr:`layers`: the backward pass ends there (no input gradient)."""
    matches_torch_func: bool = True
    """Whether ``torch.func.grad`` differentiates every layer with autograd's kernels, so that under ``vmap`` this
    plan has the bits of ``vmap`` over ``torch.func.grad_and_value``: not with SiLU, whose derivative ``torch.func``
    computes by a decomposition that rounds otherwise."""

    def cross_entropy(self, params: list[Tensor], features: Tensor, labels: Tensor) -> tuple[list[Tensor], Tensor] | None:
        """``(gradients, loss)`` of ``F.cross_entropy(model(features), labels)`` at the parameters ``params`` (the
        model's, in ``named_parameters`` order): one new tensor per parameter, and the loss (a 0-d tensor); the
        bits of ``torch.autograd.grad``. ``None`` for inputs this plan does not cover (labels not class indices,
        features not a 2-D float batch once flattened), where the caller uses autograd."""
        return self._gradients(params, features, labels, batched=False)

    def batched_cross_entropy(
        self, params: list[Tensor], features: Tensor, labels: Tensor,
    ) -> tuple[list[Tensor], Tensor] | None:
        """:meth:`cross_entropy` of clients stacked along a leading axis -- ``params[i]`` ``[clients, *shape]``,
        ``features`` ``[clients, batch, ...]``, ``labels`` ``[clients, batch]`` -- by batched kernels (``bmm``): each
        client's gradients and loss, with the bits of ``torch.func.vmap`` over :meth:`cross_entropy` (which are those
        of ``vmap`` over ``torch.func.grad_and_value`` where :attr:`matches_torch_func`), at a fraction of ``vmap``'s
        per-operator cost. Written as ``vmap``'s batching rules run it: ``addmm`` as ``bias + bmm``, the mean
        negative log-likelihood as per-example losses averaged. ``None`` where :meth:`cross_entropy` declines."""
        return self._gradients(params, features, labels, batched=True)

    def _gradients(
        self, params: list[Tensor], features: Tensor, labels: Tensor, batched: bool,
    ) -> tuple[list[Tensor], Tensor] | None:
        done = self._backward(params, features, labels, factored=False, batched=batched)
        if done is None:
            return None
        grads, _, loss = done
        return [grads[i] for i in range(self.parameters)], loss

    def cross_entropy_factors(
        self, params: list[Tensor], features: Tensor, labels: Tensor,
    ) -> tuple[list[Tensor | None], dict[int, list[tuple[Tensor, Tensor]]], Tensor] | None:
        """:meth:`cross_entropy` with each weight's gradient ``g^T a`` left as its factors ``[(g, a)]`` (None in the
        list in its place): what :meth:`fedcomp.models.functional.FlatModel.factored_grad_pieces` gives, the same
        bits, for fused SGD steps. ``None`` where :meth:`cross_entropy` declines."""
        done = self._backward(params, features, labels, factored=True)
        if done is None:
            return None
        grads, factors, loss = done
        return [grads.get(i) for i in range(self.parameters)], factors, loss

    def _backward(
        self, params: list[Tensor], features: Tensor, labels: Tensor, factored: bool, batched: bool = False,
    ) -> tuple[dict[int, Tensor], dict[int, list[tuple[Tensor, Tensor]]], Tensor] | None:
        """The forward and backward passes: the gradients by parameter index, the weights' factors (``factored``:
        in place of their gradients) and the loss; None for inputs not covered. ``batched``: every tensor has a
        leading client axis (:meth:`batched_cross_entropy`)."""
        axes = 2 if batched else 1  # the labels' axes: (clients,) examples
        if self.flatten_input and features.dim() > axes + 1:
            features = features.flatten(axes)
        if features.dim() != axes + 1 or labels.dim() != axes or labels.dtype != torch.long or not features.is_floating_point():
            return None
        with torch.no_grad():
            outputs = [features]  # each layer's output, its input first
            for layer in self.layers:
                z = outputs[-1]
                if layer.kind == LINEAR:
                    z = _linear(z, params[layer.weight], None if layer.bias is None else params[layer.bias], batched)
                else:
                    z = _FORWARD[layer.kind](z, layer.option)
                outputs.append(z)
            logp = torch.log_softmax(outputs[-1], -1)
            loss, g = _nll_and_its_gradient(logp, labels, batched)
            g = torch.ops.aten._log_softmax_backward_data(g, logp, logp.dim() - 1, logp.dtype)
            grads: dict[int, Tensor] = {}
            factors: dict[int, list[tuple[Tensor, Tensor]]] = {}
            for i in range(len(self.layers) - 1, self.first_linear - 1, -1):
                layer = self.layers[i]
                if layer.kind == LINEAR:
                    w = params[layer.weight]
                    if factored:
                        factors[layer.weight] = [(g, outputs[i])]
                    else:
                        grads[layer.weight] = g.transpose(1, 2).bmm(outputs[i]) if batched else _weight_grad(g, outputs[i], w)
                    if layer.bias is not None:
                        grads[layer.bias] = g.sum(-2)
                    if i > self.first_linear:
                        g = g.bmm(w) if batched else input_grad(g, outputs[i], w)
                else:
                    g = _BACKWARD[layer.kind](g, outputs[i], outputs[i + 1], layer.option)
        return grads, factors, loss


def _linear(z: Tensor, weight: Tensor, bias: Tensor | None, batched: bool) -> Tensor:
    """``F.linear`` as autograd's forward runs it (``addmm`` on the transposed weight), or batched as ``vmap`` runs
    that (``addmm`` decomposed: the bias plus a ``bmm``)."""
    if not batched:
        return torch.mm(z, weight.t()) if bias is None else torch.addmm(bias, z, weight.t())
    product = torch.bmm(z, weight.transpose(1, 2))
    return product if bias is None else bias.unsqueeze(1) + product


def _nll_and_its_gradient(logp: Tensor, labels: Tensor, batched: bool) -> tuple[Tensor, Tensor]:
    """The mean negative log-likelihood of ``labels`` under the log-probabilities ``logp``, and its gradient in
    ``logp``: autograd's kernels (``nll_loss_forward`` / ``_backward``), or batched as ``vmap`` runs them."""
    if not batched:
        loss, total = torch.ops.aten.nll_loss_forward(logp, labels, None, 1, -100)  # 1: the mean
        return loss, torch.ops.aten.nll_loss_backward(torch.ones_like(loss), logp, labels, None, 1, -100, total)
    clients, batch, classes = logp.shape
    each, _ = torch.ops.aten.nll_loss_forward(logp.reshape(-1, classes), labels.reshape(-1), None, 0, -100)  # 0: none
    gradient = torch.zeros_like(logp).scatter_(2, labels.unsqueeze(2), -1.0 / batch)
    return each.view(clients, batch).mean(1), gradient


def _weight_grad(g: Tensor, inputs: Tensor, weight: Tensor) -> Tensor:
    """``addmm``'s gradient for its second matrix, the transposed weight ``weight.t()``, transposed back: autograd
    multiplies in the order that matrix's strides favour (column-major, as ``weight.t()`` of a row-major weight is:
    ``(g^T inputs)^T``, whose transpose is ``g^T inputs``; otherwise ``inputs^T g``)."""
    wt = weight.t()
    if _column_major(wt):
        return g.t().mm(inputs)
    return inputs.t().mm(g).t()


def input_grad(g: Tensor, inputs: Tensor, weight: Tensor) -> Tensor:
    """``addmm``'s gradient for its first matrix, the layer's ``inputs``: ``g weight``, multiplied in the order the
    inputs' strides favour, as autograd does (``mm_mat1_backward``: ``(weight^T g^T)^T`` for column-major inputs, as
    a single example's one feature is). The two orders can round otherwise (they do on some CPUs' kernels)."""
    if _column_major(inputs):
        return weight.t().mm(g.t()).t()
    return g.mm(weight)


def _column_major(m: Tensor) -> bool:
    """Autograd's test for a column-major matrix (``mm_mat2_backward``)."""
    return m.stride(0) == 1 and (m.size(1) == 1 or m.stride(1) == m.size(0))


def plan_of(module: nn.Module) -> MlpPlan | None:
    """The plan of ``module`` when it is a perceptron this module can differentiate (module docstring), else None."""
    if type(module) is not nn.Sequential:
        return None
    index = {id(p): i for i, p in enumerate(module.parameters())}
    if len(index) != len(list(module.named_parameters(remove_duplicate=False))):
        return None  # tied parameters
    layers: list[Layer] = []
    flatten_input = False
    for position, child in enumerate(_leaves(module)):
        kind = type(child)
        if kind is nn.Linear:
            bias = None if child.bias is None else index[id(child.bias)]
            layers.append(Layer(LINEAR, index[id(child.weight)], bias))
        elif kind in _ACTIVATIONS:
            if getattr(child, "inplace", False) and kind is not nn.ReLU:  # ReLU's backward reads the output either way
                return None
            name = _ACTIVATIONS[kind]
            layers.append(Layer(name, option=getattr(child, _OPTION[name]) if name in _OPTION else None))
        elif kind is nn.Flatten and position == 0 and child.start_dim == 1 and child.end_dim == -1:
            flatten_input = True
        elif kind is not nn.Identity:
            return None
    linears = [i for i, layer in enumerate(layers) if layer.kind == LINEAR]
    if not linears or len(list(module.buffers())):
        return None
    matches_torch_func = not {layer.kind for layer in layers} & _TORCH_FUNC_ROUNDS_OTHERWISE
    return MlpPlan(tuple(layers), flatten_input, len(index), linears[0], matches_torch_func)


def _leaves(module: nn.Sequential) -> list[nn.Module]:
    """The modules of a sequential model in order, nested ``nn.Sequential`` containers opened."""
    out: list[nn.Module] = []
    for child in module:
        out.extend(_leaves(child) if type(child) is nn.Sequential else [child])
    return out
