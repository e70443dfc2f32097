"""Which trial errors Tune retries: an error that may pass on a retry (a lost actor, process or node, memory run
out) is retried ``max_failures`` times from the trial's last checkpoint; a deterministic one (a bad configuration,
a bug in a user's algorithm or task module) fails the trial at once -- every retry would fail the same way, after
running again from the checkpoint.

Tune retries every error alike (``FailureConfig`` has no per-exception setting in Ray 2.x; ``fail_fast`` ends the
whole sweep), and decides on the driver, from a count: a failed trial is retried while its failures are at most its
``Trial.max_failures``. So the trainable, before it raises a deterministic error, reports one result marked
:data:`FINAL_ERROR`; Tune hands that result to the driver's callbacks before it asks the trainable for more (which
then raises), and :class:`FinalErrors` lowers that trial's ``max_failures`` to the failures it has had, so that this
one is past it. The sweep's own value comes back as the trial ends, or starts again (``--resume`` after a fix).
Where the first trials to end all fail with one deterministic error, the sweep stops (:data:`ALIKE_TO_STOP`).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ray import cloudpickle, tune
from ray.exceptions import RayError, RayTaskError
from ray.tune import Callback

from fedcomp.platform.errors import AlgorithmError, ConfigError, PlatformError, TaskError, shortened
from fedcomp.platform.runner import replacement_line
from fedcomp.sweeps.staging import staging_folder

FINAL_ERROR = "final_error"
"""The key of the result a trial reports just before it raises a deterministic error (1.0, beside the metric at its
latest value, nan before the first): the mark :class:`FinalErrors` acts on."""

ACTOR_REPLACEMENTS = "actor_replacements"
"""The key, in every result a trial reports, of the actors its run replaced so far in this process (client actors, and
server actors with theirs: each died and was replaced, and the work since ran again: the numbers are the same; the
driver says so as it rises)."""

DETERMINISTIC_PLATFORM_ERRORS = (ConfigError, TaskError, AlgorithmError)
"""fedcomp's own errors about the input: a value out of range, a task or algorithm that breaks its contract. Its others
(``ClientFailure``, ``ActorLost``, ``ResourceError``, ``StorageError``) are about actors, the cluster and the disk."""


def deterministic(error: BaseException) -> bool:
    """Whether ``error`` would recur on a retry of the trial: fedcomp's input errors and any ordinary exception
    (a user's module), also raised in an actor the trial called; not Ray's errors for lost actors, objects, nodes
    and workers, nor ``OSError`` (storage, connections), ``MemoryError``, any ``OutOfMemoryError`` (Ray's kill,
    torch's allocators) or fedcomp's errors for lost actors and the cluster."""
    if isinstance(error, RayTaskError):  # raised in a task or actor the trial called: the error it raised there
        cause = error.cause
        return cause is not None and cause is not error and deterministic(cause)
    if any(kind.__name__ == "OutOfMemoryError" for kind in type(error).__mro__):
        return False
    if isinstance(error, (RayError, OSError, MemoryError)):
        return False
    if isinstance(error, PlatformError):
        return isinstance(error, DETERMINISTIC_PLATFORM_ERRORS)
    return isinstance(error, Exception)


class Reports:
    """A trainable's ``tune.report``, which keeps the latest value of the sweep's ``metric`` for the mark of a final
    error (Tune checks that every result holds the metric; the trial's latest value, not nan, is what the progress
    line and the searcher then see), and adds the count of replaced client actors (:data:`ACTOR_REPLACEMENTS`)."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.latest = math.nan
        self.replaced = 0

    def report(self, metrics: dict[str, Any], checkpoint: tune.Checkpoint | None = None) -> None:
        tune.report({**metrics, ACTOR_REPLACEMENTS: self.replaced}, checkpoint=checkpoint)
        self.latest = metrics.get(self.metric, self.latest)

    def note_replaced(self, events: list[dict[str, Any]]) -> None:
        """Count the client actors the run replaced (``RoundDone.replaced``), each said in the trial's log as a run
        says it; the results reported next carry the count."""
        for event in events:
            print(f"fedcomp: {replacement_line(event)}", file=sys.stderr, flush=True)
        self.replaced += len(events)

    def report_saved(self, rows: list[dict[str, Any]], save: Callable[[Path], tune.Checkpoint]) -> None:
        """Report ``rows``, the last one with the checkpoint ``save`` writes into a staging folder."""
        for metrics in rows[:-1]:
            self.report(metrics)
        with staging_folder() as folder:
            self.report(rows[-1], checkpoint=save(folder))

    @contextlib.contextmanager
    def final_if_deterministic(self) -> Iterator[None]:
        """Around the trainable's work: a deterministic error (:func:`deterministic`) is reported as the trial's
        final error (:data:`FINAL_ERROR`) and raised; other errors are raised as they are, for Tune to retry."""
        try:
            yield
        except Exception as error:
            if deterministic(error):
                tune.report({self.metric: self.latest, FINAL_ERROR: 1.0})
            raise


ALIKE_TO_STOP = 3
"""Trials failing with the same deterministic error, before any trial of the sweep completed, after which it stops:
the others would meet that error too (a data root that is not there, a bug in a module), each after starting its
process and actors."""


class FailingAlike(Exception):
    """Raised by :class:`FinalErrors` to stop Tune's fit: the sweep's first trials failed with one error. Tune's
    controller raises it on as a ``TuneError`` holding its traceback (a Ray Client's fit, wrapped once more):
    :func:`failing_alike` finds it there."""

    def __init__(self, line: str, count: int) -> None:
        super().__init__(f"the first {count} trials of the sweep failed alike: {line}")


def failing_alike(error: BaseException) -> str | None:
    """What a :class:`FailingAlike` said, where ``error`` is it or carries its traceback; else None."""
    marker = f"{FailingAlike.__module__}.{FailingAlike.__qualname__}: "
    for line in reversed(str(error).splitlines()):
        if line.startswith(marker):
            return line[len(marker):]
    return str(error) if isinstance(error, FailingAlike) else None


def error_line(error: BaseException) -> str:
    """A trial's error in one line: what the trial raised (a Ray task error's cause), as fedcomp's own errors say
    it, or its type and the first line of its message (not the notes after it)."""
    cause = getattr(error, "cause", None) or error
    text = (str(cause).strip().splitlines() or [""])[0]
    return text if isinstance(cause, PlatformError) else f"{type(cause).__name__}: {text}"


ERROR_LINE_LIMIT = 500
"""Characters of a trial's error line in the sweep's messages (a data root's, say, is up to 350: whole)."""


def last_error_line(trial: Any) -> str:
    """A failed trial's error in one line (:func:`error_line`) from the exception Tune kept; where that cannot be
    read back (a class the driver cannot import), the last line of its ``error.txt``; nothing where neither can."""
    try:  # what Tune pickled beside error.txt as the trial failed (read from storage, it may not be there yet)
        with open(trial.pickled_error_file, "rb") as file:
            error = cloudpickle.load(file)
    except Exception:
        error = None
    if isinstance(error, BaseException):
        return shortened(error_line(error), ERROR_LINE_LIMIT)
    path = getattr(trial, "error_file", None)
    try:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()] if path else []
    except OSError:
        return ""
    return shortened(lines[-1].strip(), ERROR_LINE_LIMIT) if lines else ""


class FinalErrors(Callback):
    """The driver's half: a trial whose result is marked :data:`FINAL_ERROR` is not retried when it fails next (its
    ``max_failures`` lowered to its failures so far); ``max_failures`` (the sweep's) is put back as it ends or starts.
    The first :data:`ALIKE_TO_STOP` such failures with one error, no trial completed, stop the sweep
    (:class:`FailingAlike`); its state is kept, and a resume after the fix runs every trial not completed."""

    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures
        self.final: set[str] = set()
        """The trials marked as failing deterministically in this fit."""
        self.alike: list[str] = []
        """Their errors' lines, in the order they failed."""

    def setup(
        self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None, **info: Any
    ) -> None:
        self.final, self.alike = set(), []  # this fit's (a resumed sweep's callback comes back with the last fit's)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        if result.get(FINAL_ERROR) == 1.0:
            trial.max_failures = trial.run_metadata.num_failures
            self.final.add(trial.trial_id)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        trial.max_failures = self.max_failures

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        trial.max_failures = self.max_failures
        if trial.trial_id not in self.final or any(t.status == "TERMINATED" for t in trials):
            return
        self.alike.append(last_error_line(trial))
        if len(self.alike) >= ALIKE_TO_STOP and len(set(self.alike)) == 1 and self.alike[0]:
            raise FailingAlike(self.alike[0], len(self.alike))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        trial.max_failures = self.max_failures
