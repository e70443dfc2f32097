"""Joining or starting a Ray cluster, and sizing actor resource requests to fit the cluster's nodes.

Without an address fedcomp starts its own local Ray (``address="local"``), never one that ``ray start``
left on the machine; with one (``federation.ray_address``, ``--ray-address`` or ``$RAY_ADDRESS``) it checks
that the address answers within seconds before handing it to Ray, which would otherwise retry for minutes.

Ray waits forever for resources that do not exist, so every request is checked against the cluster's alive
nodes first -- one actor must fit on one node, so totals are not enough -- and a shortfall fails at once with
a message that names it and says what would fit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ray

from fedcomp.actors.quiet import quiet_ray_start
from fedcomp.platform import catalog
from fedcomp.platform.config import Config, FederationConfig, load_config
from fedcomp.platform.errors import ConfigError, ResourceError, first_line, shortened
from fedcomp.platform.gpu_packing import Footprint, pick_clients_per_actor
from fedcomp.platform.progress import announce
from fedcomp.platform.signals import depends_on, stop_on_sigterm

GRANULARITY = 1e-4  # Ray's smallest fractional resource unit
ACTOR_MEMORY_FLOOR = 100 * 2**20
"""Bytes of its own that any client actor holds at the least: a Ray worker that has imported torch (about 290 MiB
private with the CUDA build, 16 actors of quickstart here; about 210 MiB of PSS with the CPU build,
benchmarks/MEMORY_CPU_TORCH.md). A plan of more actors than the cluster's memory holds at this floor cannot start."""
UNITS = 10_000  # resource amounts in units of GRANULARITY, so that fitting is integer arithmetic
PROBE_TIMEOUT_S = 5.0
GCS_EVERY_S = 0.1
"""How often a watch of the cluster (:func:`answering`) connects to its GCS; its daemons' processes are read each time."""


def connect(address: str | None = None, worker_log_level: str | None = None, modules: Sequence[str] = ()) -> dict[str, float]:
    """Join ``address`` (or ``$RAY_ADDRESS``) if given, reuse an initialised Ray, else (or for ``local``, Ray's
    name for it) start a fresh local one.

    ``worker_log_level`` (e.g. ``"WARNING"``) quiets the Python logging of this job's Ray workers (Tune's
    per-trial INFO lines), where this call starts the Ray session. ``modules``: the user's modules the job's
    processes import (:meth:`~fedcomp.platform.config.Config.modules`); joining a cluster, their files go to its
    nodes with the job (:func:`shipped`). Returns the cluster's total resources.

    Raises:
        ResourceError: the address is malformed, does not answer within seconds, or Ray refuses it.
    """
    field = "federation.ray_address"
    if not address and os.environ.get("RAY_ADDRESS"):
        field, address = "RAY_ADDRESS", os.environ["RAY_ADDRESS"]
    if address:
        parse_address(address, field)  # a malformed address fails even where Ray is already up
        if address.strip() == "local":
            address = None
    with _STARTING:  # two runs started at once from threads of one process: one starts Ray, the other joins it
        if ray.is_initialized():
            _same_cluster(address, field)
        elif threading.current_thread() is not threading.main_thread():
            raise ResourceError(
                "federation.backend = 'ray': Ray starts from the main thread (it sets signal handlers there, and one "
                "started from another left its agents running after the script ended); start it there first -- a "
                "first run, or ray.init() -- and runs in threads join it")
        else:
            _start_or_join(address, field, worker_log_level, modules)
    return dict(ray.cluster_resources())


_STARTING = threading.Lock()


def through_ray_client() -> bool:
    """Whether this process reaches its cluster through a Ray Client connection (``ray://HOST:PORT``): its driver
    cannot wait on an actor's streamed results, nor build a compiled graph."""
    from ray.util.client import ray as client

    return bool(client.is_connected())


def _same_cluster(address: str | None, field: str) -> None:
    """Check that the Ray this process is connected to already is the one ``address`` names (None: any).

    Raises:
        ResourceError: it is another: Ray joins one cluster a process, and a run would have gone to the first one.
    """
    if not address or through_ray_client() or ray.get_runtime_context().worker.mode != ray.SCRIPT_MODE:
        return  # a Ray Client's driver (no GCS address to compare), or a Ray worker (a trial, an actor): on its job's
        # cluster, however the config names it
    current = ray.get_runtime_context().gcs_address
    if _names(address, current):
        return
    raise ResourceError(f"{field} = {address!r}: this process is connected to the Ray at {current} already (an earlier "
                        f"run's, or your ray.init()), and Ray joins one cluster a process; call ray.shutdown() first, "
                        f"or drop the address")


