"""``benchmarks/peers.py``, the side-by-side benchmark against pfl and Flower: the harness's own logic (the
peers themselves are never installed by the tests)."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import peers
import pytest
import torch

from fedcomp import bench

SMALL = peers.Workload("small", clients=20, rounds=3, cohort=4, local_steps=2)


def exit_code(argv: list[str]) -> int:
    """The harness's exit code for ``argv``, argparse's refusals (SystemExit) included."""
    try:
        return peers.main(argv)
    except SystemExit as stop:
        return int(stop.code)


def test_workload_data_is_seeded_and_is_what_fedcomp_trains_on():
    a, b = peers.workload_arrays(SMALL), peers.workload_arrays(SMALL)
    assert set(a) == {"init", "cohorts", "features", "labels"}
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert a["features"].shape == (3, 4, 2 * bench.BATCH, bench.FEATURES) and a["features"].dtype == np.float32
    assert all(len(set(row)) == 4 for row in a["cohorts"].tolist())
    other = peers.workload_arrays(peers.Workload("small", clients=40, rounds=3, cohort=4, local_steps=2))
    assert not np.array_equal(a["cohorts"], other["cohorts"])

    # FedAvg on the written arrays gives the plain loop's (and so fedcomp's) final weights bit for bit
    from fedcomp.platform.federation import build_task

    config = SMALL.config()
    task = build_task(config)
    x = torch.from_numpy(a["init"].copy())
    for r in range(SMALL.rounds):
        total = torch.zeros(x.numel(), dtype=torch.float64)
        for j in range(a["cohorts"].shape[1]):
            xc = x.clone()
            for s in range(SMALL.local_steps):
                rows = slice(s * bench.BATCH, (s + 1) * bench.BATCH)
                batch = (torch.from_numpy(a["features"][r, j, rows]), torch.from_numpy(a["labels"][r, j, rows]))
                xg = xc.detach().requires_grad_(True)
                (grad,) = torch.autograd.grad(task.loss(xg, batch), xg)
                xc = torch.add(xc, grad, alpha=-bench.LR)  # the fused step fedcomp and torch.optim take
            total += xc.double()
        x = (total / a["cohorts"].shape[1]).float()
    assert bench.weights_hash(x) == bench.weights_hash(bench.run_plain(config, 0).final)


def fake_run(runner, workload, workers, repeat, round_ms, final, startup=1.0, peak_mib=0):
    """A timed run, or with ``peak_mib`` a memory run."""
    return peers.PeerRun(runner, workload, workers, repeat, startup, [round_ms / 1e3] * workload.rounds,
                         peak_mib * 2**20, np.asarray(final, dtype=np.float32), {runner: "1.0"},
                         {1: (f"{runner}-main", peak_mib * 2**20)} if peak_mib else {}, sampled=bool(peak_mib))


def test_peer_table_takes_medians_and_compares_with_the_plain_loop():
    w = peers.Workload("small", clients=100, rounds=4)
    ref = [0.5, -0.25]
    runs = [fake_run("plain", w, 1, i, ms, ref) for i, ms in enumerate((10, 12, 11))]
    runs += [fake_run("ray", w, 2, i, ms, ref, startup=s) for i, (ms, s) in enumerate(((30, 4.0), (20, 5.0), (25, 6.0)))]
    # the memory run's times stay out of the table; only its memory is in it
    runs += [fake_run("ray", w, 2, 3, 1000, ref, startup=60.0, peak_mib=1000)]
    runs += [fake_run("flower", w, 2, i, 500, [0.5, -0.25 + 1e-7]) for i in range(3)]
    runs += [fake_run("pfl", w, 2, i, 20, [0.5, -0.25 + 1e-7]) for i in range(3)]
    rows, round_s = peers.summarise_peers(runs)
    cells = {(r.cells["runner"], r.cells["workers"]): r.cells for r in rows}
    assert list(cells) == [("fedcomp ray", "2"), ("plain PyTorch", "1"), ("pfl", "2"), ("Flower", "2")]
    ray = cells[("fedcomp ray", "2")]
    assert ray["round (ms)"] == "25.0" and ray["overhead vs plain (ms/round)"] == "+14.0"
    assert ray["start-up (s)"] == "5.00" and ray["peak memory (MiB)"] == "1000" and ray["client updates/s"] == "400"
    assert ray["final weights sha256"] == cells[("plain PyTorch", "1")]["final weights sha256"]
    assert ray["max abs diff vs plain"] == "0.0e+00" and cells[("Flower", "2")]["max abs diff vs plain"] == "1.0e-07"
    assert cells[("plain PyTorch", "1")]["overhead vs plain (ms/round)"] == "—"
    assert cells[("plain PyTorch", "1")]["peak memory (MiB)"] == "—"  # no memory run

    table = bench.render(peers.PEER_COLUMNS, rows, markdown=True)
    assert table[0].startswith("| model | clients | rounds | runner |") and len(table) == 2 + len(rows)
    targets = "\n".join(peers.peer_target_lines(runs, round_s))
    assert "+14.0 ms" in targets and "20.0x" in targets
    assert "fedcomp Ray's round time / pfl's at 2 workers <= 0.8x: ray small/100c/4r 1.25x" in targets
    assert peers.memory_lines(runs) == ["memory at the peak by process (MiB of PSS):",
                                        "- fedcomp ray, small 100 clients, 2 worker(s), peak 1000 MiB: ray-main 1000"]


def test_tree_memory_counts_children(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(30)"])
    try:
        memory = peers.TreeMemory(os.getpid())
        deadline = time.time() + 20
        while time.time() < deadline and memory.sample() < peers.process_memory(os.getpid()) + (48 << 20):
            time.sleep(0.1)
        assert child.pid in memory.seen
        assert memory.peak >= peers.process_memory(os.getpid()) + (48 << 20)
        named = memory.name(child.pid)
        assert named.startswith("python")
    finally:
        child.kill()
        child.wait()
    # a process on its way out has no command line left; it keeps the name read before
    assert peers.process_name(child.pid) == "?" and memory.name(child.pid) == named


@pytest.mark.parametrize("runner, says", [("pfl", "pfl 0.6 is not installed"), ("flower", "Flower 1.42 is not installed")])
def test_a_missing_peer_is_one_line_and_exit_2(tmp_path, capsys, runner, says):
    args = ["--quick", "--no-install", "--bench-dir", str(tmp_path), "--runners", runner]
    assert peers.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "--no-install" in err[0]
    assert not (tmp_path / "work").exists()  # failed before any work


@pytest.mark.parametrize("argv, says", [
    (["--clients", "10"], "unrecognized arguments: --clients 10"),  # its workloads are fixed
    (["--markdown"], "unrecognized arguments: --markdown"),
    (["--runners", "tff"], "argument --runners: invalid choice: 'tff'"),
    (["--repeats", "0"], "--repeats = 0: must be >= 1"),
    (["--quick", "--memory"], "--quick and --memory each pick the workloads: give one of them"),
    (["--memory", "--models", "heavy"], "--models heavy: none of this run's workloads has that model"),
    (["--models", "huge"], "argument --models: invalid choice: 'huge'"),
])
def test_peers_bad_flags(tmp_path, capsys, argv, says):
    assert exit_code([*argv, "--bench-dir", str(tmp_path)]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_quick_runs_the_default_runners_and_peers_and_writes_no_report_file():
    """``--quick`` ran all 18 runners twice over (5 minutes and more, not the README's minute) and wrote its one
    workload's report over RESULTS.md."""
    args = peers.build_parser().parse_args(["--quick"])
    matrix, runners, repeats = peers._plan(args)
    assert runners == ["ray-replicated", "local", "plain", "optim", "pfl", "flower"] and repeats == 1
    assert str(peers.report_path(args)) == "-" and peers.report_path(peers.build_parser().parse_args([])).name == "RESULTS.md"
    named = peers.build_parser().parse_args(["--quick", "--runners", "local", "--results", "q.md"])
    assert peers._plan(named)[1] == ["local"] and str(peers.report_path(named)) == "q.md"


def test_a_stopped_harness_stops_the_runner_it_waits_for_with_what_it_started(tmp_path):
    """A SIGTERM (``timeout``'s) left the runner running -- in a session of its own -- with the Ray it had started."""
    script = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
              "time.sleep(60)']); print(child.pid, flush=True); time.sleep(60)")
    log = tmp_path / "runner.log"
    before = signal.signal(signal.SIGTERM, peers._stopped)  # as main() has it
    try:
        threading.Timer(3.0, _thread.interrupt_main, (signal.SIGTERM,)).start()
        with pytest.raises(SystemExit):
            peers.watch([sys.executable, "-c", script], dict(os.environ), log, 60, False)
    finally:
        signal.signal(signal.SIGTERM, before)
    started = int(log.read_text().split()[0])

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(started)


