"""The edge guard: a best configuration whose value on a tuned numeric axis is the smallest or largest value the
sweep tried says little about that axis' optimum -- the optimum may lie past the grid -- so every report marks it.

For each group the report ranks (per algorithm, per panel, per cell of a paper table) and each *tuned numeric axis*
of the sweep -- a grid axis whose values are all numbers, or an Optuna ``uniform`` / ``loguniform`` / ``int`` range
or an all-numeric ``choice`` -- the group's best configuration is an **edge optimum** on that axis when:

* grid axis: its value is the smallest or largest value tried *on the best configuration's line* (the group's
  configurations that share the best's value of every other axis; so a union of grids with different values per
  algorithm or per local-step count is judged on what was tried beside the best). An axis tried at two values
  only is always on an edge: it is flagged too, and the warning says so (two values bracket nothing).
* Optuna range: its value lies in the outer :data:`EDGE_FRACTION` (5 %) of the range at either end, measured in
  log space for ``loguniform``; an all-numeric ``choice``: the smallest or largest choice.

Not tuned, so never flagged: ``run.seed`` (repeats), the axes that make the groups (``algorithm.name``, the
panels, a paper table's rows and columns) and axes set jointly with one of them, categorical axes, and an axis
with fewer than two values on the best's line. Each edge of a grid axis names the next value to try past it:
the axis' own ratio for a geometric grid (two positive values count as geometric), its step for an arithmetic
one, otherwise x sqrt(10) (positive floats) or the last gap (integers); a value past a hyperparameter's validated
bound is clamped to an inclusive bound, and where nothing is left past the bound the edge says "at the bound".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import pandas as pd
from annotated_types import Ge, Gt, Le, Lt

from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.sweeps.spec import SweepSpec

EDGE_FRACTION = 0.05
"""An Optuna range's outer share (at each end, in log space for ``loguniform``) that counts as its edge."""

RANGES = ("uniform", "loguniform", "int")

EXTEND_JSON = "extend.json"
"""In a sweep folder: the record of ``--extend-edges`` (:mod:`fedcomp.sweeps.extend`), whose ``summary`` lines the
report prints."""


