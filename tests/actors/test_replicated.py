"""``federation.server: replicated`` on a real local Ray: a client actor that dies mid-run (in a call, or between the
answers of an exchange) is replaced, every replica goes back to the last checkpoint and the run ends with the local
backend's numbers, bit for bit, the user told; an error a replica's client program raises reaches the user as raised.
Parity with the local backend for every registered algorithm is in ``tests/platform/test_conformance.py``."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import ray

import fedcomp
from fedcomp.actors.collective import FAULT_JOIN
from fedcomp.actors.replicas import SLOWEST_COMPUTE
from fedcomp.actors.replicated_server import ReplicatedServer
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.server import Server
from tests.conftest import small

pytestmark = pytest.mark.ray

ACC = {"algorithm.name": "acc-fcsg-m", "federation.clients": 8, "federation.clients_per_actor": 4, "run.rounds": 6,
       "run.checkpoint_every": 3}
"""Acc-FCSG-M keeps each client's previous iterate on its actor: a replacement must get it back from the checkpoint."""
FEDDRO = {"task": {"name": "heterogeneous-composition"}, "algorithm": {"name": "feddro", "local_steps": 4, "lr": 0.3},
          "federation": {"clients": 6, "clients_per_actor": 3, "backend": "local"},
          "run": {"rounds": 4, "checkpoint_every": 2, "progress": "none"}}
"""FedDRO exchanges y at every local step (``fed.exchange``): each answer is one gather of the replicas."""


def _metrics(result) -> pd.DataFrame:
    return result.metrics.drop(columns="wall_time")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["call", "exchange", "checkpoint"])
def test_an_actor_killed_mid_run_is_replaced_and_the_run_ends_with_the_local_numbers(
    keeping, tmp_path, monkeypatch, capfd, caplog, case
):
    """A client actor killed mid-run (in a call, at an exchange, as a checkpoint is gathered) is replaced and the run
    ends with the local backend's numbers, with nothing of the failed calls on stderr but the one line (Ray prints an
    error object no one read as its reference goes)."""
    if case == "call":  # the actor of clients 4..7 exits in round index 4, after the checkpoint of round 3
        raw, overrides, kill = "quickstart", small(**ACC, **{"run.out": str(tmp_path)}), "4:4"
    elif case == "checkpoint":  # it exits as round 6's checkpoint is gathered (the third: round 0's is the first),
        # the rounds done (a node gone then failed the run with Ray's ActorUnavailableError)
        raw, overrides, kill = "quickstart", small(**ACC, **{"run.out": str(tmp_path)}), "ckpt3:4"
    else:  # the actor of clients 3..5 exits in round index 3 at the second answer of its exchange
        raw, overrides, kill = FEDDRO, {"run.out": str(tmp_path)}, "3:3:0:2"
    reference = _metrics(fedcomp.run(raw, overrides))
    monkeypatch.setenv("FEDCOMP_FAULT_KILL", kill)
    capfd.readouterr()
    result = fedcomp.run(raw, {**overrides, "federation.backend": "ray", "federation.server": "replicated"})
    pd.testing.assert_frame_equal(_metrics(result), reference, check_exact=True)
    meta = json.loads((result.run_dir / "run.json").read_text())
    assert meta["backend"]["server"] == "replicated" and meta["backend"]["transport"] == "collective"  # as the config says it
    (event,) = meta["actor_replacements"]
    restored = 2 if case == "exchange" else 3
    assert event["actor"] == 1 and event["rerun"] == (
        f"restored every replica of the server to round {restored} and re-ran the rounds since")
    err = capfd.readouterr().err
    assert f"client actor 1 (clients {3 if case == 'exchange' else 4}-" in err
    assert "Unhandled error" not in caplog.text + err, caplog.text


@pytest.mark.slow
def test_an_actor_that_dies_while_the_group_forms_again_is_replaced_too(keeping, tmp_path, monkeypatch, capsys):
    """The actor of clients 4..7 dies in round index 4; as the group forms again, the other (clients 0..3) dies at
    its second joining: both are replaced, each counting against ``federation.max_retries``, and the run ends with
    the local backend's numbers; with one retry allowed, the second death ends the run in one line."""
    overrides = small(**ACC, **{"run.out": str(tmp_path)})
    reference = _metrics(fedcomp.run("quickstart", overrides))
    monkeypatch.setenv("FEDCOMP_FAULT_KILL", "4:4,join2:0")
    capsys.readouterr()
    result = fedcomp.run("quickstart", {**overrides, "federation.backend": "ray", "federation.server": "replicated"})
    pd.testing.assert_frame_equal(_metrics(result), reference, check_exact=True)
    events = json.loads((result.run_dir / "run.json").read_text())["actor_replacements"]
    assert [event["actor"] for event in events] == [1, 0]
    err = capsys.readouterr().err
    assert "client actor 1 (clients 4-" in err and "client actor 0 (clients 0-" in err
    with pytest.raises(fedcomp.ClientFailure, match=r"^client actors \[0\] died in round 5, after 1 replacing; "
                                                      r"federation.max_retries = 1; round 3 is checkpointed"):
        fedcomp.run("quickstart", {**overrides, "federation.backend": "ray", "federation.server": "replicated",
                                   "federation.max_retries": 1})


