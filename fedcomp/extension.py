"""Everything a file of a user's own algorithm or task imports, in one place (README, "Your own task or
algorithm"; ``examples/extension.py`` is written against it)::

    from fedcomp.extension import LocalSteps, CommonHParams, State, Task, Params, register_algorithm, register_task

Each name is fedcomp's own, re-exported from the module it lives in (listed below), so what is documented there
holds here: the two registration decorators; the base classes of a task (:class:`Task`, its :class:`Params`) and of
an algorithm (:class:`LocalSteps` -- ``draw`` and a pure ``update`` -- or :class:`Algorithm` with a ``round`` of its
own, their hyperparameters :class:`CommonHParams`); the typed records of state (:class:`State`, :class:`Model`,
:class:`MinimaxModel`, :func:`unsent`); a round's federation (:class:`Round`) and a client program's context
(:class:`ClientContext`); the problem kinds' names (the module :mod:`kinds`: ``kind = kinds.PLAIN``) and their
protocols; the oracles an update differentiates through; the descent step every built-in takes (:func:`descend`);
and the seeded generator (:func:`generator`).
"""

from __future__ import annotations

from fedcomp.platform import kinds
from fedcomp.platform.algorithms.base import Algorithm, ClientContext, CommonHParams, LocalSteps, Tensors
from fedcomp.platform.algorithms.steps import descend
from fedcomp.platform.oracles import grad_and_loss, grad_xy, inner_value_vjp, outer_grad
from fedcomp.platform.params import Params
from fedcomp.platform.problems import (
    BilevelProblem,
    CompositionalMinimaxProblem,
    CompositionalProblem,
    ConditionalProblem,
    GlobalCompositionalProblem,
    MinimaxProblem,
    PlainProblem,
)
from fedcomp.platform.registry import register_algorithm, register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import MinimaxModel, Model, State, unsent
from fedcomp.platform.tasks.base import Task

__all__ = [
    "Algorithm",
    "BilevelProblem",
    "ClientContext",
    "CommonHParams",
    "CompositionalMinimaxProblem",
    "CompositionalProblem",
    "ConditionalProblem",
    "GlobalCompositionalProblem",
    "LocalSteps",
    "MinimaxModel",
    "MinimaxProblem",
    "Model",
    "Params",
    "PlainProblem",
    "Round",
    "State",
    "Task",
    "Tensors",
    "descend",
    "generator",
    "grad_and_loss",
    "grad_xy",
    "inner_value_vjp",
    "kinds",
    "outer_grad",
    "register_algorithm",
    "register_task",
    "unsent",
]