def _names(address: str, gcs_address: str) -> bool:
    """Whether ``address`` (``HOST:PORT``, ``auto``) names the Ray whose GCS is at ``gcs_address``; a ``ray://``
    address never does (a Ray Client connection is not a GCS connection)."""
    if address.strip() == "auto":
        from ray._private.utils import read_ray_address

        address = read_ray_address() or ""
    target = parse_address(address) if address and not address.strip().startswith("ray://") else None
    here = parse_address(gcs_address)
    if target is None or here is None or target[1] != here[1]:
        return False
    try:
        wanted, current = socket.gethostbyname(target[0]), socket.gethostbyname(here[0])
    except OSError:
        return False
    return wanted == current or (wanted.startswith("127.") and _is_local(current))


def _is_local(ip: str) -> bool:
    """Whether ``ip`` is an address of this machine (a node's IP seen from it, e.g. a loopback-joined head)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def _start_or_join(address: str | None, field: str, worker_log_level: str | None, modules: Sequence[str]) -> None:
    """Join ``address``, or start a fresh local Ray (None); then watch it (:func:`answering`)."""
    kwargs: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.WARNING, configure_logging=True)
    if worker_log_level:
        kwargs["logging_config"] = ray.LoggingConfig(log_level=worker_log_level)
    quiet_ray_start()
    started = time.perf_counter()
    if address:
        address = probe(address, field)  # one that cannot be a Ray head fails in one line, before anything is said
        announce(f"connecting to Ray at {address} ...")
        carried = shipped(modules)
        if carried:
            kwargs["runtime_env"] = {"py_modules": carried}
            announce(f"your modules go to the cluster's nodes with this job: {', '.join(carried)}")
        try:
            with warnings.catch_warnings():  # Ray Client's own "connection timed out" warning before its error
                warnings.simplefilter("ignore", UserWarning)
                try:
                    ray.init(address=address, **kwargs)
                except ConnectionAbortedError as aborted:
                    # A Ray Client server's session that failed to start answers the client's Init with nothing
                    # ("Initialization failure from server:"), its next one starting as it should: once more.
                    if not str(aborted).startswith("Initialization failure from server"):
                        raise
                    ray.shutdown()
                    announce("the cluster's Ray Client server did not start this job's session (it answered with an "
                             "empty failure, as where the session is slower to start than it waits); trying once more")
                    time.sleep(1.0)
                    ray.init(address=address, **kwargs)
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as error:
            raise ResourceError(f"{field} = {address!r}: Ray could not join that cluster: {first_line(error)}"
                                f"{_which_port(address, field)}") from None
    else:
        # "local": a new instance even when `ray start` left a cluster on this machine (a bare ray.init()
        # would join the latest one, and die with it).
        announce("starting local Ray ...")
        before = _descendants()
        try:
            with idle_daemons_not_started():
                ray.init(address="local", **kwargs)
        except BaseException:  # Ctrl-C while it starts: what it started so far goes with it, its agents included
            _stop_partial_start(before)
            raise
        end_idle_daemons()  # where this Ray started them after all
    stop_on_sigterm()  # in place of Ray's own answers to it
    depends_on(answering(ray.get_runtime_context().gcs_address, () if address else started_daemons()))
    resources = ray.cluster_resources()
    announce(f"Ray ready in {time.perf_counter() - started:.1f} s: " + ", ".join(
        f"{resources.get(k, 0):g} {k}s" for k in ("CPU", "GPU") if k == "CPU" or resources.get(k)))


def _stop_partial_start(before: set[int]) -> None:
    """Stop a local Ray whose ``ray.init`` was cut short (Ctrl-C): every process that began under this one since
    ``before`` (:func:`_descendants`) and still runs, then ``ray.shutdown()``. Cut short before Ray had recorded its
    node, the shutdown stops nothing, and the raylet's agents outlived the script, adopted by init. The raylet may be
    starting its agents as the script ends: the processes are stopped (:func:`_frozen`) before any is killed, so that
    none starts a child after the tree was read -- an agent started so had outlived the script (9 of 48 cut-short
    starts, four at once on 2 cores)."""
    end_started(before)
    with contextlib.suppress(Exception):
        ray.shutdown()


def end_started(before: set[int]) -> None:
    """Kill every process that began under this one since ``before`` (:func:`_descendants`), stopped first
    (:func:`_frozen`), and reap this process's own children among them (not left as zombies)."""
    started = _frozen(before)
    for pid in started:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in started:
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)


def _frozen(before: set[int], patience: float = 5.0) -> set[int]:
    """The processes that began under this one since ``before``, each stopped (``SIGSTOP``): read, stopped, waited
    for until the kernel shows them stopped (a ``fork`` under way has then finished, its child in ``/proc``), and
    read again, until a reading finds none new. A stopped process starts nothing; ``patience`` seconds bound the
    wait for any one reading's processes to stop."""
    frozen: set[int] = set()
    while new := _descendants() - before - frozen:
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
        deadline = time.monotonic() + patience
        while any(_state(pid) not in (None, "T", "Z", "X") for pid in new) and time.monotonic() < deadline:
            time.sleep(0.01)
    return frozen


