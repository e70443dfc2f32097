"""Which cluster a run uses and how its actors fit: a fresh local Ray without an address (never a cluster
`ray start` left running), a fast one-line failure for an address that does not answer, placement on a real
two-node cluster (two `ray start` processes on loopback, 1 CPU each) with the local numbers, errors raised inside
actors as the local backend's one line, and replaced actors reported (the numbers of every packing:
test_ray_backend.py and the conformance suite)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from ray._private import node as ray_node

import fedcomp
from fedcomp.actors import cluster
from fedcomp.actors.cluster import (
    GCS_EVERY_S,
    IDLE_DAEMONS,
    _descendants,
    adopt_env,
    answering,
    auto_clients_per_actor,
    connect,
    end_started,
    idle_daemons_not_started,
    packing_that_fits,
    plan_actors,
    probe,
    resume_advice,
    shipped,
    started_daemons,
)
from fedcomp.cli import main
from fedcomp.platform.config import FederationConfig
from fedcomp.platform.errors import ResourceError
from tests.ray_nodes import Cluster, free_ports

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--set", "federation.clients=8", "--set", "federation.clients_per_actor=2", "--set", "algorithm.local_steps=5",
        "--set", "algorithm.first_batch=4", "--set", "task.test_samples=2000", "--set", "run.rounds=3",
        "--set", "run.progress=none", "--set", "algorithm.name=acc-fcsg-m"]


THROUGH_A_CLIENT = [*FAST, "--set", "federation.clients_per_actor=4"]
"""FAST in 2 client actors: a Ray Client test's subject is the connection, not the placement (each actor more is a
process more, importing torch)."""


def overrides(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args[1::2])


def metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "metrics.parquet").drop(columns="wall_time")


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The real command line in a fresh process (its own Ray, or the cluster it is told to join)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "fedcomp", *args], capture_output=True, text=True, timeout=timeout,
                          env=full, cwd=ROOT)


# -- placement (no Ray needed) --------------------------------------------------------------------------------

TWO_NODES = [{"CPU": 1.0}, {"CPU": 1.0}]


def test_actor_shares_fit_the_nodes_not_the_total():
    fed = FederationConfig(clients=16, clients_per_actor=4, server="actor")  # 4 client actors and the server actor
    plan = plan_actors(fed, {"CPU": 2.0}, TWO_NODES)
    # 2 CPUs / 5 actors = 0.4 fits the total but not the nodes (two 0.4 shares per node = 4 actors); a third
    # of a CPU gives each node three.
    assert plan.cpus == pytest.approx(0.3333) and plan.server_cpus == plan.cpus
    assert 2 * int(1.0 / plan.cpus) >= len(plan.groups) + 1
    assert plan_actors(fed, {"CPU": 2.0}).cpus == pytest.approx(0.4)  # one node of 2 CPUs: the old share
    with pytest.raises(ResourceError, match=r"federation.cpus_per_actor = 0.4: 4 client actors and the server do not "
                                            r"fit on 2 nodes with CPU 1, 1 \(an actor lives on one node\); use "
                                            r"cpus_per_actor <= 0.3333 or 'auto'"):
        plan_actors(fed.model_copy(update={"cpus_per_actor": 0.4}), {"CPU": 2.0}, TWO_NODES)
    assert plan_actors(fed.model_copy(update={"cpus_per_actor": 0.2}), {"CPU": 2.0}, TWO_NODES).cpus == 0.2


@pytest.mark.parametrize("server", ["replicated", "driver"])
def test_without_a_server_actor_only_the_client_actors_are_placed(server):
    fed = FederationConfig(clients=16, clients_per_actor=4, server=server)
    plan = plan_actors(fed, {"CPU": 2.0}, TWO_NODES)
    assert plan.cpus == pytest.approx(0.5) and plan.server_cpus == 0.0  # two client actors a node, nothing else
    two = FederationConfig(clients=16, clients_per_actor=8, server=server, cpus_per_actor=1)
    assert plan_actors(two, {"CPU": 2.0}).cpus == 1.0  # a whole CPU each: the server takes none
    with pytest.raises(ResourceError, match=r"^federation.cpus_per_actor = 1 needs 4 CPUs for 4 client actors but the "
                                            r"cluster has 2; use cpus_per_actor <= 0.5 or 'auto'$"):
        plan_actors(fed.model_copy(update={"cpus_per_actor": 1}), {"CPU": 2.0})
    three = FederationConfig(clients=12, clients_per_actor=4, server=server, cpus_per_actor=0.6)  # 1.8 CPUs in all
    with pytest.raises(ResourceError, match=r"^federation.cpus_per_actor = 0.6: 3 client actors do not fit on 2 nodes "
                                            r"with CPU 1, 1 \(an actor lives on one node\); use cpus_per_actor <= 0.5 "
                                            r"or 'auto'$"):
        plan_actors(three, {"CPU": 2.0}, TWO_NODES)


def test_gpu_shares_fit_the_gpu_nodes():
    nodes = [{"CPU": 1.0, "GPU": 2.0}, {"CPU": 1.0}]
    plan = plan_actors(FederationConfig(clients=6, clients_per_actor=1, server="actor"), {"CPU": 2.0, "GPU": 2.0}, nodes)
    # Every client actor needs the GPU node: six of them and maybe the server share its one CPU.
    assert plan.gpus_per_client == pytest.approx(0.3333) and plan.cpus == pytest.approx(1 / 7, abs=1e-4)
    with pytest.raises(ResourceError, match=r"gpus_per_client = 0.75 asks 0.75 GPU per client actor; 2 nodes with GPU 1, 2 "
                                            r"hold 3 such actors, the run has 4; use federation.gpus_per_client <= 0.6666"):
        plan_actors(FederationConfig(clients=4, clients_per_actor=1, gpus_per_client=0.75), {"CPU": 4.0, "GPU": 3.0},
                    [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 2.0}])


@pytest.mark.parametrize(("clients", "cpus", "server", "expected"), [
    (16, 2.0, "replicated", [8, 8]),  # quickstart on a 2-core laptop: one actor a CPU
    (16, 3.0, "replicated", [6, 6, 4]),
    (16, 4.0, "actor", [4, 4, 4, 4]),  # the server actor, which mostly waits, takes none of the count
    (3, 8.0, "replicated", [1, 1, 1]),  # at most one actor a client
    (16, 0.5, "actor", [16]),  # at least one actor
    (16, 2.5, "replicated", [8, 8]),  # whole CPUs
])
def test_auto_packing_gives_each_actor_a_cpu(clients, cpus, server, expected):
    plan = plan_actors(FederationConfig(clients=clients, server=server), {"CPU": cpus})
    assert [len(g) for g in plan.groups] == expected
    assert sorted(c for g in plan.groups for c in g) == list(range(clients))
    assert plan.cpus * (len(expected) + (server == "actor")) <= cpus


def test_auto_packing_puts_actors_per_gpu_actors_on_each_gpu():
    plan = plan_actors(FederationConfig(clients=16, actors_per_gpu=2), {"CPU": 16.0, "GPU": 2.0})
    assert [len(g) for g in plan.groups] == [4] * 4 and plan.gpus(0) == pytest.approx(0.5)
    fixed = plan_actors(FederationConfig(clients=10, actors_per_gpu=1, gpus_per_client=0.25), {"CPU": 16.0, "GPU": 3.0})
    assert [len(g) for g in fixed.groups] == [4, 4, 2] and fixed.gpus(0) == 1.0
    # GPUs the clients do not use leave the CPU rule
    cpu_only = plan_actors(FederationConfig(clients=16, gpus_per_client=0), {"CPU": 4.0, "GPU": 2.0})
    assert len(cpu_only.groups) == 4 and cpu_only.gpus(0) == 0.0
    assert auto_clients_per_actor(FederationConfig(clients=16, actors_per_gpu=2), cpus=4.0, gpus=0.5) == 16


def test_more_actors_than_the_memory_holds_fail_at_once_pointing_to_auto():
    """1,000 clients 4 an actor on 2 CPUs: 250 processes importing torch, which Ray's memory monitor killed after the
    actors' 120 s deadline (16 GiB for actors here); auto packs them into 2."""
    cluster = {"CPU": 2.0, "memory": 16.4 * 2**30}
    with pytest.raises(ResourceError, match=r"^federation.clients = 1000 with clients_per_actor = 4 makes 250 client "
                                            r"actors, each a process that imports torch \(at least 100 MiB of its own: "
                                            r"24.4 GiB in all\), more than the cluster's 16.4 GiB of memory for actors; "
                                            r"use federation.clients_per_actor = 'auto' \(2 actors here\) or a larger number$"):
        plan_actors(FederationConfig(clients=1000, clients_per_actor=4), cluster)
    assert len(plan_actors(FederationConfig(clients=1000), cluster).groups) == 2
    assert len(plan_actors(FederationConfig(clients=1000, clients_per_actor=7), cluster).groups) == 143  # 14 GiB
    with pytest.raises(ResourceError, match=r"makes 143 client actors.*14.1 GiB in all.*13.0 GiB"):
        plan_actors(FederationConfig(clients=1000, clients_per_actor=7, server="actor"), {"CPU": 2.0, "memory": 13 * 2**30})


