"""Every algorithm and task by name: their declarations without torch, their classes on demand.

The config, ``fedcomp list``, ``report`` and a Ray run's driver need only declarations
(:func:`algorithms`, :func:`tasks`); whoever builds one imports its module (:func:`algorithm_class`,
:func:`task_class`), and :func:`load_builtins` imports them all (the conformance suite, which checks each).

A user's algorithm or task lives in a module of theirs, which every process that builds it must import -- Ray's
actors, a sweep's trials, a resumed or verified run: the config names that module (``algorithm.module``,
``task.module``: :func:`source_of` writes it as the module's file, :func:`import_source` imports it again).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from fedcomp.platform.progress import in_a_ray_worker
from fedcomp.platform.registry import (
    ALGORITHMS,
    DECLARED_ALGORITHMS,
    DECLARED_TASKS,
    TASKS,
    AlgorithmDeclaration,
    TaskDeclaration,
)

if TYPE_CHECKING:
    from fedcomp.platform.algorithms.base import Algorithm
    from fedcomp.platform.tasks.base import Task


def _declare_builtins() -> None:
    import fedcomp.platform.algorithms.builtins
    import fedcomp.platform.tasks.builtins  # noqa: F401


def algorithms() -> dict[str, AlgorithmDeclaration]:
    """Name -> declaration of every built-in algorithm and every one registered so far."""
    _declare_builtins()
    return DECLARED_ALGORITHMS


def tasks() -> dict[str, TaskDeclaration]:
    """Name -> declaration of every built-in task and every one registered so far."""
    _declare_builtins()
    return DECLARED_TASKS


def algorithm_class(name: str) -> type[Algorithm[Any, Any]]:
    """The class of algorithm ``name``, its module imported if need be (``KeyError`` for an unknown name)."""
    if name not in ALGORITHMS:
        importlib.import_module(algorithms()[name].module)
    return cast("type[Algorithm[Any, Any]]", ALGORITHMS[name])


def task_class(name: str) -> type[Task]:
    """The class of task ``name``, its module imported if need be (``KeyError`` for an unknown name)."""
    if name not in TASKS:
        importlib.import_module(tasks()[name].module)
    return cast("type[Task]", TASKS[name])


def load_builtins() -> None:
    """Import every built-in algorithm and task module, so that each registers its class."""
    modules = [a.module for a in algorithms().values()] + [t.module for t in tasks().values()]
    for module in dict.fromkeys(modules):
        importlib.import_module(module)


SCRIPT = "__main__"
"""The module name of the script Python runs: a class defined there cannot be imported by another process."""


def source_of(module: str) -> str | None:
    """Where a registered class's module comes from, as :func:`import_source` takes it: None for fedcomp's own
    modules (every process knows them) and for the running script (no other process can import it); else the
    module's file, absolute (the same for every process on this file system, whatever its working directory and
    ``sys.path``), or its dotted name where it has no file."""
    if module == SCRIPT or module == "fedcomp" or module.startswith("fedcomp."):
        return None
    file = getattr(sys.modules.get(module), "__file__", None)
    return str(Path(file).resolve()) if isinstance(file, str) and file.endswith(".py") else module  # else compiled


def import_source(source: str) -> None:
    """Import a user's module: a dotted name, or a ``.py`` file -- imported by its dotted name (the packages above
    it with an ``__init__.py`` included), its root folder put first on ``sys.path``, so that its classes pickle by
    reference and its own imports of its neighbours work. A file that is not there is imported by its name where
    that is on the path: a Ray job's working directory (``ray job submit --working-dir .``) is unpacked at another
    path on each node, and put on its workers' ``sys.path``.

    Raises:
        ImportError: the module or file cannot be imported (its message says why); an error the module's own code
            raises as it runs propagates.
    """
    if not source.endswith(".py"):
        _as_on_disk(importlib.import_module(source))
        return
    path = Path(source).expanduser().resolve()
    package = path.name == "__init__.py"  # a package's own module: named by its folder
    if not path.is_file():  # another node's file system (a job's working directory unpacked elsewhere): by its name
        _import_by_name(path)
        return
    module = _imported_from(path)
    if module is not None:  # imported already, by whatever name (``import mine`` beside it)
        _as_on_disk(module)
        return
    packages, root = _in_packages(path)
    name = ".".join(packages if package else [*packages, path.stem])
    if name in sys.modules:
        raise ImportError(f"a module named {name!r} is imported already, from {_file_of(sys.modules[name], None)}, not "
                          f"{str(path)!r}")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    _as_on_disk(importlib.import_module(name))


IMPORTED_SOURCES: dict[Path, str] = {}
"""A user's module file -> the sha256 of its bytes as this process imported it (or first found it imported)."""


def _as_on_disk(module: Any) -> None:
    """Import ``module`` again where its file, or that of a module of the user's it may import from beside it (in
    its package root's folder: ``import helper``), changed since this process imported it -- a notebook's user
    edited their task -- and say so: a run then runs the files' code (Ray's actors, each a fresh process, import
    the files as they are), and the digest run.json records is of the code that ran. Changed neighbours go first."""
    file = _file_of(module, ".py")
    if file is None or not file.is_file():
        return
    root = str(_in_packages(file)[1]) + os.sep
    neighbours = [m for name, m in list(sys.modules.items()) if m is not module and _users(name, m, root)]
    changed = [m for m in [*neighbours, module] if _changed(m)]
    for again in changed if not in_a_ray_worker() else []:  # a kept actor's note would repeat the driver's
        print(f"fedcomp: note: {again.__file__} changed since this process imported it; imported again",
              file=sys.stderr, flush=True)
    for again in [m for m in changed if m is not module] + ([module] if changed else []):
        importlib.reload(again)


