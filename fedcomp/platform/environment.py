"""The environment a run ran in, recorded in ``run.json`` so that ``fedcomp verify`` can say when a
re-run's environment differs from the original's: package versions, the git revision of the fedcomp
source (when it is a git checkout), host, CPU model, OS, the devices the clients computed on and the
torch threads of the process that evaluated the model."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import re
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from fedcomp.platform.catalog import imports_beside

PACKAGES = ("fedcomp", "torch", "numpy", "ray", "pandas", "pyarrow", "scikit-learn", "torchvision")
"""Distributions whose versions can change a run's numbers or its files."""


def package_versions() -> dict[str, str]:
    """Installed versions (read from package metadata; nothing is imported), plus Python's."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def torch_build() -> str:
    """torch's version with its build tag (``2.14.1+cu130``, which package metadata leaves out), read from its
    ``version.py`` without importing torch; the metadata's version where that file cannot be read."""
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin is not None:
        try:
            found = re.search(r"^__version__ = ['\"]([^'\"]+)['\"]", (Path(spec.origin).parent / "version.py").read_text(), re.M)
        except OSError:
            found = None
        if found:
            return found.group(1)
    return metadata.version("torch")


def torch_release() -> tuple[int, int]:
    """torch's (major, minor) release, from :func:`torch_build` (without importing torch)."""
    found = re.match(r"(\d+)\.(\d+)", torch_build())
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def release_name(release: tuple[int, ...]) -> str:
    """``(2, 7)`` as ``"2.7"``."""
    return ".".join(map(str, release))


def git_revision(path: Path | None = None) -> dict[str, Any] | None:
    """``{"revision": sha, "dirty": bool}`` of the git checkout holding ``path`` (default: the fedcomp
    source), or None when it is not in a git checkout (e.g. installed from a wheel) or git is missing."""
    if path is None:
        path = Path(__file__).resolve().parents[2]  # the folder holding the fedcomp package
    if not any((parent / ".git").exists() for parent in (path, *path.parents)):
        return None
    try:
        def git(*args: str) -> str:
            return subprocess.run(
                ["git", "-C", str(path), *args], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()

        revision = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"revision": revision, "dirty": dirty}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what :mod:`platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def devices(backend: Mapping[str, Any]) -> list[str]:
    """The torch devices the run's clients computed on, as the backend described them."""
    found = backend.get("devices") or ([backend["device"]] if backend.get("device") else [])
    return sorted(str(d) for d in found)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def module_digests(sources: Sequence[str]) -> dict[str, str]:
    """The user's modules (a config's ``task.module``, ``algorithm.module``) and the modules of theirs beside them
    that they import (:func:`~fedcomp.platform.catalog.imports_beside`) by the sha256 of their file's bytes: a re-run
    on an edited module or helper is told which (a dotted name without a file: ``"no file"``)."""
    digests = {}
    for module in [*sources, *(file for source in sources for file in imports_beside(source))]:
        path = Path(module)
        digests[module] = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "no file"
    return digests


def changed_modules(recorded: Mapping[str, str] | None, sources: Sequence[str]) -> list[tuple[str, str, str]]:
    """Each of the user's modules (``sources`` and the helpers they import) whose file differs from its digest in
    ``recorded`` (:func:`module_digests` when a run or sweep started): its path, that digest and its digest now. A
    module recorded without a file, or not recorded (a record from before it was kept), is not compared."""
    recorded = recorded or {}
    return [(module, recorded[module], now) for module, now in module_digests(sources).items()
            if recorded.get(module) not in (None, now, "no file") and now != "no file"]


def default_data_root() -> str:
    """The folder a task given no ``task.root`` reads its files under, here: ``$FEDCOMP_DATA``, else
    ``~/.cache/fedcomp`` (:func:`fedcomp.datasets.mnist.data_root`'s rule; that module imports torch), absolute."""
    return os.path.abspath(os.path.expanduser(os.environ.get("FEDCOMP_DATA") or "~/.cache/fedcomp"))


def environment(backend: Mapping[str, Any], deterministic: bool, modules: Sequence[str] = (),
                data_root: str | None = None) -> dict[str, Any]:
    """Everything :mod:`fedcomp.verification` compares between an original run and its re-run (``deterministic``:
    ``run.deterministic``; ``modules``: the user's modules the run imports, :func:`module_digests`; ``data_root``: the
    folder its task read, where no ``task.root`` named it -- a shell without the same ``$FEDCOMP_DATA`` reads
    another)."""
    env: dict[str, Any] = {
        "packages": package_versions(),
        "git": git_revision(),
        "host": platform.node(),
        "cpu": cpu_model(),
        "os": platform.platform(),
        "devices": devices(backend),
        # Threads the server computes and evaluates with: float32 reductions over large tensors are split across
        # threads, so the thread count can change the last bits of a metric. Under run.deterministic it is one
        # everywhere; otherwise the local backend (and the Ray backend's server in the driver) uses this
        # process's threads, and the server actor and the client actors one.
        "server_threads": _torch_threads() if not deterministic and (
            backend.get("name") == "local" or backend.get("server") == "driver") else 1,
    }
    if modules:
        env["modules"] = module_digests(modules)
    if data_root is not None:
        env["data_root"] = data_root
    if any(d.startswith("cuda") for d in env["devices"]):
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    return env


def differences(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[str]:
    """Human-readable differences between two :func:`environment` records (``key: a -> b``)."""
    if not a or not b:
        return ["environment not recorded in " + ("the original run" if not a else "the re-run")]
    out = []

    def walk(x: Any, y: Any, key: str) -> None:
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{key}.{k}" if key else str(k))
        elif x != y:
            out.append(f"{key}: {x} -> {y}")

    walk(a, b, "")
    return out


def summary(env: Mapping[str, Any] | None) -> str:
    """One line: ``fedcomp 0.1.0 (git 1a2b3c4), torch 2.14.1, ray 2.60.0, python 3.11.9; host vm (AMD EPYC)``."""
    if not env:
        return "not recorded"
    packages = env.get("packages", {})
    git = env.get("git")
    rev = f" (git {git['revision'][:7]}{', uncommitted changes' if git.get('dirty') else ''})" if git else ""
    names = ", ".join(f"{k} {packages[k]}" for k in ("torch", "ray", "python") if k in packages)
    return f"fedcomp {packages.get('fedcomp', '?')}{rev}, {names}; host {env.get('host')} ({env.get('cpu')})"