def _descendants() -> set[int]:
    """The PIDs of this process's children, theirs, and so on (read from ``/proc``; none where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            _, fields = _stat(stat)
        except OSError:  # ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def shipped(modules: Sequence[str]) -> list[str]:
    """The files and folders of the user's ``modules`` (:func:`~fedcomp.platform.catalog.carriers`) that a job joining
    a cluster takes to its nodes as Ray's ``py_modules``, where each node's workers import them by name when the
    module's file is not at its path there. None inside a job submitted with ``py_modules`` of its own (``ray job
    submit``; Ray refuses two), whose ``--working-dir`` carries the files."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    submitted = json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR) or "{}")
    if "py_modules" in (submitted.get("runtime_env") or {}):
        return []
    return catalog.carriers(list(modules))


def config_here(sent: Config | Mapping[str, Any]) -> Config:
    """The run's config in this actor, which is sent it as :meth:`~fedcomp.platform.config.Config.to_dict` and loads
    it here, in its constructor: a user's module that cannot be imported on this node (not there, a package it
    imports not installed) is then an error the actor's ``ready`` raises, one line at the driver, where a ``Config``
    unpickled with the actor's arguments failed before the constructor ran -- Ray printed each attempt's traceback
    and the driver saw only that the actor died. A ``Config`` (the server in the driver) is taken as it is.

    Raises:
        ConfigError: the config's module cannot be imported here, naming this node.
    """
    if isinstance(sent, Config):
        return sent
    try:
        return load_config(dict(sent))
    except ConfigError as error:
        raise ConfigError(f"{error} (on the node at {ray.util.get_node_ip_address()})") from None


IDLE_DAEMONS = ("start_monitor", "start_api_server")
"""The methods of Ray's ``Node`` that start the two processes a local Ray runs for nothing here (:func:`end_idle_daemons`)."""


@contextlib.contextmanager
def idle_daemons_not_started() -> Iterator[None]:
    """While it lasts, a local Ray that this process starts starts neither its autoscaler monitor nor its API server
    (:func:`end_idle_daemons` says why neither serves a run). Started, then ended, they cost time: ``ray.init`` waits
    for the API server to publish its address (Ray ready 3.09 -> 1.77 s: benchmarks/RAY_START.md), and both import
    Ray's modules while the raylet starts. Where this Ray has no such methods (another version), nothing changes,
    and :func:`end_idle_daemons` ends whatever it started."""
    node = getattr(getattr(ray._private, "node", None), "Node", None)  # the class ``ray.init`` starts a node with
    kept = {name: vars(node)[name] for name in IDLE_DAEMONS if node is not None and name in vars(node)}
    for name in kept:
        setattr(node, name, _not_started)
    try:
        yield
    finally:
        for name, method in kept.items():
            setattr(node, name, method)


def _not_started(_node: Any, *_args: Any, **_kwargs: Any) -> None:
    """In place of a ``Node`` method that starts an idle daemon (:func:`idle_daemons_not_started`)."""


def end_idle_daemons() -> None:
    """Stop two processes of the local Ray this process started that do nothing for it: the autoscaler monitor (a
    local Ray has nothing to scale) and the API server, which with the dashboard off (fedcomp starts Ray with
    ``include_dashboard=False``) loads only Ray's usage-statistics module, and ``ray.init`` turns usage statistics
    off for the clusters it starts.

    Together they held 127 MiB of memory for the whole run (the monitor 50, the API server 77, at 08a8103:
    benchmarks/PERFORMANCE.md). The monitor also cost time at the end: Ray's shutdown stops its GCS before the
    monitor, which answers SIGTERM by reporting its end to that GCS; Ray then waited its 1 s grace and killed it
    (1.0 s of the 1.36 s that ending a local Ray took). Nothing happens where Ray has no such process (joined a
    cluster, shut down already, not started: :func:`idle_daemons_not_started`)."""
    node = getattr(ray._private.worker, "_global_node", None)  # Ray's handle on the processes it started
    for end in ("kill_monitor", "kill_dashboard"):
        try:
            getattr(node, end)(check_alive=False)
        except Exception:
            pass


