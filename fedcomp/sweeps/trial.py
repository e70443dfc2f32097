"""One Tune trial = one whole federated run: its resources, and the trainable that runs it (a sweep with
``pack:`` runs several configurations per trial instead: :mod:`fedcomp.sweeps.packs`).

The trial's placement group has one bundle for the trainable itself, one for the server actor (where there is
one: not with ``federation.server: driver`` or ``replicated``) and one per client actor (``federation.backend:
ray``), or a single bundle when the trial runs the local backend in
its own process. Tune captures child actors into the trial's group, and the trial's config pins
``federation.cpus_per_actor`` / ``gpus_per_client`` to the bundles' sizes (and ``clients_per_actor: auto`` to the
actors they hold: sized to the trial's ``cpus_per_trial`` or ``gpus_per_trial``, not to the whole cluster), so
every actor the run starts lands in its own trial's bundles and trials never wait on each other's actors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ray import tune

from fedcomp.actors.cluster import auto_clients_per_actor, floor_share
from fedcomp.actors.quiet_exit import drop_lost_exits, drop_lost_exits_in_a_worker
from fedcomp.platform import results, run_checks
from fedcomp.platform.config import Config
from fedcomp.platform.errors import ResourceError
from fedcomp.platform.progress import in_a_ray_worker
from fedcomp.platform.runner import drive
from fedcomp.sweeps import on_disk
from fedcomp.sweeps.failures import Reports
from fedcomp.sweeps.spec import SweepSpec

FAULT_EXIT = "FEDCOMP_FAULT_TRIAL_EXIT"  # "ROUND": a fresh (not restored) trial process exits at that round

drop_lost_exits_in_a_worker()  # Tune stops trial processes with SIGTERM (all on Ctrl-C), some before they run a trial


def quiet_tune_logs() -> None:
    """Tune's and Train's INFO lines off in this trial process (one "checkpoint created" per save; "Restored on
    <node> from checkpoint" as a retried or resumed trial starts, even at ``--verbose 0``): their warnings stay."""
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    logging.getLogger("ray.tune").setLevel(logging.WARNING)


if in_a_ray_worker():  # as Ray loads the trainable into a trial process, before Tune restores the trial's checkpoint
    quiet_tune_logs()


@dataclass(frozen=True)
class TrialResources:
    """What one trial asks for: its bundles and the per-actor shares pinned into its config."""

    bundles: tuple[dict[str, float], ...]
    cpus_per_actor: float
    gpus_per_client: float
    clients_per_actor: int | None = None
    """Ray backend: the clients each actor hosts (``auto`` sized to the trial's own CPUs or GPUs)."""

    @property
    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for bundle in self.bundles:
            for key, value in bundle.items():
                out[key] = out.get(key, 0.0) + value
        return out


def trial_resources(spec: SweepSpec, config: Config, cluster_has_gpus: bool) -> TrialResources:
    """The placement-group bundles of the trial running ``config``."""
    fed = config.federation
    if fed.gpus_per_client == "auto":
        gpc = floor_share(spec.gpus_per_trial / fed.clients) if cluster_has_gpus else 0.0
    else:
        gpc = float(fed.gpus_per_client)
    if fed.backend == "local":
        bundle = {"CPU": spec.cpus_per_trial}
        if gpc:
            bundle["GPU"] = floor_share(gpc * fed.clients)
        return TrialResources((bundle,), spec.cpus_per_trial, gpc)
    per = fed.clients_per_actor
    if per == "auto":
        per = auto_clients_per_actor(fed, spec.cpus_per_trial, spec.gpus_per_trial if cluster_has_gpus else 0.0)
    actors = -(-fed.clients // per)
    processes = actors + 1 + (fed.server == "actor")  # the server runs in the trainable or on the client actors
    share = float(fed.cpus_per_actor) if fed.cpus_per_actor != "auto" else floor_share(spec.cpus_per_trial / processes)
    if share <= 0:
        raise ResourceError(
            f"cpus_per_trial = {spec.cpus_per_trial:g} is too small for {actors} client actors, the server and the "
            f"trial; raise cpus_per_trial or federation.clients_per_actor"
        )
    bundles = [{"CPU": share}] * (processes - actors)  # the trainable (and the server actor)
    for start in range(0, fed.clients, per):
        bundle = {"CPU": share}
        hosted = min(per, fed.clients - start)
        if gpc:
            bundle["GPU"] = floor_share(gpc * hosted)
        bundles.append(bundle)
    return TrialResources(tuple(bundles), share, gpc, per)


def concurrent_trials(spec: SweepSpec, configs: Iterable[Config], cluster_cpus: float, cluster_has_gpus: bool) -> int | None:
    """Trials at once: the spec's ``max_concurrent``; where it is unset, as many as give every process of a Ray-backend
    trial whose actors share its CPUs (``cpus_per_actor: auto``, the default) a whole CPU, at least one; None (Tune's
    own fit, as many as the bundles allow) where no trial is such. By the bundles alone, two 2-actor trials share the
    2 CPUs of a laptop as six processes, which is slower for every run (``benchmarks/SWEEP.md``: the wall time and the
    CPU of a 12-run sweep of tiny runs fall by about a quarter and a half with one at a time). ``configs``: every
    configuration the sweep may run (the grid's points, the Optuna axes' corners)."""
    if spec.max_concurrent is not None:
        return spec.max_concurrent
    processes = [len(trial_resources(spec, config, cluster_has_gpus).bundles) for config in configs
                 if config.federation.backend == "ray" and config.federation.cpus_per_actor == "auto"]
    return max(1, int(cluster_cpus // max(processes))) if processes else None


def members(trial: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Tune configs of the configurations a trial runs: its pack (``pack:`` sweeps), or the trial itself.
    A pack's configurations share their trial resources."""
    return [dict(m) for m in trial["pack"]] if "pack" in trial else [dict(trial)]


def placement_group_factory(trial: Mapping[str, Any], spec: SweepSpec, cluster_has_gpus: bool) -> tune.PlacementGroupFactory:
    """Tune's resource callback: the bundles computed from the trial's own config (client count and GPU
    share may be swept)."""
    res = trial_resources(spec, spec.trial_config(members(trial)[0]), cluster_has_gpus)
    return tune.PlacementGroupFactory(list(res.bundles), strategy=spec.placement.upper())


def pinned_config(spec: SweepSpec, trial: Mapping[str, Any], cluster_has_gpus: bool) -> Config:
    """The trial's run config with the per-actor shares pinned to its bundles."""
    config = spec.trial_config(trial)
    res = trial_resources(spec, config, cluster_has_gpus)
    return config.replace(**{
        "federation.cpus_per_actor": res.cpus_per_actor,
        "federation.gpus_per_client": res.gpus_per_client,
        **({"federation.clients_per_actor": res.clients_per_actor} if res.clients_per_actor else {}),
        "run.progress": "none",
    })


def write_run_files(directory: Path, checkpoint: bytes, rows: list[dict[str, Any]]) -> None:
    """A run's checkpoint (its file's content) and its evaluation rows (what :func:`read_trial_rows` reads back)
    in ``directory``."""
    results.write_checkpoint(directory / results.CHECKPOINT, checkpoint)
    results.write_metrics(directory / results.METRICS, rows)


def _save(directory: Path, checkpoint: bytes, rows: list[dict[str, Any]],
          placement: list[dict[str, Any]] | None, trial: Mapping[str, Any]) -> tune.Checkpoint:
    write_run_files(directory, checkpoint, rows)
    if placement is not None:
        results.write_json(directory / on_disk.PLACEMENT_JSON, placement)
    results.atomic_write(directory / on_disk.TRIAL_JSON, on_disk.trial_key(trial).encode())
    # from_directory builds the class it is called on; ray annotates it with the base class
    return cast(tune.Checkpoint, tune.Checkpoint.from_directory(str(directory)))


def computes_here(config: Config) -> bool:
    """Whether a run of ``config`` computes in the process that drives it: on the local backend, or with the server
    in the driver. Otherwise its driver handles numbers and bytes, and imports no torch."""
    return config.federation.backend == "local" or config.federation.server == "driver"


def torch_for(configs: Iterable[Config]) -> None:
    """Import torch into this trial process, with one thread, where a run of ``configs`` computes here
    (:func:`computes_here`); leave it out otherwise: a Ray-backend trial's process then holds no torch (its CUDA
    build: about 400 MiB, and a second to import). Imported under :func:`own_streams`."""
    if not any(computes_here(config) for config in configs):
        return
    with own_streams():
        import torch
    torch.set_num_threads(1)


@contextlib.contextmanager
def own_streams() -> Iterator[None]:
    """While it lasts, ``sys.stdout`` and ``sys.stderr`` are the process's own streams, for imports: Tune points them
    at the trial's log files, and torch's loggers keep the streams they find at import and flush them at exit, when
    Tune has closed those files -- a warning per stream, forwarded to the driver's terminal (after a Ctrl-C'd sweep's
    last line; at the end of every sweep of a user's module that imports torch)."""
    trial_streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = sys.__stdout__ or sys.stdout, sys.__stderr__ or sys.stderr
    try:
        yield
    finally:
        sys.stdout, sys.stderr = trial_streams


def trial_process(spec_json: str, env: dict[str, str]) -> SweepSpec:
    """What every trainable (a trial, a packed trial) sets up in its process first; returns the sweep's spec. The
    trainable then calls :func:`torch_for` with its runs' configs."""
    from fedcomp.actors.kept import keep_between_runs

    drop_lost_exits()  # also where the module was loaded outside a Ray worker
    os.environ.update(env)  # the driver's FEDCOMP_* settings, passed on to the actors this trial starts
    quiet_tune_logs()
    spec = SweepSpec.model_validate_json(spec_json)
    with own_streams():  # the user's modules (their configs import them again: a no-op then) may import torch
        spec.import_modules()
    keep_between_runs(spec.keep_actors)  # the next run in this process (Tune reuses it) takes these actors
    return spec


DIVERGED = "diverged"
"""The key of the result a trial that diverged reports last (its other metrics nan): the progress line's sign."""


def run_trial(trial: dict[str, Any], spec_json: str, cluster_has_gpus: bool, env: dict[str, str], metric: str) -> None:
    """The Tune trainable: build the run from the trial's config, restore it from Tune's checkpoint if
    there is one, and report every round (the latest evaluation row, as in ``metrics.parquet``) with a
    checkpoint every ``run.checkpoint_every`` rounds and at the end. A deterministic error fails the trial without
    retries (:mod:`fedcomp.sweeps.failures`; ``metric``: the sweep's)."""
    reports = Reports(metric)
    with reports.final_if_deterministic():
        _run_trial(trial, spec_json, cluster_has_gpus, env, reports)


def _run_trial(trial: dict[str, Any], spec_json: str, cluster_has_gpus: bool, env: dict[str, str], reports: Reports) -> None:
    from fedcomp.backends import make_server

    spec = trial_process(spec_json, env)
    config = pinned_config(spec, trial, cluster_has_gpus)
    torch_for([config])
    restored = tune.get_checkpoint()
    checkpoint = None
    if restored is not None:
        with restored.as_directory() as folder:
            checkpoint = results.read_checkpoint(Path(folder) / results.CHECKPOINT)
    on_disk.numbered_after(restored)
    reported = max((row["round"] for row in checkpoint["rows"]), default=-1) if checkpoint else -1
    far = on_disk.further_on(trial, checkpoint["server"]["counters"]["round"] if checkpoint else -1)
    if far is not None:  # written after Tune's last save of its state: reported again, not run again
        found = far.value
        rows = [{**row, "trial_round": row["round"]} for row in found.rows if row["round"] > reported]
        rows = rows or [{**found.rows[-1], "trial_round": found.round}]  # a checkpoint round without an evaluation
        on_disk.report_found(far, rows, reports,
                             lambda folder: _save(folder, found.data, found.rows, found.placement, trial))
        if found.round >= config.run.rounds:
            return
        checkpoint, reported = found.content, max(row["round"] for row in found.rows)
    exit_round = int(env.get(FAULT_EXIT, 0)) if restored is None and far is None else 0

    server = make_server(config)
    placement = server.placement() if hasattr(server, "placement") else None
    try:
        for step in drive(config, server, checkpoint):
            if step.round == exit_round:
                os._exit(1)  # fault injection for tests: the trial's process dies mid-run
            reports.note_replaced(step.replaced)
            if config.run.on_divergence == "stop" and step.loss is not None and run_checks.divergence(step.loss, server):
                # as a run stops: the rounds before it are the trial's (tuner.collect reads the last row as the mark)
                for row in step.rows:
                    if reported < row["round"] < step.round:
                        reports.report({**row, "trial_round": row["round"]})
                reports.report({**dict.fromkeys(step.rows[-1], math.nan), "round": step.round,
                                "trial_round": step.round, DIVERGED: 1.0})
                return
            # Every evaluation row once (the first step also carries round 0's), as in metrics.parquet
            rows = [{**row, "trial_round": row["round"]} for row in step.rows if row["round"] > reported]
            reported = max(reported, step.rows[-1]["round"])
            if step.checkpoint is None:
                for metrics in rows:
                    reports.report(metrics)
            else:  # a checkpoint round without an evaluation repeats the latest row
                data, kept = step.checkpoint, step.rows
                reports.report_saved(rows or [{**kept[-1], "trial_round": step.round}],
                                     lambda folder: _save(folder, data, kept, placement, trial))  # noqa: B023
    finally:
        server.close()


def read_trial_rows(checkpoint: tune.Checkpoint | None, sub: str = "") -> list[dict[str, Any]]:
    """Every evaluation row stored in a trial's checkpoint (``sub``: in that folder of it, e.g. a packed
    trial's member)."""
    if checkpoint is None:
        return []
    with checkpoint.as_directory() as folder:
        path = Path(folder) / sub / results.METRICS
        if not path.is_file():
            return []
        return cast(list[dict[str, Any]], results.read_parquet(path).to_dict("records"))


def read_trial_placement(checkpoint: tune.Checkpoint | None) -> list[dict[str, Any]] | None:
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        path = Path(folder) / "placement.json"
        return json.loads(path.read_text()) if path.is_file() else None
