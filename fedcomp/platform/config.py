"""The experiment configuration: four validated sections, loaded from YAML and overridden by keys.

``task`` and ``algorithm`` are validated by the chosen task's and algorithm's own frozen parameter
models (so ``algorithm.beta`` exists only for algorithms that have a beta); ``federation`` and ``run``
are fixed schemas. Every problem is reported as one line naming the field, the value and what is
allowed, as a :class:`ConfigError`, before any work starts.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from fedcomp.platform import catalog, environment
from fedcomp.platform.errors import ConfigError, did_you_mean, nearest, shown
from fedcomp.platform.params import Params
from fedcomp.platform.yamlfile import first_comment, parse_yaml, read_yaml_file

SECTIONS = ("task", "algorithm", "federation", "run")

T = TypeVar("T")


NAME_MAX_BYTES = 200
"""The longest run or sweep name (UTF-8 bytes): its id adds a 21-character stamp, and a folder name holds 255 bytes
on common file systems."""

TORCH_COMPILE_SINCE = (2, 7)
"""The first torch release that compiles every registered algorithm's oracles (``federation.torch_compile``; tested on
2.7.1 and 2.14.1): before 2.6 dynamo cannot fail at its graph limit, which the option relies on to say so rather than
run steps eagerly unseen, and 2.6's inductor fails on FedOut's mixed second-derivative product."""


def plain_name(value: str) -> str:
    """``value`` if it is a plain folder name. A run or sweep id becomes a folder under ``run.out``, so a name
    holding a path (``../../escaped``) would write outside it, and one too long for a folder name failed only
    when the run's folder was made.

    Raises:
        ValueError: the name has a separator, a leading dot, surrounding spaces, is empty or longer than
            :data:`NAME_MAX_BYTES`.
    """
    if not value or value.startswith(".") or value != value.strip() or any(c in value for c in "/\\\0"):
        raise ValueError("must be a plain folder name (no '/', '\\', leading '.' or surrounding spaces)")
    if not value.isprintable():  # a newline split the closing line; a tab printed matplotlib's missing-glyph warning
        raise ValueError("must be a plain folder name (no newline, tab or other control character)")
    size = len(value.encode())
    if size > NAME_MAX_BYTES:
        raise ValueError(f"is {size} bytes long; at most {NAME_MAX_BYTES} allowed (the id adds a "
                         f"timestamp, and a folder name holds 255 bytes)")
    return value


class FederationConfig(Params):
    """Where and how clients run."""

    clients: int = Field(16, ge=1, description="number of registered clients K")
    clients_per_round: int | None = Field(None, ge=1, description="cohort size; null = all clients")
    backend: Literal["ray", "local"] = "ray"
    clients_per_actor: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="clients hosted by one Ray actor; 'auto' = spread the clients evenly over as many actors as the "
        "cluster runs at once: one a CPU, or actors_per_gpu a GPU where the clients use "
        "GPUs; at most one actor a client. Every packing gives the same numbers; fewer actors start faster and hold "
        "less memory (each imports torch)",
    )
    gpus_per_client: float | Literal["auto"] = Field(
        "auto", description="GPU share per client; 'auto' = use GPUs only when the cluster has them"
    )
    cpus_per_actor: float | Literal["auto"] = Field(
        "auto", description="CPU share per client actor; 'auto' = fit all actors into the cluster's CPUs"
    )
    gpu_packing: Literal["fixed", "auto"] = Field(
        "fixed",
        description="'auto': on a cluster with GPUs, clients_per_actor is chosen from one client's measured GPU memory "
        "(a short probe) so that actors_per_gpu actors share each GPU; on CPUs (or 'fixed') clients_per_actor holds",
    )
    actors_per_gpu: int = Field(2, ge=1, description="client actors sharing one GPU under gpu_packing: auto")
    server: Literal["replicated", "actor", "driver"] = Field(
        "replicated",
        description="Ray backend: where the round program runs: 'replicated' (default) on every client actor, which "
        "combine each call's partial sums among themselves (their own group over TCP; no server process and no hop per "
        "call; an actor's death reruns the rounds since the last checkpoint; where the actors cannot form a group, the "
        "server runs in the driver, after one warning); 'actor', a server actor next to the client actors (an actor's "
        "death reruns its share of the call); 'driver', the driver's own process. The same numbers every way",
    )
    routing: Literal["balanced", "home"] = Field(
        "balanced",
        description="Ray backend: which actor runs a cohort member: 'balanced' spreads the members without private "
        "state evenly over the actors (a round waits for its busiest actor), 'home' always uses the actor hosting the "
        "client; the same numbers either way",
    )
    transport: Literal["calls", "graph", "collective"] = Field(
        "collective",
        description="Ray backend: how a federation call reaches the client actors: 'collective' (default), one actor "
        "call per actor (payloads over 100 KB through the object store), except that an exchange (fed.exchange: "
        "FedDRO's local steps) goes to the actors in one call and they average each step among themselves (a "
        "process group of their own over TCP sockets; by calls where they cannot form one); 'calls', every step of an exchange by "
        "calls too; 'graph', a compiled Ray graph (ray.dag) over the actors for calls with smaller payloads (a lower "
        "latency per call; its idle actors poll their channels). The same numbers every way",
    )
    ray_address: str | None = Field(None, description="existing cluster to join (else RAY_ADDRESS, else local)")
    actor_timeout_s: float = Field(120.0, gt=0, description="deadline for actors to start or answer a round")
    max_retries: int = Field(3, ge=0, description="times a round is retried after a client actor dies")
    vectorise: bool = Field(
        False,
        description="run a host's clients' local steps in lockstep under torch.func.vmap where the algorithm and "
        "task allow it (on a CPU host, client states up to 100,000 floats and three clients or more in a call: other "
        "calls are faster one at a time), equal "
        "to the one-at-a-time numbers up to float32 rounding (not bit for bit); where no call can (an algorithm with a "
        "client program of its own, a task vmap cannot batch) the run says so once and run.json records why",
    )
    fused_sgd: bool = Field(
        False,
        description="SGD local steps taken in place -- FedAvg's and its server-optimiser variants', FCSG's, "
        "LocalSGDM's, FedProx's (client states of 100,000 floats or more, not in lockstep) -- apply each "
        "torch.nn.Linear weight's gradient by its factors in one matrix product, W <- W - lr g^T a or "
        "b <- mu b + g^T a, without forming the gradient: faster on large linear layers; equal to the exact step up to "
        "float32 rounding (not bit for bit), and bitwise the same on every backend and packing",
    )
    torch_compile: bool = Field(
        False,
        description="compute the clients' gradients by torch.compile (inductor; one graph per oracle, function and "
        "batch shape): every oracle -- the loss gradient of SGD-type local steps, both partial gradients of "
        "descent-ascent steps, FedNest's y-gradients and Hessian-vector products, the compositional kinds' grad f, "
        "grad h and g's vector-Jacobian products (Local-SCGD(M), LocalSCGDAM, FedDRO and its baselines) -- so every "
        "registered algorithm; faster per step where the model is small; "
        "each client process compiles at its first steps (seconds to a minute on a 2-core CPU, an MLP's loss gradient "
        "14-19 s, before inductor's cache in the temporary directory holds the graphs); equal to the eager numbers up "
        "to float32 rounding (not bit for bit), bitwise the same on every backend and packing on machines of one kind; "
        "a function that does not compile runs eagerly for the rest of the run, with a warning. Not with vectorise or "
        "fused_sgd",
    )

    @model_validator(mode="after")
    def _check(self) -> FederationConfig:
        if self.clients_per_round is not None and self.clients_per_round > self.clients:
            raise ValueError(
                f"clients_per_round = {self.clients_per_round}: must be <= federation.clients ({self.clients})"
            )
        for name in ("gpus_per_client", "cpus_per_actor"):
            value = getattr(self, name)
            if value != "auto" and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} = {value}: must be 'auto' or a number >= 0")
        if self.server == "replicated" and "transport" in self.model_fields_set and self.transport != "collective":
            raise ValueError(
                f"transport = {self.transport!r}: applies to server: actor or driver; with server: replicated every call "
                f"goes through the client actors' group (allowed there: 'collective', the default)"
            )
        for other in ("vectorise", "fused_sgd"):
            if self.torch_compile and getattr(self, other):
                raise ValueError(f"torch_compile = true: not with {other} = true (each takes the local steps another "
                                 "way); choose one")
        if self.torch_compile and environment.torch_release() < TORCH_COMPILE_SINCE:
            raise ValueError(f"torch_compile = true: needs torch {environment.release_name(TORCH_COMPILE_SINCE)} or later, "
                             f"whose compiler takes every algorithm's oracles; this is torch {environment.torch_build()}")
        if self.gpu_packing == "auto" and self.gpus_per_client == 0:
            raise ValueError("gpu_packing = 'auto': needs GPUs but gpus_per_client = 0; use gpus_per_client = 'auto' or > 0")
        return self

    @property
    def cohort_size(self) -> int:
        return self.clients_per_round or self.clients


class RunConfig(Params):
    """How long to run, how often to evaluate and checkpoint, and where results go."""

    seed: int = Field(0, ge=0)
    rounds: int = Field(100, ge=1, description="communication rounds")
    eval_every: int = Field(1, ge=1, description="evaluate the server model every this many rounds")
    checkpoint_every: int = Field(10, ge=1, description="checkpoint every this many rounds")
    out: str = Field("results", description="results root; each run writes <out>/<run-id>/")
    name: str | None = Field(None, description="run-id prefix (default: <algorithm>_<task>)")
    progress: Literal["auto", "bar", "log", "none"] = Field(
        "auto", description="a bar in a terminal, log lines otherwise (auto), or none"
    )
    track: Literal["none", "tensorboard", "mlflow", "wandb"] = Field(
        "tensorboard", description="experiment tracking written next to the results (see fedcomp.platform.tracking)"
    )
    deterministic: bool = Field(
        True,
        description="on CUDA: deterministic kernels, cuBLAS's fixed workspace and no TF32 in every client process "
        "(same seed, same numbers; slower); false: cuDNN autotuning and TF32. On the CPU: the local backend's clients "
        "and its server (the evaluation included) compute with one torch thread, as Ray's client actors do (the same "
        "numbers on both); false: with the process's threads (faster for large models; the last bits may differ "
        "from Ray's)",
    )
    on_divergence: Literal["stop", "continue"] = Field(
        "stop", description="a non-finite training loss or model: stop the run (keeping the finite rounds) or go on"
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        return None if value is None else plain_name(value)

    @field_validator("out", mode="before")
    @classmethod
    def _path(cls, value: Any) -> Any:
        """A folder path: a ``pathlib.Path`` too, ``~`` expanded (a shell does that for the command line's own)."""
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            return value  # the field's own type check says what is wrong
        if not value.strip() or "\0" in value:
            raise ValueError("must be a folder path")
        return os.path.expanduser(value)


SECTION_MODELS: dict[str, type[Params]] = {"federation": FederationConfig, "run": RunConfig}
"""The config sections whose settings are fedcomp's own (``task`` and ``algorithm`` hold the chosen one's)."""


@dataclass(frozen=True)
class Config:
    """A complete, validated experiment configuration."""

    task_name: str
    task: Params
    algorithm_name: str
    algorithm: Params
    federation: FederationConfig
    run: RunConfig

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (YAML/JSON-ready) that :func:`load_config` turns back into this config, in any process:
        a user's task or algorithm comes with its module (``module``: :func:`fedcomp.platform.catalog.source_of`)."""
        named: dict[str, dict[str, str]] = {}
        for section, name, module in self._declared():
            source = catalog.source_of(module)
            named[section] = {"name": name} if source is None else {"name": name, "module": source}
        return {
            "task": {**named["task"], **self.task.model_dump(mode="json")},
            "algorithm": {**named["algorithm"], **self.algorithm.model_dump(mode="json")},
            "federation": self.federation.model_dump(mode="json"),
            "run": self.run.model_dump(mode="json"),
        }

    def _declared(self) -> list[tuple[str, str, str]]:
        """``(section, name, module)`` of the task and the algorithm: the module their declaration names."""
        return [("task", self.task_name, catalog.tasks()[self.task_name].module),
                ("algorithm", self.algorithm_name, catalog.algorithms()[self.algorithm_name].module)]

    def __reduce__(self) -> tuple[Any, tuple[dict[str, dict[str, Any]]]]:
        """Pickled as :meth:`to_dict`: a process that unpickles it (a Ray actor, a sweep's trial) imports a user's
        module by the config's ``module`` keys before it looks the names up."""
        return load_config, (self.to_dict(),)

    def modules(self) -> list[str]:
        """The user's modules the config's task and algorithm come from (their ``module`` keys), each once."""
        sources = (catalog.source_of(module) for _, _, module in self._declared())
        return list(dict.fromkeys(source for source in sources if source))

    def in_script(self, which: str) -> None:
        """Raise where the config's task or algorithm is defined in the running script (``__main__``), which no other
        process can import; ``which``: the processes that would have to (Ray's actors, a sweep's trials).

        Raises:
            ConfigError: naming the task or algorithm and what to do.
        """
        for section, name, module in self._declared():
            if module == catalog.SCRIPT:
                raise ConfigError(f"{section}.name = {name!r} is defined in the script being run (__main__), which "
                                  f"{which} cannot import; move it into a module (a .py file the script imports)")

    def replace(self, **overrides: Any) -> Config:
        """A new config with ``section.key`` (or ``section__key``) overrides applied and re-validated."""
        return load_config(self.to_dict(), overrides)


def preset_names() -> list[str]:
    """Names of the YAML presets shipped in the package."""
    folder = resources.files("fedcomp.platform") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    return (resources.files("fedcomp.platform") / "presets" / f"{name}.yaml").read_text()


def preset_description(name: str) -> str:
    """The first comment line of a preset file (its one-line description)."""
    return first_comment(preset_text(name))


@functools.cache
def _preset(name: str) -> Any:
    """A preset's parsed content, read once per process: presets are the package's data (a sweep builds a config
    per grid point from one, and parsing it took 4 ms)."""
    return parse_yaml(preset_text(name), f"preset {name!r}")


def _read_source(source: str | Path | Mapping[str, Any] | None) -> dict[str, Any]:
    if source is None:
        source = "quickstart"
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    text = str(source)
    path = Path(text)
    if text.endswith((".yaml", ".yml", ".json")) or path.exists():
        raw = read_yaml_file(path, "config file")
        if isinstance(raw, dict) and path.suffix == ".json" and isinstance(raw.get("config"), dict):
            raw = raw["config"]  # a run's run.json: the config it ran (its module paths absolute already)
        elif isinstance(raw, dict):
            _modules_beside(raw, path.parent)
    elif text in preset_names():
        raw = copy.deepcopy(_preset(text))
    else:
        raise ConfigError(f"preset {text!r} is unknown{did_you_mean(text, preset_names())}; allowed: "
                          f"{', '.join(preset_names())} or a .yaml file")
    if not isinstance(raw, dict):
        raise ConfigError(f"config {text!r} must be a mapping with sections {', '.join(SECTIONS)}")
    return raw


def _modules_beside(raw: dict[str, Any], folder: Path) -> None:
    """A config file's ``module`` paths (``task.module: myext.py``) are relative to the file's folder, as it and the
    module usually sit together."""
    for section in ("task", "algorithm"):
        block = raw.get(section)
        if not isinstance(block, dict):
            continue
        module = block.get("module")
        if isinstance(module, str) and module.endswith(".py") and not Path(module).expanduser().is_absolute():
            block["module"] = str(folder / module)


def parse_value(text: str) -> Any:
    """Turn a ``--set`` value into a typed value the way YAML would (``0.01`` -> float, ``true`` -> bool); an empty
    one stays the empty text (YAML's null would be reported as ``None``, not as what was typed)."""
    if not text.strip():
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def overrides_of(overrides: Any, name: str = "overrides") -> dict[str, Any]:
    """``overrides`` as the Python API takes them -- a mapping of ``section.key`` (or ``section__key``) to values, or
    None -- checked, so that a list or a key of another type is one line, not an AttributeError deep inside.

    Raises:
        ConfigError: not a mapping, or a key that is not a string.
    """
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{name} = {shown(overrides)}: must be a mapping of 'section.key' to values, e.g. "
                          f"{{'algorithm.lr': 0.01}}")
    for key in overrides:
        if not isinstance(key, str):
            raise ConfigError(f"{name} key {key!r}: must be a 'section.key' string, e.g. 'algorithm.lr'")
    return dict(overrides)


