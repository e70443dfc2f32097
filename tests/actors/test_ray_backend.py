"""The Ray backend on a real local Ray: same numbers as the local backend for any packing, actor death
and retry, and GPU/CPU request planning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
import torch

import fedcomp
from fedcomp.actors.cluster import plan_actors
from fedcomp.actors.server_actor import RayServer
from fedcomp.platform.config import FederationConfig, load_config
from fedcomp.platform.errors import ConfigError, ResourceError
from tests.conftest import GPU_PRESENT, NEEDS_TORCH_COMPILE, record_routing, small

pytestmark = pytest.mark.ray


def metrics(result) -> pd.DataFrame:
    return result.metrics.drop(columns="wall_time")


# -- the local numbers, on actors kept from one run (and test) to the next --------------------------------------

@pytest.mark.slow
def test_same_numbers_on_local_and_ray_for_even_and_uneven_packings_and_either_server(keeping, tmp_path):
    """Bit for bit, the training loss included: clients packed 3 + 3 + 2 with the server in the driver's process,
    then 4 + 4 with the server actor (one client per actor: the conformance suite)."""
    base = small(**{"federation.clients": 8, "run.out": str(tmp_path), "algorithm.name": "acc-fcsg-m"})
    reference = metrics(fedcomp.run("quickstart", base))
    for per_actor, server in ((3, "driver"), (4, "actor")):
        ray_run = fedcomp.run("quickstart", {**base, "federation.backend": "ray", "federation.clients_per_actor": per_actor,
                                             "federation.server": server})
        pd.testing.assert_frame_equal(metrics(ray_run), reference, check_exact=True)


FEDAVG = {"name": "fedavg", "lr": 0.05, "local_steps": 2, "outer_batch": 8}
ROUNDED_OPTIONS = {
    "fused_sgd": ({"name": "synthetic-classification", "features": 32, "hidden": [320, 300], "test_samples": 200},
                  FEDAVG),
    "torch_compile": ({"name": "synthetic-classification", "features": 8, "classes": 3, "hidden": [16],
                       "test_samples": 100}, FEDAVG),
    "torch_compile, compositional": (
        {"name": "sinewave", "hidden": 8, "shots": 3, "queries": 3, "eval_tasks": 3, "eval_queries": 5, "eval_steps": 1},
        {"name": "local-scgdm", "local_steps": 2},
    ),
}
"""The options equal to the exact run up to float32 rounding, each with a task and algorithm it changes: ``fused_sgd``
on a network large enough to be stepped in place (110k weights), ``torch_compile`` on a small MLP and on MAML's
sinewave with Local-SCGDM (g's compiled forward and backward, grad f)."""


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(case, marks=[NEEDS_TORCH_COMPILE] if "torch_compile" in case else [])
                                  for case in ROUNDED_OPTIONS])
def test_an_option_that_rounds_otherwise_gives_the_local_numbers_on_ray_for_any_packing_and_server(
    keeping, tmp_path, case
):
    """``federation.fused_sgd`` and ``federation.torch_compile``: the same final weights, bit for bit, on the local
    backend, with the server replicated on actors packed 3 + 1 and with the server actor, 2 + 2 -- and not the exact
    run's (the option ran; the metrics alone would not tell: they agree to their last digit). Every other case takes
    the two packings in the other order, so that its first Ray run takes the actors the case before kept: a new
    packing starts new actor processes, each importing torch (and, to compile, torch's compiler)."""
    from fedcomp.platform.results import CHECKPOINT, read_checkpoint

    option = case.split(",")[0]
    task, algorithm = ROUNDED_OPTIONS[case]
    raw = {"task": task, "algorithm": algorithm,
           "federation": {"clients": 4, "backend": "local", option: True},
           "run": {"rounds": 2, "checkpoint_every": 2, "progress": "none", "out": str(tmp_path)}}

    def final_weights(result) -> torch.Tensor:
        return read_checkpoint(result.run_dir / CHECKPOINT)["server"]["state"]["x"]

    reference = fedcomp.run(raw)
    weights = final_weights(reference)
    exact = fedcomp.run(raw, {f"federation.{option}": False})
    assert not torch.equal(final_weights(exact), weights)  # the option ran: other roundings
    torch.testing.assert_close(final_weights(exact), weights, rtol=1e-5, atol=1e-6)
    packings = ((3, "replicated"), (2, "actor"))
    if list(ROUNDED_OPTIONS).index(case) % 2:
        packings = packings[::-1]
    for per_actor, server in packings:
        ray_run = fedcomp.run(raw, {"federation.backend": "ray", "federation.clients_per_actor": per_actor,
                                    "federation.server": server})
        assert torch.equal(final_weights(ray_run), weights), (per_actor, server)
        pd.testing.assert_frame_equal(metrics(ray_run), metrics(reference), check_exact=True)


