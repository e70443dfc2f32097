"""Progress output for runs: a tqdm bar in a terminal, plain log lines when output is not a terminal
(CI, Ray jobs, files), or nothing.

A bar shows the round, the headline metric and tqdm's ETA. Log mode writes a line every ~10 % of the
rounds and at least every ``LOG_EVERY_S`` seconds -- also between evaluations, so a run that evaluates
rarely (or has slow rounds) still says where it is. :func:`announce` writes one status line (e.g.
"starting local Ray ...") in the same way, unless progress output is off; the runner sets the mode for
the code it calls with :func:`output_mode`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, TextIO

Mode = Literal["bar", "log", "none"]
LOG_EVERY_S = 30.0
"""Longest silence between two log lines of a run, in seconds."""

_mode: ContextVar[str] = ContextVar("fedcomp_progress_mode", default="auto")


def resolve(mode: str, stream: TextIO | None = None) -> Mode:
    """``auto`` becomes ``bar`` on a terminal or in a Jupyter notebook (its kernel's stream, which is no terminal:
    tqdm draws a notebook's bar there) and ``log`` otherwise; the other modes stay as they are."""
    if mode == "auto":
        stream = stream or sys.stderr
        notebook = type(stream).__module__.startswith("ipykernel.")
        return "bar" if notebook or getattr(stream, "isatty", lambda: False)() else "log"
    if mode not in ("bar", "log", "none"):
        raise ValueError(f"progress mode {mode!r}: allowed auto, bar, log, none")
    return mode  # type: ignore[return-value]


@contextmanager
def output_mode(mode: str) -> Iterator[None]:
    """Make :func:`announce` follow ``mode`` (a ``run.progress`` value) inside the block."""
    token = _mode.set(mode)
    try:
        yield
    finally:
        _mode.reset(token)


def in_a_ray_worker() -> bool:
    """Whether this process is one of Ray's workers (an actor's, a trial's), whose output Ray forwards to the
    driver's terminal -- without importing Ray where this process has not."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE


def write_line(line: str, stream: TextIO | None = None) -> None:
    """Write one line to stderr without breaking an active tqdm bar."""
    from tqdm import tqdm

    stream = stream or sys.stderr
    if getattr(tqdm, "_instances", None):
        tqdm.write(line, file=stream)
    else:
        print(line, file=stream, flush=True)


def announce(message: str) -> None:
    """One status line (``fedcomp: starting local Ray ...``), unless progress output is off."""
    if resolve(_mode.get()) != "none":
        write_line(f"fedcomp: {message}")


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h03m``: short enough for a progress line."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _value(value: Any) -> str:
    """A metric in a line: 4 decimals; one below 0.001 (a distance to an optimum, say) in 3 significant digits."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:.3g}" if 0 < abs(number) < 1e-3 else f"{number:.4f}"


def rounded_metric(value: float) -> float:
    """A metric as a run's closing line shows it (rounded as :func:`_value` writes it)."""
    return float(_value(value))


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class RunProgress:
    """Progress of one run from round ``start`` to ``total``.

    Args:
        total: the run's last round (``run.rounds``).
        start: the round the run starts from (0, or the checkpoint's round on resume).
        headline: the metric shown (the task's first metric).
        mode: a ``run.progress`` value (``auto``, ``bar``, ``log``, ``none``).
        label: the bar's description (the algorithm's name).
        stream: where output goes (default: stderr).
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        total: int,
        start: int,
        headline: str,
        mode: str = "auto",
        label: str = "",
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        log_every_s: float = LOG_EVERY_S,
    ) -> None:
        self.stream = stream or sys.stderr
        self.mode = resolve(mode, self.stream)
        self.total, self.start, self.headline = total, start, headline
        self.clock, self.log_every_s = clock, log_every_s
        self.every = max(1, total // 10)
        self.t0 = self.last_line = clock()
        self.latest: dict[str, Any] | None = None
        self.bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total, initial=start, unit="round", desc=label or None, dynamic_ncols=True, file=self.stream
            )

    def eta(self, round: int) -> float:
        """Seconds left, from the mean time per round this process has run so far."""
        done = round - self.start
        return (self.clock() - self.t0) / done * (self.total - round) if done > 0 else math.nan

    def update(self, round: int, latest: dict[str, Any] | None) -> None:
        """Round ``round`` finished; ``latest`` is the most recent evaluation row (of this round or an
        earlier one: a run need not evaluate every round)."""
        changed = latest is not None and latest is not self.latest
        if latest is not None:
            self.latest = latest
        if self.bar is not None:  # the round's evaluation set first: update() draws the bar
            if changed and latest is not None and self.headline in latest:
                self.bar.set_postfix({self.headline: _value(latest[self.headline])}, refresh=False)
            self.bar.update(round - self.bar.n)
            return
        if self.mode != "log":
            return
        now = self.clock()
        if round % self.every == 0 or round == self.total or now - self.last_line >= self.log_every_s:
            self.last_line = now
            write_line(self.line(round), self.stream)

    def line(self, round: int) -> str:
        """``round 12/40 (30%)  test_accuracy=0.8688  train_loss=0.4725  elapsed 1.8s  eta 4.2s``; between
        evaluations the metrics are the latest evaluation's, introduced by ``eval @<its round>:``."""
        parts = [f"round {round}/{self.total} ({100 * round // self.total}%)"]
        row = self.latest
        if row is not None:
            metrics = [f"{k}={_value(row[k])}" for k in (self.headline, "train_loss") if _finite(row.get(k))]
            if "round" in row and int(row["round"]) != round and metrics:
                metrics[0] = f"eval @{int(row['round'])}: {metrics[0]}"
            parts += metrics
        parts.append(f"elapsed {duration(self.clock() - self.t0)}")
        if round < self.total:
            parts.append(f"eta {duration(self.eta(round))}")
        return "  ".join(parts)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
