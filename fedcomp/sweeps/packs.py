"""Packed trials: several grid configurations in one Tune trial, so a sweep of tiny runs does not pay a
trial's start-up (a Tune trial, its process, its actors) per configuration.

``pack: sequential`` runs a trial's configurations one after another, each exactly as a run alone (bit for
bit, on either backend); ``pack: lockstep`` runs configurations that differ only in float hyperparameters of
the algorithm (lr, beta, ...) together in one process (:mod:`fedcomp.sweeps.lockstep`: same numbers up to
float32 rounding). Either way every configuration keeps its own rows, counters and checkpoints: a packed
trial reports each evaluation row with its configuration's index (``member``), its Tune checkpoint holds one
run checkpoint per configuration (``member-<k>/``) and which configurations have finished, so a resumed
trial continues each unfinished configuration from its own checkpoint; ``trials.parquet`` gets one trial per
configuration (``<tune trial id>-<k>``), as an unpacked sweep does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ray import tune

from fedcomp.platform import results
from fedcomp.platform.config import Config
from fedcomp.platform.errors import StorageError
from fedcomp.platform.runner import RoundDone, drive
from fedcomp.sweeps import on_disk
from fedcomp.sweeps.failures import Reports
from fedcomp.sweeps.spec import SweepSpec
from fedcomp.sweeps.trial import (
    FAULT_EXIT,
    members,
    pinned_config,
    read_trial_rows,
    torch_for,
    trial_process,
    write_run_files,
)

PACK_JSON = "pack.json"
SEQUENTIAL_PACK = 8
"""Configurations per trial of ``pack: sequential`` when ``pack_size`` is not given."""


def swept_floats(spec: SweepSpec) -> list[str]:
    """The algorithm fields the grid varies that are floats (what lockstep batches)."""
    names = []
    for point in spec.points():
        config = spec.base_config(**point)
        fields = type(config.algorithm).model_fields
        for key in point:
            section, _, name = key.partition(".")
            if section == "algorithm" and name in fields and fields[name].annotation is float and name not in names:
                names.append(name)
    return names


def _shape_key(config: Config, swept: Sequence[str]) -> str:
    data = config.to_dict()
    data["algorithm"] = {k: v for k, v in data["algorithm"].items() if k not in swept}
    return json.dumps(data, sort_keys=True, default=str)


def make_packs(spec: SweepSpec) -> list[list[dict[str, Any]]]:
    """The grid's trials (point x seed) in packs: for ``sequential`` configurations with the same federation
    section (the same trial resources), ``pack_size`` (default :data:`SEQUENTIAL_PACK`) at a time; for
    ``lockstep`` every configuration of one shape (all but the swept float algorithm fields equal), or
    ``pack_size`` of them at a time."""
    swept = swept_floats(spec)
    groups: dict[str, list[dict[str, Any]]] = {}
    for point in spec.points():
        for seed in spec.seed_values():
            trial = {"point": point, "run.seed": seed}
            config = spec.trial_config(trial)
            if spec.pack == "sequential":
                key = json.dumps(config.to_dict()["federation"], sort_keys=True, default=str)
            else:
                key = _shape_key(config, swept)
            groups.setdefault(key, []).append(trial)
    size = spec.pack_size or (SEQUENTIAL_PACK if spec.pack == "sequential" else None)
    packs: list[list[dict[str, Any]]] = []
    for group in groups.values():
        step = size or len(group)
        packs.extend(group[i:i + step] for i in range(0, len(group), step))
    return packs


# ---- the packed trainable --------------------------------------------------------------------------------


Saved = tuple[bytes, list[dict[str, Any]]]
"""A configuration's latest checkpoint: the file's content and the evaluation rows it holds."""


@dataclass(frozen=True)
class Pack:
    """A packed trial's checkpoint: its configurations' checkpoints as read back (to continue from), as saved (to
    save again until they are replaced), and which configurations had finished."""

    restored: dict[int, dict[str, Any]]
    saved: dict[int, Saved]
    done: set[int]

    @property
    def rounds(self) -> int:
        """The rounds its configurations' checkpoints were taken at, summed: how far the pack had come."""
        return sum(int(c["server"]["counters"]["round"]) for c in self.restored.values())

    @property
    def reported(self) -> dict[int, int]:
        """Per configuration, the last round of the rows its checkpoint holds (what Tune was told with it)."""
        return {k: max((r["round"] for r in rows), default=-1) for k, (_, rows) in self.saved.items()}


def _save(folder: Path, saved: Mapping[int, Saved], done: set[int], trial: Mapping[str, Any]) -> tune.Checkpoint:
    for k, (checkpoint, rows) in saved.items():
        sub = folder / f"member-{k}"
        sub.mkdir()
        write_run_files(sub, checkpoint, rows)
    results.write_json(folder / PACK_JSON, {"done": sorted(done), "members": sorted(saved)})
    results.atomic_write(folder / on_disk.TRIAL_JSON, on_disk.trial_key(trial).encode())
    return cast(tune.Checkpoint, tune.Checkpoint.from_directory(str(folder)))


def _restore(checkpoint: tune.Checkpoint | None) -> Pack:
    """The packed trial's checkpoint Tune handed it (none: nothing done yet)."""
    if checkpoint is None:
        return Pack({}, {}, set())
    with checkpoint.as_directory() as folder:
        return _read(Path(folder))


