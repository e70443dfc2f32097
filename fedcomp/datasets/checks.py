"""Argument checks and the seeded generator shared by the dataset builders (one clear ValueError each), and
:func:`reading`, which turns a decoder's error on a corrupt, truncated or foreign file into one line naming it."""

from __future__ import annotations

import csv
import os
import pickle
import struct
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor


def seeded(seed: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed = {seed!r}: must be a non-negative integer")


def class_labels(labels: Tensor | Sequence[int]) -> Tensor:
    """``labels`` as an int64 tensor, checked to be a non-empty 1-D vector of non-negative class ids."""
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.numel() == 0 or labels.is_floating_point() or labels.is_complex():
        raise ValueError(
            f"labels of shape {tuple(labels.shape)} and dtype {labels.dtype}: must be a non-empty 1-D integer tensor"
        )
    if labels.dtype == torch.bool or int(labels.min()) < 0:
        raise ValueError("labels: must be non-negative integer class ids")
    return labels.long()


def check_split(split: object) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split = {split!r}: allowed: 'train', 'test'")


def require_files(name: str, folder: Path, files: Sequence[str], hint: str, root: Path | None = None) -> None:
    """One-line ``FileNotFoundError`` naming the folder and the files it lacks (the loaders' first check, so that
    torchvision's download hint never shows). With the data ``root`` that ``folder`` lies under: where the files are
    in a folder below it that ends the way ``folder`` does (the root given as ``MNIST/`` or ``MNIST/raw/`` itself, not
    the folder above), the hint is the root to give instead."""
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{name} not found: {folder} must hold {', '.join(files)} "
            f"({'none is there' if len(missing) == len(files) else 'missing: ' + ', '.join(missing)}); "
            f"{_root_above(folder, files, root) or _compressed(folder, missing) or hint}"
        )


def _compressed(folder: Path, missing: Sequence[str]) -> str | None:
    """``gunzip`` advice where the missing files are in ``folder`` gzip-compressed (``<name>.gz``, as published)."""
    there = [f"{name}.gz" for name in missing if (folder / f"{name}.gz").is_file()]
    if not there:
        return None
    return f"{', '.join(there)} {'is' if len(there) == 1 else 'are'} there: gunzip {'it' if len(there) == 1 else 'them'}"


def _root_above(folder: Path, files: Sequence[str], root: Path | None) -> str | None:
    """``the data root is the folder above ...: give <root>`` where the files lie in ``root`` itself or in a folder
    of it named as ``folder``'s last parts are (``root/raw`` for ``root/MNIST/raw``), else None."""
    if root is None:
        return None
    below = folder.relative_to(root).parts
    for k in range(1, len(below) + 1):
        there = root.joinpath(*below[k:])
        if all((there / f).is_file() for f in files):
            above = root.parents[k - 1]
            return f"they are in {there}: the data root is the folder above {'/'.join(below[:k])}/, give {above}"
    return None


def md5_failure(name: str, folder: Path, error: ValueError, verify_md5: bool) -> ValueError | None:
    """torchvision's "not found or corrupted" where it checked the files' md5 (they are there: :func:`require_files`
    came first), as one line naming the folder; None for another error."""
    if verify_md5 and "corrupted" in str(error):
        return ValueError(f"{name} files in {folder} fail torchvision's md5 check; replace them with the published "
                          f"files, or set verify_md5 false (a config's task.verify_md5) for files you generated")
    return None


READ_ERRORS: tuple[type[BaseException], ...] = (
    EOFError,
    pickle.UnpicklingError,
    UnicodeDecodeError,
    OSError,  # PIL's UnidentifiedImageError and "image file is truncated" among them; FileNotFoundError passes
    zipfile.BadZipFile,
    csv.Error,
    struct.error,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    ImportError,  # a pickle naming a class that is not there
    OverflowError,
    AssertionError,
    RuntimeError,
    ValueError,
)
"""What the decoders (pickle, NumPy, torch.load, PIL, torchvision's readers, the csv module) raise on a file that is
cut short, damaged or of another format. Only the file reads are wrapped in :func:`reading`, so these are the
file's fault there, not a bug of the builder around it."""

_DETAIL = 160
"""At most this many characters of the decoder's own message go into the one line."""


def describe(error: BaseException, path: str | os.PathLike[str] | None = None) -> str:
    """``Type: first line of the message`` (shortened, without ``path`` where it quotes it: the line names it
    already), for a one-line error that quotes another."""
    text = str(error).strip()
    if path is not None:
        text = text.replace(f" {str(path)!r}", "")  # PIL's and others' messages name the file again
    if isinstance(error, KeyError) and error.args:
        text = f"no key {error.args[0]!r}"
    first = text.splitlines()[0] if text else ""
    if len(first) > _DETAIL:  # its first sentence, else its start (torch.load's are paragraphs on one line)
        sentence = first.find(". ")
        first = first[: sentence + 1] if 0 < sentence < _DETAIL else first[: _DETAIL - 3] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def cannot_read(path: str | os.PathLike[str], error: BaseException, expected: str) -> str:
    """The one line for a file a decoder failed on: empty, or cut short / damaged / of another format."""
    where = Path(path)
    if where.is_file() and where.stat().st_size == 0:
        return f"{where}: is empty (0 bytes); expected {expected}"
    return f"{where}: cannot be read ({describe(error, where)}); expected {expected}"


@contextmanager
def reading(path: str | os.PathLike[str], expected: str = "the published file") -> Iterator[None]:
    """Turn what a decoder raises on a bad file into one ``ValueError`` naming ``path`` (a file, or the folder a
    reader such as torchvision's reads several files from), the decoder's complaint and what was ``expected``.

    Wrap only the reads themselves. A missing file stays a ``FileNotFoundError``, and a ``ValueError`` whose
    message already names ``path`` (the loaders' own checks, raised inside the block) passes unchanged.
    """
    try:
        yield
    except FileNotFoundError:
        raise
    except READ_ERRORS as error:
        if isinstance(error, ValueError) and not isinstance(error, UnicodeDecodeError) and str(path) in str(error):
            raise
        raise ValueError(cannot_read(path, error, expected)) from None


def file_start(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer for a shorter file), read through :func:`reading`."""
    with reading(path), open(path, "rb") as fh:
        return fh.read(size)


def read_text(path: Path, expected: str) -> str:
    """The whole of the UTF-8 text file ``path``; one line naming the file and the line of a byte that is not UTF-8
    (a file saved in Latin-1, a binary file)."""
    with reading(path, expected), open(path, "rb") as fh:
        blob = fh.read()
    try:
        return blob.decode("utf-8-sig")  # a leading byte-order mark is not part of the text
    except UnicodeDecodeError as error:
        text, at = error.object, error.start  # the bytes after a byte-order mark, where there is one
        line, column = text.count(b"\n", 0, at) + 1, at - text.rfind(b"\n", 0, at)
        raise ValueError(f"{path} line {line}: not UTF-8 text (byte 0x{text[at]:02x} at column {column}); "
                         f"expected {expected}") from None