def answering(address: str, daemons: Sequence[int] = (), timeout_s: float = 2.0) -> Callable[[], bool]:
    """Whether the Ray head at ``HOST:PORT`` (its GCS) still takes connections (asked at most every
    :data:`GCS_EVERY_S`), and the ``daemons`` (PIDs: :func:`started_daemons` of a local Ray this process started)
    still run, while this process is connected to it.

    A SIGTERM to the whole process group stops the daemons of a local Ray along with its driver. The raylet goes
    first, and tens of milliseconds later Ray's C++ ends the driver itself with exit code 1 (its object store is
    gone); the GCS may take longer to close its port. After ``ray.shutdown`` this process no longer needs either.
    """
    host, port = address.rsplit(":", 1)
    asked = -math.inf  # when the GCS was last asked

    def alive() -> bool:
        nonlocal asked
        if not ray.is_initialized():
            return True
        if not all(map(_runs, daemons)):
            return False
        if time.monotonic() - asked < GCS_EVERY_S:
            return True
        asked = time.monotonic()
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
        except OSError:
            return False
        return True

    return alive


def started_daemons() -> tuple[int, ...]:
    """PIDs of the raylet, GCS server and log monitor that this process started (read from ``/proc``; none
    elsewhere).

    The log monitor is watched for its speed: it has no SIGTERM handler, so a SIGTERM to the process group ends it
    at once, where the raylet first runs its graceful shutdown -- at the end of which the driver's Ray exits."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, fields = _stat(stat)
            if int(fields[1]) != os.getpid():
                continue
            if name in ("raylet", "gcs_server") or b"log_monitor.py" in (stat.parent / "cmdline").read_bytes():
                found.append(int(stat.parent.name))
        except OSError:  # ended meanwhile
            continue
    return tuple(found)


def _runs(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (a dead child not yet reaped)."""
    return _state(pid) not in (None, "Z")


def _state(pid: int) -> str | None:
    """Process ``pid``'s state letter (``R``, ``S``, ``T`` stopped, ``Z`` zombie, ...), or None where there is none."""
    try:
        return _stat(Path(f"/proc/{pid}/stat"))[1][0]
    except OSError:
        return None


def _stat(path: Path) -> tuple[str, list[str]]:
    """A ``/proc/PID/stat`` file's command name and the fields after it (state, parent PID, ...)."""
    text = path.read_text()
    return text[text.index("(") + 1: text.rindex(")")], text[text.rindex(")") + 2:].split()


def parse_address(address: str, field: str = "federation.ray_address") -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address -- ``HOST:PORT`` (the head's GCS port) or ``ray://HOST:PORT`` (Ray
    Client) -- or None for ``auto`` (the cluster `ray start` recorded on this machine) and ``local`` (a new
    instance on this machine).

    Raises:
        ResourceError: one line naming ``field``, the address and the forms allowed.
    """
    text = address.strip()
    if text in ("auto", "local"):
        return None
    parts = urlsplit(text if "://" in text else f"tcp://{text}")
    if parts.scheme not in ("tcp", "ray"):
        hint = (" (that is the dashboard / jobs address; give the head's HOST:6379 or ray://HOST:10001)"
                if parts.scheme in ("http", "https") else "")
        raise ResourceError(f"{field} = {address!r}: allowed: auto, local, HOST:PORT or ray://HOST:PORT{hint}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number or out of range
        host, port = None, None
    if not host or port is None or parts.path not in ("", "/"):
        raise ResourceError(f"{field} = {address!r}: expected HOST:PORT (e.g. 10.0.0.5:6379) or ray://HOST:PORT")
    return host, port


def probe(address: str, field: str = "federation.ray_address", timeout: float = PROBE_TIMEOUT_S) -> str:
    """Check that ``address`` answers within ``timeout`` seconds (Ray itself retries for minutes); returns the
    address to join: ``auto`` read as the cluster that ``ray start`` recorded on this machine (Ray's own ``auto``
    falls back to any Ray it finds running here -- another user's session, a test's private one).

    Raises:
        ResourceError: one line naming ``field``, the address and what is wrong.
    """
    target, join = parse_address(address, field), address
    if target is None:
        from ray._private import utils as ray_utils  # what `ray start` wrote: /tmp/ray/ray_current_cluster

        found = ray_utils.read_ray_address()
        recorded_in = ray_utils.get_ray_address_file(None)  # type: ignore[attr-defined]  # (imported there)
        if not found:
            raise ResourceError(
                f"{field} = 'auto': no cluster started with `ray start` on this machine; give its HOST:PORT, or drop "
                f"the address to run on a fresh local Ray (none is recorded in {recorded_in}, where "
                f"`ray start` writes it unless given --temp-dir)"
            )
        target, join = parse_address(found, field), found
        assert target is not None
    host, port = target
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, socket.timeout) else (error.strerror or str(error))
        raise ResourceError(
            f"{field} = {address!r}: cannot reach {host}:{port} ({reason}) within {timeout:g}s; start the cluster "
            f"(`ray start --head`) or run on a fresh local Ray: {field} = local (a resume too)"
        ) from None
    if not join.strip().startswith("ray://"):
        problem = _gcs_problem(host, port, 2 * timeout)
        if problem:
            raise ResourceError(
                f"{field} = {address!r}: {host}:{port} is not a Ray head answering ({problem}); give the head's GCS "
                f"port (6379 unless `ray start --port` said otherwise) or ray://HOST:10001"
            )
    return join


def _which_port(address: str, field: str) -> str:
    """Why a Ray Client (``ray://``) could not connect, where ``address``'s port is a head's GCS port (the client times
    out there after 30 s, saying no more): asked after the failure, so that a Ray Client server is never asked a GCS's
    question before a client's connection."""
    target = parse_address(address, field) if address.strip().startswith("ray://") else None
    if target is None or _gcs_problem(*target, timeout=10.0) is not None:
        return ""
    host, port = target
    return (f"; {host}:{port} is the head's GCS port, not its Ray Client server's: give {host}:{port} without ray:// "
            f"(from a machine of the cluster), or ray://{host}:10001 (unless `ray start --ray-client-server-port` "
            f"said otherwise)")


