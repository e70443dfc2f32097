"""``--extend-edges``: after a grid sweep, keep adding the next grid value past every edge optimum until the
optimum is interior, a cap is hit, or the hyperparameter's bound is reached.

The groups and edges are the report's (:mod:`fedcomp.sweeps.edges`: per panel and algorithm, a best configuration
at the smallest or largest value tried of a tuned numeric grid axis, with the next value to try -- the axis' own
ratio or step, else x sqrt(10) -- clamped to the hyperparameter's bound). One **extension step** runs, for every
such edge at once, that group's configurations at the edge value with the axis moved to the next value (every
other axis value of the group kept, the sweep's seeds, the sweep's trial machinery: ``pack`` included); then the
edges are judged again on all trials. A joint axis (keys set together, e.g. ``gamma_x,gamma_y``) moves as one:
when every key of it is an edge of the group with a next value, each key steps to its own next value at once
(``(100, 100) -> (316, 316)``); one of its keys cannot move alone. An axis of a group is extended at most ``cap``
times (default :data:`DEFAULT_CAP`); an edge that remains says why: the cap, the bound, a joint axis one of whose
keys has no next value or is no edge, or nothing new to run.

Everything lives in the sweep's folder: step ``k`` is Tune experiment ``extend-<k>/`` (its rows also in
``extend-<k>/rows.parquet``), ``extend.json`` records the cap, each step's edges and points and whether it
finished, and ``trials.parquet`` holds the grid's rows and every finished step's (trial ids ``extend-<k>/...``).
``--resume`` continues a killed step from its trials' checkpoints and then goes on extending. Grid sweeps only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from fedcomp.platform import results
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError, StorageError
from fedcomp.sweeps.edges import EXTEND_JSON, Edge, _fmt, _plain, missing, same_group, same_value, tuned_axes
from fedcomp.sweeps.report import best_and_edges
from fedcomp.sweeps.spec import SweepSpec

DEFAULT_CAP = 3
"""Extensions per axis and group when ``edge_cap`` is not given."""

ROWS = "rows.parquet"

RunStep = Callable[[SweepSpec, Path, bool], pd.DataFrame]
"""Runs a step's spec as a Tune experiment in the given folder (restoring it when the flag says so) and returns
its rows, as ``trials.parquet`` holds them."""


def check_options(spec: SweepSpec, extend_edges: bool, edge_cap: int | None) -> int | None:
    """The cap to extend with (None: no extension); one-line :class:`ConfigError` for a bad combination."""
    if edge_cap is not None and not extend_edges:
        raise ConfigError(f"edge_cap = {edge_cap}: only with extend_edges (--extend-edges)")
    if not extend_edges:
        return None
    if edge_cap is not None and (isinstance(edge_cap, bool) or not isinstance(edge_cap, int) or edge_cap < 1):
        raise ConfigError(f"edge_cap = {edge_cap!r}: must be an integer >= 1")
    if spec.search != "grid":
        raise ConfigError(f"extend_edges with search = {spec.search!r}: extends grid axes only; widen the Optuna "
                          f"space: ranges instead" + (", or use --search grid" if spec.grids else
                                                      ", or give the axes' values under `grid:` for --search grid"))
    return DEFAULT_CAP if edge_cap is None else edge_cap


@dataclass(frozen=True)
class Move:
    """One axis of one group moved one value past its edge in one step. A joint axis is named by its keys
    (``"a,b"``) and its ``start`` and ``to`` are tuples of their values, in the same order."""

    group: tuple[tuple[str, Any], ...]
    axis: str
    side: str
    start: Any
    to: Any

    @property
    def keys(self) -> list[str]:
        return self.axis.split(",")

    def values(self, which: Any) -> tuple[Any, ...]:
        """``start`` or ``to`` as one value per key."""
        return tuple(which) if len(self.keys) > 1 else (which,)

    def to_json(self) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            return list(v) if len(self.keys) > 1 else v
        return {"group": [list(kv) for kv in self.group], "axis": self.axis, "side": self.side,
                "from": plain(self.start), "to": plain(self.to)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Move:
        def value(v: Any) -> Any:
            return tuple(v) if isinstance(v, list) else v
        return Move(tuple((k, v) for k, v in data["group"]), data["axis"], data["side"], value(data["from"]), value(data["to"]))


@dataclass
class Plan:
    """The next step: the points to run and the moves they make; the edges left as they are, and why."""

    points: list[dict[str, Any]] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    remaining: list[tuple[Edge, str]] = field(default_factory=list)


def _config_value(spec: SweepSpec, point: Mapping[str, Any], key: str) -> Any:
    """``key``'s value in the point's run config (a group key such as ``algorithm.name`` may be set by the base)."""
    if key in point:
        return point[key]
    section, _, name = key.partition(".")
    try:
        return load_config(spec.base, {**spec.set, **point}).to_dict().get(section, {}).get(name)
    except ConfigError:
        return None


def _in_group(spec: SweepSpec, point: Mapping[str, Any], group: Sequence[tuple[str, Any]]) -> bool:
    return all(same_value(point.get(key) if missing(value) else _config_value(spec, point, key), value) for key, value in group)


def known_points(spec: SweepSpec, steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The grid's points and every extension step's, in order."""
    return [*spec.points(), *(dict(p) for step in steps for p in step["points"])]


