"""UCI Adult for the equal-opportunity fairness task (FedDRO's E9), prepared as in the GCIVR code.

:func:`load_adult` reads ``<root>/adult/adult.data`` and ``<root>/adult/adult.test`` in the UCI text format
and rebuilds the table that ``mlscientist/GCIVR`` (``data.py``, itself from TFCO's "fairness with noisy
protected groups" pipeline) feeds to its logistic regression. What is implemented, and where it comes from:

* **Parsing.** 15 comma-separated fields per line, surrounding spaces ignored (pandas'
  ``skipinitialspace``); blank lines and lines starting with ``|`` are skipped (``adult.test`` opens with
  ``|1x3 Cross validator``; GCIVR skips its first line unconditionally). Label = 1 iff the income field is
  ``>50K``, with or without the trailing period that ``adult.test`` adds. Any other income value, a
  non-integer continuous field or a category outside the UCI vocabulary (``adult.names``; ``?`` is a
  category of workclass, occupation and native-country) is a one-line ``ValueError`` naming file and line.
* **Features** (all 0/1, float32). ``fnlwgt`` is dropped. Categorical columns are one-hot over the fixed
  UCI vocabulary (:data:`CATEGORIES`, so the width does not depend on which values a file happens to
  contain). Continuous columns are bucketised into 4 one-hot buckets with pandas ``cut`` semantics
  (bucket i holds edges[i] < v <= edges[i+1]): age at the quartiles of the ``adult.data`` ages (edges =
  min, 25 %, 50 %, 75 %, max, linear interpolation as ``pandas.qcut``); capital_gain at
  [-1, 1, 4000, 10000, 100000]; capital_loss [-1, 1, 1800, 1950, 4500]; hours_per_week [0, 39, 41, 50, 100];
  education_num [0, 8, 9, 11, 16] (:data:`BUCKET_EDGES`).
* **Groups.** True protected groups: 0 = race White, 1 = race Black, 2 = the other three races combined
  (Amer-Indian-Eskimo, Asian-Pac-Islander, Other). The ``race_White`` and ``race_Black`` indicators are
  removed from the features (GCIVR removes its three protected columns; ``race_Other_combined`` is a derived
  column, so the three constituent race indicators stay, as in the code). Noisy **proxy** groups: a
  fraction ``noise_level`` (GCIVR default 0.3) of all pooled rows, ``int(noise_level * N)`` of them, is
  moved to a uniformly chosen *other* group. GCIVR draws these with the unseeded ``random`` module; here
  they come from ``torch.Generator().manual_seed(proxy_seed)`` (same distribution, reproducible, not the
  same rows). As in the code, the chosen level's three proxy indicators **stay in the features**
  (``proxies_in_features=False`` drops them). Training constraints use proxies; evaluation uses true groups.
* **Split.** The two files are pooled (``adult.data`` rows first) and split by the permutation
  ``numpy.random.RandomState(split_seed).permutation(N)``: its first ``int(train_fraction * N)`` rows are
  the training set, in permutation order. With GCIVR's ``split_seed=12345`` and ``train_fraction=0.2``
  this reproduces the code's split exactly (20 % train / 80 % test, 9,768 / 39,074 rows of the real
  files). It is a local ``RandomState``, not the global NumPy state; NumPy's legacy generator is used
  only because it is what reproduces the published split.

Feature layout (:func:`feature_names`): the categorical one-hots in the order workclass, education,
marital_status, occupation, relationship, race (without White and Black), gender, native_country, each in
vocabulary order; then 4 buckets each of age, capital_gain, capital_loss, hours_per_week, education_num;
then ``proxy_White``, ``proxy_Black``, ``proxy_Other``. Width: 100 + 20 + 3 = 123 (120 without proxies).

``variant="code"`` reproduces one quirk of the pandas pipeline: a value on or outside the outer edges (for
age, the youngest age of ``adult.data``, 17 in the real files) falls in no bucket, so its four bucket
columns are all zero. The default ``"clean"`` puts it in the first or last bucket. Inferred, not known:
how FedDRO split Adult over its 8 clients (use :mod:`fedcomp.datasets.partition`).

:func:`write_adult` and :func:`fake_adult_rows` write tiny files in the same text format for tests.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets.checks import read_text, require_files
from fedcomp.datasets.mnist import data_root

__all__ = [
    "ADULT_FILES",
    "BUCKET_EDGES",
    "CATEGORIES",
    "COLUMNS",
    "GROUPS",
    "AdultData",
    "AdultSplit",
    "fake_adult_rows",
    "feature_names",
    "load_adult",
    "require_adult",
    "write_adult",
]

ADULT_FILES = ("adult.data", "adult.test")
COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
    "relationship", "race", "gender", "capital_gain", "capital_loss", "hours_per_week", "native_country",
    "income_bracket",
)  # fmt: skip
CATEGORIES: dict[str, tuple[str, ...]] = {
    "workclass": (
        "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
        "Without-pay", "Never-worked", "?",
    ),
    "education": (
        "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc", "9th",
        "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool",
    ),
    "marital_status": (
        "Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed", "Married-spouse-absent",
        "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
        "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing", "Transport-moving",
        "Priv-house-serv", "Protective-serv", "Armed-Forces", "?",
    ),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "gender": ("Female", "Male"),
    "native_country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
        "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba", "Iran", "Honduras",
        "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal", "Ireland", "France",
        "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia", "Hungary", "Guatemala",
        "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador", "Trinadad&Tobago", "Peru", "Hong",
        "Holand-Netherlands", "?",
    ),
}  # fmt: skip
"""The UCI vocabulary of each categorical column (``adult.names``), in one-hot order."""

BUCKET_EDGES: dict[str, tuple[float, ...] | None] = {
    "age": None,  # quartiles of the adult.data ages
    "capital_gain": (-1, 1, 4000, 10000, 100000),
    "capital_loss": (-1, 1, 1800, 1950, 4500),
    "hours_per_week": (0, 39, 41, 50, 100),
    "education_num": (0, 8, 9, 11, 16),
}
"""Bucket edges of the continuous columns (GCIVR/TFCO); ``None`` = 4 quantile bins fitted on ``adult.data``."""

GROUPS = ("White", "Black", "Other")
"""Protected group ids 0, 1, 2; "Other" combines Amer-Indian-Eskimo, Asian-Pac-Islander and Other."""

_CONTINUOUS = ("age", "capital_gain", "capital_loss", "hours_per_week", "education_num")
_INCOME = {"<=50K": 0, ">50K": 1}
_DROPPED_RACES = ("White", "Black")

V = TypeVar("V")


class AdultSplit(NamedTuple):
    """One part of the prepared table."""

    features: Tensor
    """float32 [N, d] of 0/1 values, in :func:`feature_names` order."""
    labels: Tensor
    """int64 [N]: 1 iff income > 50K."""
    groups: Tensor
    """int64 [N]: true protected group (0 White, 1 Black, 2 Other) -- for evaluation."""
    proxy_groups: Tensor
    """int64 [N]: noisy proxy group -- for the training constraints."""


class AdultData(NamedTuple):
    train: AdultSplit
    test: AdultSplit
    feature_names: tuple[str, ...]


def feature_names(proxies_in_features: bool = True) -> tuple[str, ...]:
    """Names of the feature columns, in order (123 with the proxy columns, 120 without)."""
    names = [
        f"{column}_{value}"
        for column, values in CATEGORIES.items()
        for value in values
        if not (column == "race" and value in _DROPPED_RACES)
    ]
    names += [f"{column}_{b}" for column in _CONTINUOUS for b in range(4)]
    if proxies_in_features:
        names += [f"proxy_{g}" for g in GROUPS]
    return tuple(names)


def load_adult(
    root: str | os.PathLike[str] | None = None,
    *,
    noise_level: float = 0.3,
    train_fraction: float = 0.2,
    split_seed: int = 12345,
    proxy_seed: int = 0,
    proxies_in_features: bool = True,
    variant: Literal["clean", "code"] = "clean",
) -> AdultData:
    """Adult prepared as in GCIVR (see the module docstring): pooled files, seeded split, proxy groups.

    Args:
        root: data root holding ``adult/adult.data`` and ``adult/adult.test``; default :func:`data_root`.
        noise_level: fraction of rows whose proxy group is moved to another group, in [0, 1).
        train_fraction: fraction of the pooled rows in the *training* part (GCIVR: 0.2).
        split_seed: seed of the split permutation (GCIVR: 12345).
        proxy_seed: seed of the proxy-group noise.
        proxies_in_features: keep the three proxy indicators as features (GCIVR does).
        variant: ``"clean"`` or ``"code"`` (out-of-range bucket values get no bucket, as in the pandas code).

    Raises:
        FileNotFoundError: a file is missing (one line naming the folder).
        ValueError: a bad argument or a malformed line.
    """
    if isinstance(noise_level, bool) or not isinstance(noise_level, (int, float)) or not 0 <= noise_level < 1:
        raise ValueError(f"noise_level = {noise_level!r}: must be a number in [0, 1)")
    if isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float)) or not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction = {train_fraction!r}: must be a number strictly between 0 and 1")
    for name, seed in (("split_seed", split_seed), ("proxy_seed", proxy_seed)):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"{name} = {seed!r}: must be an integer in 0..2**32 - 1")
    if not isinstance(proxies_in_features, bool):
        raise ValueError(f"proxies_in_features = {proxies_in_features!r}: must be True or False")
    if variant not in ("clean", "code"):
        raise ValueError(f"variant = {variant!r}: allowed: 'clean', 'code'")
    folder = require_adult(root) / "adult"
    train_rows = _read(folder / "adult.data")
    test_rows = _read(folder / "adult.test")
    for name, read in (("adult.data", train_rows), ("adult.test", test_rows)):  # an empty test file shrank the pool
        if not read:
            empty = (folder / name).stat().st_size == 0
            raise ValueError(f"{folder / name}: {'is empty (0 bytes)' if empty else 'holds no data rows'}; "
                             f"expected lines of {len(COLUMNS)} comma-separated fields")
    rows = train_rows + test_rows
    ages = np.array([r[0] for r in train_rows], dtype=np.float64)
    quartiles = tuple(np.quantile(ages, [0, 0.25, 0.5, 0.75, 1]).tolist())
    edges = {c: quartiles if e is None else e for c, e in BUCKET_EDGES.items()}

    n = len(rows)
    columns = feature_names(proxies_in_features=False)
    position = {name: i for i, name in enumerate(columns)}
    base = np.zeros((n, len(columns)), dtype=np.float32)
    labels = np.zeros(n, dtype=np.int64)
    groups = np.zeros(n, dtype=np.int64)
    index = {c: COLUMNS.index(c) for c in COLUMNS}
    for i, row in enumerate(rows):
        for column in CATEGORIES:
            value = row[index[column]]
            if not (column == "race" and value in _DROPPED_RACES):
                base[i, position[f"{column}_{value}"]] = 1.0
        for column in _CONTINUOUS:
            bucket = _bucket(row[index[column]], edges[column], variant)
            if bucket is not None:
                base[i, position[f"{column}_{bucket}"]] = 1.0
        race = row[index["race"]]
        groups[i] = GROUPS.index(race) if race in _DROPPED_RACES else 2
        labels[i] = row[index["income_bracket"]]

    proxies = groups.copy()
    moved = int(noise_level * n)
    if moved:
        gen = torch.Generator().manual_seed(proxy_seed)
        chosen = torch.randperm(n, generator=gen)[:moved].numpy()
        shift = torch.randint(1, len(GROUPS), (moved,), generator=gen).numpy()
        proxies[chosen] = (groups[chosen] + shift) % len(GROUPS)
    if proxies_in_features:
        base = np.concatenate([base, np.eye(len(GROUPS), dtype=np.float32)[proxies]], axis=1)

    perm = np.random.RandomState(split_seed).permutation(n)
    cut = int(train_fraction * n)

    def part(ix: np.ndarray) -> AdultSplit:
        return AdultSplit(
            torch.from_numpy(base[ix]),
            torch.from_numpy(labels[ix]),
            torch.from_numpy(groups[ix]),
            torch.from_numpy(proxies[ix]),
        )

    return AdultData(part(perm[:cut]), part(perm[cut:]), feature_names(proxies_in_features))


def require_adult(root: str | os.PathLike[str] | None = None) -> Path:
    """The data root (``root``, default :func:`data_root`), checked to hold ``adult/adult.data`` and ``adult.test``
    without reading them: the one-line ``FileNotFoundError`` :func:`load_adult` raises first."""
    root = data_root() if root is None else Path(root).expanduser()
    require_files("Adult", root / "adult", ADULT_FILES,
                  "copy adult.data and adult.test from https://archive.ics.uci.edu/dataset/2/adult there", root)
    return root


def write_adult(
    root: str | os.PathLike[str], train_rows: Sequence[Sequence[object]], test_rows: Sequence[Sequence[object]]
) -> Path:
    """Write ``<root>/adult/adult.data`` and ``adult.test`` in the UCI text format; return the folder.

    Each row has the 15 :data:`COLUMNS` values, income as ``"<=50K"`` or ``">50K"``. Fields are joined by
    ``", "`` as in the UCI files, each file ends with a blank line, and ``adult.test`` gets the UCI first
    line ``|1x3 Cross validator`` and a period after every income value. Files are replaced atomically.
    """
    folder = Path(root).expanduser() / "adult"
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows, header, suffix in (
        ("adult.data", train_rows, "", ""),
        ("adult.test", test_rows, "|1x3 Cross validator\n", "."),
    ):
        lines = []
        for k, row in enumerate(rows):
            if len(row) != len(COLUMNS):
                raise ValueError(f"{name} row {k}: has {len(row)} values; must have the {len(COLUMNS)} of COLUMNS")
            if row[-1] not in _INCOME:
                raise ValueError(f"{name} row {k}: income {row[-1]!r}; allowed: '<=50K', '>50K'")
            lines.append(", ".join(str(v) for v in row[:-1]) + f", {row[-1]}{suffix}\n")
        path = folder / name
        tmp = path.with_name(name + ".tmp")
        tmp.write_text(header + "".join(lines) + "\n")
        os.replace(tmp, path)
    return folder


def fake_adult_rows(n: int, seed: int) -> list[tuple[object, ...]]:
    """``n`` random but valid Adult rows (for :func:`write_adult`), drawn from ``torch.Generator(seed)``.

    Categories are uniform over the UCI vocabulary except race (about half White, a quarter Black, a
    quarter spread over the other three), continuous values are uniform over plausible ranges, and the
    income is more often ``>50K`` for older, more educated rows, so the label is learnable.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n = {n!r}: must be a positive integer")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed = {seed!r}: must be a non-negative integer")
    gen = torch.Generator().manual_seed(seed)

    def integer(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    def pick(values: Sequence[V]) -> V:
        return values[integer(0, len(values) - 1)]

    races = ("White",) * 6 + ("Black",) * 3 + ("Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other")
    rows: list[tuple[object, ...]] = []
    for _ in range(n):
        age, education_num = integer(17, 90), integer(1, 16)
        rich = float(torch.rand(1, generator=gen)) < 0.1 + 0.6 * (age > 35) * (education_num > 9)
        rows.append((
            age, pick(CATEGORIES["workclass"]), integer(10000, 1000000), pick(CATEGORIES["education"]),
            education_num, pick(CATEGORIES["marital_status"]), pick(CATEGORIES["occupation"]),
            pick(CATEGORIES["relationship"]), pick(races), pick(CATEGORIES["gender"]),
            pick((0, 0, 0, 2174, 5178, 14084, 99999)), pick((0, 0, 0, 1590, 1887, 1977, 2559)),
            integer(1, 99), pick(CATEGORIES["native_country"]), ">50K" if rich else "<=50K",
        ))  # fmt: skip
    return rows


def _read(path: Path) -> list[tuple[Any, ...]]:
    """Rows of one UCI file as tuples of typed values (ints, category strings, 0/1 label)."""
    rows = []
    vocab = {c: set(v) for c, v in CATEGORIES.items()}
    lines = read_text(path, f"UCI Adult text, lines of {len(COLUMNS)} comma-separated fields")
    for number, line in enumerate(io.StringIO(lines, newline=None), start=1):  # \n, \r\n or \r ends a line, as text mode reads
        text = line.strip()
        if not text or text.startswith("|"):
            continue
        fields = [f.strip() for f in text.split(",")]
        if len(fields) != len(COLUMNS):
            raise ValueError(f"{path} line {number}: {len(fields)} comma-separated fields; expected {len(COLUMNS)}")
        row: list[object] = []
        for column, value in zip(COLUMNS, fields):
            if column == "income_bracket":
                label = _INCOME.get(value[:-1] if value.endswith(".") else value)
                if label is None:
                    raise ValueError(
                        f"{path} line {number}: income {value!r}; "
                        "allowed: '<=50K', '>50K' (optionally with a trailing '.')"
                    )
                row.append(label)
            elif column in vocab:
                if value not in vocab[column]:
                    raise ValueError(
                        f"{path} line {number}: {column} {value!r} is not in the UCI vocabulary "
                        f"(CATEGORIES[{column!r}])"
                    )
                row.append(value)
            else:
                try:
                    row.append(int(value))
                except ValueError:
                    raise ValueError(f"{path} line {number}: {column} {value!r}; must be an integer") from None
        rows.append(tuple(row))
    return rows


def _bucket(value: float, edges: Sequence[float], variant: str) -> int | None:
    """pandas ``cut`` bucket (edges[i] < v <= edges[i+1]); out of range: None ("code") or clipped ("clean")."""
    if variant == "code" and not edges[0] < value <= edges[-1]:
        return None
    return sum(value > e for e in edges[1:-1])
