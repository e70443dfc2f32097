"""``fedcomp.extension``: one module for a user's algorithm or task file to import from -- fedcomp's own objects, the
same ones as where they live, so that the example written against it runs as the built-ins do
(``tests/platform/test_user_modules.py`` runs it on every backend)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fedcomp.extension as extension
from fedcomp.platform import oracles, registry, state
from fedcomp.platform.algorithms import base


def test_it_re_exports_fedcomps_own_objects_and_lists_each_once():
    assert sorted(extension.__all__) == sorted(set(extension.__all__))
    public = {name for name in vars(extension) if not name.startswith("_") and name != "annotations"}
    assert public == set(extension.__all__)
    assert extension.LocalSteps is base.LocalSteps and extension.register_task is registry.register_task
    assert extension.State is state.State and extension.inner_value_vjp is oracles.inner_value_vjp
    # what an algorithm with a round of its own needs (the audit read fednest/ to find them)
    assert extension.StepInfo is base.StepInfo and extension.Means is state.Means
    assert [getattr(extension, n) for n in ("grad_x", "grad_y", "hvp_yy", "jvp_xy")] == [
        oracles.grad_x, oracles.grad_y, oracles.hvp_yy, oracles.jvp_xy]


@pytest.mark.parametrize("name", ["extension.py", "portfolio.py", "two_phase_gda.py"])
def test_the_examples_import_nothing_else_of_fedcomp(name):
    example = Path(__file__).resolve().parents[1] / "examples" / name
    modules = {node.module for node in ast.walk(ast.parse(example.read_text()))
               if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedcomp")}
    assert modules == {"fedcomp.extension"}
