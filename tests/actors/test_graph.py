"""``federation.transport: graph`` (``fedcomp/actors/graph.py``): a compiled Ray graph carries the calls whose
payload travels inline, with the numbers of ordinary calls bit for bit; larger payloads still go by calls; an
error raised in a client program comes through it; and kept actors leave one graph for the next run's.
Fault recovery through the graph (an actor killed mid-exchange): ``test_ray_dro.py``; every registered
algorithm on it: the conformance suite (``tests/platform/test_conformance.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedcomp.actors.federation import INLINE_BYTES, RayFederation
from fedcomp.backends import make_server
from fedcomp.platform.config import load_config
from fedcomp.platform.server import Server

pytestmark = pytest.mark.ray

LOCAL_STEPS = 3


def feddro(dim: int, **federation: Any) -> dict[str, Any]:
    return {"task": {"name": "heterogeneous-composition", "dim": dim, "heterogeneity": 1.0},
            "algorithm": {"name": "feddro", "local_steps": LOCAL_STEPS, "lr": 0.3, "beta": 0.4},
            "federation": {"clients": 4, "clients_per_actor": 2, "backend": "local", **federation},
            "run": {"rounds": 2, "progress": "none"}}


def counted(federation: RayFederation) -> dict[str, int]:
    """Counts of the federation's steps, and of those that went through the graph, as it runs."""
    counts = {"steps": 0, "graph": 0}
    step, through_graph = federation._step, federation._collect_graph

    def counting_step(*args: Any, **kwargs: Any) -> Any:
        counts["steps"] += 1
        return step(*args, **kwargs)

    def counting_graph(*args: Any, **kwargs: Any) -> Any:
        counts["graph"] += 1
        return through_graph(*args, **kwargs)

    federation._step, federation._collect_graph = counting_step, counting_graph  # type: ignore[method-assign]
    return counts


@pytest.mark.parametrize("dim, all_by_graph", [(10, True), (INLINE_BYTES // 4 + 1_000, False)])
def test_the_graph_gives_the_local_numbers_and_carries_only_inline_payloads(keeping, dim, all_by_graph):
    raw = feddro(dim)
    local = make_server(load_config(raw))
    expected = [local.run_round() for _ in range(2)]
    reference = local.checkpoint()
    server = Server(load_config(raw, {"federation.backend": "ray", "federation.server": "actor", "federation.transport": "graph"}), RayFederation)
    counts = counted(server.federation)  # type: ignore[arg-type]
    try:
        rows = [server.run_round() for _ in range(2)]
        got = server.checkpoint()
        assert server.describe()["transport"] == "graph"
    finally:
        server.close()
    assert rows == expected
    for key in ("x", "y"):
        torch.testing.assert_close(got["state"][key], reference["state"][key], rtol=0, atol=0)
    for client, state in reference["private"].items():  # private state came back through the graph's replies
        torch.testing.assert_close(got["private"][client]["x_prev"], state["x_prev"], rtol=0, atol=0)
    if all_by_graph:
        assert counts["graph"] == counts["steps"] > 0
    else:  # the model (over 100 KB) goes by calls; the per-step answers (y, 2 floats) through the graph
        assert 0 < counts["graph"] < counts["steps"]


def test_an_error_in_a_client_program_comes_through_the_graph_which_then_goes_on(keeping):
    raw = feddro(10)
    expected = make_server(load_config(raw)).run_round()
    server = Server(load_config(raw, {"federation.backend": "ray", "federation.server": "actor", "federation.transport": "graph"}), RayFederation)
    try:
        with pytest.raises(KeyError, match="'y'") as raised:  # a broadcast without FedDRO's y, as the local backend raises
            server.federation.call("no_such_program", 0, [0, 1, 2, 3], {"x": torch.zeros(10)})  # type: ignore[attr-defined]
        where, traceback = raised.value.__notes__  # which program met it, and the actor's traceback
        assert where.startswith("fedcomp: raised in client program 'no_such_program' of algorithm 'feddro'")
        assert "in graph_step" in traceback
        assert server.run_round() == expected
    finally:
        server.close()


def test_kept_actors_go_from_one_runs_graph_to_the_next(keeping):
    """An actor takes part in one compiled graph at a time: each run tears its graph down before handing its actors
    on, so graph, calls and graph again on the same processes give the same numbers."""
    raw = feddro(10)
    expected = [make_server(load_config(raw)).run_round() for _ in range(1)]
    pids = []
    for transport in ("graph", "calls", "graph"):
        server = Server(load_config(raw, {"federation.backend": "ray", "federation.server": "actor", "federation.transport": transport}), RayFederation)
        try:
            pids.append(sorted(p["pid"] for p in server.federation.placement))  # type: ignore[attr-defined]
            assert [server.run_round()] == expected
        finally:
            server.close()
    assert pids[0] == pids[1] == pids[2]  # the same kept processes