def folder_of(value: Any, name: str, what: str = "a folder's path") -> Path:
    """A folder argument of the Python API (a ``str`` or ``os.PathLike``, ``~`` expanded) as a ``Path``.

    Raises:
        ConfigError: anything else (``None``, a number), naming the argument and ``what`` it must be.
    """
    if isinstance(value, (str, os.PathLike)) and str(value).strip():
        return Path(value).expanduser()
    raise ConfigError(f"{name} = {shown(value)}: must be {what} (a str or a pathlib.Path)")


PLACEMENT = (
    "federation.backend",
    "federation.clients_per_actor",
    "federation.cpus_per_actor",
    "federation.gpus_per_client",
    "federation.gpu_packing",
    "federation.actors_per_gpu",
    "federation.server",
    "federation.routing",
    "federation.transport",
    "federation.ray_address",
    "federation.actor_timeout_s",
    "federation.max_retries",
)
"""Settings that say where and how the clients run, never what they compute (every backend, packing, server and
transport gives the same numbers, bit for bit): what a verification or a resume may change."""


def placement_only(changes: Mapping[str, Any] | None, where: str, more: tuple[str, ...] = ()) -> dict[str, Any]:
    """``changes`` (``section.key`` or ``section__key`` overrides), checked to hold only :data:`PLACEMENT` settings
    (and ``more``).

    Raises:
        ConfigError: another setting, which could change the numbers; ``where`` names the input (``verify --set``).
    """
    allowed = (*PLACEMENT, *more)
    changes = {k.replace("__", "."): v for k, v in overrides_of(changes).items()}
    for key in changes:
        if key not in allowed:
            raise ConfigError(f"{where} {key}: only settings that leave the numbers unchanged may change; "
                              f"allowed: {', '.join(allowed)}")
    return changes


