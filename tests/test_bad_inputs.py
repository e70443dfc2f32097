"""A regression corpus of bad input, table-driven: every case goes through the real command line
(``fedcomp.cli.main``) and must end with exit code 2, exactly one line on stderr that names the field (or
file), the value and what is allowed, and no file written or changed.

Almost every case fails before Ray starts (config values, files, flags, addresses, run folders, sweep files);
the few that can only fail inside the Ray backend are at the end, marked ``ray``.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedcomp.cli import main
from fedcomp.platform import results

FAST = ["--set", "federation.backend=local", "--set", "federation.clients=4", "--set", "algorithm.local_steps=5",
        "--set", "task.test_samples=2000", "--set", "run.rounds=2", "--set", "run.progress=none"]


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LOCAL_TINY = ["--set", "federation.backend=local", "--set", "run.rounds=1", "--set", "run.progress=none"]
MISNAMED = f"""
from fedcomp.platform import catalog
from fedcomp.platform.registry import register_task

catalog.import_source({str(EXAMPLES / "extension.py")!r})


@register_task("least-squares-misnamed")
class Misnamed(catalog.task_class("least-squares")):
    metrics = ("distance", "objective_gap")
"""
"""A user's module whose task declares a metric its evaluator does not report."""
NO_JOIN = f"""
from dataclasses import dataclass

from torch import Tensor

from fedcomp.platform import catalog
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.state import State

catalog.import_source({str(EXAMPLES / "extension.py")!r})


@dataclass(frozen=True)
class WithU(State):
    x: Tensor
    velocity: Tensor
    u: Tensor


@register_algorithm("fedavg-hb-no-join")
class NoJoin(catalog.algorithm_class("fedavg-hb")):
    Client = WithU
"""
"""A user's algorithm with a private client field (u) that neither the server sends nor a join starts."""
MISSPELT_PROGRAM = f"""
from fedcomp.platform import catalog
from fedcomp.platform.registry import register_algorithm

catalog.import_source({str(EXAMPLES / "extension.py")!r})


@register_algorithm("fedavg-hb-misspelt")
class Misspelt(catalog.algorithm_class("fedavg-hb")):
    def round(self, fed, server):
        means = fed.call("local_stepz", fed.cohort(), {{"x": server.x}})
        return server.replace(x=means.x)
"""
"""A user's round that calls a client program it does not define (a misspelling of local_steps)."""
MISSPELT_NEEDLE = ("Misspelt: a round calls the client program 'local_stepz', which it does not define (did you mean "
                   "'local_steps'?)")
COLUMN_INIT = f"""
from fedcomp.platform import catalog
from fedcomp.platform.registry import register_algorithm

catalog.import_source({str(EXAMPLES / "extension.py")!r})


@register_algorithm("fedavg-hb-column")
class Column(catalog.algorithm_class("fedavg-hb")):
    def init(self, variables):
        return self.Server(x=variables["x"].reshape(-1, 1).double())
"""
"""A user's init that reshapes and casts the task's x (it ran, broadcasting a column of float64)."""
NO_JOIN_NEEDLE = ("NoJoin: its Client record WithU has u, which the server does not send (the broadcast holds x) and "
                  "which no join starts: override join(broadcast)")


@dataclass(frozen=True)
class Case:
    """One bad input: ``argv`` (``{out}``, ``{tmp}`` and the setup's names filled in), the text its one error
    line must hold, and what to prepare in the test's folder first."""

    id: str
    argv: tuple[str, ...]
    needle: str
    setup: Callable[[Path, dict], dict[str, str]] | None = None
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables set for the command (values filled in as ``argv`` is), e.g. ``FEDCOMP_DATA``."""
    ray: bool = False
    """The case fails inside a Ray actor: it runs on the session's Ray and is marked ``ray``."""


def run(*overrides: str) -> tuple[str, ...]:
    """``fedcomp run quickstart`` (fast, local) with ``--set`` overrides, writing under ``{out}``."""
    sets = [a for o in overrides for a in ("--set", o)]
    return ("run", "quickstart", *FAST, "--set", "run.out={out}", *sets)


def algorithm_of_yours(case: str, name: str, source: str, needle: str, *, in_an_actor: bool = False) -> list[Case]:
    """The example's config run with the algorithm ``name`` of a user's module ``source`` that fails with ``needle``:
    on the local backend and, ``in_an_actor``, raised in a Ray actor too (from a module file and a name of its own:
    a process registers a name from one module)."""
    def case_of(id: str, algorithm: str, settings: tuple[str, ...], ray: bool) -> Case:
        argv = ("run", str(EXAMPLES / "extension.yaml"), "--set", "algorithm.module={file}", "--set",
                f"algorithm.name={algorithm}", *settings, "--set", "run.out={out}")
        text = source.replace(f'"{name}"', f'"{algorithm}"')
        return Case(id, argv, needle, file(f"{algorithm.replace('-', '_')}.py", text), ray=ray)

    on_ray = ("--set", "federation.backend=ray", "--set", "run.rounds=1", "--set", "run.progress=none")
    return [case_of(case, name, tuple(LOCAL_TINY), False)] + (
        [case_of(f"{case}-in-an-actor", f"{name}-actor", on_ray, True)] if in_an_actor else [])


def link(name: str, target: str) -> Callable[[Path, dict], dict[str, str]]:
    """Setup: a symbolic link ``{tmp}/name`` to ``target`` (under ``{tmp}``; not there unless made); the path is
    ``{link}``."""

    def make(tmp: Path, runs: dict) -> dict[str, str]:
        (tmp / name).symlink_to(tmp / target)
        return {"link": str(tmp / name)}

    return make


def file(name: str, content: bytes | str) -> Callable[[Path, dict], dict[str, str]]:
    """Setup: write ``content`` to ``{tmp}/name`` (its folders made); the path is ``{file}``."""

    def make(tmp: Path, runs: dict) -> dict[str, str]:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return {"file": str(path)}

    return make


def folder(name: str) -> Callable[[Path, dict], dict[str, str]]:
    def make(tmp: Path, runs: dict) -> dict[str, str]:
        (tmp / name).mkdir()
        return {"file": str(tmp / name)}

    return make


def run_copy(edit: Callable[[Path, dict], None] | None = None) -> Callable[[Path, dict], dict[str, str]]:
    """Setup: a copy of a finished run's folder as ``{run}``, then ``edit(folder, runs)`` applied to it."""

    def make(tmp: Path, runs: dict) -> dict[str, str]:
        target = tmp / "run"
        shutil.copytree(runs["base"], target)
        if edit is not None:
            edit(target, runs)
        return {"run": str(target)}

    return make


def interrupted_with(change: Callable[[dict], None]) -> Callable[[Path, dict], None]:
    """Edit: the copy's ``run.json`` says the run was interrupted (so a resume continues it), and ``change`` is
    applied to its checkpoint."""

    def edit(target: Path, runs: dict) -> None:
        meta = json.loads((target / results.RUN_JSON).read_text())
        (target / results.RUN_JSON).write_text(json.dumps({**meta, "status": "interrupted"}))
        checkpoint = torch.load(target / results.CHECKPOINT, weights_only=False)
        change(checkpoint)
        torch.save(checkpoint, target / results.CHECKPOINT)

    return edit


def checkpoint_of(name: str, legacy: bool = False) -> Callable[[Path, dict], None]:
    """Edit: put the checkpoint of the run ``name`` in place of the copy's own (without its identity: a
    checkpoint from before checkpoints carried one)."""

    def edit(target: Path, runs: dict) -> None:
        checkpoint = torch.load(runs[name] / results.CHECKPOINT, weights_only=False)
        if legacy:
            checkpoint.pop("identity")
        torch.save(checkpoint, target / results.CHECKPOINT)

    return edit


def write(relative: str, content: bytes | str) -> Callable[[Path, dict], None]:
    def edit(target: Path, runs: dict) -> None:
        (target / relative).write_bytes(content if isinstance(content, bytes) else content.encode())

    return edit


def truncate(relative: str, keep: float = 0.5) -> Callable[[Path, dict], None]:
    def edit(target: Path, runs: dict) -> None:
        data = (target / relative).read_bytes()
        (target / relative).write_bytes(data[: int(len(data) * keep)])

    return edit


def cut_inside_a_string(relative: str, key: str = "run_id") -> Callable[[Path, dict], None]:
    """Truncate a JSON file inside the value of ``key`` (an unterminated string wherever the file's paths put it)."""
    def edit(target: Path, runs: dict) -> None:
        data = (target / relative).read_bytes()
        start = data.index(f'"{key}": "'.encode()) + len(key) + 5
        (target / relative).write_bytes(data[: start + 3])

    return edit


def remove(relative: str) -> Callable[[Path, dict], None]:
    def edit(target: Path, runs: dict) -> None:
        (target / relative).unlink()

    return edit


def edit_json(change: Callable[[dict], None]) -> Callable[[Path, dict], None]:
    def edit(target: Path, runs: dict) -> None:
        meta = json.loads((target / results.RUN_JSON).read_text())
        change(meta)
        (target / results.RUN_JSON).write_text(json.dumps(meta))

    return edit


def results_with(edit: Callable[[Path, dict], None]) -> Callable[[Path, dict], dict[str, str]]:
    """Setup: a results folder ``{results}`` holding one (edited) run."""

    def make(tmp: Path, runs: dict) -> dict[str, str]:
        root = tmp / "results"
        root.mkdir()
        shutil.copytree(runs["base"], root / "run")
        edit(root / "run", runs)
        return {"results": str(root)}

    return make


