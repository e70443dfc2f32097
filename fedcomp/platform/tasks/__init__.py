"""Built-in tasks; importing this package registers them."""

from fedcomp.platform.tasks import (  # noqa: F401
    adult_fairness,
    dro,
    fewshot,
    heterogeneous_composition,
    imbalanced,
    invariant_logreg,
    minimax_quadratic,
    mnist_bilevel,
    sinewave,
    synthetic_classification,
)
from fedcomp.platform.tasks.base import Task

__all__ = ["Task"]
