"""Built-in tasks; importing this package registers them."""

from fedcomp.platform.tasks import invariant_logreg, minimax_quadratic, synthetic_classification  # noqa: F401
from fedcomp.platform.tasks.base import Task

__all__ = ["Task"]
