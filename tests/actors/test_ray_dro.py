"""The FedDRO family and the DRO baselines on a real local Ray: the same numbers bit for bit as the local
backend with partial cohorts (clients that join late), and after an actor dies in the middle of an exchange.
One and two clients per actor with full cohorts: the conformance suite (tests/platform/test_conformance.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import fedcomp
from fedcomp.actors.collective import FAULT_JOIN
from fedcomp.actors.server_actor import RayServer
from fedcomp.backends import make_server
from fedcomp.platform.config import load_config

pytestmark = pytest.mark.ray

COMPOSITION = {"name": "heterogeneous-composition", "heterogeneity": 1.0}
CLASSIFICATION = {"name": "dro-classification", "dataset": "breast-cancer", "objective": "chi2", "lam": 2.0}


@pytest.mark.parametrize(
    "algorithm, task, extra, per_round",
    [
        ("feddro", COMPOSITION, {"local_steps": 3, "lr": 0.3}, 3),
        ("fedavg-co-shared-y", COMPOSITION, {"local_steps": 2, "lr": 0.3}, None),
        ("fedavg-co-1", COMPOSITION, {"local_steps": 2, "lr": 0.3}, 3),
        ("fedavg-co-2", COMPOSITION, {"local_steps": 2, "lr": 0.3}, 3),
        ("gcivr", COMPOSITION, {"lr": 0.3, "outer_batch": 4, "init": "code", "refresh_every": 2}, None),
        ("parallel-mbsgd", COMPOSITION, {"lr": 0.3}, 3),
        ("parallel-fastdro", CLASSIFICATION, {"lr": 0.05, "outer_batch": 8}, 3),
        ("parallel-pdsgd", CLASSIFICATION, {"lr": 0.05, "outer_batch": 8}, 3),
    ],
)
def test_same_numbers_on_local_and_ray(keeping, tmp_path, algorithm, task, extra, per_round):
    raw = {"task": task, "algorithm": {"name": algorithm, **extra},
           "federation": {"clients": 4, "clients_per_round": per_round, "backend": "local"},
           "run": {"rounds": 3, "progress": "none", "out": str(tmp_path)}}
    local = fedcomp.run(raw).metrics.drop(columns="wall_time")
    on_ray = fedcomp.run(raw, {"federation.backend": "ray", "federation.clients_per_actor": 2})
    pd.testing.assert_frame_equal(on_ray.metrics.drop(columns="wall_time"), local, rtol=0, atol=0)
    assert local["comm_rounds"].iloc[-1] == 3


def test_a_group_that_cannot_form_leaves_the_exchanges_to_calls(keeping, monkeypatch, tmp_path, capfd):
    """Client actors that cannot meet at the group's rendezvous (fault injected: joining fails) make the run's
    exchanges by calls, with the same numbers, after one warning that says so."""
    raw = {"task": COMPOSITION, "algorithm": {"name": "feddro", "local_steps": 3, "lr": 0.3},
           "federation": {"clients": 4, "clients_per_actor": 2, "backend": "local"},
           "run": {"rounds": 2, "progress": "none", "out": str(tmp_path)}}
    local = fedcomp.run(raw)
    monkeypatch.setenv(FAULT_JOIN, "1")
    on_ray = fedcomp.run(raw, {"federation.backend": "ray", "federation.server": "driver"})
    pd.testing.assert_frame_equal(on_ray.metrics.drop(columns="wall_time"), local.metrics.drop(columns="wall_time"),
                                  rtol=0, atol=0)
    warnings = [line for line in capfd.readouterr().err.splitlines() if "could not form a process group" in line]
    assert len(warnings) == 1 and FAULT_JOIN in warnings[0] and "by actor calls" in warnings[0], warnings


def test_collective_exchanges_give_the_local_numbers_with_idle_actors_and_on_kept_actors(keeping, tmp_path):
    """``federation.transport: collective``: the actors average each step of FedDRO's exchange among themselves.
    With 3 of 4 clients per round in 4 actors, one actor has no member each round and only takes part in the
    gathers; the next run takes two of those actors, kept, which leave their 4-actor group for a 2-actor one.
    Both runs give the local backend's rows and final state bit for bit."""
    raw = {"task": COMPOSITION, "algorithm": {"name": "feddro", "local_steps": 3, "lr": 0.3, "beta": 0.4},
           "federation": {"clients": 4, "clients_per_round": 3, "backend": "local"},
           "run": {"rounds": 3, "progress": "none", "out": str(tmp_path)}}
    local = fedcomp.run(raw)
    for per_actor in (1, 2):
        on_ray = fedcomp.run(raw, {"federation.backend": "ray", "federation.server": "actor", "federation.transport": "collective",
                                   "federation.clients_per_actor": per_actor})
        backend = json.loads((on_ray.run_dir / "run.json").read_text())["backend"]
        assert (backend["transport"], backend["client_actors"]) == ("collective", 4 // per_actor)
        pd.testing.assert_frame_equal(on_ray.metrics.drop(columns="wall_time"), local.metrics.drop(columns="wall_time"),
                                      rtol=0, atol=0)
    assert local.metrics["embedding_exchanges"].iloc[-1] == 1 + 3 * 3  # the initial estimate, then I = 3 per round


@pytest.mark.parametrize(
    "clients, per_actor, kill, transport",
    [
        (2, 1, "1:1:0:0", "calls"),  # round 1, client 1's actor, as the exchange begins
        (2, 1, "1:1:0:3", "calls"),  # ... at its last answer (the step that saves the clients' state)
        (4, 2, "0:2:1:2", "calls"),  # round 0 (after the initial estimate, call 0), clients 2-3's actor, mid-exchange
        (2, 1, "1:1:0:3", "graph"),  # the compiled graph breaks for every actor: survivors' replies are fetched
        (4, 2, "0:2:1:2", "graph"),
        (2, 1, "1:1:0:2", "collective"),  # mid-exchange: the survivor's gather fails; the exchange runs again by calls
        (2, 1, "1:1:0:3", "collective"),  # after the last gather: the survivor finished; the dead actor's share replays
        (4, 2, "0:2:1:0", "collective"),  # as its exchange begins, the other actor waiting in the first gather
    ],
)
def test_an_actor_killed_mid_exchange_is_replaced_and_replays_to_the_same_bits(
    keeping, monkeypatch, clients, per_actor, kill, transport
):
    """The replacement re-creates its clients' generators from their saved state (x_prev) and replays the
    means logged so far; the run then goes on as if nothing had happened -- by actor calls (the server in the
    driver's process here; with the server actor: test_ray_backend.py), and through a compiled graph
    (``federation.transport: graph``, the server actor), which is rebuilt over the replacement, and with the actors
    averaging each step among themselves (``transport: collective``), whose group is rebuilt likewise. Each case
    has two client actors: a replacement and a survivor."""
    raw = {"task": COMPOSITION, "algorithm": {"name": "feddro", "local_steps": 3, "lr": 0.3, "beta": 0.4},
           "federation": {"clients": clients, "clients_per_actor": per_actor, "backend": "local"},
           "run": {"rounds": 3, "progress": "none"}}
    local = make_server(load_config(raw))
    expected = [local.run_round() for _ in range(3)]
    reference = local.checkpoint()
    monkeypatch.setenv("FEDCOMP_FAULT_KILL", kill)
    server = RayServer(load_config(raw, {"federation.backend": "ray", "federation.transport": transport,
                                         "federation.server": "driver" if transport == "calls" else "actor"}))
    try:
        rows = [server.run_round() for _ in range(3)]
        got = server.checkpoint()
        assert server.restarts() == 1
    finally:
        server.close()
    assert rows == expected  # counters and losses, exactly
    for key in ("x", "y"):
        torch.testing.assert_close(got["state"][key], reference["state"][key], rtol=0, atol=0)
    for client, state in reference["private"].items():
        torch.testing.assert_close(got["private"][client]["x_prev"], state["x_prev"], rtol=0, atol=0)
