"""The command line as a user runs it: run, list, report, python -m fedcomp, bad input, kill and resume."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import fedcomp
from fedcomp.cli import main
from fedcomp.platform.results import read_checkpoint
from fedcomp.platform.server import Server

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FAST = ["--set", "federation.backend=local", "--set", "federation.clients=4", "--set", "algorithm.local_steps=5",
        "--set", "task.test_samples=2000", "--set", "run.rounds=3", "--set", "run.progress=none"]


def test_run_and_report(tmp_path, capsys):
    assert main(["run", "quickstart", *FAST, "--set", f"run.out={tmp_path}"]) == 0
    assert main(["run", "quickstart", *FAST, "--set", f"run.out={tmp_path}", "--set", "algorithm.name=fcsg"]) == 0
    assert main(["run", "quickstart", *FAST, "--set", f"run.out={tmp_path}", "--set", "algorithm.lr=0.05"]) == 0
    out = capsys.readouterr().out
    assert out.count("results: ") == 3
    (tmp_path / "a-sweep").mkdir()
    (tmp_path / "a-sweep" / "sweep.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "| fcsg-m |" in text and "| fcsg |" in text
    # the settings that tell apart runs of one algorithm and task, between the seed and the status (run.json's)
    assert "| seed | algorithm.lr | status | rounds |" in text, text
    assert text.count("| 0 | 0.01 | completed | 3 |") == 2 and "| 0 | 0.05 | completed | 3 |" in text
    assert captured.err == (f"fedcomp: 1 sweep folder under {tmp_path} not in this report, each reported on its own: "
                            f"fedcomp report {tmp_path / 'a-sweep'}\n")
    shutil.rmtree(tmp_path / "a-sweep")
    assert (tmp_path / "report.png").stat().st_size > 1000
    assert (tmp_path / "report.md").is_file()

    # one damaged run under the root is left out, with a warning, not the whole report
    run = next(p for p in tmp_path.iterdir() if (p / "run.json").is_file())
    for name, damaged in (("zz-metrics", "metrics.parquet"), ("zz-json", "run.json")):
        shutil.copytree(run, tmp_path / name)
        data = (tmp_path / name / damaged).read_bytes()
        (tmp_path / name / damaged).write_bytes(data[: len(data) // 2])
    assert main(["report", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 2 and all(line.startswith("fedcomp: warning: run zz-") for line in warnings)
    assert "zz-json left out of the report: " in warnings[0] and "run.json cannot be read" in warnings[0]
    assert "metrics.parquet cannot be read (truncated or corrupt" in warnings[1]
    assert captured.out.count("| completed |") == 3 and "Runs left out, their files unreadable:" in captured.out
    assert "- zz-metrics: " in (tmp_path / "report.md").read_text()


def test_a_run_without_a_checkpoint_runs_again_from_its_run_json_as_its_resume_says(tmp_path, capsys):
    """The resume's advice, "run its config again (run.json holds it)", had no command: `fedcomp run .../run.json`
    said "section 'backend' is unknown". It is the command now, and it runs that config: the same numbers."""
    assert main(["run", "quickstart", *FAST, "--set", f"run.out={tmp_path / 'first'}"]) == 0
    (run_dir,) = (tmp_path / "first").iterdir()
    (run_dir / "checkpoint.pt").unlink()
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 2
    advice = capsys.readouterr().err.strip().split("run its config again: ")[1]
    assert advice == f"fedcomp run {run_dir / 'run.json'}"
    assert main([*shlex.split(advice)[1:], "--set", f"run.out={tmp_path / 'again'}"]) == 0
    (again,) = (tmp_path / "again").iterdir()
    pd.testing.assert_frame_equal(pd.read_parquet(again / "metrics.parquet").drop(columns="wall_time"),
                                  pd.read_parquet(run_dir / "metrics.parquet").drop(columns="wall_time"))
    assert fedcomp.run(str(run_dir / "run.json"), {"run.out": str(tmp_path / "py")}).config.to_dict()["algorithm"] == (
        json.loads((run_dir / "run.json").read_text())["config"]["algorithm"])


def test_report_of_unknown_metric_is_one_line(tmp_path, capsys):
    main(["run", "quickstart", *FAST, "--set", f"run.out={tmp_path}"])
    capsys.readouterr()
    assert main(["report", str(tmp_path), "--metric", "auroc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "column 'auroc' is not in these results; allowed:" in err[0]
    assert main(["report", str(tmp_path / "nothing")]) == 2


def test_report_from_python_writes_what_the_command_writes(tmp_path, capsys):
    """A notebook's user had no ``fedcomp.report``: only the command line wrote a report."""
    main(["run", "quickstart", *FAST, "--set", f"run.out={tmp_path}"])
    png, md = fedcomp.report(tmp_path, out=tmp_path / "api")
    assert (png, md) == (tmp_path / "api" / "report.png", tmp_path / "api" / "report.md") and png.stat().st_size > 1000
    assert main(["report", str(tmp_path)]) == 0
    assert md.read_text() == (tmp_path / "report.md").read_text()
    with pytest.raises(fedcomp.ConfigError, match=r"^column 'auroc' is not in these results; allowed:"):
        fedcomp.report(tmp_path, metric="auroc")
    with pytest.raises(fedcomp.NoResults):
        fedcomp.report(tmp_path / "nothing")
    with pytest.raises(fedcomp.ConfigError, match=r"^results_dir = 3: must be a results or sweep folder's path"):
        fedcomp.report(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "nope"], "preset 'nope' is unknown"),
        (["run", "quickstart", "--set", "algorithm.lr=-1"], "algorithm.lr = -1: Input should be greater than 0"),
        (["run", "quickstart", "--set", "algorithm.beta=2"], "algorithm.beta = 2: Input should be less than or equal to 1"),
        (["run", "quickstart", "--set", "algorithm.inner_batch=0"], "algorithm.inner_batch = 0"),
        (["run", "quickstart", "--set", "federation.clients_per_round=20"], "federation.clients_per_round = 20: must be <="),
        (["run", "quickstart", "--set", "algorithm.name=adam"], "algorithm.name = 'adam' is unknown"),
        (["run", "quickstart", "--set", "task.name=imagenet"], "task.name = 'imagenet' is unknown"),
        (["run", "quickstart", "--set", "task.dimension=3"], "task.dimension: unknown key"),
        (["run", "quickstart", "--set", "run.rounds=many"], "run.rounds = 'many': Input should be a valid integer"),
        (["run", "quickstart", "--set", "lr=0.1"], "override 'lr' is not of the form section.key"),
        (["run", "quickstart", "--set", "algorithm.lr"], "expected section.key=value"),
        (["run", "--resume", "/nonexistent/run"], "not a fedcomp run folder"),
        (["run", "quickstart", "--resume", "x"], "--resume RUN_DIR continues a run with its stored config; drop the preset"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, args, needle):
    code = main([*args, "--set", f"run.out={tmp_path}"] if "--resume" not in args else args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("fedcomp: error: ") and needle in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_incompatible_task_and_algorithm(tmp_path, capsys):
    code = main(["run", "quickstart", "--set", "task.name=synthetic-classification", "--set", f"run.out={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and "needs a 'conditional' problem but task 'synthetic-classification' offers plain" in err
    assert list(tmp_path.iterdir()) == []


def test_python_dash_m_and_list():
    out = subprocess.run([sys.executable, "-m", "fedcomp", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for name in ("fcsg", "fcsg-m", "acc-fcsg-m", "fedavg", "invariant-logreg", "quickstart"):
        assert f"  {name} " in out.stdout


def test_list_a_name_shows_its_parameters_and_a_users_module_its_own(capsys):
    assert main(["list", "fcsg-m"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("algorithm fcsg-m [conditional]: FCSG-M") and out[1] == "  hyperparameters (algorithm.KEY):"
    assert [line.split()[:4] for line in out if line.split()[0] == "beta"] == [["beta", "float", "in", "(0,"]]
    assert "default 0.1  momentum weight" in next(line for line in out if line.split()[0] == "beta")
    assert main(["list", "invariant-logreg"]) == 0
    out = capsys.readouterr().out
    assert "metrics: test_accuracy, test_loss (headline test_accuracy, better max)" in out
    assert "objective              'paper' | 'official-code'" in out
    assert main(["list", "federation"]) == 0
    assert "clients_per_actor      int | 'auto'" in capsys.readouterr().out
    assert main(["list", "--module", str(EXAMPLES / "extension.py"), "fedavg-hb"]) == 0
    assert "momentum               float in [0, 1)              default 0.9" in capsys.readouterr().out
    assert main(["list", "--module", str(EXAMPLES / "extension.py")]) == 0
    assert "  fedavg-hb " in capsys.readouterr().out  # a user's own among fedcomp's


@pytest.mark.ray
def test_the_command_line_ends_its_ray_session_itself_and_a_callers_main_leaves_it_up(tmp_path):
    """Not Ray's exit hook, which first sleeps half a second for late worker output (a command's actors have ended
    by then); ``main(argv)`` from a caller's own process leaves the caller's Ray alone."""
    code = ("import sys, ray; from fedcomp.cli import main; "
            "ray.init(address='local', num_cpus=1, include_dashboard=False); "
            "print('after main(argv):', main(['list']) == 0 and ray.is_initialized()); "
            "sys.argv = ['fedcomp', 'list']; "
            "print('after the command line:', main() == 0 and ray.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "RAY_ADDRESS": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    said = [line for line in out.stdout.splitlines() if line.startswith("after ")]
    assert said == ["after main(argv): True", "after the command line: False"]


@pytest.mark.slow
def test_process_killed_between_rounds_resumes_to_the_same_numbers(tmp_path):
    over = ["--set", "federation.backend=local", "--set", "run.rounds=12", "--set", "run.checkpoint_every=3",
            "--set", "run.eval_every=1", "--set", "run.progress=none", "--set", "task.test_samples=5000"]
    killed_root, ref_root = tmp_path / "killed", tmp_path / "ref"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fedcomp", "run", "quickstart", *over, "--set", f"run.out={killed_root}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list(killed_root.glob("*/checkpoint.pt")):
            time.sleep(0.05)
        time.sleep(0.3)  # let it get into the round after the first checkpoint (a round takes about 0.4 s here)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (run_dir,) = killed_root.iterdir()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"  # it really was cut short
    done = pd.read_parquet(run_dir / "metrics.parquet")["round"].max()
    assert 0 < done < 12

    assert main(["run", "--resume", str(run_dir)]) == 0
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    reference = fedcomp.run("quickstart", {**dict(s.split("=", 1) for s in over[1::2]), "run.out": str(ref_root)})
    pd.testing.assert_frame_equal(
        fedcomp.load_results(run_dir).drop(columns=["wall_time", "run_id"]),
        fedcomp.load_results(reference.run_dir).drop(columns=["wall_time", "run_id"]),
        check_dtype=False,
    )


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before it runs Python: SIGINT's default disposition, as a terminal's foreground job has it. A
    suite started in the background by a non-interactive shell (``make test &``) hands its processes SIGINT
    ignored, and Python then keeps ignoring it: the run would end all its rounds and exit 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_mid_run_says_which_round_is_checkpointed_and_how_to_continue(tmp_path, stop):
    """Ctrl-C, and SIGTERM (a job scheduler's, ``ray job stop``'s) alike. The command it prints runs as printed,
    pasted into a shell, where the run's folder has a space in its path."""
    out = tmp_path / "my results"
    over = ["--set", "federation.backend=local", "--set", "run.rounds=20", "--set", "run.checkpoint_every=2",
            "--set", "run.progress=none", "--set", "task.test_samples=2000", "--set", f"run.out={out}"]
    proc = subprocess.Popen([sys.executable, "-m", "fedcomp", "run", "quickstart", *over],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list(out.glob("*/checkpoint.pt")):
            time.sleep(0.05)
        time.sleep(0.3)  # into the rounds after the first checkpoint
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    (run_dir,) = out.iterdir()
    saved = read_checkpoint(run_dir / "checkpoint.pt")["server"]["counters"]["round"]
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [
        f"fedcomp: interrupted: round {saved} is checkpointed; continue the run with: fedcomp run --resume '{run_dir}'"]
    assert 0 < saved < 20 and json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    printed = shlex.split(err.split("continue the run with: ")[1])
    assert printed[0] == "fedcomp" and main(printed[1:]) == 0  # the command it printed, as a shell splits it
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"


def test_ctrl_c_before_the_first_checkpoint_keeps_nothing_and_says_so(tmp_path, capsys, monkeypatch):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Server, "run_round", interrupted)
    assert main(["run", "quickstart", *FAST, "--set", f"run.out={tmp_path}"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["fedcomp: interrupted: nothing was kept (no checkpoint yet)"]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(fedcomp.Interrupted, match="nothing was kept") as stopped:  # the API raises it (a KeyboardInterrupt)
        fedcomp.run("quickstart", {**dict(s.split("=", 1) for s in FAST[1::2]), "run.out": str(tmp_path)})
    assert stopped.value.path is None  # no folder to continue


def test_gpu_request_on_the_local_backend_without_cuda(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = main(["run", "quickstart", *FAST, "--set", "federation.gpus_per_client=1", "--set", f"run.out={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "federation.gpus_per_client = 1 but this machine has no CUDA GPU for the local backend" in err[0]
    assert list(tmp_path.iterdir()) == []


SWEEP = {"base": "quickstart", "grid": {"algorithm.lr": [0.1, 0.05]}, "max_concurrent": 1,
         "set": {"federation.backend": "local", "federation.clients": 4, "algorithm.local_steps": 5,
                 "task.test_samples": 2000, "run.rounds": 3, "run.eval_every": 1}}


@pytest.mark.slow
@pytest.mark.ray
def test_sweep_and_its_report(ray_session, tmp_path, capsys):
    import yaml

    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--seeds", "2", "--verbose", "0", "--set", f"run.out={out}"]) == 0
    text = capsys.readouterr().out
    assert "### Best configuration per algorithm" in text and "sweep tiny_" in text and "4 trials, 0 failed" in text
    [sweep_dir] = out.iterdir()
    assert {"trials.parquet", "sweep.json", "report.png", "report.md"} <= {p.name for p in sweep_dir.iterdir()}
    assert main(["report", str(sweep_dir), "--metric", "test_loss", "--out", str(tmp_path / "rep")]) == 0
    assert "Final test_loss" in capsys.readouterr().out and (tmp_path / "rep" / "report.png").is_file()
    png, md = fedcomp.report(sweep_dir, metric="test_loss", out=tmp_path / "api")  # the same from Python
    assert md.read_text() == (tmp_path / "rep" / "report.md").read_text() and png.is_file()
    assert repr(fedcomp.load_sweep(sweep_dir)) == f"SweepResult({sweep_dir.name}: 4 trials, 0 failed, path={str(sweep_dir)!r})"


def test_a_run_result_shows_in_one_line(tmp_path):
    """Its repr was the whole config and metrics table (1.4 kB) in a notebook."""
    result = fedcomp.run("quickstart", {"federation.backend": "local", "federation.clients": 4, "run.rounds": 2,
                                        "run.progress": "none", "run.track": "none", "run.out": str(tmp_path)})
    accuracy = result.final["test_accuracy"]
    assert repr(result) == (f"RunResult(fcsg-m on invariant-logreg, round 2 of 2, test_accuracy={accuracy:.4g}, "
                            f"run_dir={str(result.run_dir)!r})")


@pytest.mark.ray
@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", "nosuch"], "sweep 'nosuch' is unknown; allowed:"),
        (["sweep", "quick", "--num-samples", "-1"], "--num-samples = -1: must be >= 1"),
        (["sweep", "quick", "--seeds", "0"], "--seeds = 0: must be >= 1"),
        (["sweep", "quick", "--search", "optuna"], "search = 'optuna' cannot take grid axes (algorithm.name, algorithm.lr, algorithm.beta)"),
        (["sweep", "quick", "--set", "algorithm.lr=-1"], "algorithm.lr = -1:"),
        (["sweep", "quick", "--set", "federation.gpus_per_client=1"], "GPU=4"),
        (["sweep", "--resume", "NOT_A_SWEEP"], "no sweep.json there; not a fedcomp sweep folder"),
        (["sweep", "quick", "--resume", "x"], "--resume SWEEP_DIR continues a sweep with its stored spec"),
    ],
)
def test_bad_sweep_input_is_one_line_and_writes_nothing(ray_session, tmp_path, capsys, argv, message):
    argv = [a.replace("NOT_A_SWEEP", str(tmp_path)) for a in argv]
    out = tmp_path / "out"
    assert main([*argv, "--set", f"run.out={out}"] if "--resume" not in argv else argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()