def test_planning_many_actors_on_many_nodes_is_quick():
    started = time.perf_counter()
    plan = plan_actors(FederationConfig(clients=1000, clients_per_actor=1, server="actor"), {"CPU": 200.0},
                       [{"CPU": 2.0}] * 100)
    assert time.perf_counter() - started < 2.0
    assert 100 * int(2.0 / plan.cpus + 1e-9) >= 1001


@pytest.mark.parametrize(("clients", "share", "cpus"), [(16, 0.5, 2.0), (16, 1.0, 3.0), (16, 0.25, 7.5), (3, 0.5, 4.0),
                                                      (16, 0.5, 0.4), (1, 1.0, 1.0)])
def test_the_packing_that_fits_is_the_fewest_clients_per_actor_whose_actors_fit(clients, share, cpus):
    per = packing_that_fits(clients, share, cpus)
    if cpus < share:
        assert per is None
        return
    assert -(-clients // per) * share <= cpus + 1e-9  # its actors fit
    assert per == 1 or -(-clients // (per - 1)) * share > cpus  # one fewer a client actor would not


@pytest.mark.ray
def test_the_advice_after_a_lost_node_names_a_packing_that_fits_the_cpus_left(ray_session):
    """The session's Ray has 2 CPUs; with no room for even one actor, only the node and the local backend are left."""
    assert resume_advice(16, 0.5) == (
        "start a node in its place; or resume the run with --set federation.clients_per_actor=4 (its 4 client actors "
        "of 0.5 CPU fit the 2 CPUs left) or --set federation.backend=local")
    assert resume_advice(16, 0.5, server_cpus=2.0) == (
        "start a node in its place; or resume the run with --set federation.backend=local")


# -- addresses ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_an_address_nothing_listens_on_fails_in_seconds(tmp_path):
    (port,) = free_ports(1)
    started = time.monotonic()
    done = cli("run", "quickstart", "--ray-address", f"127.0.0.1:{port}", "--set", f"run.out={tmp_path}")
    assert done.returncode == 2
    assert time.monotonic() - started < 60  # the command's own start-up included; Ray alone retried for minutes
    assert done.stderr.strip().splitlines() == [
        f"fedcomp: error: federation.ray_address = '127.0.0.1:{port}': cannot reach 127.0.0.1:{port} (Connection "
        f"refused) within 5s; start the cluster (`ray start --head`) or run on a fresh local Ray: "
        f"federation.ray_address = local (a resume too)"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_address_that_accepts_but_never_answers_fails_in_seconds(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]
    held: list[socket.socket] = []

    def accept() -> None:  # holds connections open without answering, until the socket is closed
        try:
            for _ in range(16):
                held.append(server.accept()[0])
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        started = time.monotonic()
        done = cli("run", "quickstart", "--set", f"federation.ray_address=127.0.0.1:{port}", "--set", f"run.out={tmp_path}",
                   env={"RAY_ADDRESS": ""})
        elapsed = time.monotonic() - started
    finally:
        server.close()
    assert done.returncode == 2 and elapsed < 90
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and f"127.0.0.1:{port} is not a Ray head answering (no reply within 10s)" in err[0], err
    assert list(tmp_path.iterdir()) == []


# -- a real two-node cluster on loopback ----------------------------------------------------------------------

@pytest.mark.ray
def test_a_head_answers_while_it_listens_and_not_once_it_is_gone(ray_session):
    assert answering(ray_session.get_runtime_context().gcs_address)()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        alive = answering(f"127.0.0.1:{listener.getsockname()[1]}")
        assert alive()
    time.sleep(GCS_EVERY_S)  # asked again only after that
    assert not alive()  # what a SIGTERM to the process group leaves of a local Ray's GCS



@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
def test_a_local_ray_answers_only_while_the_daemons_it_started_run(ray_session):
    """The log monitor (no SIGTERM handler) and then the raylet end first after a SIGTERM to the group; the driver is
    ended by Ray's C++ soon after the raylet, so the watch must not wait for the GCS port to close (nor for a dead
    daemon to be reaped)."""
    daemons = started_daemons()
    names = sorted("log_monitor" if b"log_monitor.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
                   else Path(f"/proc/{pid}/comm").read_text().strip() for pid in daemons)
    assert names == ["gcs_server", "log_monitor", "raylet"]  # the session's own, started by this process
    gcs = ray_session.get_runtime_context().gcs_address
    assert answering(gcs, daemons)()
    stand_in = subprocess.Popen(["sleep", "60"])  # a daemon that then ends
    alive = answering(gcs, [*daemons, stand_in.pid])
    assert alive()
    stand_in.terminate()
    deadline = time.time() + 10
    while Path(f"/proc/{stand_in.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.time() < deadline:
        time.sleep(0.01)
    assert not alive()  # ended, not yet reaped
    stand_in.wait()
    assert not alive()


# A local Ray started as fedcomp starts it never starts the autoscaler monitor or the API server (no log of either in
# its session), runs neither, and still runs tasks; end_idle_daemons is harmless before Ray starts and after it has
# ended, and Ray's own shutdown then goes through.
MONITOR_ENDED = """
import os, ray
from pathlib import Path
from fedcomp.actors.cluster import _runs, connect, end_idle_daemons
def idle():
    for folder in Path("/proc").glob("[0-9]*"):
        try:
            child = int((folder / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
            if child and any(s in (folder / "cmdline").read_bytes() for s in (b"/monitor.py", b"/dashboard.py")):
                yield int(folder.name)
        except OSError:  # ended meanwhile
            pass
end_idle_daemons()
connect("local")
logs = Path(ray._private.worker._global_node.get_logs_dir_path())
print(sorted(f.name for f in logs.iterdir() if f.name.startswith(("monitor.", "dashboard."))))
print([pid for pid in idle() if _runs(pid)], ray.get(ray.remote(lambda: 41 + 1).remote()))
ray.shutdown()
end_idle_daemons()
print("shut down")
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
def test_a_local_ray_runs_without_its_autoscaler_monitor_and_api_server(tmp_path):
    """They held 127 MiB for the whole run, and Ray's shutdown stopped the GCS, then gave the monitor (reporting its
    end to that GCS) its 1 s grace before killing it: most of the time ending a local Ray took."""
    done = subprocess.run([sys.executable, "-c", MONITOR_ENDED], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-4:] == ["[]", "[] 42", "shut down", ""]


def test_idle_daemons_not_started_puts_rays_own_methods_back_when_it_ends_or_fails():
    node = ray_node.Node
    own = {name: vars(node)[name] for name in IDLE_DAEMONS}
    with pytest.raises(RuntimeError, match="the start failed"), idle_daemons_not_started():
        assert all(vars(node)[name] is not own[name] for name in IDLE_DAEMONS)
        assert node.start_api_server(None, include_dashboard=False, raise_on_failure=False) is None
        raise RuntimeError("the start failed")
    assert {name: vars(node)[name] for name in IDLE_DAEMONS} == own


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster()
    yield cluster
    cluster.close()


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_places_its_actors_on_both_nodes_with_the_local_numbers(two_nodes, tmp_path):
    done = cli("run", "quickstart", *FAST, "--ray-address", two_nodes.address, "--set", f"run.out={tmp_path / 'ray'}",
               env={"RAY_TMPDIR": two_nodes.tmp})
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "ray").iterdir()
    backend = json.loads((run_dir / "run.json").read_text())["backend"]
    assert backend["gcs_address"].endswith(f":{two_nodes.port}")
    assert backend["client_actors"] == 4 and len(backend["nodes"]) == 2  # 4 actors of 1/2 CPU need both nodes
    assert backend["cpus_per_actor"] == pytest.approx(0.5)  # the server replicated on them: no server actor to place
    local = fedcomp.run("quickstart", {**overrides(FAST), "federation.backend": "local", "run.out": str(tmp_path / "local")})
    pd.testing.assert_frame_equal(metrics(run_dir), local.metrics.drop(columns="wall_time"), check_exact=True)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("server", ["replicated", "actor"])
def test_feddro_exchanges_among_the_actors_across_both_nodes_with_the_local_numbers(two_nodes, tmp_path, server):
    """The actors' group spans the nodes: with the server replicated on the client actors (the default) every call's
    result, and with the server actor (transport: collective) FedDRO's per-step means, are formed among client actors
    on both nodes (no fallback, which would warn), with the local backend's numbers."""
    args = ["--set", "federation.clients=8", "--set", "federation.clients_per_actor=2", "--set", "run.rounds=3",
            "--set", "run.eval_every=1", "--set", "algorithm.local_steps=3", "--set", "run.progress=none",
            "--set", f"federation.server={server}"]
    done = cli("run", "feddro-drift", *args, "--ray-address", two_nodes.address, "--set", f"run.out={tmp_path / 'ray'}",
               env={"RAY_TMPDIR": two_nodes.tmp})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "could not form a" not in done.stderr, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "ray").iterdir()
    backend = json.loads((run_dir / "run.json").read_text())["backend"]
    assert (backend["server"], backend["transport"], backend["client_actors"], len(backend["nodes"])) == (
        server, "collective", 4, 2)  # the replicated server's calls go through the group too: as the config says
    local = fedcomp.run("feddro-drift", {**overrides(args), "federation.backend": "local", "run.out": str(tmp_path / "local")})
    assert local.metrics["embedding_exchanges"].iloc[-1] > 0
    pd.testing.assert_frame_equal(metrics(run_dir), local.metrics.drop(columns="wall_time"), check_exact=True)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("placement, warned, ran", [
    ((), "the server cannot be replicated on the client actors here (a Ray Client connection (ray://) cannot wait on "
         "the replicas' streamed rounds); this run's server runs in a server actor on the cluster and reaches them by "
         "actor calls (server: actor; the same numbers)", ("actor", "collective")),
    (("--set", "federation.server=driver", "--set", "federation.transport=graph"),
     "federation.transport = 'graph': a driver connected through a Ray Client (ray://) cannot build a compiled graph",
     ("driver", "calls")),
    (("--set", "federation.server=actor", "--set", "federation.transport=graph"), None, ("actor", "graph")),
], ids=["default", "driver-graph", "actor-graph"])
def test_a_run_through_a_ray_client_has_the_local_numbers(two_nodes, tmp_path, placement, warned, ran):
    """``--ray-address ray://HOST:PORT`` as the README shows it: the default (server replicated) and a driver's graph
    failed with a traceback (the Ray Client cannot wait on a streamed result, nor build a compiled graph)."""
    done = cli("run", "quickstart", *THROUGH_A_CLIENT, *placement, "--ray-address", two_nodes.client, "--set",
               f"run.out={tmp_path / 'ray'}", env={"RAY_TMPDIR": two_nodes.tmp})
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("fedcomp: warning:")]
    assert [w for w in warnings if warned in w] if warned else not warnings, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "ray").iterdir()
    backend = json.loads((run_dir / "run.json").read_text())["backend"]
    assert (backend["server"], backend["transport"]) == ran
    local = fedcomp.run("quickstart", {**overrides(FAST), "federation.backend": "local", "run.out": str(tmp_path / "local")})
    assert backend["client_actors"] == 2
    pd.testing.assert_frame_equal(metrics(run_dir), local.metrics.drop(columns="wall_time"), check_exact=True)