@pytest.mark.smoke
def test_partial_participation_same_on_ray(keeping, tmp_path):
    base = small(**{"federation.clients": 12, "federation.clients_per_round": 5, "run.out": str(tmp_path),
                    "algorithm.name": "fcsg-m"})
    reference = metrics(fedcomp.run("quickstart", base))
    ray_run = fedcomp.run("quickstart", {**base, "federation.backend": "ray", "federation.clients_per_actor": 6})
    pd.testing.assert_frame_equal(metrics(ray_run), reference, check_exact=True)


def test_a_run_interrupted_on_one_backend_resumes_on_another_to_the_same_numbers(keeping, tmp_path, monkeypatch):
    """A run whose cluster went continues on the local backend (or on another cluster, or packed otherwise): resume
    takes the settings that leave the numbers unchanged, and only those."""
    from fedcomp.platform.server import Server

    real = Server.run_round

    def power_cut_in_round_4(self):
        if self.counters.round == 3:
            raise RuntimeError("power cut")
        return real(self)

    base = small(**{"run.out": str(tmp_path / "cut"), "run.rounds": 5, "run.checkpoint_every": 2,
                    "algorithm.name": "acc-fcsg-m"})  # private client state, in the checkpoint
    whole = metrics(fedcomp.run("quickstart", {**base, "run.out": str(tmp_path / "whole")}))
    monkeypatch.setattr(Server, "run_round", power_cut_in_round_4)
    with pytest.raises(RuntimeError, match="power cut"):
        fedcomp.run("quickstart", base)
    monkeypatch.setattr(Server, "run_round", real)
    [run_dir] = (tmp_path / "cut").iterdir()
    with pytest.raises(ConfigError, match=r"^fedcomp.resume\('.*'\): setting algorithm.lr: only settings that leave "
                                          r"the numbers unchanged may change; allowed: federation.backend, "):
        fedcomp.resume(run_dir, {"algorithm.lr": 0.5})
    resumed = fedcomp.resume(run_dir, {"federation.backend": "ray", "federation.clients_per_actor": 2,
                                       "run.progress": "none"})
    pd.testing.assert_frame_equal(metrics(resumed), whole, check_exact=True)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["config"]["federation"]["backend"] == "ray" and meta["status"] == "completed"


