"""Actors kept between the runs of one process (:mod:`fedcomp.actors.kept`, what a Tune trial process does for
its next trial): the next run takes the same processes, rebuilt from its own config, with the numbers of a run
on fresh actors (the local backend's, bit for bit); a dead kept actor is not taken."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from fedcomp.actors.server_actor import RayServer
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.server import Server
from tests.conftest import small

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "extension.py"

pytestmark = pytest.mark.ray


def config(server: str, seed: int, lr: float):
    return load_config("quickstart", small(**{
        "federation.backend": "ray", "federation.server": server, "federation.clients_per_actor": 2,
        "algorithm.name": "acc-fcsg-m", "algorithm.lr": lr, "run.seed": seed}))


def run(server: str, seed: int, lr: float, rounds: int) -> tuple[dict, list[int], object]:
    """``rounds`` rounds on a fresh RayServer: its checkpoint, its client actors' process ids and its server
    actor (None in the driver)."""
    ray_server = RayServer(config(server, seed, lr))
    try:
        for _ in range(rounds):
            ray_server.run_round()
        return ray_server.checkpoint(), [p["pid"] for p in ray_server.placement()], ray_server.actor
    finally:
        ray_server.close()


def assert_same_checkpoint(got: dict, expected: dict) -> None:
    assert got["state"].keys() == expected["state"].keys()
    for key, value in expected["state"].items():
        assert torch.equal(got["state"][key], value), key
    for client, state in expected["private"].items():
        for key, value in state.items():
            assert torch.equal(got["private"][client][key], value), (client, key)
    assert got["counters"] == expected["counters"]


@pytest.mark.slow
def test_the_next_run_takes_the_kept_processes_with_the_numbers_of_fresh_ones(ray_session, keeping):
    _, first_pids, first_server = run("actor", seed=1, lr=0.05, rounds=1)
    on_kept, kept_pids, kept_server = run("actor", seed=2, lr=0.02, rounds=3)
    assert kept_pids == first_pids and len(set(first_pids)) == 2
    # the server actor was kept too, and its own process kept the client actors
    assert kept_server._actor_id == first_server._actor_id
    # the reference: the same run in process (the Ray backend on fresh actors gives these bits, tested elsewhere)
    local = Server(config("actor", seed=2, lr=0.02).replace(**{"federation.backend": "local"}), LocalFederation)
    for _ in range(3):
        local.run_round()
    assert_same_checkpoint(on_kept, local.checkpoint())


@pytest.mark.slow
def test_a_kept_actor_that_died_is_not_taken_and_kept_clients_serve_a_server_in_the_driver(ray_session, keeping):
    _, pids, _ = run("driver", seed=1, lr=0.05, rounds=1)
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _running(pids[0]):
        time.sleep(0.1)
    _, later, _ = run("driver", seed=1, lr=0.05, rounds=1)  # a fresh process replaces the dead kept one
    assert pids[0] not in later and pids[1] in later and len(set(later)) == 2


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
def test_runs_in_a_keep_actors_block_take_each_others_actors_and_the_block_kills_them_at_its_end(ray_session, tmp_path):
    """``fedcomp.keep_actors()``: the Python API's way to what a sweep's trial process does between its runs."""
    import fedcomp
    from fedcomp.actors import kept

    kept.keep_between_runs(False)  # from here, only what this test keeps
    over = small(**{"federation.backend": "ray", "federation.clients_per_actor": 2, "run.out": str(tmp_path)})
    with fedcomp.keep_actors():
        fedcomp.run("quickstart", over)
        first = [actor for idle in kept._kept.values() for actor in idle]
        second = fedcomp.run("quickstart", {**over, "run.seed": 1})
        again = [actor for idle in kept._kept.values() for actor in idle]
    assert len(first) == 2 and {a._actor_id for a in again} == {a._actor_id for a in first}
    assert not kept.keeping() and not kept._kept
    deadline = time.monotonic() + 30
    for actor in first:  # killed when the block ended; ray.kill is asynchronous, so a call just after may still land
        while True:
            try:
                ray_session.get(actor.__ray_ready__.remote(), timeout=30)
            except ray_session.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, "an actor kept in the block still answers 30 s after it ended"
            time.sleep(0.05)
    local = fedcomp.run("quickstart", {**over, "run.seed": 1, "federation.backend": "local"})
    assert second.metrics.drop(columns="wall_time").equals(local.metrics.drop(columns="wall_time"))


@pytest.mark.slow
def test_an_edited_module_is_noted_once_by_the_driver_not_again_by_each_kept_actor(ray_session, keeping, tmp_path, capfd):
    """Each kept actor imports the edited file again as the driver does; Ray forwarded each one's note too, seconds
    later, sometimes after the run's result line."""
    import fedcomp

    module = tmp_path / "kept_task.py"
    module.write_text(EXAMPLE.read_text().replace('"least-squares"', '"least-squares-kept"')
                      .replace('"fedavg-hb"', '"fedavg-hb-kept"'))
    config = {"task": {"name": "least-squares-kept", "module": str(module), "dim": 10, "rows": 200},
              "algorithm": {"name": "fedavg-hb-kept", "module": str(module), "lr": 0.05}}
    over = {"run.rounds": 2, "federation.clients": 4, "federation.clients_per_round": 4, "run.progress": "none",
            "run.track": "none", "run.out": str(tmp_path), "federation.backend": "ray", "federation.clients_per_actor": 2}
    first = fedcomp.run(config, over)
    module.write_text(module.read_text() + "# edited\n")
    capfd.readouterr()
    second = fedcomp.run(config, over)
    time.sleep(3)  # Ray forwards a worker's output to the driver within a second or so
    notes = [line for line in capfd.readouterr().err.splitlines() if "changed since this process imported it" in line]
    assert notes == [f"fedcomp: note: {module} changed since this process imported it; imported again"]
    assert second.metrics.drop(columns="wall_time").equals(first.metrics.drop(columns="wall_time"))  # a comment


SHUT_DOWN_BETWEEN = """
import ray, fedcomp
over = {"run.rounds": 2, "federation.clients": 4, "task.test_samples": 2000, "run.progress": "none",
        "run.track": "none", "run.out": "out"}
with fedcomp.keep_actors():
    first = fedcomp.run("quickstart", over)
    ray.shutdown()  # the kept actors' handles now name a session that is gone
    second = fedcomp.run("quickstart", over)
print("SAME", first.metrics.drop(columns="wall_time").equals(second.metrics.drop(columns="wall_time")))
"""


@pytest.mark.slow
def test_actors_kept_in_a_ray_session_the_user_shut_down_are_dropped_not_an_error(tmp_path):
    """The user's ``ray.shutdown()`` inside ``keep_actors()``: the next run starts fresh actors on a new Ray and the
    block ends quietly (both raised Ray's ``ActorHandleNotFoundError``)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", SHUT_DOWN_BETWEEN], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SAME True" in done.stdout