@pytest.mark.ray
def test_a_ray_client_address_at_the_heads_gcs_port_says_so(two_nodes, tmp_path):
    """``ray://HOST:6379`` (the GCS port where the Ray Client's belongs): Ray's client timed out with "ray client
    connection timeout", not saying why (here after 1 s retries, not its default 30 s)."""
    done = cli("run", "quickstart", "--ray-address", f"ray://{two_nodes.address}", "--set", f"run.out={tmp_path}",
               env={"RAY_TMPDIR": two_nodes.tmp, "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1",
                    "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"fedcomp: connecting to Ray at ray://{two_nodes.address} ...",
        f"fedcomp: error: federation.ray_address = 'ray://{two_nodes.address}': Ray could not join that cluster: ray "
        f"client connection timeout; {two_nodes.address} is the head's GCS port, not its Ray Client server's: give "
        f"{two_nodes.address} without ray:// (from a machine of the cluster), or ray://127.0.0.1:10001 (unless "
        f"`ray start --ray-client-server-port` said otherwise)"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_through_a_ray_client_finishes_with_its_trials_table(two_nodes, tmp_path):
    """Every trial completed, then it said it was interrupted (exit 130, no trials.parquet): the fit runs in an actor
    on the cluster and puts no SIGINT handler in the driver, whose unchanged handler read as a caught Ctrl-C."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps({"base": "quickstart", "set": {**overrides(THROUGH_A_CLIENT), "run.out": str(tmp_path / "out"),
                                                              "run.track": "none"},
                                "grid": {"algorithm.lr": [0.1]}}))
    done = cli("sweep", str(spec), "--verbose", "0", "--ray-address", two_nodes.client, env={"RAY_TMPDIR": two_nodes.tmp})
    assert done.returncode == 0 and "interrupted" not in done.stderr, done.stderr[-3000:]
    assert "1 trial, 0 failed" in done.stdout, done.stdout
    (sweep_dir,) = (tmp_path / "out").iterdir()
    assert pd.read_parquet(sweep_dir / "trials.parquet")["status"].eq("completed").all()


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_whose_trial_fits_the_cluster_in_total_but_not_its_nodes_is_one_line(two_nodes, tmp_path):
    """Three bundles of 0.6 CPU on two nodes of 1 CPU: the totals fit, so the sweep started and Tune waited for ever
    (a run checks each node; the sweep only the totals and each bundle alone)."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps({"base": "quickstart", "set": {**overrides(FAST), "run.out": str(tmp_path / "out"),
                                                              "federation.cpus_per_actor": 0.6,
                                                              "federation.clients_per_actor": 4},
                                "grid": {"algorithm.lr": [0.1]}, "cpus_per_trial": 1.8}))
    done = cli("sweep", str(spec), "--verbose", "0", "--ray-address", two_nodes.address, env={"RAY_TMPDIR": two_nodes.tmp},
               timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("fedcomp: error: ")]
    assert done.returncode == 2 and len(errors) == 1 and done.stderr.endswith(errors[0] + "\n"), done.stderr[-3000:]
    assert "do not fit on the nodes together (CPU=1, CPU=1); lower cpus_per_trial or federation.cpus_per_actor" in \
        done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
