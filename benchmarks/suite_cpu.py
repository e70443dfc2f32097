"""Where the test suite's time goes: the CPU each test costs, Ray's processes included.

    python benchmarks/suite_cpu.py                       # the suite as `make test` runs it; writes SUITE_CPU.md
                                                         # and tests/module_costs.json
    python benchmarks/suite_cpu.py --out - -- tests/actors -n 0   # pytest's arguments after `--`

On two cores the suite is CPU-bound: both test processes keep a core busy from start to end, so it gets faster
only by spending less CPU. Neither `time` nor pytest's `--durations` says where that CPU goes. Ray's daemons and
actor processes are not the test processes' children, and a test's wall time shares the machine with the other
test process. So each test process (this file is also the pytest plugin, loaded as `-p suite_cpu`) moves itself
into a cgroup of its own. The cgroup's CPU counter counts every process it starts from then on: its Ray session's
daemons and actors, `fedcomp` subprocesses, clusters. The plugin notes how much the counter grew over each test,
setup and teardown included. It needs a cgroup it may create (cgroup v1 `cpuacct`, or v2), e.g. as root in a VM.
Without one it says so in one line and exits with 2.

Each module's CPU also goes into ``tests/module_costs.json`` (the modules measured replaced, the others kept), which
the suite's conftest reads to hand the costliest modules to the test processes first: the last modules are then the
cheap ones, and neither process waits long for the other at the end (the report says how long it did).

The run uses no pytest cache (`-p no:cacheprovider`), as in a fresh clone: mypy's test starts cold. When a test
fails or errors, the script prints the report and the tests that did not pass, leaves the report file as it was
and exits with 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

OUT_ENV = "SUITE_CPU_OUT"
ROOT = Path(__file__).resolve().parents[1]
MAKE_TEST = ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
"""pytest's arguments in ``make test`` (the Makefile's PARALLEL)."""
V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")


def hierarchy() -> tuple[Path, str]:
    """Where cgroups are made here and the file of a cgroup that holds its CPU counter."""
    if (V1 / "cpuacct.usage").is_file():
        return V1, "cpuacct.usage"
    if (V2 / "cgroup.controllers").is_file():
        return V2, "cpu.stat"
    raise OSError("no cgroup v1 cpuacct or v2 hierarchy under /sys/fs/cgroup")


class Group:
    """A new cgroup holding this process (and every process it starts later), with its CPU counter in seconds."""

    def __init__(self, name: str) -> None:
        root, self.counter = hierarchy()
        self.path = root / name
        self.path.mkdir(exist_ok=True)
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self) -> float:
        text = (self.path / self.counter).read_text()
        if self.counter == "cpuacct.usage":
            return int(text) / 1e9
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6


# -- the pytest plugin ------------------------------------------------------------------------------------------

_group: Group | None = None
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")


def pytest_configure(config: pytest.Config) -> None:
    global _group
    if os.environ.get(OUT_ENV) is None or (_worker == "main" and getattr(config.option, "numprocesses", None)):
        return  # not under this script, or the controller of test processes (which runs no test)
    _group = Group(f"fedcomp-suite-{Path(os.environ[OUT_ENV]).name}-{_worker}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _group is None:
        yield
        return
    cpu, wall = _group.seconds(), time.monotonic()
    yield
    row = {"test": item.nodeid, "cpu": _group.seconds() - cpu, "wall": time.monotonic() - wall,
           "worker": _worker, "end": time.time()}
    with open(Path(os.environ[OUT_ENV]) / f"{_worker}.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _group is not None:
        (Path(os.environ[OUT_ENV]) / f"total-{_worker}.json").write_text(json.dumps({"cpu": _group.seconds()}))


# -- the script -------------------------------------------------------------------------------------------------


def run_suite(pytest_args: list[str], folder: Path) -> tuple[float, str, list[str]]:
    """Run pytest with the plugin, rows into ``folder``; returns the wall seconds, pytest's summary line and its
    lines naming the tests that failed or errored."""
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, OUT_ENV: str(folder), "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu", "-p", "no:cacheprovider", "-q", "-rfE",
                           *pytest_args], env=env, capture_output=True, text=True, cwd=Path(here).parent)
    wall = time.monotonic() - started
    summary = next((line.strip("= ") for line in reversed(done.stdout.splitlines()) if " in " in line), "")
    if done.returncode not in (0, 1):
        sys.exit(f"suite_cpu: pytest exited with {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return wall, summary, failed


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """Every test's row the plugin wrote in ``folder``."""
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]


def _module(row: dict[str, Any]) -> str:
    return str(row["test"]).split("::")[0]


def module_cpu(rows: list[dict[str, Any]]) -> Counter[str]:
    """Each module's CPU seconds."""
    cpu: Counter[str] = Counter()
    for row in rows:
        cpu[_module(row)] += row["cpu"]
    return cpu