def _read(root: Path) -> Pack:
    """The packed trial's checkpoint in folder ``root``.

    Raises:
        StorageError: a configuration its ``pack.json`` lists has no checkpoint there, or one that does not read back.
    """
    stored = results.read_json(root / PACK_JSON) if (root / PACK_JSON).is_file() else {}
    paths = {
        int(sub.name.removeprefix("member-")): sub / results.CHECKPOINT
        for sub in root.glob("member-*") if (sub / results.CHECKPOINT).is_file()
    }
    missing = sorted(set(stored.get("members", ())) - set(paths))
    if missing:
        raise StorageError(f"{root}: no checkpoint of configuration {missing[0]}, which {PACK_JSON} lists")
    restored = {k: results.read_checkpoint(path) for k, path in paths.items()}
    saved = {k: (path.read_bytes(), list(restored[k]["rows"])) for k, path in paths.items()}
    return Pack(restored, saved, set(stored.get("done", ())))


def _whole(root: Path) -> Pack:
    """:func:`_read`, of a folder that holds the pack's ``pack.json`` (a copy cut short may lack it)."""
    if not (root / PACK_JSON).is_file():
        raise StorageError(f"{root}: no {PACK_JSON}")
    return _read(root)


def _one_at_a_time(
    configs: Sequence[Config], todo: Sequence[int], saved: Mapping[int, dict[str, Any]]
) -> Iterator[list[tuple[int, RoundDone]]]:
    from fedcomp.backends import make_server

    for k in todo:
        server = make_server(configs[k])
        try:
            for step in drive(configs[k], server, saved.get(k)):
                yield [(k, step)]
        finally:
            server.close()


def _together(
    configs: Sequence[Config], todo: Sequence[int], saved: Mapping[int, dict[str, Any]], swept: Sequence[str]
) -> Iterator[list[tuple[int, RoundDone]]]:
    from fedcomp.sweeps.lockstep import run_together

    for batch in run_together([configs[k] for k in todo], swept, [saved.get(k) for k in todo]):
        yield [(todo[i], step) for i, step in batch]


def run_pack(trial: dict[str, Any], spec_json: str, cluster_has_gpus: bool, env: dict[str, str], metric: str) -> None:
    """The Tune trainable of a packed trial: run its configurations (one at a time or in lockstep), report
    every configuration's evaluation rows tagged with its index, and checkpoint them all together. A deterministic
    error fails the trial without retries (:mod:`fedcomp.sweeps.failures`; ``metric``: the sweep's)."""
    reports = Reports(metric)
    with reports.final_if_deterministic():
        _run_pack(trial, spec_json, cluster_has_gpus, env, reports)


def _run_pack(trial: dict[str, Any], spec_json: str, cluster_has_gpus: bool, env: dict[str, str], reports: Reports) -> None:
    spec = trial_process(spec_json, env)
    configs = [pinned_config(spec, m, cluster_has_gpus) for m in members(trial)]
    torch_for(configs)
    restored = tune.get_checkpoint()
    pack = _restore(restored)
    on_disk.numbered_after(restored)
    far = on_disk.furthest(trial, pack.rounds, _whole, lambda found: found.rounds)
    if far is not None:  # written after Tune's last save of its state: reported again, not run again
        _report_found(far, pack.reported, trial, reports)
        pack = far.value
    resumed, saved, done, reported = pack.restored, dict(pack.saved), set(pack.done), pack.reported
    exit_round = int(env.get(FAULT_EXIT, 0)) if restored is None and far is None else 0
    todo = [k for k in range(len(configs)) if k not in done]
    if not todo:  # every configuration had finished (its rows reported from disk above)
        return
    steps = (
        _together(configs, todo, resumed, swept_floats(spec)) if spec.pack == "lockstep"
        else _one_at_a_time(configs, todo, resumed)
    )
    latest: dict[int, dict[str, Any]] = {}
    for batch in steps:
        pending: list[dict[str, Any]] = []
        save = False
        for k, step in batch:
            if step.round == exit_round:
                os._exit(1)  # fault injection for tests: the trial's process dies mid-run
            reports.note_replaced(step.replaced)
            new = [r for r in step.rows if r["round"] > reported.get(k, -1)]
            pending += [{**r, "member": k, "trial_round": r["round"]} for r in new]
            reported[k] = max(reported.get(k, -1), step.rows[-1]["round"])
            latest[k] = {**step.rows[-1], "member": k, "trial_round": step.round}
            if step.checkpoint is not None:
                saved[k] = (step.checkpoint, list(step.rows))
                save = True
            if step.round >= configs[k].run.rounds:
                done.add(k)
        if not save:
            for metrics in pending:
                reports.report(metrics)
            continue
        reports.report_saved(pending or [latest[batch[-1][0]]],  # [...]: a checkpoint round without an evaluation
                             lambda folder: _save(folder, saved, done, trial))


def _report_found(far: on_disk.Far[Pack], reported: Mapping[int, int], trial: Mapping[str, Any],
                  reports: Reports) -> None:
    """Report a packed trial's checkpoint found on disk (:func:`fedcomp.sweeps.on_disk.report_found`): each
    configuration's rows after those Tune was told of (``reported``)."""
    pack = far.value
    rows = [{**row, "member": k, "trial_round": row["round"]}
            for k, (_, kept) in sorted(pack.saved.items()) for row in kept if row["round"] > reported.get(k, -1)]
    if not rows:  # a checkpoint round without an evaluation
        k = max(pack.saved)
        rows = [{**pack.saved[k][1][-1], "member": k, "trial_round": pack.restored[k]["server"]["counters"]["round"]}]
    on_disk.report_found(far, rows, reports, lambda folder: _save(folder, pack.saved, pack.done, trial))


def read_pack_rows(checkpoint: tune.Checkpoint | None, member: int) -> list[dict[str, Any]]:
    """Configuration ``member``'s evaluation rows stored in a packed trial's checkpoint."""
    return read_trial_rows(checkpoint, f"member-{member}")