def missing(value: object) -> bool:
    """A missing cell (None, NA or NaN): an axis that does not apply to a trial's algorithm."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def matches(column: pd.Series, value: object) -> pd.Series:
    """The rows of ``column`` holding ``value``; a missing value (an axis that does not apply to an algorithm,
    e.g. FCSG's beta) matches the missing ones -- comparing text alone dropped them, as ``astype(str)`` keeps
    NaN, which equals nothing."""
    if missing(value):
        return column.isna()
    return column.notna() & (column.astype(str) == str(value))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds (what YAML, configs and messages expect)."""
    return value.item() if hasattr(value, "item") else value


def _fmt(value: Any) -> str:
    """A number as the messages print it (``0.316228``); anything else (a panel's dataset name) as its text."""
    value = _plain(value)
    return f"{value:.6g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Axis:
    """A tuned numeric axis: its key, how it is searched, its values (grid or choice) or range, and the keys set
    jointly with it (itself included)."""

    name: str
    kind: Literal["grid", "choice", "uniform", "loguniform", "int"]
    values: tuple[Any, ...]
    partners: frozenset[str]

    @property
    def integer(self) -> bool:
        return self.kind == "int" or all(isinstance(v, int) for v in self.values)


@dataclass(frozen=True)
class Edge:
    """One edge optimum: the group whose best configuration it is, the axis, the best's value and which end."""

    group: tuple[tuple[str, Any], ...]
    axis: str
    value: Any
    side: Literal["low", "high"]
    kind: Literal["grid", "range"]
    tried: tuple[Any, ...]
    """grid: the values tried on the best's line, sorted; range: (low, high) of the Optuna range."""
    next: Any = None
    """The value to try past the edge (grid axes); None where a bound (or the range) leaves none."""
    bound: str | None = None
    """Why there is no next value: the validated bound the best sits at (e.g. ``algorithm.beta <= 1``)."""
    log: bool = False
    choice: bool = False
    """A grid edge among an Optuna ``choice`` axis's values (widened in ``space:``, not ``grid:``)."""

    @property
    def two_values(self) -> bool:
        return self.kind == "grid" and len(self.tried) == 2

    @property
    def arrow(self) -> str:
        return "↑" if self.side == "high" else "↓"

    @property
    def marker(self) -> str:
        """What the tables append to the value, e.g. ``lr=0.3 ↑edge``."""
        return f"{self.arrow}edge"

    def who(self) -> str:
        """``local-scgdam's best`` or ``local-scgdam at dataset=digits, local_steps=4: best``."""
        name = ", ".join(str(v) for k, v in self.group if k == "algorithm.name")
        where = ", ".join(f"{k.split('.', 1)[-1]}={_fmt(v)}" for k, v in self.group if k != "algorithm.name")
        if not where:
            return f"{name or 'the sweep'}'s best"
        return f"{name} at {where}: best" if name else f"at {where}: best"

    def warning(self) -> str:
        """One line: who, which axis and value, which end, and what to try next."""
        head = f"edge: {self.who()} {self.axis} = {_fmt(self.value)}"
        if self.kind == "range":
            lo, hi = self.tried
            where = f"the {'upper' if self.side == 'high' else 'lower'} {EDGE_FRACTION:.0%} of its {'log ' if self.log else ''}range [{_fmt(lo)}, {_fmt(hi)}]"
            text = f"{head} lies in {where}; widen the range"
        else:
            text = f"{head} is the {'largest' if self.side == 'high' else 'smallest'} value tried"
            if self.two_values:
                text += " (only two values tried, so always an edge)"
            text += "; widen its choices in space:" if self.choice else "; widen the grid"
        if self.next is not None:
            return f"{text} (next: {_fmt(self.next)})"
        return f"{text} -- at the bound ({self.bound})" if self.bound else text


def tuned_axes(spec: SweepSpec, by: Sequence[str]) -> list[Axis]:
    """The sweep's tuned numeric axes when ranking per value combination of ``by`` (see the module's text)."""
    excluded = {*by, "run.seed"}
    axes: list[Axis] = []
    if spec.search == "optuna":
        for name, dist in spec.space.items():
            kind, args = next(iter(dist.items()))
            if name in excluded or (kind == "choice" and not all(_number(v) for v in args)):
                continue
            axes.append(Axis(name, cast(Any, kind), tuple(sorted(args) if kind == "choice" else args), frozenset([name])))
        return axes
    values: dict[str, list[Any]] = {}
    partners: dict[str, set[str]] = {}
    for grid in spec.grids:
        for axis, given in grid.items():
            keys = axis.split(",")
            for i, key in enumerate(keys):
                values.setdefault(key, []).extend(v[i] if len(keys) > 1 else v for v in given)
                partners.setdefault(key, set()).update(keys)
    for key, seen in values.items():
        if partners[key] & excluded or not all(_number(v) for v in seen):
            continue
        axes.append(Axis(key, "grid", tuple(sorted(set(seen))), frozenset(partners[key])))
    return axes


def _next_value(tried: Sequence[Any], side: str, integer: bool) -> Any:
    """The grid's next value past its ``side`` end: its own ratio (geometric), its step (arithmetic), else
    x sqrt(10) for positive floats or the end's own gap."""
    ordered = [float(v) for v in tried]
    end, inner = (ordered[-1], ordered[-2]) if side == "high" else (ordered[0], ordered[1])
    gaps = [b - a for a, b in itertools.pairwise(ordered)]
    positive = ordered[0] > 0
    ratios = [b / a for a, b in itertools.pairwise(ordered)] if positive else []
    arithmetic = all(math.isclose(g, gaps[0], rel_tol=1e-6) for g in gaps)
    geometric = bool(ratios) and all(math.isclose(r, ratios[0], rel_tol=1e-6) for r in ratios)
    if integer:
        if geometric and not arithmetic:
            value = end * ratios[0] if side == "high" else end / ratios[0]
        else:
            value = end + (end - inner)
        return round(value)
    if geometric:
        value = end * ratios[0] if side == "high" else end / ratios[0]
    elif arithmetic or not positive:
        value = end + (end - inner)
    else:
        value = end * math.sqrt(10) if side == "high" else end / math.sqrt(10)
    return float(f"{value:.12g}")


def _clamp(spec: SweepSpec, point: Mapping[str, Any], axis: str, value: Any, candidate: Any, side: str) -> tuple[Any, str | None]:
    """``candidate`` kept within the hyperparameter's validated bounds (clamped to an inclusive bound past
    ``value``), or None and the bound that leaves nothing past ``value``."""
    section, _, field = axis.partition(".")
    try:
        config = load_config(spec.base, {**spec.set, **point})
    except ConfigError:
        return None, "the best configuration no longer validates"
    model = getattr(config, section, None)
    info = type(model).model_fields.get(field) if model is not None else None
    limit: Any
    for rule in info.metadata if info is not None else []:
        if side == "high" and isinstance(rule, (Le, Lt)):
            limit, inclusive = (rule.le, True) if isinstance(rule, Le) else (rule.lt, False)
            if candidate > limit or (candidate == limit and not inclusive):
                if not inclusive or value >= limit:
                    return None, f"{axis} {'<=' if inclusive else '<'} {_fmt(limit)}"
                candidate = limit
        if side == "low" and isinstance(rule, (Ge, Gt)):
            limit, inclusive = (rule.ge, True) if isinstance(rule, Ge) else (rule.gt, False)
            if candidate < limit or (candidate == limit and not inclusive):
                if not inclusive or value <= limit:
                    return None, f"{axis} {'>=' if inclusive else '>'} {_fmt(limit)}"
                candidate = limit
    if candidate == value:
        return None, f"{axis} cannot go {'above' if side == 'high' else 'below'} {_fmt(value)}"
    try:
        load_config(spec.base, {**spec.set, **point, axis: candidate})
    except ConfigError as error:
        return None, str(error)
    return candidate, None


Side = Literal["low", "high"]


def _range_side(axis: Axis, value: float) -> Side | None:
    low, high = (float(v) for v in axis.values)
    if axis.kind == "loguniform":
        low, high, value = math.log(low), math.log(high), math.log(value)
    where = (value - low) / (high - low)
    return "low" if where <= EDGE_FRACTION else "high" if where >= 1 - EDGE_FRACTION else None


def find_edges(table: pd.DataFrame, best: pd.DataFrame, spec: SweepSpec, by: Sequence[str]) -> list[Edge]:
    """Every edge optimum of the ``best`` configurations (one row per value combination of ``by``) among the
    configurations of ``table`` (one row per configuration: the varying axes' columns and ``mean``)."""
    keys = [c for c in table.columns if c not in ("mean", "std", "seeds")]
    axes = [a for a in tuned_axes(spec, by) if a.name in table]
    edges: list[Edge] = []
    for _, row in best.iterrows():
        group = table
        for key in by:
            group = group[matches(group[key], row[key])]
        point = {k: _plain(row[k]) for k in keys if not missing(row[k])}
        for axis in axes:
            value = _plain(row[axis.name])
            if missing(value) or not _number(value):
                continue
            if axis.integer and float(value).is_integer():
                value = int(value)
            found: Edge | None = None
            label = tuple((k, _plain(row[k])) for k in by)
            if axis.kind in RANGES:
                side = _range_side(axis, value)
                if side:
                    found = Edge(label, axis.name, value, side, "range", axis.values, log=axis.kind == "loguniform")
            else:
                line = group
                for other in keys:
                    if other not in by and other not in axis.partners:
                        line = line[matches(line[other], row[other])]
                tried: tuple[Any, ...] = axis.values if axis.kind == "choice" else tuple(sorted({_plain(v) for v in line[axis.name] if not missing(v)}))
                if len(tried) >= 2 and value in (tried[0], tried[-1]):
                    end: Side = "high" if value == tried[-1] else "low"
                    found = Edge(label, axis.name, value, end, "grid", tried, choice=axis.kind == "choice")
                    if axis.kind == "grid":
                        candidate = _next_value(tried, end, axis.integer)
                        nxt, bound = _clamp(spec, point, axis.name, value, candidate, end)
                        found = Edge(label, axis.name, value, end, "grid", tried, nxt, bound)
            if found is not None:
                edges.append(found)
    return edges


def edge_column(best: pd.DataFrame, edges: Sequence[Edge], by: Sequence[str]) -> list[str]:
    """Per row of ``best``: its axes at an edge, e.g. ``algorithm.lr ↑`` (comma-separated; empty if none)."""
    return [", ".join(f"{e.axis} {e.arrow}" for e in edges_of(edges, row, by)) for _, row in best.iterrows()]


def same_value(a: Any, b: Any) -> bool:
    """Values equal as plain Python values (or as text: Parquet may hand back a number as a string), a missing
    value equal only to a missing one."""
    a, b = _plain(a), _plain(b)
    if missing(a) or missing(b):
        return missing(a) and missing(b)
    return bool(a == b) or str(a) == str(b)


def same_group(a: Sequence[tuple[str, Any]], b: Sequence[tuple[str, Any]]) -> bool:
    """Group labels equal: the same keys in the same order, with :func:`same_value` values."""
    return len(a) == len(b) and all(ka == kb and same_value(va, vb) for (ka, va), (kb, vb) in zip(a, b))


def edges_of(edges: Sequence[Edge], row: pd.Series, by: Sequence[str]) -> list[Edge]:
    """The edges of the best configuration ``row`` (its values of ``by``)."""
    label = tuple((k, _plain(row[k])) for k in by)
    return [e for e in edges if same_group(e.group, label)]
