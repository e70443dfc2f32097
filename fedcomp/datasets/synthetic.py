"""Synthetic data streams, generated from keyed generators (so nothing is stored or shipped).

* :func:`gaussian_outer`/:func:`gaussian_inner` -- the invariant logistic regression data of the FCSG
  paper (section 5.1): a ~ N(0, sigma1^2 I), b = sign(teacher . a), eta ~ N(a, sigma2^2 I).
* :class:`GaussianMixtureStream` -- a K-client classification stream with Dirichlet label skew, used by
  the benchmark and as a plain-problem task.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gaussian_outer(teacher: Tensor, n: int, sigma1: float, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Outer samples: features a ~ N(0, sigma1^2 I) of shape (n, d) and labels b = sign(teacher . a) in {-1, +1}."""
    a = sigma1 * torch.randn(n, teacher.numel(), generator=gen)
    b = torch.where(a @ teacher >= 0, 1.0, -1.0)
    return a, b


def gaussian_inner(a: Tensor, m: int, sigma2: float, gen: torch.Generator) -> Tensor:
    """Inner samples eta_j ~ N(a, sigma2^2 I) given each outer feature vector: shape (n, m, d)."""
    return a.unsqueeze(1) + sigma2 * torch.randn(a.shape[0], m, a.shape[1], generator=gen)


def dirichlet(alpha: float, classes: int, gen: torch.Generator) -> Tensor:
    """A Dirichlet(alpha * 1) draw made from ``gen`` (via normalised Gamma draws)."""
    gamma = torch._standard_gamma(torch.full((classes,), float(alpha)), generator=gen)
    return (gamma + 1e-12) / (gamma + 1e-12).sum()


class GaussianMixtureStream:
    """Class-conditional Gaussians N(mu_y, I) with client-specific label priors p_k ~ Dirichlet(alpha).

    Class means come from ``seed``; client priors from ``(seed, client)``; each draw from the caller's
    generator -- so any client's data can be produced anywhere without shipping it.
    """

    def __init__(self, features: int, classes: int, alpha: float, separation: float, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.means = separation * torch.randn(classes, features, generator=gen) / features**0.5
        self.classes, self.features, self.alpha, self.seed = classes, features, alpha, seed

    def prior(self, client: int) -> Tensor:
        if self.alpha <= 0:
            return torch.full((self.classes,), 1.0 / self.classes)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + client + 1)
        return dirichlet(self.alpha, self.classes, gen)

    def sample(self, prior: Tensor, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        y = torch.multinomial(prior, n, replacement=True, generator=gen)
        return self.means[y] + torch.randn(n, self.features, generator=gen), y
