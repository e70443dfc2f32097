"""benchmarks/suite_cpu.py: the CPU of each test, counted over every process the test processes start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_report_counts_every_test_of_the_selection_and_the_processes_they_start(tmp_path):
    """The report, and each module's CPU put into the cost table: the modules measured replaced, the others kept,
    a module whose file is gone dropped."""
    costs = tmp_path / "module_costs.json"
    costs.write_text(json.dumps({"tests/test_lint.py": 12.5, "tests/actors/test_routing.py": 99.0, "tests/gone.py": 3.0}))
    args = [sys.executable, "benchmarks/suite_cpu.py", "--out", str(tmp_path / "SUITE_CPU.md"), "--costs", str(costs),
            "--top", "3", "--", "tests/actors/test_routing.py", "tests/test_cli.py::test_python_dash_m_and_list", "-n", "0"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode == 2 and "cannot create a cgroup" in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "pytest: 11 passed in " in lines[2]
    modules = {line.split("|")[1].strip(" `"): line.split("|")[2:4] for line in lines if line.startswith("| `tests/")
               and line.count("|") == 4 and "::" not in line}
    assert int(modules["tests/actors/test_routing.py"][0]) == 10 and int(modules["tests/test_cli.py"][0]) == 1
    # `python -m fedcomp` in subprocesses (a new interpreter each, importing pydantic, PyYAML, pandas) costs more than
    # any routing test's bookkeeping
    slowest, runner_up = [line for line in lines if line.startswith("| `tests/") and "::" in line][:2]
    assert "test_python_dash_m_and_list" in slowest and float(slowest.split("|")[2]) > float(runner_up.split("|")[2])
    assert (tmp_path / "SUITE_CPU.md").read_text().strip() == done.stdout.strip()
    table = json.loads(costs.read_text())
    assert set(table) == {"tests/test_lint.py", "tests/actors/test_routing.py", "tests/test_cli.py"}
    assert table["tests/test_lint.py"] == 12.5 and table["tests/actors/test_routing.py"] < 99.0
    assert table["tests/test_cli.py"] == round(float(slowest.split("|")[2]), 1)


@pytest.mark.slow
def test_a_failing_test_is_named_and_the_report_is_not_written(tmp_path):
    failing = tmp_path / "test_fails.py"
    failing.write_text("def test_fails():\n    assert 1 == 2\n\n\ndef test_passes():\n    pass\n")
    out = tmp_path / "SUITE_CPU.md"
    args = [sys.executable, "benchmarks/suite_cpu.py", "--out", str(out), "--", str(failing), "-n", "0"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode == 2 and "cannot create a cgroup" in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.splitlines()[0] == f"suite_cpu: 1 test(s) did not pass; {out} left as it was:"
    assert done.stderr.splitlines()[1].startswith("  FAILED ") and "test_fails" in done.stderr.splitlines()[1]
    assert "pytest: 1 failed, 1 passed in " in done.stdout and not out.exists()


def test_the_suite_hands_out_its_costliest_modules_first(monkeypatch, tmp_path):
    """tests/conftest.py orders the collected tests by the cost table, costliest module first and a module the table
    lacks before all; each module's tests keep their order."""
    import tests.conftest

    table = tmp_path / "module_costs.json"
    table.write_text(json.dumps({"tests/a.py": 1.0, "tests/b.py": 20.0, "tests/c.py": 3.5}))
    monkeypatch.setattr(tests.conftest, "MODULE_COSTS", table)
    items = [SimpleNamespace(nodeid=f"tests/{module}.py::test_{i}", fixturenames=(), get_closest_marker=lambda _: None)
             for module, i in zip("abcadcb", range(7))]
    tests.conftest.pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == ["tests/d.py::test_4", "tests/b.py::test_1", "tests/b.py::test_6",
                                               "tests/c.py::test_2", "tests/c.py::test_5", "tests/a.py::test_0",
                                               "tests/a.py::test_3"]
