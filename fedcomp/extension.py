"""Everything a file of a user's own algorithm or task imports, in one place (README, "Your own task or
algorithm"; ``examples/extension.py`` is written against it)::

    from fedcomp.extension import LocalSteps, CommonHParams, State, Task, Params, register_algorithm, register_task

Each name is fedcomp's own, re-exported from the module it lives in (listed below), so what is documented there
holds here: the two registration decorators; the base classes of a task (:class:`Task`, its :class:`Params`) and of
an algorithm (:class:`LocalSteps` -- ``draw`` and a pure ``update`` -- or :class:`Algorithm` with a ``round`` of its
own, their hyperparameters :class:`CommonHParams`); the typed records of state (:class:`State`, :class:`Model`,
:class:`MinimaxModel`, :func:`unsent`); a round's federation (:class:`Round`) and a client program's context
(:class:`ClientContext`), what a client program of an algorithm's own ``round`` returns besides its state and
outputs (:class:`StepInfo`) and what a call gives back (:class:`Means`, readable as attributes); the problem kinds'
names (the module :mod:`kinds`: ``kind = kinds.PLAIN``) and their protocols; the oracles an update differentiates
through -- ``torch.func`` ones (:func:`grad_and_loss`, :func:`inner_value_vjp`, :func:`outer_grad`) and plain
autograd's first and second order ones of a two-variable loss (:func:`grad_x`, :func:`grad_y`, :func:`grad_xy`,
:func:`hvp_yy`, :func:`jvp_xy`; an ``update`` that takes these sets ``vectorisable = False``, since ``vmap`` cannot
batch them); the descent step every built-in takes (:func:`descend`); and the seeded generator (:func:`generator`).
Algorithms with a ``round`` of their own to read: ``fedcomp/platform/algorithms/fednest/`` (sub-rounds of client
programs) and ``fedcomp/platform/algorithms/feddro.py`` (they import these names from the modules they live in).
"""

from __future__ import annotations

from fedcomp.platform import kinds
from fedcomp.platform.algorithms.base import Algorithm, ClientContext, CommonHParams, LocalSteps, StepInfo, Tensors
from fedcomp.platform.algorithms.steps import descend
from fedcomp.platform.oracles import grad_and_loss, grad_x, grad_xy, grad_y, hvp_yy, inner_value_vjp, jvp_xy, outer_grad
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
from fedcomp.platform.state import Means, MinimaxModel, Model, State, unsent
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
    "Means",
    "MinimaxModel",
    "MinimaxProblem",
    "Model",
    "Params",
    "PlainProblem",
    "Round",
    "State",
    "StepInfo",
    "Task",
    "Tensors",
    "descend",
    "generator",
    "grad_and_loss",
    "grad_x",
    "grad_xy",
    "grad_y",
    "hvp_yy",
    "inner_value_vjp",
    "jvp_xy",
    "kinds",
    "outer_grad",
    "register_algorithm",
    "register_task",
    "unsent",
]
