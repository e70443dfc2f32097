"""``fedcomp check CONFIG``: what fedcomp promises of every algorithm and task, checked on one config -- a user's
own algorithm or task above all, which fedcomp's test suite does not know.

Each check runs the config again and compares every metric column with the first run's, bit for bit
(:func:`fedcomp.verification.compare`; ``wall_time`` is not compared):

1. **the same seed again**, on the local backend: every draw comes from the generator ``draw`` is given (a
   ``torch.randn`` without it, or a set iterated in hash order, breaks this);
2. **on Ray**, the clients packed as the config says, and **packed otherwise** (half as many clients an actor):
   the clients' results are added in a fixed order wherever they run (client state kept anywhere else breaks this);
3. **stopped and resumed**: the run to its middle evaluated round, then continued from that checkpoint to the end
   (state that the algorithm's records do not hold -- an attribute set in ``round`` -- breaks this).

Every run goes to a temporary folder, removed afterwards.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcomp.platform import results
from fedcomp.platform.config import Config, load_config, overrides_of
from fedcomp.platform.errors import ConfigError, Interrupted, shown
from fedcomp.verification import ColumnDifference, backend_text, compare

SAME_SEED = ("a draw not from the generator `draw` (or a client program's ctx.rng) is given -- torch.randn or "
             "random.random without it, a set iterated in hash order")
"""What usually breaks "the same seed again" (said under a check that found a difference, as are the two below)."""
ELSEWHERE = ("client state kept outside the algorithm's records (an attribute set on the algorithm or the task), or "
             "a result that depends on which clients share a process")
"""What usually breaks the Ray runs' checks."""
RESUMED = "state the checkpoint does not hold: an attribute set in `round` or `start`, not a field of the Server record"
"""What usually breaks "stopped and resumed"."""


@dataclass(frozen=True)
class Check:
    """One re-run compared with the first run: what it was, the columns that differ and any shape problem."""

    what: str
    differences: list[ColumnDifference]
    problems: list[str]
    cause: str = ""
    """What usually breaks this check (said where it did)."""

    @property
    def identical(self) -> bool:
        return not self.differences and not self.problems

    def line(self) -> str:
        if self.identical:
            return f"  identical  {self.what}"
        found = [f"{d.column} ({d.rows} rows, up to {d.max_abs_diff:.3g})" for d in self.differences] + self.problems
        return f"  DIFFERENT  {self.what}: {'; '.join(found)}" + (f"\n             usually: {self.cause}" if self.cause else "")


@dataclass(frozen=True)
class Conformance:
    """The outcome of :func:`check`."""

    config: Config
    rows: int
    columns: int
    checks: list[Check]
    skipped: list[str]
    seconds: float

    @property
    def identical(self) -> bool:
        return all(c.identical for c in self.checks)

    def report(self) -> str:
        run = self.config.run
        lines = [f"check {self.config.algorithm_name} on {self.config.task_name} ({self.config.federation.clients} "
                 f"clients, {run.rounds} rounds, seed {run.seed}): every metric column ({self.columns}) over "
                 f"{self.rows} rows, bit for bit"]
        lines += [c.line() for c in self.checks] + [f"  skipped    {why}" for why in self.skipped]
        failed = sum(not c.identical for c in self.checks)
        verdict = f"all {len(self.checks)} identical" if not failed else f"{failed} of {len(self.checks)} DIFFERENT"
        lines.append(f"{verdict} ({self.seconds:.1f} s)")
        return "\n".join(lines)


def check(
    source: str | Path | Mapping[str, Any] | Config = "quickstart", overrides: Mapping[str, Any] | None = None,
    ray: bool = True,
) -> Conformance:
    """Run the config (a preset, a YAML file, a dict or a :class:`Config`, with ``overrides``) and the re-runs of
    the module docstring; ``ray=False`` leaves out the Ray runs.

    Raises:
        ConfigError: the config is not valid.
    """
    from fedcomp.api import make_server
    from fedcomp.platform.runner import execute

    started = time.perf_counter()
    overrides = overrides_of(overrides)
    if not isinstance(ray, bool):
        raise ConfigError(f"ray = {ray!r}: must be True or False")
    if "run.out" in overrides:
        raise ConfigError(f"run.out = {shown(overrides['run.out'])}: a check keeps no runs (they go to a temporary "
                          f"folder, removed at its end); leave run.out out")
    config = source.replace(**overrides) if isinstance(source, Config) else load_config(source, overrides)
    rounds, every = config.run.rounds, config.run.eval_every
    middle = (rounds // 2) // every * every

    def say(what: str) -> None:  # a check runs for minutes: each run says it starts
        print(f"fedcomp: check: {what} ... ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="fedcomp-check-") as out:

            def run(what: str, **changes: Any) -> tuple[dict[str, Any], Any]:
                say(what)
                done = execute(config.replace(**{"run.out": out, "run.track": "none", "run.progress": "none", **changes}),
                               make_server, resumable=False)
                return results.read_json(done.run_dir / results.RUN_JSON), done

            _, first = run("the run, local backend", **{"federation.backend": "local"})
            again = run("the same seed again, local backend", **{"federation.backend": "local"})[1]
            reruns = [("the same seed again, local backend", again.metrics, SAME_SEED)]
            skipped = []
            if ray:
                meta, done = run("on Ray, packed as configured", **{"federation.backend": "ray"})
                reruns.append((f"{backend_text(meta['backend'])}, packed as configured", done.metrics, ELSEWHERE))
                packed = int(meta["backend"].get("clients_per_actor", 1))
                other = packed // 2 if packed > 1 else 2  # half as many clients an actor (or two, from one)
                if other <= config.federation.clients:
                    meta, done = run(f"on Ray, {other} clients an actor", **{"federation.backend": "ray",
                                                                                "federation.clients_per_actor": other})
                    reruns.append((f"{backend_text(meta['backend'])}, packed otherwise", done.metrics, ELSEWHERE))
                else:
                    skipped.append("Ray packed otherwise: one client, one packing")
            else:
                skipped.append("the Ray runs (ray=False, --no-ray)")
            if 0 < middle < rounds:
                _, stopped = run(f"stopped at round {middle}", **{"federation.backend": "local", "run.rounds": middle,
                                                                  "run.checkpoint_every": middle})
                say("resumed from its checkpoint")
                resumed = execute(config.replace(**{"run.out": out, "run.track": "none", "run.progress": "none",
                                                    "federation.backend": "local", "run.checkpoint_every": middle}),
                                  make_server, resume_dir=stopped.run_dir, resumable=False)
                reruns.append((f"stopped at round {middle} and resumed from its checkpoint", resumed.metrics, RESUMED))
            else:
                skipped.append(f"stopped and resumed: no evaluated round (run.eval_every = {every}) before the last of "
                               f"{rounds} to stop at")
    except Interrupted:  # its runs' folders went with the temporary one: nothing to continue
        raise Interrupted("the check's runs were in a temporary folder, removed; nothing to continue: check again") from None
    checks = []
    for what, metrics, cause in reruns:
        columns, found, problems = compare(first.metrics, metrics)
        checks.append(Check(what, found, problems, cause))
    return Conformance(config, len(first.metrics), len(columns), checks, skipped, time.perf_counter() - started)
