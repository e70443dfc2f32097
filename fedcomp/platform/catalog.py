"""The built-in algorithms and tasks: importing their packages registers them in
:mod:`fedcomp.platform.registry` (which stays a leaf, so algorithm and task modules can import it)."""

from __future__ import annotations


def load_builtins() -> None:
    """Import the built-in algorithm and task modules so that they register themselves."""
    import fedcomp.platform.algorithms
    import fedcomp.platform.tasks  # noqa: F401