def _valid(spec: SweepSpec, point: Mapping[str, Any]) -> bool:
    try:
        load_config(spec.base, {**spec.set, **point})
    except ConfigError:
        return False
    return True


def plan(trials: pd.DataFrame, spec: SweepSpec, steps: Sequence[Mapping[str, Any]], cap: int) -> Plan:
    """The next extension step for the sweep's ``trials`` after ``steps`` (``extend.json``'s records)."""
    by = [*spec.panels, "algorithm.name"]
    _, edges = best_and_edges(trials, spec, by=by)
    partners = {a.name: a.partners for a in tuned_axes(spec, by)}
    done = [Move.from_json(m) for step in steps for m in step["moves"]]
    known = known_points(spec, steps)
    out = Plan()
    for edge in edges:
        keys = _joint_keys(spec, partners.get(edge.axis, frozenset([edge.axis])))
        together = [next((e for e in edges if e.axis == k and same_group(e.group, edge.group)), None) for k in keys]
        if edge.kind == "grid" and len(keys) > 1 and edge is not next(e for e in together if e is not None):
            continue  # a joint axis is judged once, at its first key with an edge, for all its keys
        axis = ",".join(keys)
        count = sum(1 for m in done if m.axis == axis and same_group(m.group, edge.group))
        why = None
        if edge.kind != "grid":
            why = "an Optuna range"
        elif len(keys) > 1 and any(e is None or e.next is None for e in together):
            stuck = [f"{k} is no edge" if e is None else f"{k} is at the bound ({e.bound})" if e.bound else f"{k} has no next value"
                     for k, e in zip(keys, together) if e is None or e.next is None]
            why = f"a joint axis ({','.join(sorted(keys))}): its keys move together, and {', '.join(stuck)}"
        elif edge.next is None:
            why = f"at the bound ({edge.bound})" if edge.bound else "no next value"
        elif count >= cap:
            why = f"cap of {cap} extension{'s' if cap > 1 else ''} reached"
        else:
            start, to = (tuple(_plain(e.value) for e in together if e), tuple(_plain(e.next) for e in together if e))
            move = Move(edge.group, axis, edge.side, *((start, to) if len(keys) > 1 else (start[0], to[0])))
            if _moved_points(spec, known, [move]):
                out.moves.append(move)
            else:
                why = "nothing new to run (the next value was tried)"
        if why is not None:
            out.remaining += [(e, why) for e in (together if len(keys) > 1 else [edge]) if e is not None]
    out.points = _moved_points(spec, known, out.moves)
    return out


def _joint_keys(spec: SweepSpec, partners: frozenset[str]) -> list[str]:
    """The keys of a joint axis in the order the sweep file names them (a lone axis: itself)."""
    for grid in spec.grids:
        for axis in grid:
            if set(axis.split(",")) == partners:
                return axis.split(",")
    return sorted(partners)