def placed_on(changes: Mapping[str, Any], backend: str, where: str) -> None:
    """Refuse :data:`PLACEMENT` settings of the Ray backend among ``changes`` where the run goes on ``backend``
    ``local``, which has no actors, server or transport to place: it would run as before, the setting ignored.

    Raises:
        ConfigError: naming the first such setting; ``where`` names the input (``verify --set``).
    """
    for key in changes:
        if backend == "local" and key in PLACEMENT and key != "federation.backend":
            raise ConfigError(f"{where} {key}: says where and how the Ray backend's clients run, and this runs on "
                              f"the local backend, where it would change nothing; ask for the Ray backend too "
                              f"(federation.backend=ray), or drop it")


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Set ``section.key`` (also spelt ``section__key`` for Python keyword arguments) in ``raw``."""
    for dotted, value in overrides.items():
        key = dotted.replace("__", ".")
        section, _, field = key.partition(".")
        if section not in SECTIONS or not field or "." in field:
            near = nearest(section, SECTIONS) if field and "." not in field else None
            raise ConfigError(
                f"override {dotted!r} is not of the form section.key with section one of {', '.join(SECTIONS)}"
                + (f" (did you mean '{near}.{field}'?)" if near else "")
            )
        block = raw.setdefault(section, {})
        if not isinstance(block, dict):
            raise ConfigError(f"section {section!r} must be a mapping, got {shown(block)}")
        block[field] = value
    return raw


def _describe(error: ValidationError, section: str, model: type[BaseModel], raw: Mapping[str, Any]) -> str:
    first = error.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if not isinstance(p, int) or len(first["loc"]) == 1)
    field = loc.split(".")[0] if loc else ""
    where = f"{section}.{field}" if field else section
    if first["type"] == "extra_forbidden":
        allowed = ", ".join(["name", *model.model_fields, "module"]) if section in ("task", "algorithm") else ", ".join(
            model.model_fields
        )
        near = nearest(field, allowed.split(", "))
        return f"{where}: unknown key{f' (did you mean {section}.{near}?)' if near else ''}; allowed keys: {allowed}"
    msg = first["msg"]
    others = [e for e in error.errors()[1:] if e["loc"][:1] == first["loc"][:1] and e["type"] == "literal_error"]
    if others:  # a number-or-word field (``int | Literal["auto"]``): say both what the number lacks and the word
        msg = f"{msg} (or {others[0]['ctx']['expected']})"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    declared = model.model_fields.get(field)
    if declared is not None and type(None) in typing.get_args(declared.annotation) and first["input"] is not None:
        msg = f"{msg} (or null, for none)"  # ``--set key=None`` is the word None, not YAML's null
    if not field and msg.split(" = ")[0] in model.model_fields:
        return f"{section}.{msg}"  # a cross-field check that names its field itself
    if field and field in raw:
        return f"{where} = {shown(raw[field])}: {msg}"
    return f"{where}: {msg}"


def _validate(section: str, model: type[BaseModel], raw: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(dict(raw))
    except ValidationError as error:
        raise ConfigError(_describe(error, section, model, raw)) from None


def _import_modules(raw: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
    """Import the modules that the task and algorithm sections name (``module``, an override's first), so that a
    user's task or algorithm is known by name before the names are looked up; where a section names none, the module
    of a task or algorithm of the user's that the caller imported, so that it is imported again where it was edited
    (:func:`~fedcomp.platform.catalog.import_source`)."""
    for section in ("task", "algorithm"):
        block: Mapping[str, Any] = raw[section] if isinstance(raw.get(section), Mapping) else {}
        given = overrides.get(f"{section}.module", block.get("module"))
        if given is None:
            name = overrides.get(f"{section}.name", block.get("name"))
            declared = (catalog.tasks() if section == "task" else catalog.algorithms()).get(name) if isinstance(
                name, str) else None
            source = catalog.source_of(declared.module) if declared is not None else None
            if source is not None:
                import_user_module(source, f"{section}.name = {name!r}")
            continue
        given = os.fspath(given) if isinstance(given, os.PathLike) else given
        if isinstance(given, str) and not given.endswith(".py") and ("/" in given or os.sep in given):
            raise ConfigError(f"{section}.module = {given!r}: a path must name a .py file (a module's dotted name has "
                              f"no '/')")
        if not isinstance(given, str) or not given.strip():
            raise ConfigError(f"{section}.module = {given!r}: must be a module's dotted name or a .py file's path")
        import_user_module(given, f"{section}.module = {given!r}")


def import_user_module(source: str, where: str) -> None:
    """:func:`~fedcomp.platform.catalog.import_source`, whatever the user's module raised said in one line.

    Raises:
        ConfigError: starting with ``where``.
    """
    try:
        catalog.import_source(source)
    except (Exception, SystemExit) as error:  # the user's module: whatever its code raised, sys.exit() too
        raise ConfigError(f"{where}: cannot be imported: {type(error).__name__}: {error}") from None


def _named(
    section: str, raw: Mapping[str, Any], table: Mapping[str, T], fits: Callable[[str], bool] = lambda name: True
) -> tuple[str, T, dict[str, Any]]:
    """The section's name, its declaration and the rest of the section; an unknown name suggests the nearest one,
    of those that ``fits`` (an algorithm for the task) where one is near."""
    body = dict(raw)
    module = body.pop("module", None)  # imported already (_import_modules)
    name = body.pop("name", None)
    if name is None:
        raise ConfigError(f"{section}.name is missing; allowed: {', '.join(sorted(table))}")
    if not isinstance(name, str) or name not in table:
        near = did_you_mean(name, [n for n in table if fits(n)]) or did_you_mean(name, table)
        if isinstance(module, str):
            named = _registered_by(module, table)
            yours = f"; {section}.module {module!r} registered {', '.join(named) if named else 'none'}"
        else:
            yours = f"; {'an' if section == 'algorithm' else 'a'} {section} of your own: name its module in {section}.module"
        raise ConfigError(f"{section}.name = {name!r} is unknown{near}; allowed: {', '.join(sorted(table))}{yours}")
    return name, table[name], body


def _registered_by(module: str, table: Mapping[str, Any]) -> list[str]:
    """The names in ``table`` (declarations) that the user's ``module`` (a ``.py`` file or a dotted name) registered."""
    target = str(Path(module).expanduser().resolve()) if module.endswith(".py") else catalog.source_of(module)
    return sorted(n for n, d in table.items() if target is not None and catalog.source_of(d.module) == target)


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None
) -> Config:
    """Load a preset name, a YAML file or a dict, apply ``section.key`` overrides, and validate all of it.

    Raises:
        ConfigError: one line naming the field, the bad value and what is allowed.
    """
    tasks, algorithms = catalog.tasks(), catalog.algorithms()
    raw = _read_source(source)
    overrides = {k.replace("__", "."): v for k, v in (overrides or {}).items()}
    _import_modules(raw, overrides)
    for section, table, attr in (("task", tasks, "Params"), ("algorithm", algorithms, "HParams")):
        # Switching the task or algorithm by an override drops the base config's keys that only the old one
        # had (a preset's beta does not apply to fedavg); keys given as overrides are always validated.
        new_name = overrides.get(f"{section}.name")
        block = raw.get(section)
        if isinstance(new_name, str) and new_name in table and isinstance(block, dict) and block.get("name") != new_name:
            fields = getattr(table[new_name], attr).model_fields
            raw[section] = {k: v for k, v in block.items() if k == "name" or k in fields}
    raw = apply_overrides(raw, overrides)
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"section {unknown[0]!r} is unknown{did_you_mean(unknown[0], SECTIONS)}; allowed sections: "
                          f"{', '.join(SECTIONS)}")
    for section in SECTIONS:
        if not isinstance(raw.get(section, {}), Mapping):
            raise ConfigError(f"section {section!r} must be a mapping, got {raw[section]!r}")

    task_name, task_declared, task_body = _named("task", raw.get("task", {}), tasks)
    algo_name, algo_declared, algo_body = _named("algorithm", raw.get("algorithm", {}), algorithms,
                                                 lambda name: algorithms[name].kind in task_declared.kinds)
    if algo_declared.kind not in task_declared.kinds:  # before the algorithm's values: another algorithm is needed
        raise ConfigError(
            f"algorithm.name = {algo_name!r} needs a {algo_declared.kind!r} problem but task {task_name!r} offers "
            f"{', '.join(sorted(task_declared.kinds))}; algorithms that run on it: "
            f"{', '.join(sorted(n for n, a in algorithms.items() if a.kind in task_declared.kinds))}"
        )
    task = _validate("task", task_declared.Params, task_body)
    algorithm = _validate("algorithm", algo_declared.HParams, algo_body)
    federation = _validate("federation", FederationConfig, raw.get("federation", {}))
    run = _validate("run", RunConfig, raw.get("run", {}))

    return Config(task_name, task, algo_name, algorithm, federation, run)