def test_an_address_other_than_the_ray_this_process_is_on_is_refused_not_ignored(ray_session, tmp_path):
    """A run naming a cluster while this process is connected to another Ray ran on the first, silently; naming the
    one it is on (by any of its addresses) is fine."""
    import ray

    current = ray.get_runtime_context().gcs_address
    port = int(current.rsplit(":", 1)[1])
    for same in (current, f"127.0.0.1:{port}", f"localhost:{port}"):
        assert connect(same)["CPU"] > 0
    with pytest.raises(ResourceError, match=rf"^federation.ray_address = '127.0.0.1:1': this process is connected to "
                                            rf"the Ray at {current} already .*call ray.shutdown\(\) first"):
        connect("127.0.0.1:1")
    with pytest.raises(ResourceError, match="this process is connected to the Ray at"):
        fedcomp.run("quickstart", {"run.rounds": 1, "federation.clients": 2, "federation.ray_address": "ray://10.1.2.3:10001",
                                   "run.progress": "none", "run.out": str(tmp_path)})
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_ray_starts_from_the_main_thread_and_runs_in_threads_join_it(tmp_path):
    """A run in another thread does not start Ray (one started so left its agents running after the script ended, and
    two at once raised Ray's "called ray.init twice" or hung): one line says so; started in the main thread, runs in
    two threads at once join it."""
    script = (
        "import fedcomp, threading\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "over = {'run.rounds': 1, 'federation.clients': 2, 'federation.clients_per_actor': 2,\n"
        "        'federation.cpus_per_actor': 0.5, 'run.progress': 'none', 'run.out': 'out'}\n"
        "# two runs at once fit the 2 CPUs (each holding one would wait on the other)\n"
        "def run(seed):\n"
        "    return fedcomp.run('quickstart', {**over, 'run.seed': seed})\n"
        "with ThreadPoolExecutor(1) as pool:\n"
        "    try:\n"
        "        pool.submit(run, 0).result()\n"
        "    except fedcomp.ResourceError as error:\n"
        "        print('REFUSED', error)\n"
        "run(0)\n"
        "with ThreadPoolExecutor(2) as pool:\n"
        "    print('RUNS', len(list(pool.map(run, (1, 2)))))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "RUNS 2" in done.stdout, done.stderr[-3000:]
    assert "REFUSED federation.backend = 'ray': Ray starts from the main thread" in done.stdout
    runs = [json.loads((run / "run.json").read_text())["backend"] for run in (tmp_path / "out").iterdir()]
    assert len(runs) == 3 and len({backend["gcs_address"] for backend in runs}) == 1  # one Ray


CUT_SHORT = """
import fedcomp
from ray._private import state

def interrupted(self, *args, **kwargs):  # Ctrl-C where a user's landed: Ray's node recorded, not yet the driver's
    raise KeyboardInterrupt

state.GlobalState.get_node = interrupted
try:
    fedcomp.run("quickstart", {"run.rounds": 2, "federation.clients": 4, "run.progress": "none", "run.out": "out"})
except KeyboardInterrupt as error:
    print("INTERRUPTED", error)
import os, pathlib
zombies = [stat for stat in pathlib.Path("/proc").glob("[0-9]*/stat")  # children left unreaped (a notebook keeps them)
           if stat.read_text().rsplit(")", 1)[1].split()[:2] == ["Z", str(os.getpid())]]
print("ZOMBIES", len(zombies))
"""


def _in_folder(folder: Path) -> list[str]:
    """The PIDs of the processes whose working directory is ``folder`` (Ray's processes retitle themselves; they keep
    the script's folder)."""
    left = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if cwd.resolve() == folder.resolve():
                left.append(cwd.parent.name)
        except OSError:
            continue
    return left


def _title(pid: str) -> str:
    """A process's command line, for the assertion's message (empty where it ended meanwhile)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return ""


@pytest.mark.slow
def test_ctrl_c_while_local_ray_starts_leaves_none_of_its_processes(tmp_path):
    """The raylet's agents outlived a script whose Ctrl-C cut ``ray.init`` short (adopted by init, ignoring SIGTERM)."""
    ray_tmp = tempfile.mkdtemp(prefix="fcc", dir="/tmp")  # short: Ray's socket paths have a length limit
    done = subprocess.run([sys.executable, "-c", CUT_SHORT], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_TMPDIR": ray_tmp})
    assert "INTERRUPTED nothing was kept" in done.stdout and "ZOMBIES 0" in done.stdout, done.stdout + done.stderr[-3000:]
    deadline = time.monotonic() + 3  # SIGKILLed processes that were not the script's children end on their own time
    while (left := _in_folder(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    titles = {pid: _title(pid) for pid in left}
    for pid in left:  # not to outlive the test either
        os.kill(int(pid), signal.SIGKILL)
    assert titles == {}


def test_a_tree_that_keeps_starting_processes_is_ended_whole(tmp_path):
    """A process that starts a child every millisecond or so as its tree is ended (the raylet starting its agents as a cut-short
    script ends): the tree is stopped before any of it is killed, so no child started after the tree was read
    outlives it. Killed without stopping, the loop's children started between the reading and the kill were left."""
    before = _descendants()
    spawner = subprocess.Popen(["bash", "-c", "while :; do sleep 300 & sleep 0.001; done"], cwd=tmp_path)
    deadline = time.monotonic() + 10
    while len(_in_folder(tmp_path)) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    end_started(before)
    assert spawner.poll() is not None  # reaped: its own child
    deadline = time.monotonic() + 3
    while (left := _in_folder(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    assert left == []


def test_an_actor_takes_each_runs_fedcomp_variables_over_its_nodes_own_and_drops_the_last_runs(monkeypatch):
    """A kept actor's next run sets other ``FEDCOMP_*`` variables (a fault to inject, a data root): each run's are
    the node's own overridden by the driver's, as Ray's ``runtime_env`` gave them; the driver's process (None) is
    left as it is."""
    monkeypatch.setattr(os, "environ", {"PATH": "/bin", "FEDCOMP_DATA": "/node/data"})  # the worker's, at its start
    monkeypatch.setattr(cluster, "_node_env", None)
    seen = []
    for env in ({"FEDCOMP_FAULT_KILL": "1:1"}, {}, {"FEDCOMP_DATA": "/driver/data"}, {}, None):
        adopt_env(env)
        seen.append(dict(os.environ))
    assert seen == [
        {"PATH": "/bin", "FEDCOMP_DATA": "/node/data", "FEDCOMP_FAULT_KILL": "1:1"},
        {"PATH": "/bin", "FEDCOMP_DATA": "/node/data"},
        {"PATH": "/bin", "FEDCOMP_DATA": "/driver/data"},
        {"PATH": "/bin", "FEDCOMP_DATA": "/node/data"},
        {"PATH": "/bin", "FEDCOMP_DATA": "/node/data"},
    ]


def test_a_job_submitted_with_py_modules_of_its_own_ships_none_of_fedcomps(tmp_path, monkeypatch):
    """Ray refuses a driver's ``py_modules`` beside a submitted job's; the job's working directory carries the files."""
    mine = tmp_path / "mine_shipped.py"
    mine.write_text("")
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert shipped([str(mine)]) == [str(mine)]
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://x.zip"}}))
    assert shipped([str(mine)]) == [str(mine)]
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"py_modules": ["gcs://y.zip"]}}))
    assert shipped([str(mine)]) == []


SHIPPED_RUN = """
import sys
from pathlib import Path
import fedcomp
from fedcomp.actors.cluster import connect
from fedcomp.platform.config import load_config

config = load_config(sys.argv[1], overrides={"federation.ray_address": sys.argv[2], "run.rounds": 4,
                                            "run.progress": "none"})
fedcomp.run(config.replace(**{"federation.backend": "local", "run.out": sys.argv[3] + "/local"}))
connect(config.federation.ray_address, modules=config.modules())  # the job's files go to the nodes here
Path(config.modules()[0]).unlink()  # as on a node without the file at its path: imported from what the job took
fedcomp.run(config.replace(**{"run.out": sys.argv[3] + "/ray"}))
"""


@pytest.mark.ray
@pytest.mark.slow
def test_a_users_module_goes_to_the_nodes_with_the_job(two_nodes, tmp_path):
    """Joining a cluster, the run's driver hands the user's module file to Ray (``py_modules``): the actors on both
    nodes import it by name from there when it is not at its path -- the file is deleted once the job has started --,
    with the local backend's numbers."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "shipped_ext.py").write_text((ROOT / "examples" / "extension.py").read_text())
    (mods / "shipped.yaml").write_text((ROOT / "examples" / "extension.yaml").read_text().replace(
        "extension.py", "shipped_ext.py"))
    done = subprocess.run([sys.executable, "-c", SHIPPED_RUN, str(mods / "shipped.yaml"), two_nodes.address,
                           str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_TMPDIR": two_nodes.tmp})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"your modules go to the cluster's nodes with this job: {mods / 'shipped_ext.py'}" in done.stderr
    assert not (mods / "shipped_ext.py").exists()
    (local,), (run_dir,) = (tmp_path / "local").iterdir(), (tmp_path / "ray").iterdir()
    backend = json.loads((run_dir / "run.json").read_text())["backend"]
    assert len(backend["nodes"]) == 2, backend
    pd.testing.assert_frame_equal(metrics(run_dir), metrics(local), check_exact=True)


@pytest.mark.ray
@pytest.mark.slow
def test_a_share_no_node_fits_fails_at_once_saying_what_fits(two_nodes, tmp_path):
    started = time.monotonic()
    done = cli("run", "quickstart", *FAST, "--ray-address", two_nodes.address, "--set", "federation.cpus_per_actor=0.4",
               "--set", "federation.server=actor", "--set", f"run.out={tmp_path}", env={"RAY_TMPDIR": two_nodes.tmp})
    assert done.returncode == 2 and time.monotonic() - started < 120  # not the 120 s actor deadline plus start-up
    assert done.stderr.strip().splitlines() == [
        "fedcomp: error: federation.cpus_per_actor = 0.4: 4 client actors and the server do not fit on 2 nodes with "
        "CPU 1, 1 (an actor lives on one node); use cpus_per_actor <= 0.3333 or 'auto'"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("address", [{}, {"RAY_ADDRESS": "local"}], ids=["no-address", "RAY_ADDRESS=local"])
def test_without_an_address_a_run_starts_its_own_ray_and_never_joins_a_running_cluster(two_nodes, tmp_path, address):
    # RAY_TMPDIR makes the two-node cluster the one Ray's discovery finds (as `ray start` in /tmp/ray would).
    one_actor = ["--set", "federation.clients_per_actor=8", "--set", "federation.server=driver"]  # fewer processes
    done = cli("run", "quickstart", *FAST, *one_actor, "--set", f"run.out={tmp_path}",
               env={"RAY_TMPDIR": two_nodes.tmp, **address})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Connecting to" not in done.stderr and "existing Ray cluster" not in done.stderr
    (run_dir,) = tmp_path.iterdir()
    backend = json.loads((run_dir / "run.json").read_text())["backend"]
    assert not backend["gcs_address"].endswith(f":{two_nodes.port}") and len(backend["nodes"]) == 1
    assert two_nodes.running()  # the cluster is untouched


@pytest.mark.ray
@pytest.mark.slow
def test_a_node_lost_mid_run_is_named_at_once_and_a_node_in_its_place_lets_the_run_finish(tmp_path):
    """The worker node goes (its `ray start` and all under it killed) while the run is paused after a checkpoint: the
    run replaces the actors it held and says, as soon as Ray marks the node dead, that it left and what the
    replacements wait for (it said nothing until the 120 s deadline, and then not why); a node started in its
    place takes them, and the run ends with the local numbers. The head has no CPU, so every actor is on the worker
    node, actor 0 too, which made the restore point: over Ray's 100 KB inline size (dim 4,000), it lived in that
    node's object store, and went with it (the restore failed: ObjectReconstructionFailedError)."""
    cluster = Cluster(head_cpus=0)
    lost = [*FAST, "--set", "federation.clients_per_actor=4", "--set", "task.dim=4000", "--set", "run.rounds=30",
            "--set", "run.checkpoint_every=2", "--set", "task.test_samples=500"]
    err = tmp_path / "stderr.txt"
    try:
        with err.open("w") as stream:
            proc = subprocess.Popen([sys.executable, "-m", "fedcomp", "run", "quickstart", *lost, "--ray-address",
                                     cluster.address, "--set", f"run.out={tmp_path / 'ray'}"], stdout=subprocess.DEVNULL,
                                    stderr=stream, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                                  "RAY_TMPDIR": cluster.tmp})
        try:
            deadline = time.monotonic() + 240
            while not list((tmp_path / "ray").glob("*/checkpoint.pt")) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGSTOP)
            cluster.kill_worker()
            os.kill(proc.pid, signal.SIGCONT)
            while "left the cluster" not in err.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            cluster.add_worker()
            assert proc.wait(timeout=240) == 0, err.read_text()[-3000:]
        finally:
            proc.kill()
    finally:
        cluster.close()
    warned = [line for line in err.read_text().splitlines() if "left the cluster" in line]
    assert len(warned) == 2, err.read_text()[-3000:]
    assert all(re.fullmatch(
        r"fedcomp: warning: round \d+: node [\d.]+ \(id [0-9a-f]{8}\) left the cluster with client actor \d; its "
        r"replacement asks for \{'CPU': 0.5\} and waits up to federation.actor_timeout_s = 120 s for a node with room "
        r"\(available now: CPU=0\)", line) for line in warned), warned
    (run_dir,) = (tmp_path / "ray").iterdir()
    assert {event["actor"] for event in json.loads((run_dir / "run.json").read_text())["actor_replacements"]} == {0, 1}
    local = fedcomp.run("quickstart", {**overrides(lost), "federation.backend": "local", "run.out": str(tmp_path / "local")})
    pd.testing.assert_frame_equal(metrics(run_dir), local.metrics.drop(columns="wall_time"), check_exact=True)


# -- the session's local Ray ----------------------------------------------------------------------------------

@pytest.mark.ray
@pytest.mark.parametrize("server", ["actor", "driver"])
def test_a_replaced_client_actor_is_reported_on_stderr_and_in_run_json(keeping, tmp_path, capsys, monkeypatch, server):
    monkeypatch.setenv("FEDCOMP_FAULT_KILL", "1:4")  # the actor hosting clients 4 to 7 dies in round index 1
    assert main(["run", "quickstart", *FAST, "--set", "federation.backend=ray", "--set", f"federation.server={server}",
                 "--set", "federation.clients_per_actor=4", "--set", f"run.out={tmp_path / 'ray'}"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedcomp:")]
    assert len(lines) == 1 and lines[0].startswith("fedcomp: round 2: client actor 1 (clients 4-7) died ("), lines
    assert lines[0].endswith("); replaced it and re-ran its share of the round")
    (run_dir,) = (tmp_path / "ray").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    (event,) = meta["actor_replacements"]
    assert {k: event[k] for k in ("round", "actor", "clients", "incarnation")} == {
        "round": 2, "actor": 1, "clients": [4, 5, 6, 7], "incarnation": 1}
    monkeypatch.delenv("FEDCOMP_FAULT_KILL")
    local = fedcomp.run("quickstart", {**overrides(FAST), "federation.backend": "local", "run.out": str(tmp_path / "local")})
    pd.testing.assert_frame_equal(metrics(run_dir), local.metrics.drop(columns="wall_time"), check_exact=True)


@pytest.mark.ray
def test_an_error_inside_the_actors_is_the_local_backends_one_line(keeping, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path / "no-data"))  # MNIST is not there
    argv = ["run", "fednest-hr", "--set", "run.rounds=1", "--set", "run.progress=none", "--set", f"run.out={tmp_path / 'out'}"]
    assert main([*argv, "--set", "federation.backend=local"]) == 2
    local = capsys.readouterr().err.strip().splitlines()
    assert main([*argv, "--set", "federation.backend=ray"]) == 2
    remote = capsys.readouterr().err.strip().splitlines()
    assert main([*argv, "--set", "federation.backend=ray", "--set", "federation.server=driver"]) == 2
    in_driver = capsys.readouterr().err.strip().splitlines()
    assert len(local) == 1 and "task.source = 'mnist': MNIST not found" in local[0]
    assert remote == local and in_driver == local
    assert not (tmp_path / "out").exists()


EXPLODING = """
from fedcomp.platform import catalog
from fedcomp.platform.registry import register_algorithm


@register_algorithm("fedavg-exploding")
class Exploding(catalog.algorithm_class("fedavg")):
    def update(self, problem, state, batch, step):
        raise ValueError(f"update exploded at step {step}")
"""


def test_a_bug_in_a_users_algorithm_is_the_same_exception_on_ray_as_on_the_local_backend(ray_session, tmp_path):
    """Ray's wrapper said it in Ray's words (RayTaskError(ValueError), terminal colour codes, 100 lines)."""
    (tmp_path / "exploding.py").write_text(EXPLODING)
    over = {"algorithm.module": str(tmp_path / "exploding.py"), "algorithm.name": "fedavg-exploding",
            "task.name": "synthetic-classification", "run.rounds": 1, "run.progress": "none",
            "run.out": str(tmp_path / "out"), "federation.clients": 4}
    raised = {}
    for backend in ("local", "ray"):
        with pytest.raises(ValueError, match=r"^update exploded at step 0") as error:
            fedcomp.run("quickstart", {**over, "federation.backend": backend})
        raised[backend] = error.value
    assert type(raised["ray"]) is ValueError  # the user's own exception, not Ray's wrapper of it
    where, note = raised["ray"].__notes__
    assert note.startswith("raised in a Ray actor: ") and "update exploded at step 0" in note and "\x1b[" not in note
    assert 'in update' in note  # the actor's traceback, down to the user's line
    # and which program met it: all four clients on the local backend, the actor's two on Ray
    assert raised["local"].__notes__ == ["fedcomp: raised in client program 'local_steps' of algorithm 'fedavg-exploding' "
                                         "on task 'synthetic-classification', round 1, for 4 clients (0, 1, 2, 3)"]
    assert where.startswith("fedcomp: raised in client program 'local_steps' of algorithm 'fedavg-exploding' on task "
                            "'synthetic-classification', round 1, for 2 clients (")


@pytest.mark.ray
def test_errors_are_unwrapped_through_nested_actors(ray_session):
    import ray

    from fedcomp.actors.federation import wait_ready
    from fedcomp.platform.errors import ConfigError

    @ray.remote(num_cpus=0)
    class Inner:
        def ready(self):
            raise ConfigError("task.root = '/nowhere': no data there")

    @ray.remote(num_cpus=0)
    class Outer:
        def __init__(self):
            self.inner = Inner.remote()

        def ready(self):
            return wait_ready([self.inner], ["inner"], 60)

    outer = Outer.remote()
    with pytest.raises(ConfigError, match=r"^task.root = '/nowhere': no data there$"):
        wait_ready([outer], ["outer"], 60)


def test_auto_means_the_cluster_ray_start_recorded_not_any_ray_running_here(tmp_path, monkeypatch):
    """Ray's own ``auto`` joins any Ray it finds running on the machine when ``ray start`` recorded none (another
    user's session, a test's private one): fedcomp's reads only what ``ray start`` wrote."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where Ray keeps the address `ray start` recorded
    with pytest.raises(ResourceError, match=r"^federation.ray_address = 'auto': no cluster started with `ray start` "
                                            r"on this machine; give its HOST:PORT, .* \(none is recorded in "
                                            + re.escape(str(tmp_path / "ray" / "ray_current_cluster"))
                                            + r", where `ray start` writes it unless given --temp-dir\)$"):
        probe("auto")
    (tmp_path / "ray").mkdir()
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    with pytest.raises(ResourceError, match=rf"^federation.ray_address = 'auto': cannot reach 127.0.0.1:{port} "):
        probe("auto", timeout=2)