def sweep_folder(content: str | None) -> Callable[[Path, dict], dict[str, str]]:
    """Setup: a folder ``{sweep}`` with ``sweep.json`` holding ``content`` (None: no file)."""

    def make(tmp: Path, runs: dict) -> dict[str, str]:
        root = tmp / "sweep"
        root.mkdir()
        if content is not None:
            (root / "sweep.json").write_text(content)
        return {"sweep": str(root)}

    return make


def sweep_with(name: str, content: bytes) -> Callable[[Path, dict], dict[str, str]]:
    """Setup: a folder ``{sweep}`` with a valid ``sweep.json`` and the file ``name`` holding ``content`` (fedcomp's
    copy of Tune's state, ``tune_state.pkl``; the trials table, ``trials.parquet``)."""

    def make(tmp: Path, runs: dict) -> dict[str, str]:
        names = sweep_folder('{"spec": {"base": "quickstart", "grid": {"algorithm.lr": [0.1]}}, "cluster_has_gpus": false}')(tmp, runs)
        (Path(names["sweep"]) / name).write_bytes(content)
        return names

    return make


def a_table() -> bytes:
    """A small valid Parquet file's bytes."""
    buffer = io.BytesIO()
    pd.DataFrame({"trial": ["t0"], "round": [0]}).to_parquet(buffer, index=False)
    return buffer.getvalue()


GOOD_YAML = "task: {name: invariant-logreg}\nalgorithm: {name: fcsg-m}\n"
BOMB = "&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"
for _level in range(1, 8):  # 9 ** 8 items in a few lines: their full repr took seconds and gigabytes
    BOMB = f"&a{_level} [{BOMB}, " + ", ".join([f"*a{_level - 1}"] * 8) + "]"

def omniglot_zips(first: bytes) -> Callable[[Path, dict], dict[str, str]]:
    """Setup: a folder ``{file}`` holding ``first`` as images_background_small1.zip beside the shipped small2."""

    def make(tmp: Path, runs: dict) -> dict[str, str]:
        from fedcomp.datasets.omniglot_small import shipped_root

        target = tmp / "omniglot-small"
        target.mkdir()
        (target / "images_background_small1.zip").write_bytes(first)
        shutil.copy(shipped_root() / "images_background_small2.zip", target)
        return {"file": str(target)}

    return make


def omniglot_small(*overrides: str) -> tuple[str, ...]:
    """``fedcomp run maml-omniglot-small-1shot`` (local) with ``--set`` overrides, writing under ``{out}``."""
    sets = [a for o in overrides for a in ("--set", o)]
    return ("run", "maml-omniglot-small-1shot", "--set", "federation.backend=local", "--set", "run.out={out}", *sets)


# -- fake data sets in their real formats, then damaged (the package's own writers make them) ------------------


def data_root(build: Callable[[Path], None]) -> Callable[[Path, dict], dict[str, str]]:
    """Setup: a data root ``{root}`` under ``{tmp}`` that ``build`` fills (and damages)."""

    def make(tmp: Path, runs: dict) -> dict[str, str]:
        root = tmp / "data"
        root.mkdir()
        build(root)
        return {"root": str(root)}

    return make


def cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def cifar10(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """Build: CIFAR-10 python-version batches (40 training, 20 test images), then ``damage(folder)``."""

    def build(root: Path) -> None:
        from fedcomp.datasets.cifar import write_cifar_batches

        gen = torch.Generator().manual_seed(0)
        for split, n in (("train", 40), ("test", 20)):
            images = torch.randint(0, 256, (n, 3, 32, 32), generator=gen, dtype=torch.uint8)
            write_cifar_batches(root, images, torch.arange(n) % 10, "cifar10", split)
        damage(root / "cifar-10-batches-py")

    return build


def edit_batch(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    """Damage: unpickle the batch ``name``, let ``change`` edit it (or return something to pickle instead)."""

    def damage(folder: Path) -> None:
        with open(folder / name, "rb") as fh:
            entry = pickle.load(fh, encoding="latin1")
        replaced = change(entry)
        with open(folder / name, "wb") as fh:
            pickle.dump(entry if replaced is None else replaced, fh, protocol=2)

    return damage


def mnist(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """Build: MNIST IDX files (60 training, 20 test images of 28 x 28) under ``MNIST/raw``, then ``damage(raw)``."""

    def build(root: Path) -> None:
        from fedcomp.datasets.mnist import write_idx

        for split, n in (("train", 60), ("test", 20)):
            write_idx(root, torch.zeros(n, 28, 28, dtype=torch.uint8), torch.arange(n) % 10, split)
        damage(root / "MNIST" / "raw")

    return build


def legacy_mnist(raw: Path) -> None:
    """Damage: torchvision's legacy ``processed`` pair in place of the IDX files, the training one garbage."""
    processed = raw.parent / "processed"
    processed.mkdir()
    (processed / "training.pt").write_bytes(b"not a torch file")
    torch.save((torch.zeros(2, 28, 28, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64)), processed / "test.pt")
    shutil.rmtree(raw)


def idx_labels(count: int) -> bytes:
    return struct.pack(">2i", 0x801, count) + bytes(count)


def catvsdog(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """Build: LibAUC's cat-vs-dog arrays (6,000 rows of 2 x 2 pixels), then ``damage(folder)``."""

    def build(root: Path) -> None:
        from fedcomp.datasets.catvsdog import write_catvsdog

        write_catvsdog(root, np.zeros((6000, 2, 2, 3), np.uint8), np.arange(6000) % 2)
        damage(root / "cat_vs_dog")

    return build


def npz_in_place(path: Path) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, labels=np.zeros(3))
    path.write_bytes(buffer.getvalue())


def adult(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """Build: UCI Adult text files (300 rows each), then ``damage(folder)``."""

    def build(root: Path) -> None:
        from fedcomp.datasets.adult import fake_adult_rows, write_adult

        damage(write_adult(root, fake_adult_rows(300, 0), fake_adult_rows(300, 1)))

    return build


def latin1_byte(name: str, find: bytes) -> Callable[[Path], None]:
    """Damage: the first ``find`` in ``name`` gets an e-acute in Latin-1 after its first letter."""

    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data.replace(find, find[:1] + b"\xe9" + find[1:], 1))

    return damage


def omniglot(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """Build: an extracted Omniglot tree (2 + 2 characters, 2 drawings of 8 x 8), then ``damage(drawing)`` of the
    first drawing of images_background/Latin/character01."""

    def build(root: Path) -> None:
        from fedcomp.datasets.omniglot import write_omniglot

        folder = write_omniglot(root, {"images_background": {"Latin": 2}, "images_evaluation": {"Kannada": 2}},
                                drawings=2, size=8)
        damage(folder / "images_background" / "Latin" / "character01" / "0001_01.png")

    return build


def melanoma_latin1(root: Path) -> None:
    """Build: Kaggle's melanoma layout (10 JPEGs of 8 x 8), its train.csv saved in Latin-1 (an e-acute, line 4)."""
    from fedcomp.datasets.melanoma import write_melanoma

    folder = write_melanoma(root, np.zeros((10, 3, 8, 8), np.uint8), [i % 2 for i in range(10)], [i % 5 for i in range(10)])
    latin1_byte("train.csv", b"ISIC_0000002")(folder)


def stl10(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """Build: STL-10's binary files (4 training, 2 test images), then ``damage(folder)``."""

    def build(root: Path) -> None:
        from fedcomp.datasets.stl10 import write_stl10

        blank = np.zeros((4, 3, 96, 96), np.uint8)
        damage(write_stl10(root, (blank, np.arange(4)), (blank[:2], np.arange(2))))

    return build


def binary(dataset: str, *overrides: str) -> tuple[str, ...]:
    """``fedcomp run auc-table1-offline`` (local) on ``task.dataset`` read from the data root ``{root}``."""
    sets = [a for o in overrides for a in ("--set", o)]
    return ("run", "auc-table1-offline", "--set", f"task.dataset={dataset}", "--set", "task.root={root}", "--set",
            "task.verify_md5=false", "--set", "federation.backend=local", "--set", "run.out={out}", *sets)


def preset(name: str, *overrides: str) -> tuple[str, ...]:
    """``fedcomp run <name>`` (local) with ``--set`` overrides, writing under ``{out}``."""
    sets = [a for o in overrides for a in ("--set", o)]
    return ("run", name, "--set", "federation.backend=local", "--set", "run.out={out}", *sets)


DATA = (("FEDCOMP_DATA", "{root}"),)
"""``env`` of the cases whose task reads the data root from $FEDCOMP_DATA (Adult; MNIST for fednest)."""
CIFAR10 = "{root}/cifar-10-batches-py"
CIFAR_BATCH = "expected a CIFAR-10 python-version batch (a pickled dict of 'data', uint8 rows of 3072 pixels, and 'labels')"
MNIST_RAW = "{root}/MNIST/raw"
IDX_IMAGES = "expected an uncompressed IDX file of unsigned bytes in 3 dimensions (magic number 0x00000803)"
CATVSDOG = "{root}/cat_vs_dog"

CASES = [
    # -- values: out of range, mistyped, not finite --------------------------------------------------------
    Case("lr-inf", run("algorithm.lr=inf"), "algorithm.lr = 'inf': Input should be a finite number"),
    Case("lr-yaml-inf", run("algorithm.lr=.inf"), "algorithm.lr = inf: Input should be a finite number"),
    Case("lr-minus-inf", run("algorithm.lr=-inf"), "algorithm.lr = '-inf': Input should be a finite number"),
    Case("lr-nan", run("algorithm.lr=nan"), "algorithm.lr = 'nan': Input should be a finite number"),
    Case("lr-yaml-nan", run("algorithm.lr=.nan"), "algorithm.lr = nan: Input should be a finite number"),
    Case("lr-negative", run("algorithm.lr=-1"), "algorithm.lr = -1: Input should be greater than 0"),
    Case("lr-text", run("algorithm.lr=fast"), "algorithm.lr = 'fast': Input should be a valid number"),
    Case("lr-list", run("algorithm.lr=[0.1, 0.2]"), "algorithm.lr = [0.1, 0.2]: Input should be a valid number"),
    Case("beta-nan", run("algorithm.beta=nan"), "algorithm.beta = 'nan': Input should be a finite number"),
    Case("beta-above-1", run("algorithm.beta=2"), "algorithm.beta = 2: Input should be less than or equal to 1"),
    Case("inner-batch-0", run("algorithm.inner_batch=0"), "algorithm.inner_batch = 0: Input should be greater than"),
    Case("local-steps-0", run("algorithm.local_steps=0"), "algorithm.local_steps = 0: Input should be greater than"),
    Case("local-steps-float", run("algorithm.local_steps=2.5"), "algorithm.local_steps = 2.5: Input should be a valid integer"),
    Case("task-noise-inf", run("task.noise_ratio=inf"), "task.noise_ratio = 'inf': Input should be a finite number"),
    Case("task-unknown-key", run("task.dimension=3"), "task.dimension: unknown key; allowed keys: name, dim"),
    Case("algorithm-of-another-kind-before-its-values", run("algorithm.name=parallel-pdsgd"),  # local_steps=5 > 1 too
         "algorithm.name = 'parallel-pdsgd' needs a 'compositional-global' problem but task 'invariant-logreg' offers"),
    Case("algorithm-needing-oracles-the-task-lacks", run("task.name=synthetic-classification", "algorithm.name=local-sgdm-rl"),
         "algorithm.name = 'local-sgdm-rl' with weights 'monitor' needs a task that offers class_weighted_loss, "
         "monitor_batches, monitor_slice; the task's problem SyntheticClassification lacks"),
    Case("run-key-misspelt", run("run.round=3"), "run.round: unknown key (did you mean run.rounds?); allowed keys: seed,"),
    Case("task-dim-too-large-for-memory", run("task.dim=1000000000000"),
         "out of memory (RuntimeError: [enforce fail at alloc_cpu.cpp"),
    Case("task-inner-dim-not-below-dim", ("run", "feddro-drift", *LOCAL_TINY, "--set", "task.inner_dim=50", "--set",
                                          "task.dim=10", "--set", "run.out={out}"), "task.inner_dim = 50: must be < dim = 10"),
    Case("fewshot-fewer-classes-than-ways", ("run", "maml-fewshot-mnist", *LOCAL_TINY, "--set", "task.train_digits=[0]",
                                             "--set", "task.ways=2", "--set", "task.rotations=false", "--set",
                                             "run.out={out}"), "task.ways = 2: only 1 meta-training classes"),
    Case("optional-number-the-word-none", ("run", "maml-fewshot-mnist", "--set", "task.tasks_per_client=None", "--set",
                                            "run.out={out}"),
         "task.tasks_per_client = 'None': Input should be a valid integer, unable to parse string as an integer (or "
         "null, for none)"),
    Case("task-objective", run("task.objective=mine"), "task.objective = 'mine': Input should be 'paper' or 'official-code'"),
    Case("lr-empty", run("algorithm.lr="), "algorithm.lr = '': Input should be a valid number"),
    Case("rounds-a-boolean", run("run.rounds=true"), "run.rounds = True: a boolean where a number or a word is wanted"),
    Case("beta-a-boolean", run("algorithm.beta=yes"), "algorithm.beta = True: a boolean where a number or a word is wanted"),
    Case("algorithm-name-a-list", run("algorithm.name=[fcsg]"), "algorithm.name = ['fcsg'] is unknown; allowed: "),
    Case("task-name-a-mapping", run("task.name={{a: 1}}"), "task.name = {{'a': 1}} is unknown; allowed: "),
    Case("module-no-such-file", run("algorithm.module={tmp}/mine.py"),
         "algorithm.module = '{tmp}/mine.py': cannot be imported: ImportError: no such file '{tmp}/mine.py'"),
    Case("module-no-such-name", run("task.module=no_such_module_of_yours"),
         "task.module = 'no_such_module_of_yours': cannot be imported: ModuleNotFoundError: No module named"),
    Case("module-raises", run("algorithm.module={file}"), "algorithm.module = '{file}': cannot be imported: "
         "RuntimeError: the user's bug", file("buggy.py", "raise RuntimeError(\"the user's bug\")\n")),
    Case("module-a-text-file", run("algorithm.module={file}"), "algorithm.module = '{file}': a path must name a .py file",
         file("mods/notpy.txt", "x = 1\n")),
    Case("module-a-folder", run("algorithm.module={tmp}/mods"), "algorithm.module = '{tmp}/mods': a path must name a .py file",
         file("mods/mine.py", "x = 1\n")),
    Case("module-exits", run("algorithm.module={file}"), "algorithm.module = '{file}': cannot be imported: SystemExit: 3",
         file("exits.py", "import sys\nsys.exit(3)\n")),
    Case("module-exits-with-words", run("algorithm.module={file}"),
         "algorithm.module = '{file}': cannot be imported: SystemExit: bye from module",
         file("exits.py", "import sys\nsys.exit('bye from module')\n")),
    Case("module-task-misses-a-metric", ("run", str(EXAMPLES / "extension.yaml"), "--set", "task.module={file}", "--set",
                                         "task.name=least-squares-misnamed", *LOCAL_TINY, "--set", "run.out={out}"),
         "task 'least-squares-misnamed' declares metrics distance, objective_gap, but its evaluator does not report "
         "distance (it reported distance_to_optimum, objective_gap)", file("misnamed.py", MISNAMED)),
    *algorithm_of_yours("module-algorithm-private-field-never-started", "fedavg-hb-no-join", NO_JOIN, NO_JOIN_NEEDLE,
                        in_an_actor=True),
    *algorithm_of_yours("module-round-calls-a-program-it-lacks", "fedavg-hb-misspelt", MISSPELT_PROGRAM,
                        MISSPELT_NEEDLE, in_an_actor=True),
    *algorithm_of_yours("module-algorithm-init-reshapes-x", "fedavg-hb-column", COLUMN_INIT,
                        "Column.init: its x is torch.float64 of shape (10, 1), the task's x torch.float32 of shape "
                        "(10,); start from the task's variables as they are (variables['x'].clone())"),
    Case("batchnorm-policy", ("run", "auc-table1-offline", "--set", "federation.backend=local", "--set",
                              "task.batchnorm=sometimes", "--set", "run.out={out}"),
         "task.batchnorm = 'sometimes': Input should be 'averaged', 'local' or 'batch'"),
    Case("fednest-dropout-masks", ("run", "fednest-hr-offline", "--set", "task.dropout_masks=sometimes", "--set", "run.out={out}"),
         "task.dropout_masks = 'sometimes': Input should be 'batch' or 'evaluation'"),
    Case("fednest-inner-sampling", ("run", "fednest-hr-offline", "--set", "algorithm.inner_sampling=shuffle", "--set",
                                    "run.out={out}"),
         "algorithm.inner_sampling = 'shuffle': Input should be 'replacement' or 'epochs'"),
    Case("fednest-epochs-without-local-data", ("run", "fednest-minimax", "--set", "federation.backend=local", "--set",
                                               "algorithm.inner_sampling=epochs",
                                               "--set", "run.out={out}"),
         "algorithm.inner_sampling = 'epochs' needs a task whose clients hold local datasets"),
    Case("omniglot-small-root-missing", omniglot_small("task.root={tmp}/nothing"),
         "task.root = '{tmp}/nothing': {tmp}/nothing/images_background_small1.zip: no such file; the Omniglot small subsets need"),
    Case("omniglot-small-zip-md5", omniglot_small("task.root={file}"),
         "task.root = '{file}': {file}/images_background_small1.zip: md5 ", omniglot_zips(b"PK\x03\x04 truncated")),
    Case("omniglot-small-zip-corrupt", omniglot_small("task.root={file}", "task.verify_md5=false"),
         "task.root = '{file}': {file}/images_background_small1.zip: not a readable zip file", omniglot_zips(b"not a zip")),
    Case("data-root-a-file", omniglot_small("task.root={file}"),
         "task.root = '{file}': a file, not a folder: give the folder the dataset's files are under (README, Data)",
         file("data.tar", "not a folder")),
    Case("omniglot-source", omniglot_small("task.source=omniglot-tiny"),
         "task.source = 'omniglot-tiny': Input should be 'omniglot' or 'omniglot-small'"),
    Case("algorithm-unknown", run("algorithm.name=adam"), "algorithm.name = 'adam' is unknown (did you mean 'fedadam'?); "
         "allowed: "),
    Case("algorithm-unknown-far-from-any", run("algorithm.name=zzz"), "algorithm.name = 'zzz' is unknown; allowed: "),
    # the nearest of those that run on the task (it said 'fedavg-s', a minimax algorithm, for quickstart's task)
    Case("algorithm-unknown-near-one-for-the-task", run("algorithm.name=fedavgs"),
         "algorithm.name = 'fedavgs' is unknown (did you mean 'fedavg'?); allowed: "),
    Case("algorithm-misspelt-beside-its-module", ("run", str(EXAMPLES / "extension.yaml"), "--set",
                                                  "algorithm.name=fedavg-hbb", *LOCAL_TINY, "--set", "run.out={out}"),
         "algorithm.name = 'fedavg-hbb' is unknown (did you mean 'fedavg-hb'?); allowed: "),
    Case("algorithm-its-module-registers-none", ("run", str(EXAMPLES / "extension.yaml"), "--set",
                                                 "algorithm.module={file}", "--set", "algorithm.name=mine-own",
                                                 *LOCAL_TINY, "--set", "run.out={out}"),
         "; algorithm.module '{file}' registered none", file("registers_nothing.py", "X = 1\n")),
    Case("task-unknown", run("task.name=imagenet"), "task.name = 'imagenet' is unknown; allowed: "),
    Case("algorithm-task-mismatch", run("task.name=synthetic-classification"),
         "algorithm.name = 'fcsg-m' needs a 'conditional' problem but task 'synthetic-classification' offers plain"),
    Case("clients-0", run("federation.clients=0"), "federation.clients = 0: Input should be greater than or equal to 1"),
    Case("clients-per-actor-0", run("federation.clients_per_actor=0"),
         "federation.clients_per_actor = 0: Input should be greater than or equal to 1 (or 'auto')"),
    Case("clients-per-actor-word", run("federation.clients_per_actor=many"),
         "federation.clients_per_actor = 'many': Input should be a valid integer, unable to parse string as an "
         "integer (or 'auto')"),
    Case("clients-text", run("federation.clients=many"), "federation.clients = 'many': Input should be a valid integer"),
    Case("cohort-too-big", run("federation.clients_per_round=20"), "federation.clients_per_round = 20: must be <= federation.clients (4)"),
    Case("backend", run("federation.backend=gpu"), "federation.backend = 'gpu': Input should be 'ray' or 'local'"),
    Case("cpus-inf", run("federation.cpus_per_actor=inf"), "federation.cpus_per_actor = 'inf': Input should be a finite number"),
    Case("cpus-negative", run("federation.cpus_per_actor=-1"), "federation.cpus_per_actor = -1"),
    Case("gpus-nan", run("federation.gpus_per_client=nan"), "federation.gpus_per_client = 'nan': Input should be a finite number"),
    Case("actor-timeout-0", run("federation.actor_timeout_s=0"), "federation.actor_timeout_s = 0: Input should be greater than 0"),
    Case("actor-timeout-inf", run("federation.actor_timeout_s=inf"), "federation.actor_timeout_s = 'inf': Input should be a finite number"),
    Case("retries-negative", run("federation.max_retries=-1"), "federation.max_retries = -1: Input should be greater than or equal to 0"),
    Case("routing", run("federation.routing=nearest"), "federation.routing = 'nearest': Input should be 'balanced' or 'home'"),
    Case("transport-replicated", run("federation.server=replicated", "federation.transport=graph"),
         "federation.transport = 'graph': applies to server: actor or driver; with server: replicated every call"),
    Case("transport", run("federation.transport=dag"), "federation.transport = 'dag': Input should be 'calls', 'graph' or 'collective'"),
    Case("vectorise-text", run("federation.vectorise=maybe"), "federation.vectorise = 'maybe': Input should be a valid boolean"),
    Case("fused-sgd-text", run("federation.fused_sgd=sometimes"),
         "federation.fused_sgd = 'sometimes': Input should be a valid boolean"),
    Case("torch-compile-text", run("federation.torch_compile=fast"),
         "federation.torch_compile = 'fast': Input should be a valid boolean"),
    Case("torch-compile-vectorise", run("federation.torch_compile=true", "federation.vectorise=true"),
         "federation.torch_compile = true: not with vectorise = true (each takes the local steps another way); choose one"),
    Case("torch-compile-fused", run("federation.torch_compile=true", "federation.fused_sgd=true"),
         "federation.torch_compile = true: not with fused_sgd = true (each takes the local steps another way); choose one"),
    Case("rounds-0", run("run.rounds=0"), "run.rounds = 0: Input should be greater than or equal to 1"),
    Case("rounds-text", run("run.rounds=many"), "run.rounds = 'many': Input should be a valid integer"),
    Case("eval-every-0", run("run.eval_every=0"), "run.eval_every = 0: Input should be greater than or equal to 1"),
    Case("checkpoint-every-0", run("run.checkpoint_every=0"),
         "run.checkpoint_every = 0: Input should be greater than or equal to 1"),
    Case("seed-negative", run("run.seed=-1"), "run.seed = -1: Input should be greater than or equal to 0"),
    Case("progress", run("run.progress=loud"), "run.progress = 'loud': Input should be 'auto', 'bar', 'log' or 'none'"),
    Case("on-divergence", run("run.on_divergence=maybe"), "run.on_divergence = 'maybe': Input should be 'stop' or 'continue'"),
    Case("unknown-section", run("model.depth=3"), "override 'model.depth' is not of the form section.key with section one of"),
    Case("section-misspelt", run("algoritm.lr=0.1"), "override 'algoritm.lr' is not of the form section.key with section "
         "one of task, algorithm, federation, run (did you mean 'algorithm.lr'?)"),
    Case("override-no-section", run("lr=0.1"), "override 'lr' is not of the form section.key"),
    Case("override-no-value", ("run", "quickstart", "--set", "algorithm.lr", "--set", "run.out={out}"),
         "--set 'algorithm.lr': expected section.key=value"),
    # -- run names and results folders -----------------------------------------------------------------------
    Case("name-escapes", run("run.name=../../escaped"), "run.name = '../../escaped': must be a plain folder name"),
    Case("name-absolute", run("run.name=/tmp/x"), "run.name = '/tmp/x': must be a plain folder name"),
    Case("name-hidden", run("run.name=.hidden"), "run.name = '.hidden': must be a plain folder name"),
    Case("name-backslash", run("run.name=a\\b"), "run.name = 'a\\\\b': must be a plain folder name"),
    Case("name-too-long", run("run.name=" + "x" * 201), "run.name = '" + "x" * 201 + "': is 201 bytes long; at most 200 allowed"),
    Case("name-too-long-in-utf8", run("run.name=" + "é" * 101),
         "run.name = '" + "é" * 101 + "': is 202 bytes long; at most 200 allowed"),  # bytes, as folder names count
    Case("name-a-newline", ("run", "{file}", "--set", "run.out={out}"),
         "run.name = 'two\\nlines': must be a plain folder name (no newline",
         file("name.yaml", 'task: {name: invariant-logreg}\nalgorithm: {name: fcsg}\nrun: {name: "two\\nlines"}\n')),
    Case("out-empty", ("run", "quickstart", *FAST, "--set", "run.out="), "run.out = '': must be a folder path"),
    Case("out-under-a-file", ("run", "quickstart", *FAST, "--set", "run.out={file}/results"),
         "run.out = '{file}/results': '{file}' is a file, not a folder", file("plain.txt", "not a folder")),
    Case("out-is-a-file", ("run", "quickstart", *FAST, "--set", "run.out={file}"),
         "run.out = '{file}': '{file}' is a file, not a folder", file("plain.txt", "not a folder")),
    Case("out-a-link-to-nothing", ("run", "quickstart", *FAST, "--set", "run.out={link}"),
         "run.out = '{link}': '{link}' is a link to '{tmp}/gone', which is not there", link("out", "gone")),
    Case("out-under-a-link-to-nothing", ("run", "quickstart", *FAST, "--set", "run.out={link}/results"),
         "run.out = '{link}/results': '{link}' is a link to '{tmp}/gone', which is not there", link("out", "gone")),
    Case("out-a-loop-of-links", ("run", "quickstart", *FAST, "--set", "run.out={link}"), "run.out = '{link}': ",
         link("out", "out")),
    Case("out-a-name-too-long", ("run", "quickstart", *FAST, "--set", "run.out={tmp}/" + "x" * 300),
         "run.out = '{tmp}/" + "x" * 300 + "': the name 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx ...' is 300 bytes long; "
         "this file system's names are at most 255"),
    Case("verify-out-a-link-to-nothing", ("verify", "{run}", "--backend", "local", "--out", "{link}"),
         "'{link}' is a link to '{tmp}/gone', which is not there",
         lambda tmp, runs: {**run_copy()(tmp, runs), **link("out", "gone")(tmp, runs)}),
    Case("out-a-name-too-long-above", run("run.out={tmp}/" + "a" * 300 + "/runs"),
         "' is 300 bytes long; this file system's names are at most 255"),
    Case("sweep-out-a-name-too-long", ("sweep", "quick", "--set", "federation.backend=local", "--set",
                                     "run.out={tmp}/" + "b" * 300), "' is 300 bytes long; this file system's names are at most 255"),
    Case("sweep-out-a-link-to-nothing", ("sweep", "quick", "--set", "federation.backend=local", "--set", "run.out={link}"),
         "'{link}' is a link to '{tmp}/gone', which is not there", link("out", "gone")),
    # -- config files ------------------------------------------------------------------------------------------
    Case("preset-unknown", ("run", "nope", "--set", "run.out={out}"), "preset 'nope' is unknown; allowed: "),
    Case("preset-misspelt", ("run", "quikstart", "--set", "run.out={out}"),
         "preset 'quikstart' is unknown (did you mean 'quickstart'?); allowed: "),
    Case("file-missing", ("run", "{tmp}/missing.yaml", "--set", "run.out={out}"), "config file '{tmp}/missing.yaml' does not exist"),
    Case("file-is-folder", ("run", "{file}", "--set", "run.out={out}"), "config file '{file}' is a folder, not a YAML file",
         folder("dir.yaml")),
    Case("yaml-tab-indented", ("run", "{file}", "--set", "run.out={out}"),
         "is not valid YAML: line 2, column 1: found character '\\t' that cannot start any token (YAML indents with spaces",
         file("tabs.yaml", "task:\n\tname: invariant-logreg\n")),
    Case("yaml-corrupt", ("run", "{file}", "--set", "run.out={out}"), "is not valid YAML: line 2",
         file("corrupt.yaml", "task: {name: invariant-logreg\nalgorithm: [fcsg\n")),
    Case("yaml-binary", ("run", "{file}", "--set", "run.out={out}"), "config file '{file}' is a binary file, not YAML text",
         file("model.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")),
    Case("yaml-latin1", ("run", "{file}", "--set", "run.out={out}"), "is not UTF-8 text (byte 0xe9 at offset",
         file("latin1.yaml", "task: {name: caf\xe9}\n".encode("latin-1"))),
    Case("yaml-duplicate-key", ("run", "{file}", "--set", "run.out={out}"), "line 4, column 3: key 'lr' is given twice in one mapping",
         file("dup.yaml", "task: {name: invariant-logreg}\nalgorithm:\n  lr: 0.1\n  lr: 10\n  name: fcsg-m\n")),
    Case("yaml-list-as-a-key", ("run", "{file}", "--set", "run.out={out}"),
         "line 1, column 3: a key must be a word or a number, not a list",
         file("listkey.yaml", "? [a, b]\n: 1\ntask: {name: invariant-logreg}\nalgorithm: {name: fcsg}\n")),
    Case("yaml-aliases-expanding-to-thousands", ("run", "{file}", "--set", "run.out={out}"),
         "task.dim = [[[...], [...], [...], [...], [...], [...], [...], [...], [...]], [[...], ", file("bomb.yaml", "task: {name: invariant-logreg, dim: [&b [&a [x, x, x, x, x, x, x, x, x], "
                                  "*a, *a, *a, *a, *a, *a, *a, *a], *b, *b, *b, *b, *b, *b, *b, *b]}\nalgorithm: {name: fcsg}\n")),
    Case("yaml-list", ("run", "{file}", "--set", "run.out={out}"), "must be a mapping with sections task, algorithm",
         file("list.yaml", "- task\n- algorithm\n")),
    Case("yaml-empty", ("run", "{file}", "--set", "run.out={out}"), "must be a mapping with sections task, algorithm",
         file("empty.yaml", "")),
    Case("yaml-section-scalar", ("run", "{file}", "--set", "run.out={out}"), "section 'algorithm' must be a mapping, got 3",
         file("scalar.yaml", "task: {name: invariant-logreg}\nalgorithm: 3\n")),
    Case("yaml-unknown-section", ("run", "{file}", "--set", "run.out={out}"), "section 'model' is unknown; allowed sections",
         file("section.yaml", GOOD_YAML + "model: {depth: 3}\n")),
    Case("yaml-lr-inf", ("run", "{file}", "--set", "run.out={out}"), "algorithm.lr = inf: Input should be a finite number",
         file("inf.yaml", "task: {name: invariant-logreg}\nalgorithm: {name: fcsg-m, lr: .inf}\n")),
    # -- cluster addresses (malformed ones fail before Ray starts) ---------------------------------------------
    Case("address-dashboard", (*run(), "--set", "federation.backend=ray", "--ray-address", "http://127.0.0.1:8265"),
         "federation.ray_address = 'http://127.0.0.1:8265': allowed: auto, local, HOST:PORT or ray://HOST:PORT (that is the dashboard"),
    Case("address-no-port", (*run(), "--set", "federation.backend=ray", "--ray-address", "headnode"),
         "federation.ray_address = 'headnode': expected HOST:PORT"),
    Case("address-bad-port", (*run(), "--set", "federation.backend=ray", "--ray-address", "headnode:99999"),
         "federation.ray_address = 'headnode:99999': expected HOST:PORT"),
    Case("address-client-no-port", (*run(), "--set", "federation.backend=ray", "--ray-address", "ray://headnode"),
         "federation.ray_address = 'ray://headnode': expected HOST:PORT"),
    Case("address-scheme", run("federation.backend=ray", "federation.ray_address=grpc://h:1"),
         "federation.ray_address = 'grpc://h:1': allowed: auto, local, HOST:PORT or ray://HOST:PORT"),
    # -- command-line flags ------------------------------------------------------------------------------------
    Case("no-command", (), "the following arguments are required: {{run,verify,check,list,sweep,report,bench}}"),
    Case("unknown-command", ("train",), "argument {{run,verify,check,list,sweep,report,bench}}: invalid choice: 'train'"),
    Case("unknown-command-typo", ("swep",), "invalid choice: 'swep' (did you mean 'sweep'?) (choose from 'run', 'verify', "),
    Case("unknown-flag", ("run", "quickstart", "--fast"), "unrecognized arguments: --fast"),
    Case("check-run-out", ("check", "quickstart", "--no-ray", "--set", "run.out={out}"),
         "a check keeps no runs (they go to a temporary folder, removed at its end); leave run.out out"),
    Case("sweep-verbose", ("sweep", "quick", "--verbose", "5"), "argument --verbose: invalid choice: 5 (choose from 0, 1, 2)"),
    Case("sweep-seeds-text", ("sweep", "quick", "--seeds", "x"), "argument --seeds: invalid int value: 'x'"),
    Case("sweep-search", ("sweep", "quick", "--search", "random"), "argument --search: invalid choice: 'random' (choose "
         "from 'grid', 'optuna')"),
    Case("sweep-search-typo", ("sweep", "quick", "--search", "optna"),
         "argument --search: invalid choice: 'optna' (did you mean 'optuna'?) (choose from 'grid', 'optuna')"),
    Case("sweep-seeds-0", ("sweep", "quick", "--seeds", "0", "--set", "run.out={out}"), "--seeds = 0: must be >= 1"),
    Case("sweep-num-samples-0", ("sweep", "quick", "--num-samples", "0", "--set", "run.out={out}"), "--num-samples = 0: must be >= 1"),
    Case("sweep-concurrent-0", ("sweep", "quick", "--max-concurrent", "0", "--set", "run.out={out}"), "--max-concurrent = 0: must be >= 1"),
    Case("resume-with-preset", ("run", "quickstart", "--resume", "{tmp}"), "--resume RUN_DIR continues a run with its stored config"),
    Case("list-unknown", ("list", "nope"), "list 'nope': not an algorithm, task, config section or preset"),
    Case("list-module-missing", ("list", "--module", "{tmp}/missing.py"), "--module '{tmp}/missing.py': cannot be imported"),
    Case("resume-set-lr", ("run", "--resume", "{tmp}", "--set", "algorithm.lr=0.5"),
         "--resume '{tmp}': setting algorithm.lr: only settings that leave the numbers unchanged may change; allowed: "
         "federation.backend,"),
    Case("resume-set-backend-bad", ("run", "--resume", "{run}", "--set", "federation.backend=gpu"),
         "federation.backend = 'gpu': Input should be 'ray' or 'local'", run_copy()),
    # -- sweep files -------------------------------------------------------------------------------------------
    Case("sweep-unknown", ("sweep", "nosuch", "--set", "run.out={out}"), "sweep 'nosuch' is unknown; allowed:"),
    Case("sweep-misspelt", ("sweep", "fcsg-invariant-l", "--set", "run.out={out}"),
         "sweep 'fcsg-invariant-l' is unknown (did you mean 'fcsg-invariant-lr'?); allowed:"),
    Case("sweep-key-misspelt", ("sweep", "{file}", "--set", "run.out={out}"),
         "sweep key 'grids' is unknown (did you mean 'grid'?); allowed: name,",
         file("grids-sweep.yaml", "base: quickstart\ngrids: {algorithm.lr: [0.1]}\n")),
    Case("sweep-asha-grace-over-rounds", ("sweep", "quick", "--scheduler", "asha", "--set", "run.rounds=3", "--set",
                                          "run.out={out}"),
         "grace_rounds = 5: ASHA gives every trial that many rounds before it may stop one, more than run.rounds = 3"),
    Case("sweep-name-a-list", ("sweep", "quick", "--set", "algorithm.name=[fcsg]", "--set", "run.out={out}"),
         "algorithm.name = ['fcsg'] is unknown; allowed: "),
    Case("sweep-file-tabs", ("sweep", "{file}", "--set", "run.out={out}"),
         "sweep file '{file}' is not valid YAML: line 2, column 1", file("tabs-sweep.yaml", "grid:\n\talgorithm.lr: [0.1]\n")),
    Case("sweep-file-binary", ("sweep", "{file}", "--set", "run.out={out}"), "sweep file '{file}' is a binary file",
         file("bin-sweep.yaml", b"\x00\x01\x02")),
    Case("sweep-name-escapes", ("sweep", "{file}", "--set", "run.out={out}"),
         "sweep name = '../../escaped': must be a plain folder name",
         file("name-sweep.yaml", "name: ../../escaped\nbase: quickstart\ngrid: {algorithm.lr: [0.1]}\n")),
    Case("sweep-name-too-long", ("sweep", "{file}", "--set", "run.out={out}"),
         "sweep name = '" + "y" * 201 + "': is 201 bytes long; at most 200 allowed",
         file("long-sweep.yaml", "name: " + "y" * 201 + "\nbase: quickstart\ngrid: {algorithm.lr: [0.1]}\n")),
    Case("sweep-cpus-inf", ("sweep", "{file}", "--set", "run.out={out}"), "cpus_per_trial = inf: Input should be a finite number",
         file("cpus-sweep.yaml", "base: quickstart\ngrid: {algorithm.lr: [0.1]}\ncpus_per_trial: .inf\n")),
    Case("sweep-grid-lr-inf", ("sweep", "{file}", "--set", "run.out={out}"), "algorithm.lr = inf: Input should be a finite number",
         file("grid-sweep.yaml", "base: quickstart\ngrid: {algorithm.lr: [0.1, .inf]}\n")),
    Case("sweep-grid-aliases-expanding-to-millions", ("sweep", "{file}", "--set", "run.out={out}"),
         "sweep point {{'algorithm.lr': [[...], [...], [...], [...], [...], [...], [...], [...], [...]]}}: algorithm.lr = [[[...], ",
         file("sweep-bomb.yaml", "base: quickstart\ngrid: {algorithm.lr: " + BOMB + "}\n")),
    Case("sweep-grid-empty", ("sweep", "{file}", "--set", "run.out={out}"), 'grid axis algorithm.lr = []: must be a non-empty list of values',
         file("sweep-grid-empty.yaml", "base: quickstart\ngrid: {algorithm.lr: []}\n")),
    Case("sweep-grid-scalar", ("sweep", "{file}", "--set", "run.out={out}"), 'grid axis algorithm.lr = 0.1: must be a non-empty list of values',
         file("sweep-grid-scalar.yaml", "base: quickstart\ngrid: {algorithm.lr: 0.1}\n")),
    Case("sweep-grid-unknown-key", ("sweep", "{file}", "--set", "run.out={out}"), 'algorithm.nonsense: unknown key; allowed keys: name, lr,',
         file("sweep-grid-unknown-key.yaml", "base: quickstart\ngrid: {algorithm.nonsense: [1]}\n")),
    Case("sweep-grid-lr-negative", ("sweep", "{file}", "--set", "run.out={out}"), 'algorithm.lr = -1: Input should be greater than 0',
         file("sweep-grid-lr-negative.yaml", "base: quickstart\ngrid: {algorithm.lr: [0.1, -1]}\n")),
    Case("sweep-space-loguniform-reversed", ("sweep", "{file}", "--set", "run.out={out}"), 'space algorithm.lr = {{loguniform: [0.2, 0.001]}}: needs 0 < low < high',
         file("sweep-space-loguniform-reversed.yaml", "base: quickstart\nsearch: optuna\nnum_samples: 2\nspace: {algorithm.lr: {loguniform: [0.2, 0.001]}}\n")),
    Case("sweep-space-loguniform-zero", ("sweep", "{file}", "--set", "run.out={out}"), 'space algorithm.lr = {{loguniform: [0, 0.1]}}: needs 0 < low < high',
         file("sweep-space-loguniform-zero.yaml", "base: quickstart\nsearch: optuna\nnum_samples: 2\nspace: {algorithm.lr: {loguniform: [0, 0.1]}}\n")),
    Case("sweep-space-distribution", ("sweep", "{file}", "--set", "run.out={out}"), "space algorithm.lr = {{gaussian: [0, 0.1]}}: must be one of {{uniform: ...}}",
         file("sweep-space-distribution.yaml", "base: quickstart\nsearch: optuna\nnum_samples: 2\nspace: {algorithm.lr: {gaussian: [0, 0.1]}}\n")),
    Case("sweep-scheduler", ("sweep", "{file}", "--set", "run.out={out}"), "sweep scheduler = 'hyperband': Input should be 'none' or 'asha'",
         file("sweep-scheduler.yaml", "base: quickstart\ngrid: {algorithm.lr: [0.1]}\nscheduler: hyperband\n")),
    Case("sweep-metric-unknown", ("sweep", "{file}", "--set", "run.out={out}"), "metric = 'nonsense' is not reported by task 'invariant-logreg'; allowed: test_accuracy,",
         file("sweep-metric-unknown.yaml", "base: quickstart\ngrid: {algorithm.lr: [0.1]}\nmetric: nonsense\n")),
    Case("sweep-tasks-without-a-shared-metric", ("sweep", "{file}", "--set", "run.out={out}"),
         "sweep point {{'task.name': 'sinewave'}}: metric = 'test_accuracy' is not reported by task 'sinewave'; allowed: "
         "test_loss, train_loss (what every task of the sweep reports)",
         file("two-tasks.yaml", "base: quickstart\ngrid: {task.name: [invariant-logreg, sinewave]}\n")),
    Case("mlflow-store-a-file", run("run.out={tmp}", "run.track=mlflow"),
         "run.track = 'mlflow': '{tmp}/mlflow' is a file, where MLflow's store goes", file("mlflow", "not a folder")),
    Case("mlflow-database-damaged", run("run.out={tmp}", "run.track=mlflow"),
         "run.track = 'mlflow': '{tmp}/mlflow/mlflow.db' cannot be read as MLflow's database (file is not a database)",
         file("mlflow/mlflow.db", b"not a database" * 100)),
    Case("sweep-mlflow-store-a-file", ("sweep", "quick", "--set", "federation.backend=local", "--set", "run.out={tmp}",
                                       "--set", "run.track=mlflow"),
         "run.track = 'mlflow': '{tmp}/mlflow' is a file, where MLflow's store goes", file("mlflow", "not a folder")),
    Case("sweep-mlflow-database-damaged", ("sweep", "quick", "--set", "federation.backend=local", "--set",
                                           "run.out={tmp}", "--set", "run.track=mlflow"),
         "run.track = 'mlflow': '{tmp}/mlflow/mlflow.db' cannot be read as MLflow's database (file is not a database)",
         file("mlflow/mlflow.db", b"not a database" * 100)),
    Case("sweep-resume-max-concurrent", ("sweep", "--resume", "{sweep}", "--max-concurrent", "2"),
         "--resume SWEEP_DIR continues a sweep with its stored spec; drop --max-concurrent (--ray-address and --verbose "
         "may stay)", sweep_folder(None)),
    Case("sweep-resume-not-a-sweep", ("sweep", "--resume", "{sweep}"), "no sweep.json there; not a fedcomp sweep folder",
         sweep_folder(None)),
    Case("sweep-resume-corrupt-json", ("sweep", "--resume", "{sweep}"), "sweep.json cannot be read (Unterminated string",
         sweep_folder('{"spec": {"base": "quick')),
    Case("sweep-resume-no-spec", ("sweep", "--resume", "{sweep}"), "sweep.json holds no sweep spec", sweep_folder("{}")),
    Case("sweep-resume-bad-spec", ("sweep", "--resume", "{sweep}"), "the stored spec is not valid",
         sweep_folder('{"spec": {"search": "random"}}')),
    Case("sweep-resume-extend-record-without-cap", ("sweep", "--resume", "{sweep}"),
         "extend.json is not fedcomp's record of this sweep's edge extensions (KeyError: 'cap')",
         sweep_with("extend.json", b'{"steps": []}')),
    Case("sweep-resume-extend-record-odd-step", ("sweep", "--resume", "{sweep}"),
         "extend.json is not fedcomp's record of this sweep's edge extensions (KeyError: 'moves')",
         sweep_with("extend.json", b'{"cap": 3, "steps": [{"points": []}]}')),
    # -- resuming a run ----------------------------------------------------------------------------------------
    Case("resume-missing", ("run", "--resume", "{tmp}/nothing"), "no run.json there; not a fedcomp run folder"),
    Case("resume-run-json-corrupt", ("run", "--resume", "{run}"), "run.json cannot be read (Unterminated string",
         run_copy(cut_inside_a_string("run.json"))),
    Case("resume-run-json-list", ("run", "--resume", "{run}"), "run.json is not a JSON object", run_copy(write("run.json", "[1, 2]"))),
    Case("resume-run-json-no-config", ("run", "--resume", "{run}"), "run.json holds no run config",
         run_copy(edit_json(lambda meta: meta.pop("config")))),
    Case("resume-run-json-bad-value", ("run", "--resume", "{run}"),
         "the config in run.json is not valid: algorithm.lr = 'inf': Input should be a finite number",
         run_copy(edit_json(lambda meta: meta["config"]["algorithm"].update(lr="inf")))),
    Case("resume-no-checkpoint", ("run", "--resume", "{run}"), "no checkpoint.pt there: the run stopped before its "
         "first checkpoint (round 10), so there is nothing to continue; run its config again: fedcomp run ",
         run_copy(remove("checkpoint.pt"))),
    Case("resume-truncated-checkpoint", ("run", "--resume", "{run}"),
         "checkpoint.pt cannot be read (truncated or corrupt: ", run_copy(truncate("checkpoint.pt"))),
    Case("resume-garbage-checkpoint", ("run", "--resume", "{run}"), "checkpoint.pt cannot be read (truncated or corrupt",
         run_copy(write("checkpoint.pt", b"this is not a checkpoint"))),
    Case("resume-foreign-pickle", ("run", "--resume", "{run}"), "checkpoint.pt is not a fedcomp run checkpoint",
         run_copy(lambda target, runs: torch.save({"weights": torch.zeros(3)}, target / "checkpoint.pt"))),
    Case("resume-other-algorithm", ("run", "--resume", "{run}"),
         "checkpoint.pt belongs to another run: algorithm.beta = '(unset)' in the checkpoint, 0.1 in run.json; "
         "algorithm.name = 'fcsg' in the checkpoint, 'fcsg-m' in run.json", run_copy(checkpoint_of("fcsg"))),
    Case("resume-other-clients", ("run", "--resume", "{run}"),
         "checkpoint.pt belongs to another run: federation.clients = 8 in the checkpoint, 4 in run.json",
         run_copy(checkpoint_of("clients8"))),
    Case("resume-checkpoint-past-the-rounds", ("run", "--resume", "{run}"),
         "checkpoint.pt is at round 100, past the run's run.rounds = 2: it is not this run's checkpoint",
         run_copy(interrupted_with(lambda c: c["server"]["counters"].update(round=100)))),
    Case("resume-other-seed", ("run", "--resume", "{run}"),
         "checkpoint.pt belongs to another run: run.seed = 1 in the checkpoint, 0 in run.json", run_copy(checkpoint_of("seed1"))),
    Case("resume-other-task", ("run", "--resume", "{run}"),
         "checkpoint.pt belongs to another run: task.test_samples = 3000 in the checkpoint, 2000 in run.json",
         run_copy(checkpoint_of("task3000"))),
    Case("resume-legacy-other-algorithm", ("run", "--resume", "{run}"),
         "checkpoint.pt holds the state ['x'] but algorithm.name = 'fcsg-m' keeps ['u', 'x']; it belongs to another run",
         run_copy(checkpoint_of("fcsg", legacy=True))),
    Case("resume-legacy-more-clients", ("run", "--resume", "{run}"),
         "checkpoint.pt holds client 7 but federation.clients = 4; it belongs to another run",
         run_copy(checkpoint_of("acc8", legacy=True))),
    # -- reports -----------------------------------------------------------------------------------------------
    Case("report-nothing", ("report", "{tmp}/nothing"), "no fedcomp run results under"),
    Case("report-unknown-metric", ("report", "{results}", "--metric", "auroc"),
         "column 'auroc' is not in these results; allowed:", results_with(lambda target, runs: None)),
    Case("sweep-resume-garbage-state-copy", ("sweep", "--resume", "{sweep}"),
         "tune_state.pkl cannot be read (UnpicklingError", sweep_with("tune_state.pkl", b"\x00garbage")),
    Case("sweep-resume-foreign-state-copy", ("sweep", "--resume", "{sweep}"),
         "tune_state.pkl cannot be read (not a copy of Tune's state files); it is fedcomp's copy of Tune's state: delete it",
         sweep_with("tune_state.pkl", pickle.dumps([1, 2]))),
    Case("sweep-resume-cut-tune-state-no-copy", ("sweep", "--resume", "{sweep}"),
         "experiment_state-2026-12-06_22-00-00.json cannot be read (cut short or damaged), and {sweep} holds no copy of "
         "Tune's state (tune_state.pkl) to resume from; nothing was changed",
         sweep_with("experiment_state-2026-12-06_22-00-00.json", b'{"trial_data": [["{\\"trial_id')),
    Case("sweep-resume-cut-tuner-pkl-no-copy", ("sweep", "--resume", "{sweep}"), "tuner.pkl cannot be read",
         sweep_with("tuner.pkl", pickle.dumps({"a": 1})[:7])),
    Case("report-metric-a-text-column", ("report", "{results}", "--metric", "algorithm"),
         "column 'algorithm' holds text, not numbers; allowed: ", results_with(lambda target, runs: None)),
    Case("report-metrics-without-rounds", ("report", "{results}"), "metrics.parquet has no round column: not a fedcomp "
         "run's metrics", results_with(lambda target, runs: pd.read_parquet(target / "metrics.parquet").drop(
             columns="round").to_parquet(target / "metrics.parquet"))),
    Case("report-sweep-panels-not-an-axis", ("report", "{sweep}"), "the stored spec's panels or table name 'task.bogus', "
         "not an axis of the sweep", lambda tmp, runs: {**sweep_folder('{"spec": {"base": "quickstart", "grid": '
                                                         '{"algorithm.lr": [0.1]}, "panels": ["task.bogus"]}}')(tmp, runs)}),
    Case("report-unknown-x", ("report", "{results}", "--x", "epochs"),
         "column 'epochs' is not in these results; allowed:", results_with(lambda target, runs: None)),
    Case("report-corrupt-run-json", ("report", "{results}"), "run.json cannot be read", results_with(truncate("run.json"))),
    Case("report-corrupt-metrics", ("report", "{results}"), "metrics.parquet cannot be read",
         results_with(truncate("metrics.parquet"))),
    Case("report-sweep-corrupt-trials", ("report", "{sweep}"), "trials.parquet cannot be read (truncated or corrupt: ",
         sweep_with("trials.parquet", b"PAR1 cut short")),
    Case("report-out-is-a-file", ("report", "{results}", "--out", "{results}/run/run.json"),
         "--out '{results}/run/run.json': '{results}/run/run.json' is a file, not a folder", results_with(lambda target, runs: None)),
    Case("report-out-under-a-file", ("report", "{results}", "--out", "{results}/run/run.json/plots"),
         "is a file, not a folder", results_with(lambda target, runs: None)),
    Case("report-sweep-out-is-a-file", ("report", "{sweep}", "--out", "{sweep}/sweep.json"),
         "--out '{sweep}/sweep.json': '{sweep}/sweep.json' is a file, not a folder", sweep_with("trials.parquet", a_table())),
    Case("verify-corrupt-metrics", ("verify", "{run}"), "metrics.parquet cannot be read (truncated or corrupt: ",
         run_copy(truncate("metrics.parquet"))),
    Case("verify-corrupt-run-json", ("verify", "{run}"), "run.json cannot be read (Unterminated string",
         run_copy(cut_inside_a_string("run.json"))),
    Case("verify-a-diverged-run", ("verify", "{run}"), "the run's status is 'diverged', not 'completed'; a diverged run "
         "stops there for good", run_copy(lambda target, runs: (target / "run.json").write_text(json.dumps(
             {**json.loads((target / "run.json").read_text()), "status": "diverged"})))),
    Case("verify-out-the-run-itself", ("verify", "{run}", "--backend", "local", "--out", "{run}"),
         "verify --out '{run}': lies in the run folder it verifies", run_copy()),
    Case("verify-out-inside-the-run", ("verify", "{run}", "--backend", "local", "--out", "{run}/again"),
         "verify --out '{run}/again': lies in the run folder it verifies", run_copy()),
    # -- data sets whose files are empty, cut short, damaged or of another format --------------------------------
    Case("cifar-batch-cut", binary("cifar10"), f"task.dataset = 'cifar10': {CIFAR10}/data_batch_1: cannot be read "
         f"(UnpicklingError: pickle data was truncated); {CIFAR_BATCH}",
         data_root(cifar10(lambda folder: cut(folder / "data_batch_1", 1000)))),
    Case("cifar-test-batch-empty", binary("cifar10"), f"{CIFAR10}/test_batch: is empty (0 bytes); {CIFAR_BATCH}",
         data_root(cifar10(lambda folder: cut(folder / "test_batch", 0)))),
    Case("cifar-meta-garbage", binary("cifar10"), f"{CIFAR10}/batches.meta: cannot be read (",
         data_root(cifar10(lambda folder: (folder / "batches.meta").write_bytes(b"garbage\x00\x01")))),
    Case("cifar-batch-without-labels", binary("cifar10"),
         f"{CIFAR10}/data_batch_2: has no 'labels' (it has 'batch_label', 'data', 'filenames'); {CIFAR_BATCH}",
         data_root(cifar10(edit_batch("data_batch_2", lambda entry: entry.__delitem__("labels"))))),
    Case("cifar-batch-a-list", binary("cifar10"), f"{CIFAR10}/data_batch_3: holds a pickled list; {CIFAR_BATCH}",
         data_root(cifar10(edit_batch("data_batch_3", lambda entry: [1, 2])))),
    Case("cifar-rows-of-1000", binary("cifar10"),
         f"{CIFAR10}/data_batch_2: 'data' holds uint8 (8, 1000); expected uint8 rows of 3072 pixels (3 x 32 x 32)",
         data_root(cifar10(edit_batch("data_batch_2", lambda entry: entry.update(data=np.zeros((8, 1000), np.uint8)))))),
    Case("cifar-label-42", binary("cifar10"), f"{CIFAR10}/data_batch_2: 'labels' holds the label 42; CIFAR-10 labels are 0..9",
         data_root(cifar10(edit_batch("data_batch_2", lambda entry: entry["labels"].__setitem__(3, 42))))),
    Case("mnist-images-cut", binary("mnist"), f"task.dataset = 'mnist': {MNIST_RAW}/train-images-idx3-ubyte: holds 5000 "
         "bytes but its header (60 x 28 x 28) needs 47056; is it cut short?",
         data_root(mnist(lambda raw: cut(raw / "train-images-idx3-ubyte", 5000)))),
    Case("mnist-images-gzipped", binary("mnist"), f"{MNIST_RAW}/train-images-idx3-ubyte: is gzip-compressed; {IDX_IMAGES} (in its folder: "
         "mv train-images-idx3-ubyte train-images-idx3-ubyte.gz && gunzip train-images-idx3-ubyte.gz)",
         data_root(mnist(lambda raw: (raw / "train-images-idx3-ubyte").write_bytes(
             gzip.compress((raw / "train-images-idx3-ubyte").read_bytes()))))),
    Case("mnist-images-wrong-magic", binary("mnist"), f"{MNIST_RAW}/t10k-images-idx3-ubyte: magic number 0x00000801; {IDX_IMAGES}",
         data_root(mnist(lambda raw: shutil.copy(raw / "t10k-labels-idx1-ubyte", raw / "t10k-images-idx3-ubyte")))),
    Case("mnist-labels-empty", binary("mnist"), f"{MNIST_RAW}/t10k-labels-idx1-ubyte: is empty (0 bytes); expected an "
         "uncompressed IDX file of unsigned bytes in 1 dimension (magic number 0x00000801)",
         data_root(mnist(lambda raw: cut(raw / "t10k-labels-idx1-ubyte", 0)))),
    Case("mnist-label-count", binary("mnist"), f"{MNIST_RAW}/train-labels-idx1-ubyte: holds 10 labels but "
         f"{MNIST_RAW}/train-images-idx3-ubyte holds 60 images; expected one label per image",
         data_root(mnist(lambda raw: (raw / "train-labels-idx1-ubyte").write_bytes(idx_labels(10))))),
    Case("mnist-processed-garbage", binary("mnist"), "{root}/MNIST/processed/training.pt: cannot be read (UnpicklingError: ",
         data_root(mnist(legacy_mnist))),
    Case("fednest-mnist-images-cut", preset("fednest-hr-offline", "task.source=mnist"),
         f"task.source = 'mnist': {MNIST_RAW}/train-images-idx3-ubyte: holds 5000 bytes but its header",
         data_root(mnist(lambda raw: cut(raw / "train-images-idx3-ubyte", 5000))), env=DATA),
    Case("catvsdog-labels-empty", binary("catvsdog"), f"task.dataset = 'catvsdog': {CATVSDOG}/cat_vs_dog_label.npy: is empty "
         "(0 bytes); expected a NumPy .npy file of 0/1 labels [n]",
         data_root(catvsdog(lambda folder: cut(folder / "cat_vs_dog_label.npy", 0)))),
    Case("catvsdog-labels-an-npz", binary("catvsdog"), f"{CATVSDOG}/cat_vs_dog_label.npy: is a zip archive (an .npz of several "
         "arrays?), not one array", data_root(catvsdog(lambda folder: npz_in_place(folder / "cat_vs_dog_label.npy")))),
    Case("catvsdog-data-cut", binary("catvsdog"), f"{CATVSDOG}/cat_vs_dog_data.npy: cannot be read (ValueError: mmap length is "
         "greater than file size); expected a NumPy .npy file of uint8 images [n, H, W, 3]",
         data_root(catvsdog(lambda folder: cut(folder / "cat_vs_dog_data.npy", 3000)))),
    Case("catvsdog-labels-text", binary("catvsdog"), f"{CATVSDOG}/cat_vs_dog_label.npy: is not a .npy file (it starts with "
         "b'0,1,0,', not the .npy magic", data_root(catvsdog(lambda folder: (folder / "cat_vs_dog_label.npy").write_text("0,1,0,1\n")))),
    Case("melanoma-csv-latin1", binary("melanoma", "task.image_size=8"), "task.dataset = 'melanoma': {root}/melanoma/train.csv line 4: "
         "not UTF-8 text (byte 0xe9 at column 2); expected CSV text with the columns image_name, target, tfrecord",
         data_root(melanoma_latin1)),
    Case("stl10-images-empty", binary("stl10"), "{root}/stl10_binary/train_X.bin is empty (0 bytes); expected 27648 bytes",
         data_root(stl10(lambda folder: cut(folder / "train_X.bin", 0)))),
    Case("stl10-labels-empty", binary("stl10"), "{root}/stl10_binary/train_y.bin is empty (0 bytes); expected one label in 1..10 "
         "per image of train_X.bin (4 images, 0 labels)", data_root(stl10(lambda folder: cut(folder / "train_y.bin", 0)))),
    Case("adult-empty", preset("feddro-adult"), "task.name = 'adult-fairness': {root}/adult/adult.data: is empty (0 bytes)",
         data_root(adult(lambda folder: cut(folder / "adult.data", 0))), env=DATA),
    Case("adult-cut", preset("feddro-adult"), "{root}/adult/adult.data line 25: 13 comma-separated fields; expected 15",
         data_root(adult(lambda folder: cut(folder / "adult.data", 3000))), env=DATA),
    Case("adult-latin1", preset("feddro-adult"), "{root}/adult/adult.data line 13: not UTF-8 text (byte 0xe9 at column 6); expected UCI Adult text",
         data_root(adult(latin1_byte("adult.data", b"Private"))), env=DATA),
    Case("adult-clients-over-rows", preset("feddro-adult", "federation.clients=5000"),
         "federation.clients = 5000: at most 120 allowed (the training part of Adult holds 120 rows",
         data_root(adult(lambda folder: None)), env=DATA),
    Case("dro-clients-over-examples", preset("feddro-offline", "federation.clients=1000"),
         "federation.clients = 1000: at most 795 allowed (the training part of task.dataset = 'digits-st' holds 795 examples"),
    Case("omniglot-png-text", preset("maml-omniglot-1shot", "task.root={root}", "task.verify_md5=false"),
         "task.root = '{root}': {root}/omniglot-py/images_background/Latin/character01/0001_01.png: cannot be read "
         "(UnidentifiedImageError: cannot identify image file); expected a PNG image",
         data_root(omniglot(lambda png: png.write_text("not a png")))),
    Case("omniglot-png-cut", preset("maml-omniglot-1shot", "task.root={root}", "task.verify_md5=false"),
         "{root}/omniglot-py/images_background/Latin/character01/0001_01.png: cannot be read (OSError: ",
         data_root(omniglot(lambda png: cut(png, 60)))),
    # -- on the Ray backend: the one line comes from inside an actor (the server actor builds the task) ----------
    Case("ray-cifar-batch-cut", binary("cifar10", "federation.backend=ray", "federation.server=actor",
                                       "federation.clients=2", "federation.clients_per_actor=1"),
         f"task.dataset = 'cifar10': {CIFAR10}/data_batch_1: cannot be read (UnpicklingError: pickle data was truncated)",
         data_root(cifar10(lambda folder: cut(folder / "data_batch_1", 1000))), ray=True),
    # a sweep checks every trial's data files before Tune starts one (each would fail alike) -- in a Ray task
    Case("ray-sweep-data-missing", ("sweep", "auc-table1", "--set", "run.out={out}"),
         "task.dataset = 'cifar10': cifar10 not found: {root}/cifar-10-batches-py must hold data_batch_1",
         data_root(lambda root: None), env=DATA, ray=True),
    Case("ray-sweep-data-of-a-later-point-missing", ("sweep", "auc-table1", "--set", "run.out={out}"),
         "task.dataset = 'cifar100': cifar100 not found: {root}/cifar-100-python must hold train, test, meta",
         data_root(cifar10(lambda folder: None)), env=DATA, ray=True),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Finished tiny runs (local backend) whose folders the resume and report cases copy and damage."""
    root = tmp_path_factory.mktemp("runs")
    variants = {"base": [], "fcsg": ["algorithm.name=fcsg"], "clients8": ["federation.clients=8"],
                "seed1": ["run.seed=1"], "task3000": ["task.test_samples=3000"],
                "acc8": ["algorithm.name=acc-fcsg-m", "federation.clients=8"]}
    made = {}
    for name, overrides in variants.items():
        argv = [a.format(out=root / name) for a in run(*overrides)]
        assert main(argv) == 0
        (made[name],) = (root / name).iterdir()
    return made


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.ray] if c.ray else []) for c in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(case: Case, runs, tmp_path, capsys, monkeypatch, request):
    names = {"tmp": str(tmp_path), "out": str(tmp_path / "out")}
    if case.ray:
        request.getfixturevalue("ray_session")
    if case.setup is not None:
        names.update(case.setup(tmp_path, runs))
    for variable, value in case.env:
        monkeypatch.setenv(variable, value.format(**names))
    before = snapshot(tmp_path)
    capsys.readouterr()
    try:
        code = main([a.format(**names) for a in case.argv])
    except SystemExit as stop:  # argparse's exit, as the console script sees it
        code = stop.code
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2, (code, captured.err[-2000:])
    assert len(err) == 1, err
    assert err[0].startswith("fedcomp: error: "), err
    assert case.needle.format(**names) in err[0], err[0]
    assert snapshot(tmp_path) == before, "the failed command wrote or changed files"


def test_the_corpus_is_large_and_distinct():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("change", "needle"), [
    (lambda c: c["server"]["state"].update(x=torch.zeros(3)), "the checkpoint's x has shape (3,), this run's (11,): "
                                                              "it is not this run's checkpoint"),
    (lambda c: c["server"]["state"].pop("u"), "the checkpoint does not hold this run's server state (KeyError: "),
], ids=["model-of-another-size", "without-u"])
def test_a_checkpoint_of_this_runs_identity_whose_state_is_not_this_runs_is_one_line(change, needle, runs, tmp_path,
                                                                                    capsys):
    """Found as the server takes the state (a traceback before), after the run's folder is opened: run.json is
    written again, the checkpoint is not changed, and the line does not say to continue (that would fail again)."""
    names = run_copy(interrupted_with(change))(tmp_path, runs)
    checkpoint = (Path(names["run"]) / results.CHECKPOINT).read_bytes()
    capsys.readouterr()
    assert main(["run", "--resume", names["run"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "continue" not in err[0], err
    assert (Path(names["run"]) / results.CHECKPOINT).read_bytes() == checkpoint
