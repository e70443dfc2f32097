"""Built-in tasks; importing this package registers them."""

from fedcomp.platform.tasks import (  # noqa: F401
    adult_fairness,
    dro,
    heterogeneous_composition,
    invariant_logreg,
    minimax_quadratic,
    mnist_bilevel,
    synthetic_classification,
)
from fedcomp.platform.tasks.base import Task

__all__ = ["Task"]