def _gcs_problem(host: str, port: int, timeout: float) -> str | None:
    """Why ``host:port`` does not answer as a Ray head's GCS (None if it does).

    Asked in a child process: Ray's own client retries a silent port for 40 s, prints its retries, and on
    some settings ends the process; a child can be given a deadline and its output kept out of sight."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    code = "import sys, ray._raylet as r; r.GcsClient(address=sys.argv[1])"
    try:
        done = subprocess.run([sys.executable, "-c", code, target], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no reply within {timeout:g}s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.strip().splitlines() if line.strip() and not line.startswith("[")]
    return shortened(lines[-1], 160) if lines else f"exit code {done.returncode}"


def cluster_nodes() -> list[dict[str, float]]:
    """The resources of each alive node of the connected cluster."""
    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]


@dataclass(frozen=True)
class ActorPlan:
    """Which clients each actor hosts and what each actor asks Ray for."""

    groups: tuple[tuple[int, ...], ...]
    cpus: float
    gpus_per_client: float
    server_cpus: float
    packing: dict[str, Any] = dataclass_field(default_factory=dict)
    """How ``gpu_packing: auto`` chose the clients per actor (for run.json); empty when it did not."""

    def gpus(self, group: int) -> float:
        return floor_share(self.gpus_per_client * len(self.groups[group]))

    def resources(self, group: int) -> dict[str, float]:
        res = {"CPU": self.cpus}
        if self.gpus(group):
            res["GPU"] = self.gpus(group)
        return res


def floor_share(value: float) -> float:
    """``value`` rounded down to Ray's resource granularity."""
    return math.floor(value / GRANULARITY + 1e-9) * GRANULARITY