def test_memory_flag_runs_the_memory_targets_workload_once():
    matrix, runners, repeats = peers._plan(peers.build_parser().parse_args(["--memory", "--runners", "ray", "plain"]))
    assert [(w.model, w.clients, n) for w, workers in matrix for n in workers] == [("small", 1000, 2)]
    assert runners == ["ray", "plain"] and repeats == 1


def test_models_flag_keeps_that_models_workloads_at_every_worker_count():
    matrix, _, repeats = peers._plan(peers.build_parser().parse_args(["--models", "heavy", "--repeats", "5"]))
    assert [(w.model, w.clients, n) for w, workers in matrix for n in workers] == [
        (w.model, w.clients, n) for w, workers in peers.FULL_MATRIX for n in workers if w.model == "heavy"]
    assert matrix and repeats == 5


@pytest.mark.slow
def test_peers_quick_with_fedcomp_runners_only(tmp_path, capsys):
    """The harness end to end (subprocesses, memory, report) with the runners that need no peer installed."""
    out = tmp_path / "RESULTS.md"
    args = ["--quick", "--runners", "local", "local-vmap", "plain", "--bench-dir", str(tmp_path), "--results", str(out)]
    assert peers.main(args) == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    rows = {}
    for line in (ln for ln in text.splitlines() if ln.startswith("| small")):
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[3]] = dict(zip(peers.PEER_COLUMNS, cells))
    assert set(rows) == {"fedcomp local", "fedcomp local, vectorised clients", "plain PyTorch"}
    assert rows["fedcomp local"]["final weights sha256"] == rows["plain PyTorch"]["final weights sha256"]
    assert rows["fedcomp local"]["max abs diff vs plain"] == "0.0e+00"
    # lockstep vmap: the plain loop's weights up to float32 rounding (bit for bit is not promised)
    assert float(rows["fedcomp local, vectorised clients"]["max abs diff vs plain"]) < 1e-5
    for cells in rows.values():
        assert float(cells["round (ms)"]) > 0 and float(cells["peak memory (MiB)"]) > 10
        assert float(cells["start-up (s)"]) > 0 and float(cells["test acc"]) > 0
    assert "machine:" in text and "load average" in text and "python benchmarks/peers.py --quick" in text


@pytest.mark.slow
@pytest.mark.ray
def test_cli_memory_samples_a_users_fedcomp_run_and_names_its_processes(tmp_path):
    """``--memory`` also measures the product's own tree: ``fedcomp run`` of the workload, writing its results."""
    workload = peers.Workload("small", clients=20, rounds=2)
    memory = peers.cli_memory(workload, tmp_path)
    [line] = peers.cli_memory_lines(workload, memory)
    assert memory.peak > 100 << 20 and "ray::ClientActor" in line and "python fedcomp" in line, line
    (run_dir,) = (tmp_path / "cli-runs").iterdir()
    assert (run_dir / "metrics.parquet").is_file() and (run_dir / "checkpoint.pt").is_file()
