"""A user's task and algorithm in a module of theirs (``examples/extension.py``): the config names the module
(``task.module``, ``algorithm.module``), so every process of a run imports it -- a Ray actor, a sweep's trial, a
fresh ``fedcomp`` process that resumes, verifies or reports the run; a task or algorithm defined in the running
script cannot go where only an import reaches, and says so in one line; a module or class that breaks the contract
fails in one line too."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

import fedcomp
from fedcomp.conformance import check
from fedcomp.platform import catalog
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError, TaskError, TrialsFailed
from fedcomp.platform.params import Params
from fedcomp.platform.registry import (
    ALGORITHMS,
    DECLARED_ALGORITHMS,
    DECLARED_TASKS,
    TASKS,
    register_algorithm,
    register_task,
)
from fedcomp.platform.state import Model
from fedcomp.sweeps.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "extension.py"
EXAMPLE_YAML = REPO / "examples" / "extension.yaml"
TINY = {"run.rounds": 3, "run.eval_every": 1, "run.progress": "none", "run.track": "none", "federation.clients": 4,
        "federation.clients_per_round": 4, "algorithm.local_steps": 3}
METRICS = ["round", "samples", "train_loss", "distance_to_optimum", "objective_gap"]


def fresh_process(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run by a new Python that has not imported the example (nor has it on its path)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedcomp", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_config_file_names_its_module_beside_it_and_the_config_carries_its_path():
    config = load_config(EXAMPLE_YAML)
    assert (config.task_name, config.algorithm_name) == ("least-squares", "fedavg-hb")
    sections = config.to_dict()
    assert sections["task"]["module"] == sections["algorithm"]["module"] == str(EXAMPLE)
    assert load_config(sections) == config
    assert "module" not in load_config("quickstart").to_dict()["task"]  # fedcomp's own need none


def test_a_process_that_never_imported_the_module_unpickles_the_config(tmp_path):
    pickled = tmp_path / "config.pickle"
    pickled.write_bytes(pickle.dumps(load_config(EXAMPLE_YAML)))
    done = fresh_process(f"""
        import pickle, sys
        assert "extension" not in sys.modules
        config = pickle.loads(open({str(pickled)!r}, "rb").read())
        print(config.task_name, config.algorithm_name, type(config.algorithm).__module__)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["least-squares", "fedavg-hb", "extension"]


def test_a_module_edited_in_a_long_lived_process_is_imported_again_and_run_json_has_the_code_that_ran(tmp_path, capfd):
    """A notebook's user edits their task between two runs: the second runs the edited file (it ran the code first
    imported, while run.json recorded the edited file's digest; Ray's fresh actors ran the edit), and says so once."""
    module = tmp_path / "edited_task.py"
    source = EXAMPLE.read_text().replace('"least-squares"', '"least-squares-edited"').replace('"fedavg-hb"', '"fedavg-hb-edited"')
    module.write_text(source)
    config = {"task": {"name": "least-squares-edited", "module": str(module), "dim": 10, "rows": 200},
              "algorithm": {"name": "fedavg-hb-edited", "module": str(module), "lr": 0.05}}
    over = {**TINY, "federation.backend": "local", "run.out": str(tmp_path / "runs")}
    first = fedcomp.run(config, over)
    assert "imported again" not in capfd.readouterr().err
    module.write_text(source.replace("return 0.5 * (features @ x - targets)", "return 5.0 * (features @ x - targets)"))
    second = fedcomp.run(config, over)
    assert capfd.readouterr().err.count(f"fedcomp: note: {module} changed since this process imported it; imported again") == 1
    assert second.metrics["train_loss"].iloc[1] > 5 * first.metrics["train_loss"].iloc[1]  # the edited loss (was equal)
    recorded = json.loads((second.run_dir / "run.json").read_text())["environment"]["modules"]
    assert recorded == {str(module): hashlib.sha256(module.read_bytes()).hexdigest()[:16]}
    third = fedcomp.run(config, over)
    assert "imported again" not in capfd.readouterr().err  # imported again once
    pd.testing.assert_frame_equal(third.metrics[METRICS], second.metrics[METRICS], check_exact=True)


