"""The descent step (fedcomp/platform/algorithms/steps.py): ``x - lr d`` rounded once, as torch.optim takes it,
with the same bits whole, in the parameters' pieces, in place and batched under ``vmap``."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from fedcomp.platform.algorithms.steps import descend, descend_


def _case(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * 10.0 ** torch.randint(-3, 3, (), generator=gen).item()
    d = torch.randn(n, generator=gen) * 10.0 ** torch.randint(-3, 3, (), generator=gen).item()
    return x, d, float(torch.rand((), generator=gen)) * 0.3


def test_the_step_is_torch_optims_and_rounds_once():
    gen = torch.Generator().manual_seed(0)
    x, d, lr = torch.randn(4099, generator=gen), torch.randn(4099, generator=gen), 0.0371
    param = torch.nn.Parameter(x.clone())
    param.grad = d.clone()
    torch.optim.SGD([param], lr=lr).step()
    assert torch.equal(descend(x, d, lr), param.detach())
    exact = (x.double() - torch.tensor(lr, dtype=torch.float32).double() * d.double()).float()
    two_roundings = x - lr * d
    assert torch.equal(descend(x, d, lr), exact)  # one rounding of the exact value (here, for every element)
    assert not torch.equal(two_roundings, exact)  # the product rounded first differs somewhere


@pytest.mark.parametrize("seed", range(20))
def test_whole_pieces_and_in_place_give_the_same_bits(seed):
    n = 1 + 97 * seed  # lengths that leave every kind of vector tail
    x, d, lr = _case(n, seed)
    cuts = sorted({0, n, *torch.randint(0, n, (3,), generator=torch.Generator().manual_seed(seed)).tolist()})
    sizes = [b - a for a, b in pairwise(cuts) if b > a]
    pieces = x.clone()
    descend_(list(pieces.split(sizes)), list(d.split(sizes)), lr)
    assert torch.equal(pieces, descend(x, d, lr))


def test_lockstep_configurations_each_with_its_own_lr_give_each_ones_bits():
    xs, ds = torch.randn(5, 777), torch.randn(5, 777)
    lrs = torch.tensor([0.3, 0.1, 0.05, 0.01, 0.003], dtype=torch.float64)  # as lockstep batches them
    batched = torch.func.vmap(descend)(xs, ds, lrs)
    alone = torch.stack([descend(x, d, float(lr)) for x, d, lr in zip(xs, ds, lrs)])
    assert batched.dtype == torch.float32 and torch.equal(batched, alone)
