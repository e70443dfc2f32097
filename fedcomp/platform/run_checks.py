"""The runner's guards: where a run may write, whether a checkpoint belongs to the run resuming from it, and
whether a run has diverged.

Each check fails with one line that says what is wrong and what would be right, as the config checks do.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fedcomp.platform import catalog, results
from fedcomp.platform.config import Config
from fedcomp.platform.errors import ConfigError, StorageError, TaskError, resuming, to_run_again

if TYPE_CHECKING:  # loaded by the servers that check their state, not by a Ray run's driver
    import torch

T = TypeVar("T")

IDENTITY_KEYS = ("federation.clients", "run.seed")
"""Besides the whole ``algorithm`` and ``task`` sections: what a checkpoint must share with the run resuming it."""


def run_folder(config: Config, run_id: str) -> Path:
    """``<run.out>/<run_id>``, absolute (the run's result names it so wherever the caller's working directory goes
    next), checked to lie directly inside ``run.out`` (a run name cannot climb out of it).

    Raises:
        ConfigError: the folder would lie elsewhere.
    """
    out = Path(config.run.out).absolute()
    folder = out / run_id
    try:
        inside = folder.resolve().parent == out.resolve()
    except (RuntimeError, OSError) as error:  # a loop of links (RuntimeError before Python 3.13), a name too long
        raise StorageError(f"run.out = {config.run.out!r}: {error}") from None
    if not inside:
        raise ConfigError(f"run.name = {config.run.name!r}: the run folder {str(folder)!r} would lie outside run.out")
    return folder


def importable(config: Config) -> None:
    """Check that every process of the run can build its task and algorithm: a Ray run's actors import the modules
    that define them, which cannot be the script being run.

    Raises:
        ConfigError: a Ray-backend run of a task or algorithm defined in the running script.
    """
    if config.federation.backend == "ray":
        try:
            config.in_script("Ray's actors")
        except ConfigError as error:
            raise ConfigError(f"{error} or use federation.backend = 'local'") from None


def reports_declared(metrics: dict[str, Any], config: Config) -> dict[str, Any]:
    """``metrics`` (the first evaluation's), checked to hold every metric the task declares, each a number: the
    results, the progress line and the reports read them by name.

    Raises:
        TaskError: a declared metric missing, or not a number.
    """
    declared = catalog.tasks()[config.task_name].metrics
    if not isinstance(metrics, dict):
        raise TaskError(f"task {config.task_name!r}'s evaluator returned {type(metrics).__name__} "
                        f"{str(metrics)[:60]!r}, not a dict of its metrics ({', '.join(declared)})")
    missing = [m for m in declared if m not in metrics]
    odd = [m for m in declared if m in metrics and not isinstance(metrics[m], numbers.Real)]
    if missing or odd:
        what = f"does not report {', '.join(missing)}" if missing else f"reports {odd[0]} = {metrics[odd[0]]!r}, not a number"
        raise TaskError(f"task {config.task_name!r} declares metrics {', '.join(declared)}, but its evaluator {what} "
                        f"(it reported {', '.join(metrics) or 'nothing'})")
    return metrics


def checkpoint_identity(config: Config) -> dict[str, Any]:
    """What makes a checkpoint this run's: the algorithm and task sections, the client count and the seed
    (flattened to ``section.key``); stored in every checkpoint and compared on resume."""
    sections = config.to_dict()
    identity = {f"{s}.{k}": v for s in ("algorithm", "task") for k, v in sections[s].items() if k != "module"}
    for key in IDENTITY_KEYS:
        section, field = key.split(".")
        identity[key] = sections[section][field]
    return identity


def read_resume_file(run_dir: str | Path, name: str, read: Callable[[Path], T], folder: str, consequence: str = "") -> T:
    """``read`` of the file ``name`` in the run folder ``run_dir`` that ``--resume`` named.

    Raises:
        ConfigError: the file is not there (``run_dir`` is not ``folder``).
        StorageError: it cannot be read (truncated, corrupt); the message ends with ``consequence``.
    """
    where = resuming("run", run_dir)
    path = Path(run_dir) / name
    if not path.is_file():
        raise ConfigError(f"{where}: no {name} there; not {folder}")
    try:
        return read(path)
    except StorageError as error:
        raise StorageError(f"{where}: {error}{consequence}") from None


def same_modules(run_dir: Path, earlier: dict[str, Any], config: Config) -> None:
    """Check that the user's modules a resumed run imports are the files it started with (their sha256 in
    ``run.json``'s ``environment``): an edited module would run the rounds still to come with other code than the
    rounds kept, and the record of the code the run started with would be overwritten.

    Raises:
        ConfigError: a module's file changed since the run started, naming it and both digests.
    """
    from fedcomp.platform.environment import changed_modules

    for module, then, now in changed_modules((earlier.get("environment") or {}).get("modules"), config.modules())[:1]:
        raise ConfigError(f"{resuming('run', run_dir)}: {module} changed since the run started (sha256 {then} then, "
                          f"{now} now), so the rounds still to run would run other code than the rounds kept; put the "
                          f"file back as it was, or start a new run of its config: {to_run_again(run_dir / results.RUN_JSON)}")


def reads_default_root(config: Config) -> bool:
    """Whether a run of ``config`` reads its data under the default root
    (:func:`~fedcomp.platform.environment.default_data_root`): its task takes a ``root`` and was given none."""
    return "root" in type(config.task).model_fields and getattr(config.task, "root", None) is None


def same_data_root(run_dir: Path, earlier: dict[str, Any], config: Config) -> None:
    """Warn where a resumed run whose task reads the default data root (no ``task.root``) would read another folder
    than it started with: ``$FEDCOMP_DATA`` differs in this shell. Not refused: the data may have moved whole."""
    from fedcomp.platform.environment import default_data_root

    then = (earlier.get("environment") or {}).get("data_root")
    if then is not None and reads_default_root(config) and then != default_data_root():
        print(f"fedcomp: warning: {resuming('run', run_dir)}: it read its data under {then} (no task.root: "
              f"$FEDCOMP_DATA or ~/.cache/fedcomp), this shell under {default_data_root()}; for the same data, "
              f"resume with FEDCOMP_DATA={then}", file=sys.stderr, flush=True)


def open_checkpoint(run_dir: Path, config: Config) -> dict[str, Any]:
    """The checkpoint in ``run_dir``, checked to belong to ``config`` (the run's ``run.json``).

    Raises:
        ConfigError: there is no checkpoint, or it was written by another run; the message names what differs.
        StorageError: the checkpoint cannot be read (truncated, corrupt).
    """
    where = resuming("run", run_dir)
    if not (run_dir / results.CHECKPOINT).is_file() and (run_dir / results.RUN_JSON).is_file():
        raise ConfigError(f"{where}: no {results.CHECKPOINT} there: the run stopped before its first checkpoint "
                          f"(round {config.run.checkpoint_every}), so there is nothing to continue; run its config "
                          f"again: {to_run_again(run_dir / results.RUN_JSON)}")
    checkpoint = read_resume_file(run_dir, results.CHECKPOINT, results.read_checkpoint, "a resumable run folder",
                                  "; the run cannot continue from it")
    stored = checkpoint.get("identity")
    if stored is not None:
        wanted = checkpoint_identity(config)
        differ = [
            f"{key} = {stored.get(key, '(unset)')!r} in the checkpoint, {wanted.get(key, '(unset)')!r} in run.json"
            for key in sorted(set(stored) | set(wanted)) if stored.get(key) != wanted.get(key)
        ]
        if differ:
            more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
            raise ConfigError(f"{where}: {results.CHECKPOINT} belongs to another run: {'; '.join(differ[:3])}{more}")
    else:
        _check_legacy(where, checkpoint, config)
    saved = (checkpoint.get("server") or {}).get("counters", {}).get("round")
    if isinstance(saved, int) and saved > config.run.rounds:
        raise ConfigError(f"{where}: {results.CHECKPOINT} is at round {saved}, past the run's run.rounds = "
                          f"{config.run.rounds}: it is not this run's checkpoint")
    return checkpoint


def _check_legacy(where: str, checkpoint: dict[str, Any], config: Config) -> None:
    """What can be checked of a checkpoint written before checkpoints carried their identity: its global
    state keys belong to the algorithm and its clients to the run."""
    from fedcomp.platform.federation import build_algorithm

    server = checkpoint["server"]
    synced = set(build_algorithm(config).Server.names())
    held = set(server.get("state", {}))
    if held != synced:
        raise ConfigError(
            f"{where}: {results.CHECKPOINT} holds the state {sorted(held)} but algorithm.name = "
            f"{config.algorithm_name!r} keeps {sorted(synced)}; it belongs to another run"
        )
    clients = sorted(server.get("private", {}))
    if clients and clients[-1] >= config.federation.clients:
        raise ConfigError(
            f"{where}: {results.CHECKPOINT} holds client {clients[-1]} but federation.clients = "
            f"{config.federation.clients}; it belongs to another run"
        )


def model_finite(server: Any) -> bool:
    """Whether the server's global state (the model and what else the algorithm keeps) is finite.

    A server that can answer cheaply says so itself (``model_finite()``: the Ray server actor checks next to
    the state and sends one flag with each round); an in-process server's state (``tensors()``) is checked here."""
    probe = getattr(server, "model_finite", None)
    if callable(probe):
        return bool(probe())
    return state_finite(server.tensors())


def state_finite(state: dict[str, Any]) -> bool:
    """Whether every tensor in ``state`` holds finite values only (checked after every round)."""
    import torch

    return all(_finite(v) for v in state.values() if isinstance(v, torch.Tensor))


def _finite(tensor: torch.Tensor) -> bool:
    """NumPy's check for float32/64 tensors in CPU memory: the same answer as torch's, about ten times faster (2.7
    against 0.25 ms for the heavy MLP's 1.09 M parameters, on one thread); torch's elsewhere (GPU, bfloat16)."""
    import numpy as np
    import torch

    if tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.float64):
        return bool(np.isfinite(tensor.detach().numpy()).all())
    return bool(torch.isfinite(tensor).all())


def divergence(loss: float, server: Any) -> str | None:
    """Why the run has diverged after a round with training loss ``loss`` (None if it has not)."""
    if not math.isfinite(loss):
        return f"train_loss = {loss}"
    if not model_finite(server):
        return "the model has non-finite parameters"
    return None


def divergence_hint(config: Config) -> str:
    """What to try after a divergence: a smaller step size, where the algorithm has one."""
    lr = getattr(config.algorithm, "lr", None)
    return f"lower algorithm.lr (now {lr:g})" if isinstance(lr, (int, float)) else "use a smaller step size"
