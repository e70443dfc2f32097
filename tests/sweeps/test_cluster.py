"""Sweeps on clusters other than the test session's: a sweep submitted through the Ray Jobs CLI to a real
head node on loopback, and a sweep on a two-node cluster (``ray.cluster_utils.Cluster``) whose client
actors land on both nodes with the same numbers as on one node. Each runs in its own processes so that the
session's Ray is left alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import fedcomp

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
TINY = {
    "federation.clients": 4,
    "algorithm.local_steps": 5,
    "algorithm.first_batch": 4,
    "task.test_samples": 2000,
    "run.rounds": 3,
    "run.eval_every": 1,
    "run.progress": "none",
}
COLUMNS = ["round", "comm_rounds", "local_steps", "samples", "train_loss", "test_accuracy", "test_loss"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "RAY_ADDRESS": ""}


def one_node_rows(out: Path, **overrides) -> pd.DataFrame:
    config = {**TINY, **overrides, "federation.backend": "local", "run.out": str(out)}
    return fedcomp.run("quickstart", config).metrics[COLUMNS]


def test_sweep_submitted_as_a_ray_job(tmp_path):
    port, dashboard = free_port(), free_port()
    # The session's Ray runs on this machine too: every fixed default port of a node gets a free one, or the
    # second node's job agent cannot bind its port and every submission is refused.
    ports = [f"--{name}={free_port()}" for name in (
        "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port",
        "ray-client-server-port")]
    # its own temp folder: the head writes its address file there, not into /tmp/ray where a later plain
    # ray.init() on this machine would find it (the head is killed, so it does not remove the file itself)
    temp = tempfile.mkdtemp(prefix="fedcomp-job-")
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--port", str(port), "--num-cpus", "2", "--include-dashboard=true",
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard), *ports, "--block",
         "--disable-usage-stats", "--temp-dir", temp],
        env={**env(), "RAY_TMPDIR": temp}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.time() + 180
        while subprocess.run([str(BIN / "ray"), "job", "list", "--address", address], env=env(),
                             capture_output=True).returncode != 0:
            assert time.time() < deadline and head.poll() is None, "the Ray head did not come up"
            time.sleep(2)
        workdir = tmp_path / "job"
        workdir.mkdir()
        out = tmp_path / "results"
        # the trials' clients run in-process: placing trials' actors is the two-node test's subject below
        spec = {"base": "quickstart", "set": {**TINY, "federation.backend": "local", "run.out": str(out)},
                "grid": {"algorithm.lr": [0.1, 0.05]}, "max_concurrent": 1}
        (workdir / "tiny.yaml").write_text(yaml.safe_dump(spec))
        submit = [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(workdir), "--",
                  "fedcomp", "sweep", "tiny.yaml", "--verbose", "0"]
        while True:  # the dashboard answers before the node's job agent is up; Ray says to try again
            job = subprocess.run(submit, env=env(), capture_output=True, text=True, timeout=400)
            if "No available agent to submit job" not in job.stderr + job.stdout or time.time() > deadline:
                break
            time.sleep(3)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in job.stdout + job.stderr
        [trials_file] = out.glob("*/trials.parquet")
        trials = pd.read_parquet(trials_file)
        assert sorted(trials["algorithm.lr"].unique()) == [0.05, 0.1] and set(trials["status"]) == {"completed"}
        rows = trials[trials["algorithm.lr"] == 0.1].sort_values("round")[COLUMNS].reset_index(drop=True)
        reference = one_node_rows(tmp_path / "reference", **{"algorithm.lr": 0.1})
        pd.testing.assert_frame_equal(rows, reference, check_dtype=False)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=3)  # a graceful stop can take half a minute; the group is killed below
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(temp, ignore_errors=True)


TWO_NODES = textwrap.dedent(
    """
    import json, sys
    import ray
    from ray.cluster_utils import Cluster
    import fedcomp

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False)
    spec = json.loads(sys.argv[1])
    result = fedcomp.sweep(spec)
    [placement] = [json.loads(p.read_text()) for p in sorted(result.path.glob("*/checkpoint_*/placement.json"))[-1:]]
    nodes = sorted({n["NodeID"] for n in ray.nodes() if n["Alive"]})
    print(json.dumps({"placement": placement, "nodes": nodes, "trials": str(result.path / "trials.parquet")}))
    ray.shutdown()
    cluster.shutdown()
    """
)


def test_two_node_sweep_places_client_actors_on_both_nodes_with_one_node_numbers(tmp_path):
    out = tmp_path / "results"
    # One client per actor: 6 bundles (trial, server, 4 client actors) spread over 2 one-CPU nodes.
    spec = {"base": "quickstart", "set": {**TINY, "federation.clients_per_actor": 1, "run.out": str(out)},
            "placement": "spread", "cpus_per_trial": 1.5}
    proc = subprocess.run([sys.executable, "-c", TWO_NODES, json.dumps(spec)], env=env(), capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    client_nodes = {actor["node"] for actor in report["placement"]}
    assert len(report["nodes"]) == 2 and client_nodes == set(report["nodes"])
    trials = pd.read_parquet(report["trials"]).sort_values("round")
    reference = one_node_rows(tmp_path / "reference")
    pd.testing.assert_frame_equal(trials[COLUMNS].reset_index(drop=True), reference, check_dtype=False)
