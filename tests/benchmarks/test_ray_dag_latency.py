"""``benchmarks/ray_dag_latency.py``: it times a round trip by every way it compares (calls, a compiled graph, the
actors' group), on today's API."""

from __future__ import annotations

import sys

import pytest
import ray_dag_latency

pytestmark = pytest.mark.ray


def test_every_transport_is_timed(ray_session, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ray_dag_latency.py", "--calls", str(ray_dag_latency.BLOCK)])
    monkeypatch.setattr(ray_dag_latency, "IDLE_S", 0.2)
    ray_dag_latency.main()
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "x |" in line]
    assert [r[1].strip() for r in rows] == ["ordinary actor calls", "compiled graph", "actors' group, one exchange step"]
    assert all(float(r[2]) > 0 for r in rows)