def _users(name: str, module: Any, root: str) -> bool:
    """Whether a module is the user's, in ``root`` or below: not fedcomp's, an installed package's (a virtualenv in
    the user's folder) or the running script (``__main__``, never imported again)."""
    file = str(getattr(module, "__file__", None) or "")
    return (file.startswith(root) and name != SCRIPT and name != "fedcomp" and not name.startswith("fedcomp.")
            and "site-packages" not in file and "dist-packages" not in file)


def imports_beside(source: str) -> list[str]:
    """The files of the user's modules beside ``source`` (in its package root's folder or below) that it imports,
    directly or through one another -- ``import helper``, ``from helper import SCALE``, also inside a function --
    as this process has them imported: run.json records their digests with the module's, so a re-run on an edited
    helper is told which file changed, and a resume on one is refused. Empty where ``source`` is no imported file."""
    path = Path(source)
    module = _imported_from(path)
    if module is None:
        return []
    root = str(_in_packages(path)[1]) + os.sep
    seen, todo, found = {id(module)}, [module], []
    while todo:
        for name in _imported_names(todo.pop()):
            other = sys.modules.get(name)
            if other is not None and id(other) not in seen and _users(name, other, root):
                seen.add(id(other))
                todo.append(other)
                file = _file_of(other, ".py")
                found += [str(file)] if file is not None else []  # a compiled module of theirs: no source to hash
    return sorted(found)


def _imported_names(module: Any) -> set[str]:
    """The dotted names a module's source imports (``from pkg import mod`` names ``pkg`` and ``pkg.mod``), read from
    its file; none where it has no readable Python source."""
    file = _file_of(module, ".py")
    if file is None:
        return set()
    try:
        tree = ast.parse(file.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), module.__package__ or "")
            except (ImportError, ValueError):
                continue
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _changed(module: Any) -> bool:
    """Whether the module's file changed since this process imported it (or first looked at it)."""
    file = _file_of(module, ".py")
    if file is None or not file.is_file():
        return False
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    before = IMPORTED_SOURCES.setdefault(file, digest)
    IMPORTED_SOURCES[file] = digest
    return before != digest


def _in_packages(path: Path) -> tuple[list[str], Path]:
    """The packages a module's file ``path`` lies in (a folder with an ``__init__.py``; its own folder, for a
    package's ``__init__.py``), outermost first, and the folder that holds the outermost (the file's, where none)."""
    packages: list[str] = []
    root = path.parent
    while (root / "__init__.py").is_file():
        packages.insert(0, root.name)
        root = root.parent
    return packages, root


def _imported_from(path: Path) -> Any:
    """The module this process imported from the file ``path`` (resolved), by whatever name; None if none."""
    return next((m for m in list(sys.modules.values()) if _file_of(m, path.name) == path), None)


def _file_of(module: Any, named: str | None) -> Path | None:
    """The module's file, resolved (only where its name is ``named``, when given: resolving every module's is slow)."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or (named is not None and not file.endswith(named)):
        return None
    return Path(file).resolve()


def _import_by_name(path: Path) -> None:
    """Import in place of the file ``path`` that is not there the module whose file has that path's tail, by the
    shortest dotted name that the path's last parts spell and that is on the path: ``/a/lab/pkg/mod.py`` as ``mod``,
    ``pkg.mod`` or ``lab.pkg.mod`` -- ``pkg`` a package shipped or unpacked on this node (:func:`carriers`, a job's
    working directory), whose file ``.../pkg/mod.py`` ends as the missing one does. Only such a module: ``json.py``
    missing does not import the standard library's ``json``."""
    package = path.name == "__init__.py"  # a package's own module: named by its folder
    parts = [*path.parent.parts[1:], *([] if package else [path.stem])]
    for start in reversed(range(len(parts))):
        name = ".".join(parts[start:])
        if not all(part.isidentifier() for part in parts[start:]):
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and (name == error.name or name.startswith(f"{error.name}.")):
                continue  # not on the path under this name
            raise  # the module is there: an import of its own failed
        file = getattr(module, "__file__", None)
        tail = Path(*path.parts[-(len(parts) - start + package):])
        if isinstance(file, str) and Path(file).parts[-len(tail.parts):] == tail.parts:
            return
    raise ImportError(f"no such file {str(path)!r}, nor a module {parts[-1]!r} of that file's name on the path")


def carriers(sources: list[str]) -> list[str]:
    """The local files and folders that carry the user's modules ``sources`` (as :func:`source_of` writes them) to
    a cluster's other nodes, for Ray's ``py_modules``: a module's file, or the top folder of the packages it is in;
    for a dotted name, its top package's folder or its file -- not one installed in the environment
    (``site-packages``: every node's environment is its own to install). On a node where a file is not at its path,
    :func:`import_source` imports it by its name from there."""
    out: list[str] = []
    for source in sources:
        if source.endswith(".py"):
            path = Path(source).expanduser().resolve()
            if path.is_file():
                packages, root = _in_packages(path)
                out.append(str(root / packages[0]) if packages else str(path))
            continue
        spec = importlib.util.find_spec(source.split(".")[0])
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        origin = Path(spec.origin).resolve()
        where = origin.parent if spec.submodule_search_locations else origin
        if not {"site-packages", "dist-packages"} & set(where.parts):
            out.append(str(where))
    return list(dict.fromkeys(out))