def _moved_points(spec: SweepSpec, known: Sequence[Mapping[str, Any]], moves: Sequence[Move]) -> list[dict[str, Any]]:
    """The points of each move's group at its edge value, moved to its next value; the points made here count
    too, so two axes of one group moved in one step also get their corner (every other axis value kept)."""
    pool = [dict(p) for p in known]
    new: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    changed = True
    while changed:
        changed = False
        for move in moves:
            start, to = move.values(move.start), move.values(move.to)
            for point in [*pool, *new]:
                if _in_group(spec, point, move.group) and all(same_value(point.get(k), v) for k, v in zip(move.keys, start)):
                    moved = {**point, **dict(zip(move.keys, to))}
                    if moved in pool or moved in new or moved in rejected:
                        continue
                    if _valid(spec, moved):
                        new.append(moved)
                        changed = True
                    else:
                        rejected.append(moved)
    return new


def step_spec(spec: SweepSpec, points: Sequence[Mapping[str, Any]], k: int) -> SweepSpec:
    """The sweep's spec with its grid replaced by ``points`` (one single-point grid each): what step ``k`` runs."""
    data = spec.model_dump()
    data.update(name=f"{spec.name or 'sweep'}-extend-{k}", grid=[{key: [v] for key, v in p.items()} for p in points],
                panels=[], table=None)
    return SweepSpec.model_validate(data)


def _state(path: Path) -> dict[str, Any]:
    """``extend.json`` of the sweep in ``path``, checked to be fedcomp's record of its extension steps.

    Raises:
        StorageError: it cannot be read, or is not such a record (edited, damaged); nothing is changed.
    """
    state = results.read_json(path / EXTEND_JSON)
    try:
        cap, steps = state["cap"], state["steps"]
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1 or not isinstance(steps, list):
            raise TypeError("cap must be a whole number >= 1 and steps a list")
        for step in steps:
            if not isinstance(step["points"], list) or not isinstance(step.get("done", False), bool):
                raise TypeError("a step's points must be a list and done true or false")
            for move in step["moves"]:
                Move.from_json(move)
    except (KeyError, TypeError, ValueError) as error:
        raise StorageError(f"{path / EXTEND_JSON} is not fedcomp's record of this sweep's edge extensions "
                           f"({type(error).__name__}: {error}); put it back, or delete it to stop extending") from None
    return state


def check_record(path: Path) -> None:
    """Where the sweep in ``path`` extends its edges, check its record (:func:`_state`) before a resume starts."""
    if (path / EXTEND_JSON).is_file():
        _state(path)


def start(path: Path, cap: int) -> None:
    """Record, before the grid runs, that this sweep extends its edges (so ``--resume`` goes on extending)."""
    results.write_json(path / EXTEND_JSON, {"cap": cap, "steps": [], "summary": []})


