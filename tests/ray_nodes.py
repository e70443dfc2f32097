"""A real two-node Ray cluster on loopback for the tests whose subject is placement or a cluster's own entry
points: two `ray start` processes (head and worker, 1 CPU each) on free ports and a temp folder of their own,
so the test session's Ray is left alone, stopped by their process groups."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Cluster:
    """Two `ray start` processes (head and worker, 1 CPU each) on their own ports and temp dir.

    ``dashboard`` gives the head its dashboard and job agent, at :attr:`jobs` (``ray job submit --address``); a
    cluster without them starts faster and costs less CPU while it idles. ``head_cpus = 0`` puts every actor on the
    worker node.
    """

    def __init__(self, dashboard: bool = False, head_cpus: int = 1) -> None:
        if not Path(RAY).is_file():
            pytest.skip("the ray command is not installed next to this Python")
        self.tmp = tempfile.mkdtemp(prefix="fcr", dir="/tmp")  # short: Ray's socket paths have a length limit
        # the venv's commands on PATH: a job's entrypoint (`fedcomp ...`) runs in the head's environment
        # A node that goes is marked dead after 3 missed health checks 0.5 s apart (Ray's default: 5, 3 s apart).
        # The head's Ray Client server starts a server process for each connecting driver; now and then (3 of ~16
        # first connects in one session's tries, 2 of 4 in another's) that process dies as it starts, with empty logs, and the driver reconnects once
        # the server has waited for its channel: 10 s here (Ray's default: 30 s; such a process answers in 3 s).
        self.env = {**os.environ, "RAY_TMPDIR": self.tmp, "RAY_AUTH_MODE": "disabled",
                    "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
                    "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "10",
                    "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        self.env.pop("RAY_ADDRESS", None)
        self.procs: list[subprocess.Popen] = []
        self.jobs = ""
        self.port = 0
        self.client = ""
        self.head_cpus = head_cpus
        self._start_until_up(lambda: self._start(head=True, dashboard=dashboard), self._answers, "the head's GCS port")
        self.address = f"127.0.0.1:{self.port}"
        self._start_until_up(lambda: self._start(head=False), self._joined, "the second node")

    def _start_until_up(self, start, ready, what: str, attempts: int = 3) -> None:
        """``start()`` a node and wait until ``ready()``; where its `ray start` exits first -- one of the ports it was
        given taken meanwhile: they are free when picked, not reserved, and other tests start Rays beside this one
        --, start it again on other ports, up to ``attempts`` times."""
        for attempt in range(attempts):
            start()
            if self._wait(ready, what, fail=attempt == attempts - 1):
                return
            self.procs.pop().wait()  # exited: its group has nothing left to stop

    def _start(self, head: bool, dashboard: bool = False) -> None:
        """Start a node's `ray start` on fresh ports (the head's GCS port becomes :attr:`port`)."""
        ports = free_ports(10)
        while any(ports[2] <= port <= ports[2] + 60 for i, port in enumerate(ports) if i != 2):
            ports = free_ports(10)  # Ray refuses a component port inside the worker ports' range
        args = [RAY, "start", "--block", "--num-cpus", str(self.head_cpus if head else 1), "--num-gpus", "0", "--node-ip-address", "127.0.0.1",
                "--object-manager-port", str(ports[0]), "--node-manager-port", str(ports[1]),
                "--min-worker-port", str(ports[2]), "--max-worker-port", str(ports[2] + 60),
                "--dashboard-agent-listen-port", str(ports[3]), "--dashboard-agent-grpc-port", str(ports[4]),
                "--runtime-env-agent-port", str(ports[5]), "--metrics-export-port", str(ports[6]),
                "--object-store-memory", str(100 * 1024**2), "--disable-usage-stats"]
        if head:
            self.port = ports[7]
            self.client = f"ray://127.0.0.1:{ports[8]}"  # the head's Ray Client server
            args += ["--head", "--port", str(ports[7]), "--ray-client-server-port", str(ports[8]),
                     "--temp-dir", str(Path(self.tmp) / "ray")]  # RAY_TMPDIR's default
            if dashboard:
                args += ["--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port",
                         str(ports[9])]
                self.jobs = f"http://127.0.0.1:{ports[9]}"
            else:
                args += ["--include-dashboard", "false"]
        else:
            args += ["--address", f"127.0.0.1:{self.port}"]
        log = open(self._log(len(self.procs)), "w")  # noqa: SIM115 (the node's stdout for its life)
        self.procs.append(subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def _joined(self) -> bool:
        """Whether the worker's `ray start` reports that it joined the head."""
        return "Ray runtime started" in self._log(len(self.procs) - 1).read_text()

    def _log(self, index: int) -> Path:
        return Path(self.tmp) / f"start-{index}.log"

    def kill_worker(self) -> None:
        """Kill the worker node: its `ray start` and everything it started (its raylet, its actors), as a machine that
        goes away."""
        worker = self.procs.pop(1)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()

    def add_worker(self) -> None:
        """Start a worker node (in place of one killed)."""
        self._start_until_up(lambda: self._start(head=False), self._joined, "a new worker node")

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def _wait(self, ready, what: str, timeout: float = 240, fail: bool = True) -> bool:
        """Wait until ``ready()``: True; False where the last node's `ray start` exited first and not ``fail``;
        else stop the cluster and fail the test, quoting the end of that node's output."""
        deadline = time.monotonic() + timeout
        exited = False
        while time.monotonic() < deadline:
            if ready():
                return True
            if any(p.poll() is not None for p in self.procs):
                exited = True
                break
            time.sleep(1)
        if exited and not fail and self.procs[-1].poll() is not None and all(p.poll() is None for p in self.procs[:-1]):
            return False
        tail = self._log(len(self.procs) - 1).read_text()[-1500:]
        self.close()
        pytest.fail(f"the test cluster did not bring up {what}; the last node's `ray start` said:\n{tail}")

    def stop(self) -> None:
        """Stop the two `ray start` processes (and what they started, their process groups) by their PIDs: a
        graceful stop took about 35 s here, so after a short grace the groups are killed."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []

    def close(self) -> None:
        """Stop the nodes and remove their temp folder."""
        self.stop()
        subprocess.run(["rm", "-rf", self.tmp], check=False)
