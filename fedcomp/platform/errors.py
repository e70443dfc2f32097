"""The platform's exceptions: every user-facing failure is one of these, with a one-line message.

The command line prints the message as one line and exits with the error's ``exit_code``: 2 for anything
the user can fix in the input, the files or the cluster, 3 for a run that diverged.
"""

from __future__ import annotations

import difflib
import reprlib
import shlex
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class PlatformError(Exception):
    """Base of every error fedcomp raises on purpose. :attr:`path`: the folder it kept where there is one to go on
    from (a run's to resume with ``fedcomp.resume(error.path)``, a sweep's), else None."""

    exit_code = 2
    path: object = None


class ConfigError(PlatformError, ValueError):
    """A configuration value is unknown, mistyped or out of range (raised before any work starts)."""


class ResourceError(PlatformError):
    """The cluster cannot host what the configuration asks for (GPUs, CPUs, actors that never start), or the
    cluster asked for cannot be reached."""


class ClientFailure(PlatformError):
    """A client kept failing after the configured number of retries."""


class ActorLost(PlatformError):
    """A Ray actor that fedcomp does not replace died mid-run (the server actor); the run's folder keeps its last
    checkpoint."""


class TaskError(PlatformError):
    """A task does not do what it declares: its evaluator does not report a metric it declares (a user's task; the
    built-ins are tested for it)."""


class AlgorithmError(PlatformError):
    """An algorithm's records do not fit together: a client's first state lacks a private field that the server
    does not send and its ``join`` does not start (a user's algorithm; the built-ins are tested for it)."""


class TrialsFailed(PlatformError):
    """Every trial of a sweep failed; the message gives the first one's error and how to continue once it is fixed
    (:attr:`path`: the sweep's folder, whose ``trials.parquet`` holds what they reported)."""

    def __init__(self, message: str, path: object = None) -> None:
        super().__init__(message)
        self.path = path


class StorageError(PlatformError):
    """Results cannot be written (disk full, read-only folder) or a stored file cannot be read back."""


class NotThisRun(ConfigError):
    """A checkpoint that passed the identity check holds a state that is not the run's (edited, damaged): found as the
    server takes it, so the message says only that -- continuing it again would meet the same."""


class NoResults(PlatformError, FileNotFoundError):
    """There are no results where they were asked for (no runs in a folder, a sweep with no trials table yet); a
    ``FileNotFoundError`` still, for code that catches that."""


class Diverged(PlatformError):
    """The training loss or the model became non-finite; the run stopped and kept its finite rounds."""

    exit_code = 3


class Interrupted(KeyboardInterrupt):
    """The user stopped a run or a sweep (Ctrl-C, or SIGTERM: :mod:`fedcomp.platform.signals`); the message says what
    was kept and how to continue, :attr:`path` the folder to continue (``fedcomp.resume``, ``fedcomp.resume_sweep``)
    or None where nothing was kept. A ``KeyboardInterrupt`` still, so that code catching that keeps working."""

    def __init__(self, message: str, path: object = None) -> None:
        super().__init__(message)
        self.path = path


_on_command_line: list[bool] = [False]
"""Whether this process is inside the ``fedcomp`` command (:func:`command_line`): messages then say what to type
there, else what to call in Python. Process-wide, not per thread: a farewell said on the signal watch's thread is
the command's."""


@contextmanager
def command_line() -> Iterator[None]:
    """While inside (the ``fedcomp`` command's ``main``), messages that say how to continue a run or sweep, or name
    the folder given to continue, say it as the command line does (``--resume``), not as Python does."""
    before = _on_command_line[0]
    _on_command_line[0] = True
    try:
        yield
    finally:
        _on_command_line[0] = before


@contextmanager
def config_field(field: str) -> Iterator[None]:
    """A dataset loader's ``FileNotFoundError`` or ``ValueError`` (files missing, empty, cut short or damaged)
    raised inside as the ``ConfigError`` ``"<field>: <its message>"``: the config setting that led to the files."""
    try:
        yield
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(f"{field}: {error}") from None


def to_continue(kind: str, path: object) -> str:
    """How to continue the run (``kind="run"``) or sweep (``"sweep"``) kept in ``path``: the command to type
    (:func:`command`) inside the ``fedcomp`` command, else the Python call (``fedcomp.resume('...')``)."""
    return command(kind, "--resume", path) if _on_command_line[0] else _python_call(kind, path)


def resuming(kind: str, path: object) -> str:
    """How a message names the folder the user gave to continue a run (``kind="run"``) or sweep: ``--resume '<path>'``
    inside the ``fedcomp`` command, else the Python call that was given it."""
    return f"--resume {str(path)!r}" if _on_command_line[0] else _python_call(kind, path)


def to_run_again(run_json: object) -> str:
    """How to start a run anew from the config in a run's ``run.json``: the command inside the ``fedcomp`` command,
    else the Python call."""
    return command("run", run_json) if _on_command_line[0] else f"fedcomp.run({str(run_json)!r})"


def _python_call(kind: str, path: object) -> str:
    return f"fedcomp.{'resume' if kind == 'run' else 'resume_sweep'}({str(path)!r})"


def add_note(error: BaseException, note: str) -> None:
    """Add ``note`` to ``error``, printed after its message in its traceback (Python 3.11's notes; on 3.10 none)."""
    add = getattr(error, "add_note", None)
    if add is not None:
        add(note)


def command(*words: object) -> str:
    """A fedcomp command line that a message tells the user to run, each word quoted for the shell where it needs
    it (a run folder whose name has a space): copied and pasted, it runs as shown."""
    return " ".join(shlex.quote(str(word)) for word in ("fedcomp", *words))


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel = 2
_SHOWN.maxtuple = _SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxset = _SHOWN.maxfrozenset = 20
_SHOWN.maxstring = _SHOWN.maxother = 1000


def shown(value: object) -> str:
    """``repr(value)`` for a message that names a value the user gave, abridged with ``...`` past 20 items or 2
    levels: a YAML file's aliases can expand a few lines into millions of items, whose full repr takes seconds."""
    return _SHOWN.repr(value)


def nearest(word: object, choices: Iterable[str]) -> str | None:
    """The choice nearest a misspelt ``word`` (``difflib``'s closest, at a similarity of 0.7 or more: a typo, not
    a word that shares a part, as ``noise_ratio`` and ``separation``), else None."""
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.7) if isinstance(word, str) else []
    return near[0] if near else None


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice :func:`nearest` ``word``, else nothing: the suggestion a message adds
    before it lists what is allowed."""
    near = nearest(word, choices)
    return f" (did you mean {near!r}?)" if near else ""


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name if it has none), :func:`shortened` to ``limit``."""
    lines = str(error).strip().splitlines()
    return shortened(lines[0] if lines else type(error).__name__, limit)


def shortened(text: str, limit: int) -> str:
    """``text`` cut after a whole word to at most ``limit`` characters, `` ...`` marking the cut."""
    if len(text) <= limit:
        return text
    return (text[:limit - 4].rsplit(" ", 1)[0] or text[:limit - 4]) + " ..."
