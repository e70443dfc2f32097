"""The catalog: every algorithm and task declared without torch, each implementation registered with its
declaration, and a user's one-file algorithm declared by its class attributes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import Field

from fedcomp.platform import catalog
from fedcomp.platform.algorithms.base import CommonHParams
from fedcomp.platform.algorithms.fedavg import FedAvg
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.kinds import PLAIN
from fedcomp.platform.registry import (
    ALGORITHMS,
    DECLARED_ALGORITHMS,
    DECLARED_TASKS,
    TASKS,
    AlgorithmDeclaration,
    register_algorithm,
)

WITHOUT_TORCH = """
import sys
from fedcomp.platform import catalog
from fedcomp.platform.config import load_config
algorithms, tasks = catalog.algorithms(), catalog.tasks()
config = load_config("quickstart", {"algorithm.name": "scaffold", "algorithm.lr": 0.5})
print(len(algorithms), len(tasks), config.algorithm.lr, sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
"""


def test_declarations_and_a_validated_config_import_no_torch():
    """A Ray run's driver and ``fedcomp list`` need only declarations: importing torch (its CUDA build) holds
    about 330 MiB of a process's memory and takes seconds."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    algorithms, tasks, lr, torch_modules = done.stdout.split(maxsplit=3)
    assert int(algorithms) >= 29 and int(tasks) >= 12 and float(lr) == 0.5 and torch_modules.strip() == "[]"


def builtins_only(declared):
    """The built-ins' declarations (other tests register their own algorithms and tasks in this process)."""
    return [(name, d) for name, d in declared.items() if d.module.startswith("fedcomp.platform.")]


def test_every_declaration_names_the_module_that_registers_its_class_with_its_attributes():
    catalog.load_builtins()
    assert set(ALGORITHMS) == set(DECLARED_ALGORITHMS) and set(TASKS) == set(DECLARED_TASKS)
    for name, declared in builtins_only(DECLARED_ALGORITHMS):
        cls = catalog.algorithm_class(name)
        assert (cls.name, cls.__module__, cls.HParams, cls.kind, cls.description) == (
            name, declared.module, declared.HParams, declared.kind, declared.description)
        assert declared.description and declared.kind
    for name, declared in builtins_only(DECLARED_TASKS):
        cls = catalog.task_class(name)
        assert (cls.name, cls.__module__, cls.Params, cls.kinds, cls.metrics, cls.mode, cls.description) == (
            name, declared.module, declared.Params, declared.kinds, declared.metrics, declared.mode,
            declared.description)
        assert declared.metrics and declared.kinds and declared.mode in ("max", "min")


class _TwiceHParams(CommonHParams):
    """lr, q, batch and a knob (a user's algorithm in this test)."""

    knob: float = Field(1.0, gt=0)


def test_a_users_algorithm_is_declared_by_its_class_attributes_and_validated_by_the_config():
    @register_algorithm("test-catalog-user")
    class UserAlgorithm(FedAvg):
        HParams = _TwiceHParams
        kind = PLAIN
        description = "a user's FedAvg with a knob"

    declared = catalog.algorithms()["test-catalog-user"]
    assert declared == AlgorithmDeclaration("test-catalog-user", _TwiceHParams, PLAIN, "a user's FedAvg with a knob",
                                            __name__)
    assert catalog.algorithm_class("test-catalog-user") is UserAlgorithm
    assert load_config("quickstart", {"algorithm.name": "test-catalog-user", "algorithm.knob": 2}).algorithm.knob == 2
    with pytest.raises(ConfigError, match="knob"):
        load_config("quickstart", {"algorithm.name": "test-catalog-user", "algorithm.knob": -1})


def test_a_class_registered_with_a_declaration_takes_its_attributes_from_it_alone():
    declared = AlgorithmDeclaration("test-catalog-declared", _TwiceHParams, PLAIN, "declared", __name__)
    with pytest.raises(TypeError, match=r"sets kind, which its declaration 'test-catalog-declared' sets"):
        @register_algorithm(declared)
        class SetsKindToo(FedAvg):
            kind = PLAIN

    elsewhere = AlgorithmDeclaration("test-catalog-elsewhere", _TwiceHParams, PLAIN, "declared", "somewhere.else")
    with pytest.raises(TypeError, match=r"its declaration 'test-catalog-elsewhere' says somewhere\.else"):
        @register_algorithm(elsewhere)
        class InAnotherModule(FedAvg):
            pass

    @register_algorithm(declared)
    class Declared(FedAvg):
        pass

    assert (Declared.name, Declared.HParams, Declared.kind, Declared.description) == (
        "test-catalog-declared", _TwiceHParams, PLAIN, "declared")
    assert FedAvg.HParams is not _TwiceHParams  # the parent keeps its own


def test_an_unknown_name_lists_the_declared_ones():
    with pytest.raises(ConfigError, match=r"algorithm\.name = 'nope' is unknown; allowed: .*fedavg.*scaffold"):
        load_config("quickstart", {"algorithm.name": "nope"})


def test_a_module_file_imported_already_by_another_name_is_not_imported_again(tmp_path, monkeypatch):
    """A user's ``import mine``, run beside ``mine.py`` in a folder that is a package too, and then the config's
    ``module: .../pkg/mine.py`` (as a package's module, ``pkg.mine``): the file runs once, its classes registered
    once. A file whose dotted name another file holds is refused."""
    import importlib

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mine_once.py").write_text("import sys\nsys.mine_once_runs = getattr(sys, 'mine_once_runs', 0) + 1\n")
    monkeypatch.syspath_prepend(str(package))
    importlib.import_module("mine_once")
    try:
        catalog.import_source(str(package / "mine_once.py"))
        assert sys.mine_once_runs == 1 and "pkg.mine_once" not in sys.modules  # type: ignore[attr-defined]
        other = tmp_path / "elsewhere"
        other.mkdir()
        (other / "mine_once.py").write_text("")
        with pytest.raises(ImportError, match=r"^a module named 'mine_once' is imported already, from .*pkg/mine_once.py"):
            catalog.import_source(str(other / "mine_once.py"))
    finally:
        sys.modules.pop("mine_once", None)
        del sys.mine_once_runs  # type: ignore[attr-defined]


def _defined(description: str) -> type:
    """A user's class as a notebook cell defines it: the same module and qualified name each time the cell runs."""

    class Redefined(FedAvg):
        HParams = _TwiceHParams
        kind = PLAIN

    Redefined.description = description
    Redefined.__qualname__ = "Redefined"
    return Redefined


def test_a_class_defined_again_takes_its_name_over_and_another_class_cannot():
    first = register_algorithm("test-catalog-again")(_defined("first"))
    second = register_algorithm("test-catalog-again")(_defined("second"))
    assert catalog.algorithm_class("test-catalog-again") is second is not first
    assert catalog.algorithms()["test-catalog-again"].description == "second"

    class Other(FedAvg):
        HParams = _TwiceHParams
        kind = PLAIN

    with pytest.raises(ValueError, match=rf"algorithm name 'test-catalog-again' is already registered by {__name__}\.Redefined"):
        register_algorithm("test-catalog-again")(Other)


@pytest.mark.parametrize("name", [3, None, "", "a b", "../../escaped", "-lead", "é"])
def test_a_registered_name_is_one_a_config_and_a_folder_can_hold(name):
    with pytest.raises(ValueError, match=r"must be letters, digits, '-', '_' or '.', a letter or digit first"):
        @register_algorithm(name)
        class Named(FedAvg):
            HParams = _TwiceHParams
            kind = PLAIN
