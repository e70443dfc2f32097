"""The driver's proxy to the server actor (:class:`~fedcomp.actors.server_actor.RayServer`): pipelined rounds."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import fedcomp
from fedcomp.actors.server_actor import RayServer
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.server import Server
from tests.conftest import small, unraisable_hooks_in_a_fresh_worker

pytestmark = pytest.mark.ray


@pytest.mark.slow
def test_run_rounds_keeps_the_next_round_queued_one_round_ahead_with_the_in_process_numbers(keeping):
    config = load_config("quickstart", small(**{"federation.backend": "ray", "federation.clients_per_actor": 2,
                                                "algorithm.name": "fcsg-m"}))
    local = Server(config.replace(**{"federation.backend": "local"}), LocalFederation)
    server = RayServer(config)
    try:
        replies = server.run_rounds([False, True, False])
        first = next(replies)
        # round 2 was submitted before round 1's reply was handed out: a call made now runs after it
        assert server.checkpoint()["counters"]["round"] == 2
        got = [(record, metrics) for record, metrics, _ in [first, *replies]]
        expected = [local.one_round(evaluate)[:2] for evaluate in (False, True, False)]
        assert got == expected  # bit for bit, the evaluation too
        assert [record["round"] for record, _ in got] == [1, 2, 3] and got[1][1] is not None

        abandoned = server.run_rounds([False] * 4)
        next(abandoned)
        abandoned.close()  # a caller that stops early (a diverged run, a trial Tune stops)
        assert server.checkpoint()["counters"]["round"] == 5  # one round on from the last reply taken, no more
        assert server.model_finite()
    finally:
        server.close()


def test_actor_processes_import_neither_pandas_nor_pyarrow():
    """A client or server actor's process loads torch and Ray but not the results' frame libraries (tens of MiB
    each; benchmarks/IMPORT_MEMORY.md): the driver writes the results."""
    import subprocess
    import sys

    code = ("import sys, fedcomp.actors.client_actor, fedcomp.actors.server_actor; "
            "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]"]


@pytest.mark.slow
def test_the_server_and_client_actors_processes_drop_lost_exits(keeping):
    """Their processes leave out the traceback of a SIGTERM that lands in a weakref callback
    (:mod:`fedcomp.actors.quiet_exit`); the driver keeps Python's reports."""
    import sys

    import ray

    config = load_config("quickstart", small(**{"federation.backend": "ray", "federation.clients_per_actor": 2,
                                                "algorithm.name": "fcsg-m"}))
    server = RayServer(config)
    try:
        def hook(actor: object) -> str:
            return type(sys.unraisablehook).__name__

        clients = ray.get(server.actor.__ray_call__.remote(lambda actor: actor.server.federation.actors))
        hooks = ray.get([a.__ray_call__.remote(hook) for a in [server.actor, *clients]])
        assert len(hooks) == 3 and set(hooks) == {"DropLostExits"}
        assert type(sys.unraisablehook).__name__ != "DropLostExits"
    finally:
        server.close()


def test_loading_the_actor_modules_in_a_worker_drops_lost_exits_before_any_constructor_runs(ray_session):
    """Ray may stop an actor's process with SIGTERM while it still builds the actor (a killed run's replacement)."""
    for module in ("fedcomp.actors.client_actor", "fedcomp.actors.server_actor"):
        before, after = unraisable_hooks_in_a_fresh_worker(ray_session, module)
        assert before != "DropLostExits" and after == "DropLostExits", module


ACC = {"algorithm.name": "acc-fcsg-m", "federation.clients": 8, "federation.clients_per_actor": 4, "run.rounds": 8,
       "run.checkpoint_every": 3}
"""Acc-FCSG-M keeps each client's previous iterate on its client actor: a new server actor's get it back from the
checkpoint."""


@pytest.mark.slow
@pytest.mark.parametrize(("kill", "lines"), [
    ("server4", ["round 4: the server actor died (Worker unexpectedly exits with a connection error code 2); started "
                 "another, with new client actors, from round 3's checkpoint, and re-ran the rounds since"]),
    ("server1,3:4", ["round 1: the server actor died (Worker unexpectedly exits with a connection error code 2); "
                     "started another, with new client actors, from the start, and re-ran the rounds since",
                     "round 4: client actor 1 (clients 4-7) died (Worker unexpectedly exits with a connection error "
                     "code 2); replaced it and re-ran its share of the round"]),
])
def test_a_server_actor_that_dies_is_started_again_and_the_run_ends_with_the_local_numbers(
    keeping, tmp_path, monkeypatch, capsys, kill, lines
):
    """Its process exits as it is asked for round 4 (after round 3's checkpoint), or round 1 (before any checkpoint;
    a client actor of the new one dies in round 4 too): another server actor, with new client actors, goes back to
    the checkpoint the driver holds (or the start) and runs the rounds since again; the user is told, run.json
    keeps it, and the numbers are the local backend's. It stopped the run (ActorLost: resume by hand)."""
    reference = fedcomp.run("quickstart", small(**ACC, **{"run.out": str(tmp_path / "local")}))
    monkeypatch.setenv("FEDCOMP_FAULT_KILL", kill)
    capsys.readouterr()
    result = fedcomp.run("quickstart", small(**ACC, **{"run.out": str(tmp_path / "ray"), "federation.backend": "ray",
                                                       "federation.server": "actor"}))
    pd.testing.assert_frame_equal(result.metrics.drop(columns="wall_time"), reference.metrics.drop(columns="wall_time"),
                                  check_exact=True)
    told = [line.removeprefix("fedcomp: ") for line in capsys.readouterr().err.splitlines() if line.startswith("fedcomp:")]
    assert told == lines
    events = json.loads((result.run_dir / "run.json").read_text())["actor_replacements"]
    assert [(event["round"], event["actor"]) for event in events] == [
        (int(line.split(":")[0].split()[1]), "server" if "server" in line else 1) for line in lines]


@pytest.mark.slow
def test_a_server_actor_that_dies_once_more_than_max_retries_allows_is_one_line(ray_session):
    """Killed with ``federation.max_retries = 0`` (no new one): :class:`ActorLost`, whose line the runner completes
    with how to resume, not Ray's traceback -- in a pipelined stretch of rounds and in a single call alike."""
    import ray

    from fedcomp.platform.errors import ActorLost

    server = RayServer(load_config("quickstart", small(**{"federation.backend": "ray", "federation.clients_per_actor": 2,
                                                          "federation.server": "actor", "federation.max_retries": 0})))
    try:
        next(server.run_rounds([False]))
        ray.kill(server.actor)
        expected = r"^federation.server = 'actor': the server actor died \(.+\); the server's state lived there$"
        with pytest.raises(ActorLost, match=expected):
            list(server.run_rounds([False, False]))
        with pytest.raises(ActorLost, match=expected):
            server.checkpoint()
    finally:
        server.close()