@pytest.mark.parametrize("name, private", [("fcsg-m", False), ("acc-fcsg-m", True)])
def test_balanced_routing_spreads_clients_without_private_state_and_keeps_every_number(keeping, name, private):
    """A cohort of 4 from 8 clients hosted 4 + 4: FCSG-M's clients (nothing private) run 2 + 2 on any actor,
    Acc-FCSG-M's (each keeps its previous iterate x_prev) where their state is; both give the local numbers bit for bit,
    checkpoints included."""
    from fedcomp.actors.federation import RayFederation
    from fedcomp.platform.server import Server

    over = small(**{"algorithm.name": name, "federation.clients": 8, "federation.clients_per_round": 4,
                    "run.rounds": 4})
    local = fedcomp.api.make_server(load_config("quickstart", over))
    expected = [{k: v for k, v in local.run_round().items() if k != "wall_time"} for _ in range(4)]
    server = Server(load_config("quickstart", {**over, "federation.backend": "ray", "federation.clients_per_actor": 4}),
                    RayFederation)
    router = server.federation.router
    calls = record_routing(server)
    try:
        got = [{k: v for k, v in server.run_round().items() if k != "wall_time"} for _ in range(4)]
        checkpoint = server.checkpoint()
    finally:
        server.close()
    assert got == expected
    want = local.checkpoint()
    assert torch.equal(checkpoint["state"]["x"], want["state"]["x"])
    assert sorted(checkpoint["private"]) == sorted(want["private"])
    for client, state in want["private"].items():
        assert all(torch.equal(checkpoint["private"][client][k], v) for k, v in state.items())
    moved = [c for members in calls for i, clients in members.items() for c in clients if c // 4 != i]
    if private:
        assert router.stateful and not router.free and not moved
        assert sorted(router.holder) == sorted(want["private"])
    else:
        assert router.free and not router.holder and not want["private"] and moved
        assert all(sorted(map(len, members.values())) == [2, 2] for members in calls[1:])


@pytest.mark.slow
def test_fednest_sub_rounds_same_on_ray(keeping, tmp_path):
    raw = {"task": {"name": "minimax-quadratic"}, "algorithm": {"name": "fednest", "inner_steps": 3, "local_steps": 2},
           "federation": {"clients": 12, "clients_per_round": 5, "backend": "local"},
           "run": {"rounds": 3, "progress": "none", "out": str(tmp_path)}}
    reference = metrics(fedcomp.run(raw))
    ray_run = fedcomp.run(raw, {"federation.backend": "ray", "federation.clients_per_actor": 6})
    pd.testing.assert_frame_equal(metrics(ray_run), reference, check_exact=True)
    assert reference["comm_rounds"].tolist() == [0, 4, 8, 12]  # minimax: 2T + 2 per epoch (no FedIHGP)


def test_fednest_code_variant_private_counters_same_on_ray(keeping, tmp_path):
    # ihgp: code keeps each client's Neumann counter as private state on its actor across sub-rounds
    over = {"algorithm.name": "fednest", "algorithm.ihgp": "code", "algorithm.inner_steps": 2,
            "algorithm.neumann_terms": 3, "federation.clients": 6, "federation.clients_per_round": 3,
            "federation.backend": "local", "task.per_client": 40, "task.hidden": 20, "run.rounds": 2,
            "run.eval_every": 1, "run.progress": "none", "run.out": str(tmp_path)}
    reference = metrics(fedcomp.run("fednest-hr-offline", over))
    ray_run = fedcomp.run("fednest-hr-offline", {**over, "federation.backend": "ray", "federation.clients_per_actor": 3})
    pd.testing.assert_frame_equal(metrics(ray_run), reference, check_exact=True)
    assert reference["comm_rounds"].tolist() == [0, 8, 16]  # 2T + N + 3 per epoch


def test_round_profile_phases_add_up_to_the_drivers_round_time(keeping):
    from fedcomp.actors.federation import PHASES

    server = RayServer(load_config("quickstart", small(**{"federation.backend": "ray", "federation.clients_per_actor": 2})))
    try:
        started = time.perf_counter()
        for _ in range(3):
            server.run_round()
        elapsed = time.perf_counter() - started
        phases = server.profile()
    finally:
        server.close()
    assert list(phases) == [*PHASES, "server round program", "driver -> server actor call"]
    assert phases["actor compute (slowest actor)"] > 0 and phases["submit actor calls"] > 0
    assert sum(phases.values()) == pytest.approx(elapsed, rel=0.05)


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_rewinding_to_before_a_clients_first_round_forgets_its_later_private_state(keeping, backend):
    """Local SGDM averaging the model only keeps each client's momentum buffer from its first round on; restoring
    the round-0 checkpoint (no buffers) into the same live clients must leave them with none, so the rounds
    repeat exactly rather than starting from the momentum of the rounds undone."""
    from fedcomp.actors.federation import RayFederation
    from fedcomp.platform.server import Server

    config = load_config({
        "task": {"name": "synthetic-classification", "hidden": [8], "test_samples": 50},
        "algorithm": {"name": "local-sgdm", "average": "model", "lr": 0.1, "local_steps": 3, "outer_batch": 8},
        "federation": {"clients": 4, "backend": backend, "clients_per_actor": 2},
        "run": {"progress": "none"},
    })
    server = Server(config, RayFederation) if backend == "ray" else fedcomp.api.make_server(config)
    try:
        start = server.checkpoint()
        assert start["private"] == {}
        first = [{k: v for k, v in server.run_round().items() if k != "wall_time"} for _ in range(2)]
        assert sorted(server.checkpoint()["private"]) == [0, 1, 2, 3]
        server.restore(start)
        assert server.federation.private_states() == {}
        again = [{k: v for k, v in server.run_round().items() if k != "wall_time"} for _ in range(2)]
    finally:
        server.close()
    assert again == first


@pytest.mark.slow
def test_vectorised_clients_on_one_actor_match_the_local_vectorised_run(keeping, tmp_path):
    # last of its section: one client actor is a new shape of run, whose start kills the kept actors of two
    base = small(**{"run.out": str(tmp_path), "federation.vectorise": True, "algorithm.name": "acc-fcsg-m"})
    local = metrics(fedcomp.run("quickstart", base))
    on_ray = metrics(fedcomp.run("quickstart", {**base, "federation.backend": "ray", "federation.clients_per_actor": 4}))
    pd.testing.assert_frame_equal(on_ray, local, rtol=0, atol=0)  # same clients in lockstep together: same bits


# -- planning and placement -------------------------------------------------------------------------------------

def test_gpu_request_on_a_cluster_without_gpus_fails_at_once(ray_session, tmp_path, capsys):
    from fedcomp.cli import main

    code = main(["run", "quickstart", "--set", f"run.out={tmp_path}", "--set", "federation.gpus_per_client=0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        "fedcomp: error: federation.gpus_per_client = 0.5 needs 8 GPUs for 16 clients but the cluster has no GPUs; "
        "use federation.gpus_per_client = 0 or 'auto'"
    ]
    assert list(tmp_path.iterdir()) == []


def test_more_client_actors_than_the_memory_holds_fail_at_once(ray_session, tmp_path, capsys):
    from fedcomp.cli import main

    code = main(["run", "quickstart", "--set", f"run.out={tmp_path}", "--set", "federation.clients=10000",
                 "--set", "federation.clients_per_actor=1"])
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err.startswith("fedcomp: error: federation.clients = 10000 with clients_per_actor = 1 makes 10000 client "
                          "actors, each a process that imports torch (at least 100 MiB of its own: 976.6 GiB in all)")
    assert err.endswith("use federation.clients_per_actor = 'auto' (2 actors here) or a larger number")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "fed, cluster, expected",
    [
        (dict(clients=16, clients_per_actor=1, server="actor"), {"CPU": 2.0}, dict(groups=16, cpus=0.1176, gpus_per_client=0.0)),
        (dict(clients=16, clients_per_actor=1), {"CPU": 2.0}, dict(groups=16, cpus=0.125, gpus_per_client=0.0)),  # no server actor
        (dict(clients=16, clients_per_actor=8, server="actor"), {"CPU": 2.0, "GPU": 2.0},
         dict(groups=2, cpus=0.6666, gpus_per_client=0.125)),
        (dict(clients=16, clients_per_actor=8, server="driver"), {"CPU": 2.0, "GPU": 2.0},
         dict(groups=2, cpus=1.0, gpus_per_client=0.125)),
        (dict(clients=4), {"CPU": 16.0, "GPU": 8.0}, dict(groups=4, cpus=1.0, gpus_per_client=1.0)),
        (dict(clients=10, clients_per_actor=4, gpus_per_client=0.25), {"CPU": 4.0, "GPU": 4.0},
         dict(groups=3, cpus=1.0, gpus_per_client=0.25)),
        (dict(clients=8, clients_per_actor=1, gpus_per_client=0, server="actor"), {"CPU": 8.0, "GPU": 1.0},
         dict(groups=8, cpus=0.8888, gpus_per_client=0.0)),
    ],
)
def test_plan_actors(fed, cluster, expected):
    plan = plan_actors(FederationConfig(**fed), cluster)
    assert len(plan.groups) == expected["groups"]
    assert plan.cpus == pytest.approx(expected["cpus"], abs=1e-4)
    assert plan.gpus_per_client == pytest.approx(expected["gpus_per_client"])
    assert sorted(c for g in plan.groups for c in g) == list(range(fed["clients"]))
    if plan.gpus_per_client:
        assert plan.resources(0)["GPU"] == pytest.approx(plan.gpus_per_client * len(plan.groups[0]))
    else:
        assert "GPU" not in plan.resources(0)


@pytest.mark.parametrize(
    "fed, cluster, needle",
    [
        (dict(clients=16, gpus_per_client=1), {"CPU": 8.0, "GPU": 2.0}, "needs 16 GPUs for 16 clients but the cluster has 2"),
        (dict(clients=4, gpus_per_client=0.75, clients_per_actor=2), {"CPU": 8.0, "GPU": 4.0}, "asks one actor for 1.5 GPUs"),
        (dict(clients=16, clients_per_actor=1, cpus_per_actor=1, server="actor"), {"CPU": 4.0},
         "cpus_per_actor = 1 needs 17 CPUs for 16 client actors and the server but the cluster has 4"),
        (dict(clients=16, clients_per_actor=1, cpus_per_actor=1), {"CPU": 4.0}, "cpus_per_actor = 1 needs 16 CPUs for 16 client actors but"),
        (dict(clients=100_000, clients_per_actor=1), {"CPU": 2.0}, "too many for 2 CPUs; raise federation.clients_per_actor"),
    ],
)
def test_plan_actors_names_the_shortfall(fed, cluster, needle):
    with pytest.raises(ResourceError, match=needle):
        plan_actors(FederationConfig(**fed), cluster)


@pytest.mark.slow
@pytest.mark.skipif(GPU_PRESENT, reason="a CPU-only Ray declaring GPUs; on a GPU machine the real one is there")
def test_actors_are_scheduled_on_declared_gpus(tmp_path):
    """A separate CPU-only Ray that declares 2 GPUs: actors get GPU ids and compute on the CPU; a shortfall is
    named; ``gpu_packing: auto`` schedules its probe on a GPU, finds no CUDA there and says so in one line."""
    script = textwrap.dedent(
        f"""
        import ray, fedcomp
        from fedcomp.actors.server_actor import RayServer
        from fedcomp.platform.config import load_config
        ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, object_store_memory=100 * 1024**2)
        over = {small(**{"federation.clients": 8, "federation.clients_per_actor": 4, "federation.backend": "ray",
                         "federation.server": "driver"})!r}
        server = RayServer(load_config("quickstart", over))
        placement = server.placement()
        server.close()
        print("PLACEMENT", sorted((len(p["gpu_ids"]), p["device"]) for p in placement))
        for key, value in (("federation.gpus_per_client", 0.5), ("federation.gpu_packing", "auto")):
            try:
                RayServer(load_config("quickstart", {{**over, key: value}}))
            except fedcomp.ResourceError as error:
                print("ERROR", error)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    # 'auto' gives each of the 2 actors (4 clients x 0.25 GPU) one whole GPU; CUDA is absent, so CPU compute
    assert "PLACEMENT [(1, 'cpu'), (1, 'cpu')]" in out.stdout
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERROR")]
    assert errors == ["ERROR federation.gpus_per_client = 0.5 needs 4 GPUs for 8 clients but the cluster has 2; "
                      "use federation.gpus_per_client = 0 or 'auto'",
                      "ERROR federation.gpu_packing = 'auto' measures a client on a GPU, but none is visible here"]


# -- fresh actors: another process on this cluster, actors that die ---------------------------------------------

@pytest.mark.slow
def test_cli_joins_an_existing_cluster(ray_session, tmp_path):
    """`fedcomp run --ray-address` from another process runs on this session's cluster, not a new one."""
    address = ray_session.get_runtime_context().gcs_address
    args = [sys.executable, "-m", "fedcomp", "run", "quickstart", "--ray-address", address,
            "--set", f"run.out={tmp_path}", "--set", "run.rounds=2", "--set", "run.progress=none",
            "--set", "federation.clients=4", "--set", "algorithm.local_steps=5", "--set", "task.test_samples=2000"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = tmp_path.iterdir()
    backend = json.loads((run_dir / "run.json").read_text())["backend"]
    assert backend["name"] == "ray" and backend["gcs_address"] == address and backend["client_actors"] == 2  # auto: one a CPU of the 2
    assert fedcomp.load_results(run_dir)["round"].max() == 2


@pytest.mark.slow
def test_killed_client_actor_is_replaced_and_its_round_retried(keeping, monkeypatch):
    over = small(**{"federation.clients": 8, "federation.clients_per_actor": 4, "algorithm.name": "acc-fcsg-m",
                    "run.rounds": 4})
    local = fedcomp.api.make_server(load_config("quickstart", over))
    for _ in range(4):
        local.run_round()
    expected = local.checkpoint()

    # The actor hosting clients 4..7 exits (a real process death) in round index 2, after it has private
    # state (Acc-FCSG-M's x_prev) from rounds 0 and 1 that its replacement must get back.
    monkeypatch.setenv("FEDCOMP_FAULT_KILL", "2:4")
    server = RayServer(load_config("quickstart", {**over, "federation.backend": "ray"}))
    try:
        for _ in range(4):
            server.run_round()
        got = server.checkpoint()
        assert server.restarts() == 1
    finally:
        server.close()
    for key in ("x", "u"):
        torch.testing.assert_close(got["state"][key], expected["state"][key], rtol=0, atol=0)
    for client, state in expected["private"].items():
        torch.testing.assert_close(got["private"][client]["x_prev"], state["x_prev"], rtol=0, atol=0)
    assert got["counters"] == expected["counters"]


@pytest.mark.slow
def test_actor_killed_between_per_step_exchanges_catches_up_by_replay(keeping, tmp_path, monkeypatch):
    """FedDRO keeps its per-step private state (x_local, x_prev) only on the actor; a replacement gets the
    last saved state and replays the round's earlier per-step calls, then the round goes on identically."""
    raw = {"task": {"name": "heterogeneous-composition"}, "algorithm": {"name": "feddro", "local_steps": 4, "lr": 0.3},
           "federation": {"clients": 6, "clients_per_actor": 3, "backend": "local"},
           "run": {"rounds": 3, "progress": "none", "out": str(tmp_path)}}
    reference = metrics(fedcomp.run(raw))
    monkeypatch.setenv("FEDCOMP_FAULT_KILL", "1:3:0:2")  # round 1, the actor of clients 3..5, exchange 0, at its second answer
    server = RayServer(load_config(raw, {"federation.backend": "ray"}))
    try:
        rows = [server.run_round() for _ in range(3)]
        assert server.restarts() == 1
        final = server.evaluate()
    finally:
        server.close()
    assert final["grad_norm_sq"] == reference["grad_norm_sq"].iloc[-1]
    assert rows[-1]["embedding_exchanges"] == reference["embedding_exchanges"].iloc[-1]


DRIVER_WITHOUT_TORCH = """
import sys
import fedcomp
server = sys.argv[2]
result = fedcomp.run("quickstart", {"federation.backend": "ray", "federation.server": server, "run.rounds": 3,
                                    "run.checkpoint_every": 2, "run.progress": "none", "run.out": sys.argv[1]})
print(int(result.final["round"]), (result.run_dir / "checkpoint.pt").is_file(), "torch" in sys.modules)
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("server", ["replicated", "actor"])
def test_a_ray_runs_driver_imports_no_torch(tmp_path, server):
    """Its checkpoints saved where the server's state lives, the driver handles numbers and bytes: torch's CUDA
    build would hold ~330 MiB of it (the memory target, benchmarks/MEMORY_REPLICATED.md)."""
    done = subprocess.run([sys.executable, "-c", DRIVER_WITHOUT_TORCH, str(tmp_path), server], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["3", "True", "False"]