def test_a_module_the_caller_imported_and_then_edited_is_imported_again_by_a_config_that_names_none(
        tmp_path, capfd, monkeypatch):
    """``import mine`` then ``fedcomp.run`` with no ``module`` key (the name is enough): the edit was not imported
    again, so the local backend ran the old code while run.json recorded the edited file's digest, and a verify in
    a fresh process differed ("environment: same as the original's")."""
    module = tmp_path / "caller_imported.py"
    source = EXAMPLE.read_text().replace('"least-squares"', '"least-squares-caller"').replace('"fedavg-hb"', '"fedavg-hb-caller"')
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "caller_imported", raising=False)
    __import__("caller_imported")
    config = {"task": {"name": "least-squares-caller", "dim": 10, "rows": 200},
              "algorithm": {"name": "fedavg-hb-caller", "lr": 0.05}}
    over = {**TINY, "federation.backend": "local", "run.out": str(tmp_path / "runs")}
    first = fedcomp.run(config, over)
    module.write_text(source.replace("return 0.5 * (features @ x - targets)", "return 5.0 * (features @ x - targets)"))
    capfd.readouterr()
    second = fedcomp.run(config, over)
    assert capfd.readouterr().err.splitlines() == [
        f"fedcomp: note: {module} changed since this process imported it; imported again"]
    assert second.metrics["train_loss"].iloc[1] > 5 * first.metrics["train_loss"].iloc[1]  # the edited loss
    recorded = json.loads((second.run_dir / "run.json").read_text())["environment"]["modules"]
    assert recorded == {str(module): hashlib.sha256(module.read_bytes()).hexdigest()[:16]}


def test_a_neighbour_module_edited_in_a_long_lived_process_is_imported_again_before_the_module(tmp_path, capfd):
    """``mine.py`` takes a constant from ``helper.py`` beside it: an edit of the helper alone went unseen."""
    (tmp_path / "scale_helper.py").write_text("SCALE = 1.0\n")
    module = tmp_path / "scaled_task.py"
    module.write_text(EXAMPLE.read_text()
                      .replace("from __future__ import annotations\n", "from __future__ import annotations\n\nfrom scale_helper import SCALE\n")
                      .replace('"least-squares"', '"least-squares-scaled"').replace('"fedavg-hb"', '"fedavg-hb-scaled"')
                      .replace("return 0.5 * (features @ x - targets)", "return SCALE * 0.5 * (features @ x - targets)"))
    config = {"task": {"name": "least-squares-scaled", "module": str(module), "dim": 10, "rows": 200},
              "algorithm": {"name": "fedavg-hb-scaled", "module": str(module), "lr": 0.05}}
    over = {**TINY, "federation.backend": "local", "run.out": str(tmp_path / "runs")}
    first = fedcomp.run(config, over)
    (tmp_path / "scale_helper.py").write_text("SCALE = 10.0\n")
    capfd.readouterr()
    second = fedcomp.run(config, over)
    assert capfd.readouterr().err.splitlines() == [
        f"fedcomp: note: {tmp_path / 'scale_helper.py'} changed since this process imported it; imported again"]
    assert second.metrics["train_loss"].iloc[1] > 5 * first.metrics["train_loss"].iloc[1]  # the helper's new scale
    recorded = json.loads((second.run_dir / "run.json").read_text())["environment"]["modules"]
    assert recorded == {str(path): hashlib.sha256(path.read_bytes()).hexdigest()[:16]
                        for path in (module, tmp_path / "scale_helper.py")}  # the helper's too: a verify names it


