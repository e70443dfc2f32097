"""A sweep submitted through the Ray Jobs CLI to a real two-node cluster on loopback (two `ray start`
processes, 1 CPU each): its trial's client actors land on both nodes, and its numbers are one node's. The
cluster runs in its own processes, so the session's Ray is left alone."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import fedcomp
from tests.ray_nodes import RAY, Cluster

pytestmark = pytest.mark.slow

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


def one_node_rows(out: Path, **overrides) -> pd.DataFrame:
    config = {**TINY, **overrides, "federation.backend": "local", "run.out": str(out)}
    return fedcomp.run("quickstart", config).metrics[COLUMNS]


def test_a_sweep_submitted_as_a_ray_job_places_client_actors_on_both_nodes_with_one_node_numbers(tmp_path):
    cluster = Cluster(dashboard=True)
    try:
        ray_job = [RAY, "job"]
        deadline = time.time() + 180
        while subprocess.run([*ray_job, "list", "--address", cluster.jobs], env=cluster.env,
                             capture_output=True).returncode != 0:
            assert time.time() < deadline and cluster.running(), "the Ray head's job server did not come up"
            time.sleep(2)
        out = tmp_path / "results"
        # One client per actor: 6 bundles (trial, server, 4 client actors) spread over 2 one-CPU nodes.
        spec = {"base": "quickstart", "set": {**TINY, "federation.clients_per_actor": 1, "run.out": str(out)},
                "grid": {"algorithm.lr": [0.1]}, "placement": "spread", "cpus_per_trial": 1.5}
        (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(spec))
        # No --working-dir: the two nodes share one session folder on one machine, and a working dir uploaded
        # with the job vanished under its running driver (its getcwd failed as the sweep ended).
        submit = [*ray_job, "submit", "--address", cluster.jobs, "--", "fedcomp", "sweep",
                  str(tmp_path / "tiny.yaml"), "--verbose", "0"]
        while True:  # the dashboard answers before the node's job agent is up; Ray says to try again
            job = subprocess.run(submit, env=cluster.env, capture_output=True, text=True, timeout=400)
            if "No available agent to submit job" not in job.stderr + job.stdout or time.time() > deadline:
                break
            time.sleep(3)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in job.stdout + job.stderr
        [placement] = [json.loads(p.read_text()) for p in sorted(out.glob("*/*/checkpoint_*/placement.json"))[-1:]]
        assert len({actor["node"] for actor in placement}) == 2  # the cluster's two nodes
        [trials_file] = out.glob("*/trials.parquet")
        trials = pd.read_parquet(trials_file)
        assert set(trials["status"]) == {"completed"} and list(trials["algorithm.lr"].unique()) == [0.1]
        rows = trials.sort_values("round")[COLUMNS].reset_index(drop=True)
    finally:
        cluster.close()
    reference = one_node_rows(tmp_path / "reference", **{"algorithm.lr": 0.1})
    pd.testing.assert_frame_equal(rows, reference, check_dtype=False)
