"""A sweep specification: the base experiment, the axes to search, repeats, and how to schedule trials.

A sweep file (or a preset in ``fedcomp/sweeps/presets``) looks like::

    # one-line description
    base: fig1-fcsg-m                  # a run preset, a run YAML file (beside this one), or the four sections
    set: {run.rounds: 40}              # fixed overrides of the base
    grid:                              # --search grid: one grid, or a list of grids whose union is searched
      - {algorithm.name: [fcsg], algorithm.lr: [0.01, 0.005, 0.001]}
      - {algorithm.name: [fcsg-m], algorithm.lr: [0.01, 0.005], algorithm.beta: [0.1, 0.9]}
      - {"algorithm.local_steps,run.rounds": [[4, 100], [8, 50]]}   # a joint axis: values set together
    space:                             # --search optuna: one distribution per axis
      algorithm.lr: {loguniform: [0.001, 0.1]}
      algorithm.beta: {choice: [0.1, 0.5, 0.9]}
    seeds: 3                           # repeats: run.seed, run.seed + 1, ...
    metric: test_accuracy              # default: the task's headline metric
    mode: max                          # default: the task's direction for its headline metric
    pack: lockstep                     # optional: several configurations per trial (none | sequential | lockstep)
    table:                             # optional: the report also tabulates the sweep in a paper's layout
      rows: [task.dataset, algorithm.name]
      columns: algorithm.local_steps   # one column per value; each cell at the best of the other axes
      metrics: [client_auroc_var]      # more metrics shown at the same chosen configurations

Every grid point (or, for Optuna, the space's corners) is validated as a full run config before anything
starts, so an unknown axis, a value out of range or an algorithm/task mismatch is one clear line.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedcomp.platform import catalog
from fedcomp.platform.config import SECTIONS, Config, import_user_module, load_config, plain_name
from fedcomp.platform.errors import ConfigError, did_you_mean, shown
from fedcomp.platform.params import Params
from fedcomp.platform.report import metric_mode
from fedcomp.platform.yamlfile import first_comment, parse_yaml, read_yaml_file

DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")

Grid = dict[str, list[Any]]


class TableSpec(BaseModel):
    """A sweep's results in a paper's layout: one row per value combination of ``rows``, one column per value of
    ``columns``; each cell is the best configuration of the remaining axes (mean ± std over seeds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: list[str] = Field(min_length=1, description="axes whose values make the rows")
    columns: str = Field(description="the axis whose values make the columns")
    metrics: list[str] = Field(default_factory=list, description="more metrics shown at the chosen configurations")


class SweepSpec(Params):
    """A validated sweep: what to run (``base`` + ``set``), what to vary, and how (frozen, and strict about a
    boolean where a number is wanted, as every parameter model is: ``seeds: true`` is not one seed)."""

    model_config = ConfigDict(**{**Params.model_config, "validate_default": False})  # an unset grid stays {}: a
    # spec read back from its JSON (a trial's, sweep.json) would otherwise give the validator the [] it refuses

    name: str | None = Field(None, description="sweep-id prefix (default: the preset or file name)")
    description: str = ""
    base: str | dict[str, Any] = Field("quickstart", description="run preset, run YAML file, or sections")
    modules: list[str] = Field(default_factory=list, description="modules (dotted names or .py files) of the "
                               "user's tasks and algorithms the sweep runs, which every trial imports (filled in "
                               "from the trials' configs)")
    set: dict[str, Any] = Field(default_factory=dict, description="fixed section.key overrides")
    grid: dict[str, Any] | list[dict[str, Any]] = Field(default_factory=dict, description="grid axes (a list = union of grids)")
    space: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Optuna axes: {dist: args}")
    search: Literal["grid", "optuna"] = "grid"
    num_samples: int = Field(1, ge=1, description="Optuna: configurations to try; grid: must be 1")
    seeds: int = Field(1, ge=1, description="repeats of every configuration, seeds run.seed, run.seed+1, ...")
    metric: str | None = None
    mode: Literal["min", "max"] | None = None
    panels: list[str] = Field(default_factory=list, description="axes that split the report into panels (best per panel)")
    table: TableSpec | None = Field(None, description="tabulate the report in a paper's layout")
    scheduler: Literal["none", "asha"] = "none"
    grace_rounds: int = Field(5, ge=1, description="ASHA: rounds every trial gets before it can be stopped")
    max_concurrent: int | None = Field(None, ge=1, description="trials running at once (default: as many as fit, "
                                       "and for Ray-backend trials whose actors share the trial's CPUs, as many "
                                       "as give each of their processes a whole CPU: benchmarks/SWEEP.md)")
    cpus_per_trial: float = Field(1.0, gt=0, description="CPUs one trial's server and client actors share")
    gpus_per_trial: float = Field(1.0, ge=0, description="GPUs one trial's clients share, where the cluster has GPUs")
    placement: Literal["pack", "spread"] = Field("pack", description="placement-group strategy of a trial")
    max_failures: int = Field(2, ge=0, description="times a failed trial is retried from its last checkpoint")
    seed: int = Field(0, ge=0, description="seed of the Optuna sampler")
    pack: Literal["none", "sequential", "lockstep"] = Field(
        "none", description="grid configurations per Tune trial: one (none), several one at a time (sequential, "
        "bit for bit), or several in lockstep in one process (lockstep: configurations differing only in float "
        "algorithm fields, vmapped; equal up to float32 rounding)",
    )
    reuse_actors: bool = Field(True, description="a finished trial's process runs the next trial of the same "
                               "resources (saves the process start and imports; false: a fresh process per trial)")
    keep_actors: bool = Field(True, description="Ray-backend runs hand their server and client actors to the "
                              "next run in the same trial process, rebuilt from its config (saves starting them; "
                              "false: fresh actors per run)")
    pack_size: int | None = Field(None, ge=1, description="configurations per packed trial (default: sequential 8, "
                                  "lockstep every configuration of one shape)")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        return None if value is None else plain_name(value)

    @field_validator("grid")
    @classmethod
    def _grid(cls, value: dict[str, Any] | list[dict[str, Any]]) -> list[Grid] | dict[str, Any]:
        """A list of grids; no grid stays ``{}``, as it was given (``[]`` is refused: a stored spec read back
        -- a resumed sweep's -- made ``{}`` into a ``[]`` its trials then refused)."""
        if value == {}:
            return {}
        grids = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            raise ValueError("grid = []: an empty list of grids has no points; give at least one grid or leave it out")
        for grid in grids:
            for axis, values in grid.items():
                if not isinstance(values, list) or not values:
                    raise ValueError(f"grid axis {axis} = {values!r}: must be a non-empty list of values")
                width = len(axis.split(","))
                if len(set(axis.split(","))) < width:
                    raise ValueError(f"grid axis {axis}: a joint axis names each key once")
                if width > 1 and any(not isinstance(v, list) or len(v) != width for v in values):
                    raise ValueError(f"grid axis {axis} = {values!r}: a joint axis of {width} keys takes lists of {width} values")
        return grids

    # ---- derived -------------------------------------------------------------------------------------

    @property
    def grids(self) -> list[Grid]:
        return self.grid if isinstance(self.grid, list) else []  # normalised to a list by the validator, or {}

    def points(self) -> list[dict[str, Any]]:
        """Every grid point (the union of the grids' Cartesian products, in order, without duplicates)."""
        out: list[dict[str, Any]] = []
        for grid in self.grids or [{}]:
            axes = list(grid)
            for values in itertools.product(*(grid[a] for a in axes)):
                point: dict[str, Any] = {}
                for axis, value in zip(axes, values):
                    keys = axis.split(",")
                    point.update(zip(keys, value) if len(keys) > 1 else [(axis, value)])
                if point not in out:
                    out.append(point)
        return out

    def base_config(self, **more: Any) -> Config:
        self.import_modules()
        return load_config(self.base, {**self.set, **more})

    def import_modules(self) -> None:
        """Import :attr:`modules`, so that this process knows the user's tasks and algorithms by name (a trial's
        process does not otherwise: only the driver imported them)."""
        for source in self.modules:
            import_user_module(source, f"sweep modules: {source!r}")

    def seed_values(self) -> list[int]:
        first = self.base_config().run.seed
        return [first + i for i in range(self.seeds)]

    def resolved_metric(self) -> tuple[str, Literal["min", "max"]]:
        """The metric to rank trials by and its direction. Defaults: the task's headline metric in the
        task's own direction; for another metric, min for losses, distances and gradient norms, else max."""
        task = catalog.tasks()[self.base_config().task_name]
        metric = self.metric or task.metrics[0]
        if self.mode:
            return metric, self.mode
        return metric, metric_mode(self.base_config().task_name, metric)

    def trial_overrides(self, trial: Mapping[str, Any]) -> dict[str, Any]:
        """The full override set of one Tune trial config (``point``/axes, then the repeat's seed)."""
        overrides = {**self.set, **trial.get("point", {})}
        overrides.update({k: v for k, v in trial.items() if "." in k})
        if "__trial_index__" in trial:  # Optuna repeats (Tune's Repeater numbers them 0..seeds-1)
            overrides["run.seed"] = self.seed_values()[int(trial["__trial_index__"])]
        return overrides

    def trial_config(self, trial: Mapping[str, Any]) -> Config:
        self.import_modules()
        return load_config(self.base, self.trial_overrides(trial))

    def axes(self) -> list[str]:
        """The names of everything the sweep varies (grid axes or Optuna axes, and the seed)."""
        names = (list(dict.fromkeys(k for g in self.grids for a in g for k in a.split(",")))
                 if self.search == "grid" else list(self.space))
        return names + (["run.seed"] if "run.seed" not in names else [])


def _axis_key(axis: str, where: str) -> None:
    section, _, field = axis.partition(".")
    if section not in SECTIONS or not field or "." in field:
        raise ConfigError(f"{where} {axis!r}: not of the form section.key with section one of {', '.join(SECTIONS)}")


def _check_distribution(axis: str, dist: Mapping[str, Any]) -> None:
    if len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
        raise ConfigError(
            f"space {axis} = {{{', '.join(f'{k}: {v!r}' for k, v in dist.items())}}}: must be one of "
            f"{', '.join(f'{{{d}: ...}}' for d in DISTRIBUTIONS)}"
        )
    kind, args = next(iter(dist.items()))
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise ConfigError(f"space {axis} = {{choice: {args!r}}}: must be a non-empty list of values")
        return
    if not (isinstance(args, list) and len(args) == 2 and all(isinstance(a, (int, float)) for a in args)):
        raise ConfigError(f"space {axis} = {{{kind}: {args!r}}}: must be [low, high]")
    low, high = args
    if not (math.isfinite(low) and math.isfinite(high) and low < high) or (kind == "loguniform" and low <= 0):
        allowed = "0 < low < high" if kind == "loguniform" else "low < high"
        raise ConfigError(f"space {axis} = {{{kind}: {args!r}}}: needs {allowed}")


def corners(spec: SweepSpec) -> list[dict[str, Any]]:
    """Optuna axes at their low and high ends (each choice once): the values checked before the sweep."""
    out: list[dict[str, Any]] = []
    for axis, dist in spec.space.items():
        kind, args = next(iter(dist.items()))
        values = args if kind == "choice" else [int(a) if kind == "int" else a for a in args]
        out.extend({axis: v} for v in values)
    return out or [{}]


def _check_pack(spec: SweepSpec, backends: set[str]) -> None:
    """Packed trials need a grid, no early stopping, and (lockstep) the in-process backend (``backends``: those
    the sweep's points use)."""
    if spec.pack == "none":
        if spec.pack_size is not None:
            raise ConfigError(f"pack_size = {spec.pack_size}: only with pack = 'sequential' or 'lockstep'")
        return
    if spec.search != "grid":
        raise ConfigError(f"pack = {spec.pack!r}: packs grid configurations; with search = 'optuna' use pack = 'none'")
    if spec.scheduler != "none":
        raise ConfigError(f"pack = {spec.pack!r}: ASHA stops whole trials, not one configuration of a pack; "
                          f"use scheduler = 'none' or pack = 'none'")
    if spec.pack == "lockstep" and backends != {"local"}:
        raise ConfigError("pack = 'lockstep' runs a trial's configurations in one process: set "
                          "federation.backend = 'local' (or use pack = 'sequential')")


def validate(spec: SweepSpec) -> list[str]:
    """Check that every trial of ``spec`` is a valid run config; raise :class:`ConfigError` naming the first
    bad axis, value or combination. Returns the modules of the user's tasks and algorithms that the trials run
    and :attr:`SweepSpec.modules` lacks."""
    if spec.search == "optuna":
        if spec.grids:
            axes = ", ".join(dict.fromkeys(a for g in spec.grids for a in g))
            raise ConfigError(
                f"search = 'optuna' cannot take grid axes ({axes}): Optuna proposes every value itself and Tune's "
                f"grid_search does not mix with a searcher; give each axis in `space:` as a distribution "
                f"(e.g. {{choice: [...]}}) or use --search grid"
            )
        if not spec.space:
            raise ConfigError("search = 'optuna' needs a `space:` with at least one axis, e.g. algorithm.lr: {loguniform: [0.001, 0.1]}")
        for axis, dist in spec.space.items():
            _axis_key(axis, "space axis")
            _check_distribution(axis, dist)
        candidates = corners(spec)
    else:
        if spec.space:
            raise ConfigError(
                f"space: ({', '.join(spec.space)}) gives distributions for --search optuna; with --search grid "
                f"give the values to try under `grid:`"
            )
        if spec.num_samples != 1:
            raise ConfigError(
                f"num_samples = {spec.num_samples}: a grid search tries every point once; repeat it with "
                f"seeds: N (or --seeds N)" + (", or give the axes as distributions under `space:` for --search optuna"
                                              if spec.grids else ", or use --search optuna")
            )
        for grid in spec.grids:
            for axis in grid:
                for key in axis.split(","):
                    _axis_key(key, "grid axis")
                    if key == "run.seed" and spec.seeds > 1:
                        raise ConfigError(f"grid axis {axis} with seeds = {spec.seeds}: seeds repeats every "
                                          f"configuration at run.seed, run.seed + 1, ...; give the seeds one way")
        candidates = spec.points()
    for key in spec.set:
        _axis_key(key, "set key")
    stray = axis_not_in_sweep(spec)
    if stray is not None:
        field, key, allowed = stray
        raise ConfigError(f"{field}: {key!r} is not an axis of this sweep; allowed: {', '.join(allowed)}")
    backends: set[str] = set()
    modules: list[str] = []
    shortest = (math.inf, "")  # the fewest rounds of a trial, and where
    tasks: dict[str, str] = {}  # the trials' tasks, and where each is first
    spec.import_modules()
    for point in candidates:
        where = f"sweep point {shown(point)}: " if point else ""
        try:
            config = load_config(spec.base, {**spec.set, **point})
            config.in_script("a sweep's trials, each in a process of its own,")
        except ConfigError as error:
            raise ConfigError(f"{_blamed(spec, where, error)}{error}") from None
        modules.extend(config.modules())
        shortest = min(shortest, (config.run.rounds, where))
        if config.federation.gpu_packing == "auto":
            raise ConfigError(f"{where}federation.gpu_packing = 'auto': a trial's placement group is sized from "
                              f"federation.clients_per_actor before the trial starts; use federation.gpu_packing = 'fixed' in sweeps")
        backends.add(config.federation.backend)
        tasks.setdefault(config.task_name, where)
    _check_pack(spec, backends)
    rounds, where = shortest
    if spec.scheduler == "asha" and spec.grace_rounds > rounds:
        raise ConfigError(f"{where}grace_rounds = {spec.grace_rounds}: ASHA gives every trial that many rounds before it "
                          f"may stop one, more than run.rounds = {rounds}; use grace_rounds <= {rounds} (in the sweep's "
                          f"file: grace_rounds: {rounds}) or more rounds")
    metric, _ = spec.resolved_metric()
    reported = {task: catalog.tasks()[task].metrics for task in tasks}
    shared = [m for m in next(iter(reported.values())) if all(m in r for r in reported.values())]
    several = len(tasks) > 1
    wanted = [("metric", metric), *(("table.metrics", m) for m in (spec.table.metrics if spec.table else []))]
    for task, where in tasks.items():  # every trial's task reports the metric the sweep ranks them by
        for name, value in wanted:
            if value not in reported[task] and value != "train_loss":
                raise ConfigError(f"{where if several else ''}{name} = {value!r} is not reported by task {task!r}; "
                                  f"allowed: {', '.join((*shared, 'train_loss'))}"
                                  + (" (what every task of the sweep reports)" if several else ""))
    return [m for m in dict.fromkeys(modules) if m not in spec.modules]


def axis_not_in_sweep(spec: SweepSpec) -> tuple[str, str, list[str]] | None:
    """The first key the report splits or tabulates by (``panels``, ``table``) that is not an axis of the sweep, as
    (field, key, the axes allowed there); None where all are."""
    for key in spec.panels:
        if key not in spec.axes():
            return "panels", key, spec.axes()
    if spec.table is not None:
        allowed = [a for a in spec.axes() if a != "run.seed"]
        for key in [*spec.table.rows, spec.table.columns]:
            if key not in allowed:
                return "table", key, allowed
    return None


def _blamed(spec: SweepSpec, where: str, error: ConfigError) -> str:
    """Where a configuration's error comes from: the sweep point ``where`` -- unless the base with the sweep's
    ``set`` (the CLI's ``--set``, the API's ``overrides``) fails alike without it, whose error names its field."""
    try:
        load_config(spec.base, spec.set)
    except ConfigError as alone:
        if str(alone) == str(error):
            return ""
    return where


# ---- loading ---------------------------------------------------------------------------------------------


def preset_names() -> list[str]:
    """Names of the sweep presets shipped in the package."""
    folder = resources.files("fedcomp.sweeps") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    return (resources.files("fedcomp.sweeps") / "presets" / f"{name}.yaml").read_text()


def preset_description(name: str) -> str:
    return first_comment(preset_text(name))


def _base_file(base: Any, folder: Path) -> Any:
    """A ``base`` that names a run YAML file, made absolute, so that the sweep folder's ``sweep.json`` names it from
    anywhere (a report, a resume): relative to ``folder`` -- a sweep file's, as a config file's modules are to it --
    or, where it is not there but is in the working directory, to that (sweep files written before)."""
    return _beside(base, folder, (".yaml", ".yml"))


def _beside(value: Any, folder: Path, suffixes: tuple[str, ...]) -> Any:
    """A file's path ending in one of ``suffixes``, made absolute: relative to ``folder``, or, where it is not there
    but is in the working directory, to that; any other value as it is."""
    if not isinstance(value, str) or not value.endswith(suffixes):
        return value
    path = Path(value).expanduser()
    beside = folder / path
    return str((path if path.is_absolute() or (not beside.is_file() and path.is_file()) else beside).absolute())


def _modules_beside(raw: dict[str, Any], folder: Path) -> None:
    """A sweep file's ``.py`` modules -- its ``modules`` list, a ``task.module`` / ``algorithm.module`` in its
    ``base`` sections, in ``set`` or on a grid axis -- relative to its folder (:func:`_beside`), as a run config
    file's are to it."""
    def at(value: Any) -> Any:
        return _beside(value, folder, (".py",))

    base: dict[str, Any] = raw["base"] if isinstance(raw.get("base"), dict) else {}
    for block in (base.get(section) for section in ("task", "algorithm")):
        if isinstance(block, dict) and "module" in block:
            block["module"] = at(block["module"])
    if isinstance(raw.get("modules"), list):
        raw["modules"] = [at(m) for m in raw["modules"]]
    if isinstance(raw.get("set"), dict):
        raw["set"] = {k: at(v) if str(k).endswith("module") else v for k, v in raw["set"].items()}
    grids = raw.get("grid")
    for grid in [g for g in (grids if isinstance(grids, list) else [grids]) if isinstance(g, dict)]:
        for key, values in grid.items():
            if str(key).endswith("module") and isinstance(values, list):
                grid[key] = [at(v) for v in values]


def load_spec(source: str | Path | Mapping[str, Any] | SweepSpec, **changes: Any) -> SweepSpec:
    """Load a sweep preset name, a YAML file or a mapping, apply ``changes`` (CLI flags: ``search``,
    ``seeds``, ``set`` merged into the spec's), and validate every trial.

    Raises:
        ConfigError: one line naming the field, the value and what is allowed.
    """
    if isinstance(source, SweepSpec):
        raw: dict[str, Any] = source.model_dump()
    elif isinstance(source, Mapping):
        raw = dict(source)
        if "base" in raw:
            raw["base"] = _base_file(raw["base"], Path.cwd())
    else:
        text = str(source)
        path = Path(text)
        if text.endswith((".yaml", ".yml")) or path.exists():
            raw = read_yaml_file(path, "sweep file")
            default_name = path.stem
            if isinstance(raw, dict):
                raw["base"] = _base_file(raw.get("base", "quickstart"), path.parent)
                _modules_beside(raw, path.parent)
                raw.setdefault("description", first_comment(path.read_text(errors="replace")))
        elif text in preset_names():
            raw = parse_yaml(preset_text(text), f"sweep preset {text!r}")
            default_name = text
            if isinstance(raw, dict):
                raw.setdefault("description", preset_description(text))
        else:
            raise ConfigError(f"sweep {text!r} is unknown{did_you_mean(text, preset_names())}; allowed: "
                              f"{', '.join(preset_names())} or a .yaml file")
        if not isinstance(raw, dict):
            raise ConfigError(f"sweep {text!r} must be a mapping with keys such as base, grid, seeds")
        raw.setdefault("name", default_name)
    extra_set = changes.pop("set", None) or {}
    raw = {**raw, **{k: v for k, v in changes.items() if v is not None}}
    if extra_set:
        raw["set"] = {**(raw.get("set") or {}), **{k.replace("__", "."): v for k, v in extra_set.items()}}
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(p) for p in first["loc"][:1])
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"sweep key {field!r} is unknown{did_you_mean(field, SweepSpec.model_fields)}; allowed: "
                              f"{', '.join(SweepSpec.model_fields)}") from None
        value = raw.get(field)
        if msg.startswith(("grid", "space")):
            raise ConfigError(msg) from None
        raise ConfigError(f"sweep {field} = {value!r}: {msg}") from None
    missing = validate(spec)
    return spec.model_copy(update={"modules": [*spec.modules, *missing]}) if missing else spec