def test_run_json_records_the_users_modules_beside_it_that_it_imports_and_only_those(tmp_path, monkeypatch):
    """Imported at the top, inside a function, from a package beside it (relative too) and through another helper:
    recorded; a module of the user's loaded in the process but not imported by it (a notebook's own helper) is not,
    since a fresh process that verifies the run would not have it."""
    package = tmp_path / "lab"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inner.py").write_text("from . import deep\n")
    (package / "deep.py").write_text("DEPTH = 1\n")
    (tmp_path / "chained.py").write_text("import lab.inner\n")
    (tmp_path / "lazy.py").write_text("LAZY = 2\n")
    (tmp_path / "unrelated.py").write_text("OTHER = 3\n")
    module = tmp_path / "importer.py"
    module.write_text("import chained\n\ndef late():\n    import lazy\n    return lazy.LAZY\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("importer", "chained", "lab", "lab.inner", "lab.deep", "lazy", "unrelated"):
        monkeypatch.delitem(sys.modules, name, raising=False)
        __import__(name)
    found = catalog.imports_beside(str(module))
    assert found == sorted(str(tmp_path / f) for f in ("chained.py", "lab/__init__.py", "lab/inner.py", "lab/deep.py",
                                                         "lazy.py"))
    assert catalog.imports_beside(str(tmp_path / "not-imported.py")) == []


@pytest.mark.ray
def test_its_run_on_ray_actors_has_the_local_backends_numbers_and_converges(ray_session, tmp_path):
    runs = {backend: fedcomp.run(EXAMPLE_YAML, {**TINY, "run.rounds": 8, "federation.backend": backend,
                                                "run.out": str(tmp_path)})
            for backend in ("local", "ray")}
    pd.testing.assert_frame_equal(runs["ray"].metrics[METRICS], runs["local"].metrics[METRICS], check_exact=True)
    distance = runs["local"].metrics["distance_to_optimum"]
    assert distance.iloc[-1] < 0.5 * distance.iloc[0]  # towards the pooled least-squares solution


@pytest.mark.slow
def test_a_sweep_of_it_from_the_cli_prints_no_warning_of_rays_at_its_end(tmp_path):
    """Each trial imported the module -- and with it torch, whose loggers keep the streams they find -- while Tune
    pointed the process's streams at the trial's log files: at exit they flushed closed files, a Ray warning per
    stream and trial ("ValueError when calling 'flush' on stream ...") after the sweep's report."""
    for name in ("extension.py", "extension.yaml"):
        shutil.copy(REPO / "examples" / name, tmp_path / name)
    (tmp_path / "sweep.yaml").write_text(
        "base: extension.yaml\nset: {run.track: none, run.rounds: 2, federation.backend: local}\n"
        "grid: {algorithm.lr: [0.01, 0.03]}\n")
    done = cli("sweep", "sweep.yaml", "--verbose", "0", "--set", f"run.out={tmp_path / 'results'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 trials, 0 failed" in done.stdout
    assert "ValueError when calling" not in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_the_cli_runs_it_then_fresh_processes_verify_and_report_it_and_verify_tells_an_edited_module(tmp_path):
    for name in ("extension.py", "extension.yaml"):
        shutil.copy(REPO / "examples" / name, tmp_path / name)
    out = tmp_path / "results"
    done = cli("run", "extension.yaml", *(f"--set={k}={v}" for k, v in TINY.items()), "--set", f"run.out={out}",
               "--set", "federation.backend=local", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "distance_to_optimum" in done.stdout.splitlines()[0]  # the closing line shows the task's own metrics
    [run_dir] = out.iterdir()
    verified = cli("verify", str(run_dir), "--backend", "local", cwd=REPO)
    assert verified.returncode == 0 and "identical" in verified.stdout, verified.stdout + verified.stderr
    assert "environment: same as the original's" in verified.stdout
    reported = cli("report", str(out), cwd=REPO)
    assert reported.returncode == 0, reported.stderr
    assert "| distance_to_optimum |" in (out / "report.md").read_text()  # its headline, from the module in run.json
    with (tmp_path / "extension.py").open("a") as module:
        module.write("# edited since the run\n")
    edited = cli("verify", str(run_dir), "--backend", "local", cwd=REPO)
    assert f"modules.{tmp_path / 'extension.py'}: " in edited.stdout, edited.stdout


@pytest.mark.slow
def test_verify_and_resume_name_an_edited_helper_the_module_imports(tmp_path):
    """The task takes a constant from ``scale_helper.py`` beside it: after the helper's edit a verify differed
    without saying why, and a resume ran the rounds to come with the new constant."""
    (tmp_path / "scale_helper.py").write_text("SCALE = 1.0\n")
    (tmp_path / "scaled.py").write_text(EXAMPLE.read_text()
        .replace("from __future__ import annotations\n", "from __future__ import annotations\n\nfrom scale_helper import SCALE\n")
        .replace("return 0.5 * (features @ x - targets)", "return SCALE * 0.5 * (features @ x - targets)"))
    (tmp_path / "scaled.yaml").write_text(EXAMPLE_YAML.read_text().replace("extension.py", "scaled.py"))
    done = cli("run", "scaled.yaml", *(f"--set={k}={v}" for k, v in TINY.items()), "--set=run.checkpoint_every=2",
               "--set=federation.backend=local", f"--set=run.out={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [run_dir] = (tmp_path / "out").iterdir()
    (tmp_path / "scale_helper.py").write_text("SCALE = 10.0\n")
    edited = cli("verify", str(run_dir), "--backend", "local", cwd=REPO)
    assert edited.returncode == 1, edited.stdout + edited.stderr
    assert f"modules.{tmp_path / 'scale_helper.py'}: " in edited.stdout, edited.stdout
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))  # as a kill after round 2 leaves it
    refused = cli("run", "--resume", str(run_dir), cwd=tmp_path)
    assert refused.returncode == 2 and f"{tmp_path / 'scale_helper.py'} changed since the run started" in refused.stderr


@pytest.mark.slow
def test_a_run_resumes_only_with_the_module_it_started_with(tmp_path):
    """An edited module would run the rounds still to come with other code, and its new digest would replace the
    record of the one the run started with: the resume is refused in one line until the file is put back (fresh
    processes: this one may have imported the example from elsewhere)."""
    for name in ("extension.py", "extension.yaml"):
        shutil.copy(REPO / "examples" / name, tmp_path / name)
    done = cli("run", "extension.yaml", *(f"--set={k}={v}" for k, v in TINY.items()), "--set=run.checkpoint_every=2",
               "--set=federation.backend=local", f"--set=run.out={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [run_dir] = (tmp_path / "out").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))  # as a kill after round 2 leaves it
    before = (run_dir / "run.json").read_bytes()
    module = tmp_path / "extension.py"
    original = module.read_text()
    module.write_text(original + "# edited since the run started\n")
    refused = cli("run", "--resume", str(run_dir), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert re.fullmatch(rf"fedcomp: error: --resume {re.escape(repr(str(run_dir)))}: {re.escape(str(module))} changed "
                        rf"since the run started \(sha256 [0-9a-f]{{16}} then, [0-9a-f]{{16}} now\), so the rounds "
                        rf"still to run would run other code than the rounds kept; .*\n", refused.stderr), refused.stderr
    assert (run_dir / "run.json").read_bytes() == before  # the record of the code it started with is kept
    module.write_text(original)
    resumed = cli("run", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "run.json").read_text())["environment"]["modules"] == meta["environment"]["modules"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_records_the_module_and_its_trials_import_it(ray_session, tmp_path):
    catalog.import_source(str(EXAMPLE))
    base = load_config(EXAMPLE_YAML).to_dict()
    for section in ("task", "algorithm"):
        del base[section]["module"]  # as a script that imported the module writes its config
    result = fedcomp.sweep({"base": base, "set": {**TINY, "run.out": str(tmp_path)}, "grid": {"algorithm.lr": [0.02, 0.05]},
                            "name": "mine", "max_failures": 0})
    assert result.spec.modules == [str(EXAMPLE)]
    assert set(result.trials["status"]) == {"completed"} and result.trials["trial"].nunique() == 2
    alone = fedcomp.run(EXAMPLE_YAML, {**TINY, "algorithm.lr": 0.05, "federation.backend": "local", "run.out": str(tmp_path)})
    rows = result.trials[result.trials["algorithm.lr"] == 0.05].reset_index(drop=True)
    pd.testing.assert_frame_equal(rows[METRICS], alone.metrics[METRICS], check_dtype=False, check_exact=True)


@pytest.mark.ray
@pytest.mark.slow
def test_a_resumed_sweep_warns_of_a_module_or_helper_edited_since_it_started(ray_session, tmp_path, capfd):
    """A resume is how a sweep continues after its module was fixed (failed trials run again), so it is not refused
    as a run's is; but the trials not yet finished then run other code than the finished ones, and it said nothing."""
    (tmp_path / "sweep_helper.py").write_text("SCALE = 1.0\n")
    module = tmp_path / "swept.py"
    module.write_text(EXAMPLE.read_text()
                      .replace("from __future__ import annotations\n", "from __future__ import annotations\n\nfrom sweep_helper import SCALE\n")
                      .replace('"least-squares"', '"least-squares-swept"').replace('"fedavg-hb"', '"fedavg-hb-swept"'))
    base = {"task": {"name": "least-squares-swept", "module": str(module), "dim": 10, "rows": 200},
            "algorithm": {"name": "fedavg-hb-swept", "module": str(module), "lr": 0.05}}
    result = fedcomp.sweep({"base": base, "set": {**TINY, "federation.backend": "local", "run.out": str(tmp_path)},
                            "grid": {"algorithm.lr": [0.02, 0.05]}})
    recorded = json.loads((result.path / "sweep.json").read_text())["modules"]
    assert set(recorded) == {str(module), str(tmp_path / "sweep_helper.py")}
    (result.path / "trials.parquet").unlink()  # written at the end only: as a sweep killed before its end
    capfd.readouterr()
    fedcomp.resume_sweep(result.path)
    assert "changed since the sweep started" not in capfd.readouterr().err
    (result.path / "trials.parquet").unlink()
    (tmp_path / "sweep_helper.py").write_text("SCALE = 2.0\n")
    fedcomp.resume_sweep(result.path)
    warnings = [line for line in capfd.readouterr().err.splitlines() if "changed since the sweep started" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"fedcomp: warning: {tmp_path / 'sweep_helper.py'} changed "
                                                          f"since the sweep started (sha256 "), warnings


@pytest.fixture
def in_script():
    """The example's task registered again as the running script would register it (its module ``__main__``)."""
    catalog.import_source(str(EXAMPLE))
    register_task("in-script")(type("InScript", (catalog.task_class("least-squares"),), {"__module__": "__main__"}))
    yield "in-script"
    TASKS.pop("in-script"), DECLARED_TASKS.pop("in-script")


def test_a_task_in_the_running_script_runs_locally_and_is_refused_on_ray_and_in_sweeps_in_one_line(in_script, tmp_path):
    overrides = {**TINY, "task.name": in_script, "run.out": str(tmp_path)}
    config = load_config(EXAMPLE_YAML, overrides)
    assert "module" not in config.to_dict()["task"] and config.modules() == [str(EXAMPLE)]  # the algorithm's only
    with pytest.raises(ConfigError, match=r"^task.name = 'in-script' is defined in the script being run"):
        config.in_script("another process")
    assert fedcomp.run(config, {"federation.backend": "local"}).final["round"] == 3
    with pytest.raises(ConfigError, match=r"^task.name = 'in-script' is defined in the script being run \(__main__\), "
                                          r"which Ray's actors cannot import; move it into a module"):
        fedcomp.run(config, {"federation.backend": "ray"})
    with pytest.raises(ConfigError, match=r"^sweep point \{'algorithm.lr': 0.1\}: task.name = 'in-script' is defined in "
                                          r"the script being run \(__main__\), which a sweep's trials, each in a process"):
        load_spec({"base": str(EXAMPLE_YAML), "set": overrides, "grid": {"algorithm.lr": [0.1]}})
    assert len(list(tmp_path.iterdir())) == 1  # the local run's folder only


@pytest.mark.parametrize(("body", "message"), [
    ({"metrics": ("distance", "objective_gap")},
     r"^task 'least-squares-odd' declares metrics distance, objective_gap, but its evaluator does not report distance "
     r"\(it reported distance_to_optimum, objective_gap\)$"),
    ({"loss": None},  # found mid-round before, where the algorithm first called it: an AttributeError's traceback
     r"^task 'least-squares-odd' offers the 'plain' problem kind, but its problem lacks loss \(PlainProblem in "
     r"fedcomp.platform.problems: what algorithm 'fedavg-hb' calls\)$"),
    ({"evaluator": lambda self: (lambda state: None)},
     r"^task 'least-squares-odd''s evaluator returned NoneType 'None', not a dict of its metrics"),
    ({"init_params": lambda self, gen: [torch.zeros(3)]},
     r"^task 'least-squares-odd''s init_params returned list, not a dict of flat tensors with 'x'"),
], ids=["evaluator-lacks-a-declared-metric", "problem-lacks-a-method-of-its-kind", "evaluator-returns-none",
        "init-params-returns-a-list"])
def test_a_task_that_does_not_do_what_it_declares_fails_in_one_line_and_leaves_no_run(tmp_path, body, message):
    catalog.import_source(str(EXAMPLE))
    register_task("least-squares-odd")(type("Odd", (catalog.task_class("least-squares"),), {**body, "__module__": __name__}))
    try:
        with pytest.raises(TaskError, match=message):
            fedcomp.run(EXAMPLE_YAML, {**TINY, "task.name": "least-squares-odd", "federation.backend": "local",
                                       "run.out": str(tmp_path)})
        assert not any(p.is_dir() for p in tmp_path.iterdir())
    finally:
        TASKS.pop("least-squares-odd"), DECLARED_TASKS.pop("least-squares-odd")


def test_a_class_that_cannot_be_declared_is_refused_at_registration_in_one_line():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class PlainHParams:
        lr: float = 0.1

    with pytest.raises(TypeError, match=r"^Bad.HParams = .*: must be a subclass of fedcomp.platform.params.Params"):
        register_algorithm("bad")(type("Bad", (), {"HParams": PlainHParams, "kind": "plain"}))
    for attributes, message in (({"kinds": "plain"}, r"Bad.kinds = 'plain': must be the problem kinds"),
                                ({"kinds": {"plain"}, "metrics": ()}, r"Bad.metrics = \(\): must be the metrics"),
                                ({"kinds": {"plain"}, "metrics": {"m"}}, r"Bad.metrics = \{'m'\}: must be the metrics"),
                                ({"kinds": {"plain"}, "metrics": ("m",), "mode": "up"}, r"Bad.mode = 'up': must be")):
        with pytest.raises(TypeError, match=message):
            register_task("bad")(type("Bad", (), {"Params": Params, **attributes}))
    with pytest.raises(TypeError, match=r"^Bad.kind: 'compositionl' is not a problem kind; did you mean 'compositional'\? "
                                        r"\(fedcomp's: plain, conditional, "):
        register_algorithm("bad")(type("Bad", (), {"HParams": Params, "kind": "compositionl"}))
    with pytest.raises(TypeError, match=r"^Bad.kinds: 'bilevl' is not a problem kind; did you mean 'bilevel'\?"):
        register_task("bad")(type("Bad", (), {"Params": Params, "kinds": ("plain", "bilevl"), "metrics": ("m",)}))
    assert "bad" not in TASKS and "bad" not in catalog.algorithms()
    with pytest.raises(TypeError, match=r"^Bad.Client = <class 'dict'>: must be a subclass of fedcomp.platform.state.State"):
        register_algorithm("bad")(type("Bad", (), {"HParams": Params, "kind": "plain", "Client": dict}))
    class Undecorated(Model):  # fields declared without @dataclass(frozen=True): Model's __init__ takes x only
        x: torch.Tensor
        u: torch.Tensor

    with pytest.raises(TypeError, match=r"^Bad.Client = <class '.*Undecorated'>: must be a subclass of "
                                        r"fedcomp.platform.state.State declared with @dataclass\(frozen=True\)"):
        register_algorithm("bad")(type("Bad", (), {"HParams": Params, "kind": "plain", "Client": Undecorated,
                                                   "Server": Model}))
    with pytest.raises(TypeError, match=r"^Bad.round_local = frozenset\(\{'velocity'\}\): must be a set of the Client "
                                        r"record's fields \(x\)$"):  # a field the record lacks was not begun, silently
        register_algorithm("bad")(type("Bad", (), {"HParams": Params, "kind": "plain", "Client": Model, "Server": Model,
                                                   "round_local": frozenset({"velocity"})}))
    register_algorithm("kind-of-my-own")(type("Mine", (), {"HParams": Params, "kind": "graph-signal", "Client": Model,
                                                           "Server": Model}))  # a kind far from fedcomp's
    assert ALGORITHMS.pop("kind-of-my-own") and DECLARED_ALGORITHMS.pop("kind-of-my-own").kind == "graph-signal"


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("no_such_module_anywhere", r"^algorithm.module = 'no_such_module_anywhere': cannot be imported: "
                                    r"ModuleNotFoundError: No module named 'no_such_module_anywhere'$"),
        ("missing.py", r"^algorithm.module = '.*missing.py': cannot be imported: ImportError: no such file '.*missing.py', "
                       r"nor a module 'missing' of that file's name on the path$"),
        ("broken.py", r"^algorithm.module = '.*broken.py': cannot be imported: ZeroDivisionError: division by zero$"),
        (3, r"^algorithm.module = 3: must be a module's dotted name or a .py file's path$"),
    ],
)
def test_a_module_that_cannot_be_imported_is_one_line(tmp_path, module, message):
    (tmp_path / "broken.py").write_text("1 / 0\n")
    (tmp_path / "run.yaml").write_text(f"algorithm: {{name: fedavg-hb, module: {module}}}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "run.yaml")


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_whose_every_trial_fails_says_why_in_one_line_and_keeps_its_folder(ray_session, tmp_path):
    (tmp_path / "misreported.py").write_text(textwrap.dedent(f"""
        from fedcomp.platform import catalog
        from fedcomp.platform.registry import register_task

        catalog.import_source({str(EXAMPLE)!r})


        @register_task("least-squares-misreported")
        class Misreported(catalog.task_class("least-squares")):
            metrics = ("distance", "objective_gap")
    """))
    overrides = {**TINY, "task.module": str(tmp_path / "misreported.py"), "task.name": "least-squares-misreported",
                 "run.out": str(tmp_path / "out")}
    with pytest.raises(TrialsFailed, match=r"^every trial of the sweep failed \(2\); the first: task "
                                           r"'least-squares-misreported' declares metrics distance, objective_gap, but its "
                                           r"evaluator does not report distance .*; once it is fixed, continue with: "
                                           r"fedcomp.resume_sweep\('.*'\) \(a module or data files mended; a setting of "
                                           r"the sweep's own is changed by running the sweep again\)$"):
        fedcomp.sweep({"base": str(EXAMPLE_YAML), "set": overrides, "grid": {"algorithm.lr": [0.02, 0.05]},
                       "max_failures": 0, "name": "failing"})
    [folder] = (tmp_path / "out").iterdir()
    trials = pd.read_parquet(folder / "trials.parquet")
    assert set(trials["status"]) == {"error"} and trials["trial"].nunique() == 2


BUGGY = """
from fedcomp.platform import catalog
from fedcomp.platform.registry import register_algorithm


@register_algorithm("fedavg-mended")
class Mended(catalog.algorithm_class("fedavg")):
    def update(self, problem, state, batch, step):
        {body}
"""


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_whose_first_trials_fail_alike_stops_and_its_resume_after_the_fix_runs_them_all(ray_session, tmp_path):
    """Four configurations of an algorithm module with a bug: every trial would fail alike, each after starting its
    process; the sweep stops after the first three, one line saying so, with the error's whole line (350
    characters: a data root's is as long; it was cut at 300, mid-word). Mended, the module's resume runs all four
    (the failed ones again, the fourth for the first time), still one at a time (``max_concurrent: 1``; Tune
    started the three failed ones at once, two on 2 CPUs): no trial's steps (36 of 50 ms each) begin before the last
    one's end."""
    module = tmp_path / "mended.py"
    module.write_text(BUGGY.format(body='raise ValueError("a bug in update " + "and more " * 35 + "to its end")'))
    overrides = {**TINY, "algorithm.module": str(module), "algorithm.name": "fedavg-mended",
                 "run.out": str(tmp_path / "out")}
    spec = {"base": "quickstart", "set": overrides, "grid": {"algorithm.lr": [0.01, 0.02, 0.03, 0.04]},
            "max_failures": 0, "max_concurrent": 1, "name": "alike"}
    with pytest.raises(TrialsFailed, match=r"^the first 3 trials of the sweep failed alike: ValueError: a bug in "
                                           r"update (and more ){35}to its end; it stopped there, the others not run \(each would meet it too\); "
                                           r"once it is fixed, continue with: fedcomp.resume_sweep\('.*'\)"):
        fedcomp.sweep(spec)
    [folder] = (tmp_path / "out").iterdir()
    assert not (folder / "trials.parquet").exists()
    steps = tmp_path / "steps.txt"
    module.write_text(BUGGY.format(body=f"print(self.hp.lr, __import__('time').time(), file=open({str(steps)!r}, 'a')); "
                                        "__import__('time').sleep(0.05); return super().update(problem, state, batch, step)"))
    trials = fedcomp.resume_sweep(folder).trials
    assert set(trials["status"]) == {"completed"} and trials["trial"].nunique() == 4
    times = pd.DataFrame([line.split() for line in steps.read_text().splitlines()], columns=["lr", "t"]).astype(float)
    spans = times.groupby("lr")["t"].agg(["min", "max"]).sort_values("min")
    assert len(spans) == 4 and (spans["min"].iloc[1:].to_numpy() > spans["max"].iloc[:-1].to_numpy()).all(), spans


@pytest.mark.ray
@pytest.mark.slow
def test_fedcomp_check_finds_the_example_conformant_on_every_backend_packing_and_resume(keeping):
    outcome = check(EXAMPLE_YAML, {**TINY, "run.rounds": 6, "run.eval_every": 2})
    assert [c.what for c in outcome.checks] == [
        "the same seed again, local backend", "ray (2 client actors, clients_per_actor=2), packed as configured",
        "ray (4 client actors, clients_per_actor=1), packed otherwise", "stopped at round 2 and resumed from its checkpoint",
    ]
    assert outcome.identical and outcome.skipped == [] and outcome.rows == 4
    assert outcome.report().splitlines()[-1].startswith("all 4 identical")


def test_fedcomp_check_tells_an_algorithm_that_draws_outside_its_generator(capfd):
    """Noise from torch's global generator, not the one ``draw`` is given: the same seed gives other numbers. Each
    run of the check says it starts (a check printed nothing for minutes)."""
    catalog.import_source(str(EXAMPLE))
    parent = catalog.algorithm_class("fedavg-hb")

    def update(self, problem, state, batch, step):  # type: ignore[no-untyped-def]
        new, loss = parent.update(self, problem, state, batch, step)
        return new.replace(x=new.x + 1e-3 * torch.randn_like(new.x)), loss

    register_algorithm("fedavg-hb-noisy")(type("Noisy", (parent,), {"update": update, "__module__": __name__}))
    try:
        outcome = check(EXAMPLE_YAML, {**TINY, "algorithm.name": "fedavg-hb-noisy", "run.rounds": 4,
                                       "run.eval_every": 2}, ray=False)
    finally:
        ALGORITHMS.pop("fedavg-hb-noisy"), DECLARED_ALGORITHMS.pop("fedavg-hb-noisy")
    same_seed, resumed = outcome.checks
    assert not same_seed.identical and "distance_to_optimum" in [d.column for d in same_seed.differences]
    assert same_seed.line().startswith("  DIFFERENT  the same seed again, local backend: ")
    assert same_seed.line().splitlines()[1] == ("             usually: a draw not from the generator `draw` (or a client "
                                                "program's ctx.rng) is given -- torch.randn or random.random without "
                                                "it, a set iterated in hash order")
    assert outcome.skipped == ["the Ray runs (ray=False, --no-ray)"]
    assert outcome.report().splitlines()[-1].startswith("2 of 2 DIFFERENT")
    said = [line.split(" ... (")[0] for line in capfd.readouterr().err.splitlines()]
    assert said == [f"fedcomp: check: {what}" for what in ("the run, local backend", "the same seed again, local backend",
                                                           "stopped at round 2", "resumed from its checkpoint")]


def test_a_module_file_not_at_its_path_is_imported_by_name_where_that_is_on_the_path(tmp_path, monkeypatch):
    """As on another node of a cluster, where a job's working directory is unpacked elsewhere and on the path."""
    import sys

    (tmp_path / "elsewhere_mine.py").write_text("import sys\nsys.elsewhere_mine_runs = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        catalog.import_source("/no/such/folder/elsewhere_mine.py")
        assert sys.elsewhere_mine_runs == 1  # type: ignore[attr-defined]
    finally:
        sys.modules.pop("elsewhere_mine", None)
        del sys.elsewhere_mine_runs  # type: ignore[attr-defined]


def test_a_package_registering_in_its_init_is_imported_once_by_its_own_name(tmp_path, monkeypatch):
    """``source_of`` writes a package's ``__init__.py``: a fresh process imports the package (not ``pkg.__init__``,
    which ran the file a second time and registered its classes twice); a missing ``json.py`` does not import the
    standard library's ``json``."""
    import sys

    package = tmp_path / "pkg_once"
    package.mkdir()
    (package / "__init__.py").write_text("import sys\nsys.pkg_once_runs = getattr(sys, 'pkg_once_runs', 0) + 1\n")
    try:
        catalog.import_source(str(package / "__init__.py"))
        catalog.import_source(str(package / "__init__.py"))
        assert sys.pkg_once_runs == 1 and "pkg_once" in sys.modules and "pkg_once.__init__" not in sys.modules  # type: ignore[attr-defined]
    finally:
        sys.modules.pop("pkg_once", None)
        del sys.pkg_once_runs  # type: ignore[attr-defined]
    with pytest.raises(ImportError, match=r"no such file '/no/such/json.py', nor a module 'json' of that file's name"):
        catalog.import_source("/no/such/json.py")


def test_a_module_file_in_a_package_not_at_its_path_is_imported_by_its_package_name(tmp_path, monkeypatch):
    """``/elsewhere/lab/pkg_far/mod_far.py`` missing, ``pkg_far`` shipped to this node (on the path): imported as
    ``pkg_far.mod_far``, the name its classes pickle by, not as a top-level ``mod_far``; a module of that name whose
    file has another tail does not stand in for it."""
    import sys

    package = tmp_path / "pkg_far"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod_far.py").write_text("import sys\nsys.mod_far_runs = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        catalog.import_source("/elsewhere/lab/pkg_far/mod_far.py")
        assert sys.mod_far_runs == 1 and "pkg_far.mod_far" in sys.modules and "mod_far" not in sys.modules  # type: ignore[attr-defined]
        with pytest.raises(ImportError, match=r"nor a module 'mod_far' of that file's name on the path"):
            catalog.import_source("/elsewhere/lab/other_pkg/mod_far.py")
    finally:
        for name in ("pkg_far", "pkg_far.mod_far"):
            sys.modules.pop(name, None)
        del sys.mod_far_runs  # type: ignore[attr-defined]


def test_the_files_that_carry_a_users_modules_to_other_nodes(tmp_path, monkeypatch):
    """A lone file itself; a file in packages: the top package's folder; a dotted name: its top package's folder or
    its file; fedcomp's own and installed packages, and a file not there: nothing."""
    lone = tmp_path / "lone_mod.py"
    lone.write_text("")
    top = tmp_path / "lab_top"
    (top / "inner").mkdir(parents=True)
    for init in (top / "__init__.py", top / "inner" / "__init__.py"):
        init.write_text("")
    (top / "inner" / "algo.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    sources = [str(lone), str(top / "inner" / "algo.py"), str(top / "__init__.py"), "lab_top.inner.algo", "lone_mod",
               "yaml", str(tmp_path / "missing.py")]
    assert catalog.carriers(sources) == [str(lone), str(top)]


@pytest.mark.ray
@pytest.mark.parametrize("server", ["replicated", "actor"])
def test_a_module_the_actors_cannot_import_is_one_line_naming_the_node(tmp_path, server):
    """A user's module that imports a package installed where the driver runs but not on the cluster's nodes: the
    actors load the config themselves and say why in one line (was: Ray's unpickling traceback per attempt, then
    "an actor died while starting")."""
    body = EXAMPLE.read_text()
    (tmp_path / "nodeless.py").write_text(
        body + "\nimport ray._private.worker as _worker\n"
        "if _worker.global_worker.mode == _worker.WORKER_MODE:  # a Ray actor, not the driver\n"
        "    import a_package_the_nodes_lack  # noqa: F401\n")
    (tmp_path / "nodeless.yaml").write_text(EXAMPLE_YAML.read_text().replace("extension.py", "nodeless.py"))
    done = cli("run", "nodeless.yaml", "--set", "run.rounds=2", "--set", "run.progress=none", "--set",
               f"federation.server={server}", "--set", "federation.clients=4", "--set", "run.out=out", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"fedcomp: error: task.module = '{tmp_path / 'nodeless.py'}': cannot be imported: "
                           "ModuleNotFoundError: No module named 'a_package_the_nodes_lack' (on the node at "), line
    assert not (tmp_path / "out").exists()
