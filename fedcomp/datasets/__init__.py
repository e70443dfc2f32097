"""Data sources: synthetic streams now; torchvision loaders, partitioners and imbalance builders later."""

from fedcomp.datasets.synthetic import GaussianMixtureStream, gaussian_inner, gaussian_outer

__all__ = ["GaussianMixtureStream", "gaussian_inner", "gaussian_outer"]