def _combine(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    for column in out.columns:  # a column int in one frame and text in another: Parquet needs one type
        if out[column].dtype == object and out[column].dropna().map(type).nunique() > 1:
            out[column] = out[column].map(lambda v: v if missing(v) or isinstance(v, (list, tuple)) else str(v))
    return out


def extend(path: Path, spec: SweepSpec, grid_rows: pd.DataFrame, run_step: RunStep, trials_file: str) -> pd.DataFrame:
    """Run extension steps until no edge can move (continuing recorded unfinished steps first); rewrite
    ``trials_file`` with the grid's rows and every finished step's after each step; return all rows."""
    state = _state(path)
    cap = int(state["cap"])
    frames = [grid_rows]
    for k, step in enumerate(state["steps"], start=1):
        folder = path / f"extend-{k}"
        if step.get("done") and (folder / ROWS).is_file():
            frames.append(results.read_parquet(folder / ROWS))
        else:  # killed mid-step: its trials continue from their checkpoints
            frames.append(_run(spec, state, k, folder, run_step, restore=True, path=path, trials_file=trials_file, frames=frames))
    trials = _combine(frames)
    if state["steps"]:  # the grid's trials file (just written) lacks the recorded steps' rows
        results.write_parquet(path / trials_file, trials)
    while True:
        next_step = plan(trials, spec, state["steps"], cap)
        if not next_step.points:
            break
        k = len(state["steps"]) + 1
        step = {"moves": [m.to_json() for m in next_step.moves], "points": next_step.points, "done": False}
        state["steps"].append(step)
        results.write_json(path / EXTEND_JSON, state)
        frames.append(_run(spec, state, k, path / f"extend-{k}", run_step, restore=False, path=path, trials_file=trials_file, frames=frames))
        trials = _combine(frames)
    state["summary"] = summary(trials, spec, state["steps"], cap)
    results.write_json(path / EXTEND_JSON, state)
    return trials


def _run(spec: SweepSpec, state: dict[str, Any], k: int, folder: Path, run_step: RunStep, *, restore: bool,
         path: Path, trials_file: str, frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Run (or continue) step ``k`` of ``state``; store its rows, rewrite the sweep's trials and record the step
    as done (in ``state`` and its file)."""
    step = state["steps"][k - 1]
    rows = run_step(step_spec(spec, step["points"], k), folder, restore)
    rows = rows.assign(trial=f"extend-{k}/" + rows["trial"].astype(str)) if "trial" in rows else rows
    results.write_parquet(folder / ROWS, rows)
    results.write_parquet(path / trials_file, _combine([*frames, rows]))
    step["done"] = True
    results.write_json(path / EXTEND_JSON, state)
    return rows


def _who(group: Sequence[tuple[str, Any]]) -> str:
    name = ", ".join(str(v) for k, v in group if k == "algorithm.name")
    where = ", ".join(f"{k.split('.', 1)[-1]}={_fmt(v)}" for k, v in group if k != "algorithm.name")
    return f"{name} at {where}" if where and name else (name or where or "the sweep")


def _fmt_values(values: tuple[Any, ...]) -> str:
    """One axis' value as the summary prints it; a joint axis' values as ``(a, b)``."""
    return _fmt(values[0]) if len(values) == 1 else "(" + ", ".join(_fmt(v) for v in values) + ")"


def summary(trials: pd.DataFrame, spec: SweepSpec, steps: Sequence[Mapping[str, Any]], cap: int) -> list[str]:
    """The report's lines: each extended axis of each group (how far, in how many steps, and where its best is
    now), then each edge that remains and why."""
    moves = [Move.from_json(m) for step in steps for m in step["moves"]]
    by = [*spec.panels, "algorithm.name"]
    best, _ = best_and_edges(trials, spec, by=by)
    remaining = plan(trials, spec, steps, cap).remaining
    lines = []
    seen: list[tuple[tuple[tuple[str, Any], ...], str, str]] = []
    for move in moves:
        key = (move.group, move.axis, move.side)
        if any(same_group(g, move.group) and a == move.axis and s == move.side for g, a, s in seen):
            continue
        seen.append(key)
        chain = [m for m in moves if same_group(m.group, move.group) and m.axis == move.axis and m.side == move.side]
        values = " → ".join(_fmt_values(move.values(v)) for v in [chain[0].start, *(m.to for m in chain)])
        row = next((r for _, r in best.iterrows() if same_group(tuple((k, r[k]) for k in by), move.group)), None)
        now = ("" if row is None or any(missing(row[k]) for k in move.keys)
               else f"; best now {_fmt_values(tuple(_plain(row[k]) for k in move.keys))}")
        still = any(same_group(e.group, move.group) and e.axis in move.keys for e, _ in remaining)
        lines.append(f"extended: {_who(move.group)} {move.axis} {'upward' if move.side == 'high' else 'downward'} "
                     f"in {len(chain)} step{'s' if len(chain) > 1 else ''}: {values}{now}"
                     f"{' (still an edge)' if still else ' (interior)'}")
    for edge, why in remaining:
        lines.append(f"edge remains: {_who(edge.group)} {edge.axis} = {_fmt(edge.value)} "
                     f"({'largest' if edge.side == 'high' else 'smallest'} tried): {why}")
    if not lines:
        lines.append("no edge optimum: nothing extended")
    return lines