def test_an_error_a_replica_meets_reaches_the_user_as_raised(ray_session):
    """PDSGD's round program checks its dual weights against the task's examples: restored from a checkpoint of the
    wrong size, every replica raises the local backend's ConfigError, which reaches the user as it was raised (not
    wrapped in Ray's error), and the server is told apart from a dead actor (no replacement)."""
    raw = {"task": {"name": "dro-classification", "dataset": "breast-cancer"},
           "algorithm": {"name": "parallel-pdsgd", "outer_batch": 4},
           "federation": {"clients": 3, "clients_per_actor": 2, "backend": "ray", "server": "replicated"},
           "run": {"rounds": 2, "progress": "none"}}
    server = ReplicatedServer(load_config(raw))
    try:
        server.run_round()
        checkpoint = server.checkpoint()
        state = dict(checkpoint["state"])
        (dual,) = (k for k in state if k != "x")
        state[dual] = state[dual][:-1]
        server.restore({**checkpoint, "state": state})
        with pytest.raises(ConfigError, match="the stored dual weights have"):
            server.run_round()
        assert server.restarts() == 0
    finally:
        server.close()


def test_actors_that_cannot_form_a_group_run_the_server_in_the_driver_after_one_warning(
    keeping, monkeypatch, tmp_path, capfd
):
    """Client actors that cannot meet at the group's rendezvous (fault injected: joining fails) cannot hold replicas
    of the server: the run goes on with the server in the driver (no process more to place, say in a Tune trial's
    bundles), the same numbers, after one warning that says so; run.json records the server the run had."""
    raw = {"task": FEDDRO["task"], "algorithm": {"name": "feddro", "local_steps": 3, "lr": 0.3},
           "federation": {"clients": 4, "clients_per_actor": 2, "backend": "local"},
           "run": {"rounds": 2, "progress": "none", "out": str(tmp_path)}}
    local = fedcomp.run(raw)
    monkeypatch.setenv(FAULT_JOIN, "1")
    capfd.readouterr()
    on_ray = fedcomp.run(raw, {"federation.backend": "ray", "federation.server": "replicated"})
    pd.testing.assert_frame_equal(_metrics(on_ray), _metrics(local), check_exact=True)
    err = capfd.readouterr().err.splitlines()
    warnings = [line for line in err if "the server cannot be replicated on the client actors here" in line]
    assert len(warnings) == 1 and FAULT_JOIN in warnings[0] and "runs in the driver" in warnings[0], err
    assert not [line for line in err if "could not form a process group for collective exchanges" in line]
    backend = json.loads((on_ray.run_dir / "run.json").read_text())["backend"]
    assert (backend["server"], backend["transport"]) == ("driver", "calls")


def test_the_profile_counts_each_calls_slowest_actor_beside_each_replicas_own_phases(ray_session):
    """Every replica learns, with each call's answer, the most seconds any actor computed on it: a round's overhead is
    then measured over that, as with a server actor (``benchmarks/profile_round.py``), and it is not a phase (the
    driver's wait is what the phases leave of its time)."""
    raw = {"task": FEDDRO["task"], "algorithm": {"name": "feddro", "local_steps": 3, "lr": 0.3},
           "federation": {"clients": 4, "clients_per_actor": 2, "backend": "ray", "server": "replicated"},
           "run": {"rounds": 3, "progress": "none"}}
    server = ReplicatedServer(load_config(raw))
    try:
        for _ in server.run_rounds([False] * 3):
            pass
        replicas = ray.get([actor.replica_profile.remote() for actor in server.actors.actors])
        assert len({p[SLOWEST_COMPUTE] for p in replicas}) == 1, replicas  # every replica heard the same
        assert replicas[0][SLOWEST_COMPUTE] >= max(p["actor compute (this replica)"] for p in replicas) > 0
        phases = server.profile()
        spent = sum(s for k, s in phases.items() if k not in (SLOWEST_COMPUTE, "driver waiting for replica 0"))
        assert phases["driver waiting for replica 0"] == pytest.approx(server.driver_s - spent)
        assert phases["server round program"] >= 0
    finally:
        server.close()


def test_a_caller_that_stops_taking_replies_early_finds_the_server_at_its_last_reply(keeping):
    """The replicas run a call's rounds back to back, ahead of the caller: one that stops after the first reply of
    four (a diverged run, an API user's loop that breaks) then reads the state of round 1, not of round 4, and the
    rounds after it are the in-process server's, bit for bit."""
    config = load_config("quickstart", small(**{"federation.backend": "ray", "federation.server": "replicated",
                                                "federation.clients_per_actor": 2, "algorithm.name": "fcsg-m"}))
    local = Server(config.replace(**{"federation.backend": "local"}), LocalFederation)
    expected = [local.one_round(evaluate)[:2] for evaluate in (False, False, True, False)]
    server = ReplicatedServer(config)
    try:
        abandoned = server.run_rounds([False] * 4)
        first, _, _ = next(abandoned)
        abandoned.close()
        assert server.checkpoint()["counters"]["round"] == 1
        got = [(first, None), *((record, metrics) for record, metrics, _ in server.run_rounds([False, True, False]))]
        assert got == expected  # the evaluation of round 3 too
        assert [record["round"] for record, _ in got] == [1, 2, 3, 4] and server.round == 4

        left = server.run_rounds([False] * 3)
        next(left)
        del left  # dropped without close(): the same
        assert server.evaluate() == local.one_round(True)[1]
        assert server.checkpoint()["counters"]["round"] == 5
    finally:
        server.close()
