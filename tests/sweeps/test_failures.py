"""Which trial errors a sweep retries: a deterministic one (a user's module raising, fedcomp's input errors) fails its
trial once; a lost actor, process or node is retried (also ``test_tuner``'s trial whose process exits mid-run)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest
from ray.exceptions import ActorDiedError, OutOfMemoryError, RayTaskError

import fedcomp
from fedcomp.platform.errors import (
    ActorLost,
    AlgorithmError,
    ClientFailure,
    ConfigError,
    ResourceError,
    StorageError,
    TaskError,
    TrialsFailed,
)
from fedcomp.sweeps.failures import deterministic

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "extension.py"
EXAMPLE_YAML = REPO / "examples" / "extension.yaml"


class TorchOutOfMemoryError(RuntimeError):
    """As torch names its allocators' error (a ``RuntimeError``)."""


TorchOutOfMemoryError.__name__ = "OutOfMemoryError"


def in_an_actor(error: BaseException) -> RayTaskError:
    """``error`` as a trial sees it when an actor it called raised it."""
    return RayTaskError("ClientActor.run", "Traceback ...", error)


@pytest.mark.parametrize("error", [
    ValueError("a user's algorithm"), KeyError("x"), ZeroDivisionError(), ImportError("no module"),
    ConfigError("lr = -1"), TaskError("does not report distance"), in_an_actor(TypeError("a user's task")),
    in_an_actor(AlgorithmError("its Client record has u, which no join starts")),
])
def test_a_bad_input_or_a_users_bug_is_deterministic(error):
    assert deterministic(error)


@pytest.mark.parametrize("error", [
    ActorDiedError(), OutOfMemoryError("killed"), ClientFailure("a client actor died"), ActorLost("the server actor"),
    ResourceError("actors never started"), StorageError("disk full"), OSError("stale file handle"), MemoryError(),
    TorchOutOfMemoryError("CUDA out of memory"), in_an_actor(ActorDiedError()), in_an_actor(TorchOutOfMemoryError()),
])
def test_a_lost_actor_node_or_memory_may_pass_on_a_retry(error):
    assert not deterministic(error)


def failing_task(folder: Path) -> Path:
    """A user's task module whose evaluator raises a ValueError, each time noting a line in ``attempts.txt``."""
    module = folder / "failing_task.py"
    module.write_text(textwrap.dedent(f"""
        from fedcomp.platform import catalog
        from fedcomp.platform.registry import register_task

        catalog.import_source({str(EXAMPLE)!r})


        @register_task("least-squares-failing")
        class Failing(catalog.task_class("least-squares")):
            def evaluator(self):
                def evaluate(state):
                    with open({str(folder / "attempts.txt")!r}, "a") as attempts:
                        attempts.write("evaluated\\n")
                    raise ValueError("the user's evaluator is broken")
                return evaluate
    """))
    return module


@pytest.mark.ray
@pytest.mark.slow
def test_a_trial_whose_users_module_raises_fails_once_without_retries(ray_session, tmp_path):
    """``max_failures: 2`` retried the trial twice, each attempt failing the same way (three attempts in all)."""
    overrides = {"run.rounds": 3, "run.eval_every": 1, "run.progress": "none", "run.track": "none",
                 "federation.backend": "local", "federation.clients": 4, "federation.clients_per_round": 4,
                 "algorithm.local_steps": 3, "task.module": str(failing_task(tmp_path)),
                 "task.name": "least-squares-failing", "run.out": str(tmp_path / "out")}
    with pytest.raises(TrialsFailed, match=r"^every trial of the sweep failed \(1\); the first: ValueError: the user's "
                                           r"evaluator is broken; each trial's error.txt is under "):
        fedcomp.sweep({"base": str(EXAMPLE_YAML), "set": overrides, "grid": {"algorithm.lr": [0.02]},
                       "max_failures": 2, "name": "failing"})
    assert (tmp_path / "attempts.txt").read_text().splitlines() == ["evaluated"]  # one attempt
    [folder] = (tmp_path / "out").iterdir()
    [error] = folder.glob("*/error.txt")
    assert error.read_text().count("Failure # ") == 1
    trials = pd.read_parquet(folder / "trials.parquet")
    assert set(trials["status"]) == {"error"} and trials["trial"].nunique() == 1