def auto_clients_per_actor(fed: FederationConfig, cpus: float, gpus: float) -> int:
    """``federation.clients_per_actor: auto``: the clients spread evenly over as many actors as run at once --
    ``fed.actors_per_gpu`` a GPU of ``gpus`` where the clients use GPUs (``gpu_packing: auto``'s packing before its
    probe), else one a CPU of ``cpus`` -- and at most one actor a client.

    Every packing gives the same numbers, and each actor is a process that starts and imports torch (about 0.4
    GiB): on 2 CPUs, quickstart's 16 clients run faster in 2 actors than in 4 (``benchmarks/PACKING.md``). A server
    actor (``server: actor``) mostly waits on the client actors and takes no CPU from this count: with it, quickstart
    takes 15.1 s in 2 client actors on 2 CPUs against 18.7 s in one, for 1.56 against 1.22 GiB
    (``benchmarks/PACKING.md``)."""
    slots = gpus * fed.actors_per_gpu if gpus > 0 and fed.gpus_per_client != 0 else cpus
    actors = min(fed.clients, max(1, math.floor(slots + 1e-9)))
    return -(-fed.clients // actors)


def plan_actors(
    fed: FederationConfig, cluster: Mapping[str, float], nodes: Sequence[Mapping[str, float]] | None = None,
    footprint: Footprint | None = None,
) -> ActorPlan:
    """Pack clients into actors and size their CPU/GPU requests so that they fit ``nodes`` (each alive node's
    resources; default: one node holding ``cluster``, the totals).

    With ``gpu_packing: auto`` on a cluster with GPUs, the clients spread evenly over ``actors_per_gpu`` actors a
    GPU, checked against ``footprint`` (one client's measured GPU memory, :func:`probe_footprint_on_cluster`) by
    :func:`~fedcomp.platform.gpu_packing.pick_clients_per_actor` when given; without GPUs ``clients_per_actor``
    holds (``auto``: :func:`auto_clients_per_actor`).

    One actor lives on one node, so shares are fitted per node: with ``auto``, the largest CPU share (at most
    1) such that every client actor and the server actor (``federation.server: actor``; with the server replicated
    on the client actors or in the driver there is none to place) find a node whichever node Ray puts the server
    on, and the largest GPU share per client (at most 1 and the cluster's GPUs over the clients) such that every
    client actor finds a node's GPU.

    Raises:
        ResourceError: GPUs or CPUs are asked for that the nodes do not have, or more actors than the cluster's
            memory holds (:data:`ACTOR_MEMORY_FLOOR` each); the message says what would fit.
    """
    k = fed.clients
    total_gpus, total_cpus = float(cluster.get("GPU", 0.0)), float(cluster.get("CPU", 0.0))
    auto_per = auto_clients_per_actor(fed, total_cpus, total_gpus)
    per = auto_per if fed.clients_per_actor == "auto" else fed.clients_per_actor
    packing: dict[str, Any] = {}
    if fed.gpu_packing == "auto" and cluster.get("GPU", 0.0) > 0:
        gpus = max(1, int(cluster["GPU"]))
        if footprint is None:  # a check before the probe: the packing auto aims at, memory not yet measured
            per = math.ceil(k / (gpus * fed.actors_per_gpu))
        else:
            per = pick_clients_per_actor(footprint, footprint.device, fed.actors_per_gpu, k, fed.cohort_size, gpus)
        packing = {"gpu_packing": "auto", "clients_per_actor": per, "actors_per_gpu": fed.actors_per_gpu, "gpus": gpus,
                   "footprint_bytes": footprint.as_dict() if footprint else None}
    groups = tuple(tuple(range(i, min(i + per, k))) for i in range(0, k, per))
    n = len(groups)
    nodes = [dict(node) for node in nodes] if nodes else [dict(cluster)]
    units = [(_units(node.get("CPU", 0.0)), _units(node.get("GPU", 0.0))) for node in nodes]
    server = fed.server == "actor"
    actors = f"{n} client actors and the server" if server else f"{n} client actors"

    if fed.gpus_per_client == "auto":
        gpc = _auto_gpus(units, n, per, min(1.0, total_gpus / k)) if total_gpus else 0.0
    else:
        gpc = float(fed.gpus_per_client)
        need = gpc * k
        if need > 0 and need > total_gpus + 1e-9:
            have = "has no GPUs" if not total_gpus else f"has {total_gpus:g}"
            raise ResourceError(
                f"federation.gpus_per_client = {gpc:g} needs {need:g} GPUs for {k} clients but the cluster {have}; "
                f"use federation.gpus_per_client = 0 or 'auto'"
            )
        if gpc * per > 1 and not float(gpc * per).is_integer():
            raise ResourceError(
                f"federation.gpus_per_client = {gpc:g} x clients_per_actor = {per} asks one actor for "
                f"{gpc * per:g} GPUs; an actor can take a fraction of one GPU or whole GPUs"
            )
        held = _slots_total(units, 0, _units(gpc * per))
        if held < n:
            fits = _auto_gpus(units, n, per, min(1.0, total_gpus / k))
            raise ResourceError(
                f"federation.gpus_per_client = {gpc:g} asks {gpc * per:g} GPU per client actor; {_describe(nodes, 'GPU')} "
                f"hold {held} such actors, the run has {n}; use federation.gpus_per_client <= {fits:g} or 'auto'"
            )
    gpu_units = _units(floor_share(gpc * per))
    memory = float(cluster.get("memory", 0.0))
    if memory and (n + server) * ACTOR_MEMORY_FLOOR > memory:
        auto = -(-k // auto_per)
        raise ResourceError(
            f"federation.clients = {k} with clients_per_actor = {per} makes {n} client actors, each a process that "
            f"imports torch (at least {ACTOR_MEMORY_FLOOR / 2**20:.0f} MiB of its own: "
            f"{(n + server) * ACTOR_MEMORY_FLOOR / 2**30:.1f} GiB in all), more than the cluster's "
            f"{memory / 2**30:.1f} GiB of memory for actors; use federation.clients_per_actor = 'auto' ({auto} "
            f"actor{'s' if auto > 1 else ''} here) or a larger number"
        )

    if fed.cpus_per_actor == "auto":
        cpu_units = _auto_cpus(units, n, gpu_units, server)
        if cpu_units is None:
            raise ResourceError(
                f"federation.clients = {k} with clients_per_actor = {per} makes {n} actors, too many for "
                f"{total_cpus:g} CPUs; raise federation.clients_per_actor or use 'auto' ({_describe(nodes, 'CPU')})"
            )
        cpus = cpu_units / UNITS
    else:
        cpus = float(fed.cpus_per_actor)
        need = cpus * (n + server)
        best = _auto_cpus(units, n, gpu_units, server)
        advice = f"use cpus_per_actor <= {best / UNITS:g} or 'auto'" if best else "raise federation.clients_per_actor or use 'auto'"
        if need > total_cpus + 1e-9:
            raise ResourceError(
                f"federation.cpus_per_actor = {cpus:g} needs {need:g} CPUs for {actors} but the cluster has "
                f"{total_cpus:g}; {advice}"
            )
        if not _fits(units, n, _units(cpus), gpu_units, server):
            raise ResourceError(
                f"federation.cpus_per_actor = {cpus:g}: {actors} do not fit on {_describe(nodes, 'CPU')} (an actor "
                f"lives on one node); {advice}"
            )
    return ActorPlan(groups, cpus, gpc, cpus if server else 0.0, packing)


def probe_footprint_on_cluster(config: Config, timeout: float) -> Footprint:
    """:func:`~fedcomp.platform.gpu_probe.probe_footprint` run on one of the cluster's GPUs (a Ray task asking
    for a whole GPU, before any client actor holds one), with this job's ``FEDCOMP_*`` environment.

    Raises:
        ResourceError: the probe did not finish within ``timeout`` seconds, or failed (its first line)."""
    options: dict[str, Any] = {"num_gpus": 1, "num_cpus": 0, "max_retries": 0}
    if fedcomp_env():
        options["runtime_env"] = {"env_vars": fedcomp_env()}
    ref = ray.remote(_probe_here).options(**options).remote(config.to_dict())
    try:
        footprint: Footprint = ray.get(ref, timeout=timeout)
        return footprint
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise ResourceError(
            f"federation.gpu_packing = 'auto': the GPU memory probe did not finish within {timeout:g}s "
            f"(federation.actor_timeout_s); is a whole GPU free?"
        ) from None
    except ray.exceptions.RayTaskError as error:
        cause = getattr(error, "cause", None)
        if isinstance(cause, (ResourceError, ConfigError)):
            raise type(cause)(str(cause)) from None
        last = (str(cause or error).strip().splitlines() or [type(error).__name__])[-1]
        raise ResourceError(f"federation.gpu_packing = 'auto': the GPU memory probe failed: {last}") from None


def _probe_here(sent: Mapping[str, Any]) -> Footprint:
    """The GPU memory probe's Ray task: :func:`~fedcomp.platform.gpu_probe.probe_footprint` on the config it was sent
    as its dict (:func:`config_here`)."""
    from fedcomp.platform.gpu_probe import probe_footprint  # torch: only where GPUs are packed

    return probe_footprint(config_here(sent))


def _units(amount: float) -> int:
    return int(math.floor(float(amount) * UNITS + 1e-6))


def _slots(cpu: int, gpu: int, cpu_each: int, gpu_each: int) -> int:
    """How many actors asking for ``cpu_each`` / ``gpu_each`` (units) one node with ``cpu`` / ``gpu`` holds."""
    held = cpu // cpu_each if cpu_each else 1 << 40
    return min(held, gpu // gpu_each) if gpu_each else held


def _slots_total(nodes: Sequence[tuple[int, int]], cpu_each: int, gpu_each: int) -> int:
    return sum(_slots(c, g, cpu_each, gpu_each) for c, g in nodes)


def _fits(nodes: Sequence[tuple[int, int]], actors: int, cpu_each: int, gpu_each: int, server: bool) -> bool:
    """Whether ``actors`` client actors, and with ``server`` a CPU-only server actor of the same CPU share, fit
    ``nodes``, wherever Ray puts the server (it is started first; equal-sized client actors then fit greedily)."""
    slots = [_slots(c, g, cpu_each, gpu_each) for c, g in nodes]
    if not server:
        return sum(slots) >= actors
    after_server = [
        sum(slots) - slots[j] + _slots(c - cpu_each, g, cpu_each, gpu_each)
        for j, (c, g) in enumerate(nodes) if c >= cpu_each
    ]
    return bool(after_server) and min(after_server) >= actors


def _auto_cpus(nodes: Sequence[tuple[int, int]], actors: int, gpu_each: int, server: bool) -> int | None:
    """The largest CPU share (units, at most one CPU) that fits; None if even Ray's smallest does not.

    The candidates are the shares that split some node evenly; fitting only gets easier as the share
    shrinks, so a binary search finds the largest."""
    candidates = sorted({min(UNITS, c // m) for c, _ in nodes for m in range(1, actors + 2) if c // m > 0})
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if _fits(nodes, actors, candidates[mid], gpu_each, server):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def _auto_gpus(nodes: Sequence[tuple[int, int]], actors: int, per: int, cap: float) -> float:
    """The largest GPU share per client (at most ``cap``) whose actors (``per`` clients each) all find a
    node's GPU; 0 when none does (the run then computes on CPUs)."""
    cap_units = _units(floor_share(cap))
    shares = {cap_units} | {g // (m * per) for _, g in nodes for m in range(1, actors + 1)}
    for share in sorted((s for s in shares if 0 < s <= cap_units), reverse=True):
        each = share * per
        if each > UNITS and each % UNITS:
            continue  # Ray takes a fraction of one GPU or whole GPUs
        if _slots_total(nodes, 0, each) >= actors:
            return share / UNITS
    return 0.0


def _describe(nodes: Sequence[Mapping[str, float]], key: str) -> str:
    amounts = ", ".join(f"{node.get(key, 0.0):g}" for node in nodes)
    return f"{len(nodes)} node{'s' if len(nodes) > 1 else ''} with {key} {amounts}"


def fedcomp_env() -> dict[str, str]:
    """``FEDCOMP_*`` variables of this process, passed on to the actors it starts."""
    return {k: v for k, v in os.environ.items() if k.startswith("FEDCOMP_")}


_node_env: dict[str, str] | None = None
"""The ``FEDCOMP_*`` variables this actor's process started with (its node's own), recorded at its first
:func:`adopt_env`."""


def adopt_env(env: Mapping[str, str] | None) -> None:
    """Make this actor's ``FEDCOMP_*`` variables its node's own overridden by ``env``, the driver's
    (:func:`fedcomp_env`, sent with the actor's arguments; None: leave them be, as in the driver's process) -- what
    Ray's ``runtime_env`` ``env_vars`` gave, whose workers Ray starts apart from its pool of idle ones (six actors
    started twice took 14 worker processes with them, 6 without) and never hands an actor of another environment,
    so a kept actor (:mod:`fedcomp.actors.kept`) also takes the next run's variables, a fault to inject or a data
    root, and drops the last run's."""
    global _node_env
    if env is None:
        return
    if _node_env is None:
        _node_env = fedcomp_env()
    for name in fedcomp_env():
        del os.environ[name]
    os.environ.update({**_node_env, **env})


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray's options for a client or server actor asking for ``resources`` (its ``FEDCOMP_*`` variables go with its
    arguments: :func:`adopt_env`)."""
    return {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0), "max_restarts": 0}


def node_gone(node_id: str | None) -> str | None:
    """``node 10.0.0.7 (id 3f2a9c1e)`` where the cluster lists ``node_id`` as dead (Ray marks a node dead some seconds
    after it went: its health checks fail first), else None."""
    if node_id is None:
        return None
    for node in ray.nodes():
        if node.get("NodeID") == node_id and not node.get("Alive", True):
            return f"node {node.get('NodeManagerAddress', '?')} (id {node_id[:8]})"
    return None


def packing_that_fits(clients: int, cpus_per_actor: float, cpus: float) -> int | None:
    """The fewest clients per actor whose client actors, ``cpus_per_actor`` each, fit in ``cpus`` (what is left of a
    cluster after a node went), or None where not even one such actor fits."""
    actors = math.floor(cpus / cpus_per_actor + 1e-9) if cpus_per_actor > 0 else clients
    return -(-clients // min(actors, clients)) if actors >= 1 else None


def resume_advice(clients: int, cpus_per_actor: float, server_cpus: float = 0.0) -> str:
    """What to do when a node left with actors and no room is left for them: a node in its place, or a resume that
    fits the nodes left -- the clients per actor that fit the CPUs the cluster has now, or the local backend."""
    left = float(ray.cluster_resources().get("CPU", 0.0)) - server_cpus
    per = packing_that_fits(clients, cpus_per_actor, left) if left > 0 else None
    fits = (f"--set federation.clients_per_actor={per} (its {-(-clients // per)} client actors of {cpus_per_actor:g} "
            f"CPU fit the {left:g} CPUs left) or " if per is not None else "")
    return f"start a node in its place; or resume the run with {fits}--set federation.backend=local"


def node_lost_notice(node: str | None, warning: Callable[[str], str], advice: Callable[[], str]) -> Callable[[], str | None]:
    """A ``waiting`` callback (:func:`~fedcomp.actors.federation.wait_ready`) for a dead actor's replacement: once
    Ray marks ``node``, where the dead actor was, dead, it prints ``fedcomp: warning: <warning(the node)>`` and
    returns why the replacement may wait, with ``advice`` (said once: the wait asks no more after an answer)."""

    def lost() -> str | None:
        gone = node_gone(node)
        if gone is None:
            return None
        print(f"fedcomp: warning: {warning(gone)}", file=sys.stderr, flush=True)
        return f"{gone} left the cluster ({advice()})"

    return lost


def describe_resources() -> str:
    avail = ray.available_resources()
    return ", ".join(f"{k}={avail.get(k, 0):g}" for k in ("CPU", "GPU") if k in ray.cluster_resources() or k == "CPU")