def report(folder: Path, rows: list[dict[str, Any]], wall: float, summary: str, pytest_args: list[str], top: int) -> str:
    import common

    processes = [json.loads(f.read_text())["cpu"] for f in sorted(folder.glob("total-*.json"))]
    by_module, count = module_cpu(rows), Counter(map(_module, rows))
    in_tests, total = sum(r["cpu"] for r in rows), sum(processes)
    who = "The test process" if len(processes) == 1 else f"The {len(processes)} test processes"
    lines = [
        "# Where the test suite's CPU goes",
        "",
        f"{common.generated_by('Measured', shlex.join(['python', 'benchmarks/suite_cpu.py', '--', *pytest_args]))}. "
        f"pytest: {summary}.",
        "",
        f"{who} and every process started from {'it' if len(processes) == 1 else 'them'} used "
        f"**{total / 60:.1f} min of CPU** in {wall / 60:.1f} min of wall time "
        f"({total / wall:.2f} cores busy on average); {in_tests / 60:.1f} min of it inside tests, the rest "
        "collecting them and starting and stopping the processes' Ray sessions."
        + _tail(rows, len(processes)),
        "",
        "| tests costing | tests | CPU (s) |",
        "|---|---:|---:|",
    ]
    for low, high in ((0, 1), (1, 5), (5, 20), (20, 10_000)):
        chosen = [r["cpu"] for r in rows if low <= r["cpu"] < high]
        label = f"{low}–{high} s" if high < 10_000 else f"{low} s or more"
        lines.append(f"| {label} | {len(chosen)} | {sum(chosen):.0f} |")
    lines += ["", f"The {top} modules that cost most:", "", "| module | tests | CPU (s) |", "|---|---:|---:|"]
    lines += [f"| `{m}` | {count[m]} | {s:.0f} |" for m, s in by_module.most_common(top)]
    lines += ["", f"The {top} tests that cost most (setup and teardown included; wall time beside the other test "
              "process):", "", "| test | CPU (s) | wall (s) |", "|---|---:|---:|"]
    lines += [f"| `{r['test']}` | {r['cpu']:.1f} | {r['wall']:.1f} |"
              for r in sorted(rows, key=lambda r: -r["cpu"])[:top]]
    return "\n".join(lines) + "\n"


def _tail(rows: list[dict[str, Any]], processes: int) -> str:
    """How long before the last test process's last test the first one's ended (that process idle till then)."""
    ends: dict[str, float] = {}
    for row in rows:
        ends[row["worker"]] = max(ends.get(row["worker"], 0.0), row["end"])
    if processes < 2 or len(ends) < 2:
        return ""
    return f" The first test process ran out of tests {max(ends.values()) - min(ends.values()):.0f} s before the last."


def update_costs(path: Path, measured: Counter[str]) -> None:
    """Put the measured modules' CPU into the table at ``path`` (the others' kept, a module whose file is gone
    dropped), atomically."""
    from fedcomp.platform.results import atomic_write

    old = json.loads(path.read_text()) if path.is_file() else {}
    table = {module: cost for module, cost in old.items() if (ROOT / module).is_file()}
    table.update((module, round(cpu, 1)) for module, cpu in measured.items())
    atomic_write(path, (json.dumps(dict(sorted(table.items())), indent=1) + "\n").encode())


def main() -> None:
    import common

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(common.HERE / "SUITE_CPU.md"), help="the report ('-': print only)")
    parser.add_argument("--top", type=int, default=25, help="rows in the per-module and per-test tables")
    parser.add_argument("--costs", default=str(ROOT / "tests" / "module_costs.json"),
                        help="the table of each module's CPU that orders the suite, written with the report ('-': leave it)")
    parser.add_argument("pytest_args", nargs="*", default=MAKE_TEST, help="pytest's arguments (after --)")
    args = parser.parse_args()
    try:  # may a cgroup be made here? (the test processes make theirs)
        probe = hierarchy()[0] / f"fedcomp-suite-probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        print(f"suite_cpu: cannot create a cgroup to count the suite's CPU in ({error})", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        wall, summary, failed = run_suite(args.pytest_args, Path(tmp))
        rows = read_rows(Path(tmp))
        text = report(Path(tmp), rows, wall, summary, args.pytest_args, args.top)
        for group in hierarchy()[0].glob(f"fedcomp-suite-{Path(tmp).name}-*"):
            try:
                group.rmdir()
            except OSError:  # a process of the run still lingers in it
                pass
    if failed:  # a failing test's CPU is not what the suite spends: printed, not published
        print(text)
        kept = "" if args.out == "-" else f"; {args.out} left as it was"
        print(f"suite_cpu: {len(failed)} test(s) did not pass{kept}:", *failed, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    common.publish(text, args.out)
    if args.out != "-" and args.costs != "-":
        update_costs(Path(args.costs), module_cpu(rows))


if __name__ == "__main__":
    main()
