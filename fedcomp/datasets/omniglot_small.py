"""Real Omniglot offline: the two small background subsets shipped inside the package, and their split.

``data/omniglot_small/`` holds ``images_background_small1.zip`` and ``images_background_small2.zip`` exactly
as the Omniglot repository publishes them (Lake, Salakhutdinov and Tenenbaum, Science 2015; MIT licence in
``LICENSE`` beside them, about 2.9 MB). Each zip holds ``images_background_smallN/<Alphabet>/<characterNN>/
<id>_<drawer>.png`` (105 x 105, 1-bit). Greek and Latin are in both zips, byte for byte, and are read once:
242 distinct characters x 20 drawers.

:func:`load_omniglot_small` reads the PNGs straight out of the zips (no extraction, nothing written) and
preprocesses them as :func:`fedcomp.datasets.omniglot.load_omniglot` does (grey, inverted so strokes are
bright, 28 x 28 bilinear). Characters are named ``"images_background/<Alphabet>/<characterNN>"`` -- the
names the same characters have in the full set -- and sorted; drawings are sorted by file name.

:func:`small_split` splits by **alphabet**, as the Vinyals / Torchmeta split of the full set does (a
held-out alphabet is the harder, standard test: no meta-test character shares an alphabet with a
meta-training one). The full-set split cannot be used: all 8 alphabets here are background alphabets,
which it assigns to train or val only. Here: val = Early_Aramaic (a validation alphabet of the full-set
split too), test = Korean and Tagalog (one alphabet from each zip; 57 characters), train = the other five
(163 characters) -- 67 / 9 / 24 % of the characters, close to the full split's 63 / 11 / 26 %.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import zipfile
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from fedcomp.datasets.omniglot import OmniglotData, to_28px

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["SMALL_ALPHABETS", "SMALL_SPLIT", "SMALL_ZIPS", "load_omniglot_small", "require_omniglot_small", "shipped_root", "small_split"]

SmallSplitName = Literal["train", "val", "test"]

SMALL_ZIPS: dict[str, str] = {
    "images_background_small1.zip": "e704a628b5459e08445c13499850abc4",
    "images_background_small2.zip": "b75a71a51d3b13f821f212756fe481fd",
}
"""The two zips and their md5 (checked unless ``verify_md5`` is off)."""

SMALL_ALPHABETS: dict[str, int] = {
    "Balinese": 24, "Early_Aramaic": 22, "Greek": 24, "Japanese_(katakana)": 47, "Korean": 40, "Latin": 26,
    "Sanskrit": 42, "Tagalog": 17,
}
"""The 8 distinct alphabets of the two zips and their character counts (242)."""

SMALL_SPLIT: dict[str, tuple[str, ...]] = {
    "val": ("Early_Aramaic",),
    "test": ("Korean", "Tagalog"),
}
"""Held-out alphabets; every other alphabet is meta-training (see the module docstring for why)."""

_SET = "images_background"


def shipped_root() -> Path:
    """The folder inside the installed package that holds the two zips and their licence."""
    return Path(str(resources.files("fedcomp.datasets") / "data" / "omniglot_small"))


def small_split(characters: list[str], split: SmallSplitName) -> list[int]:
    """Positions in ``characters`` (names ``"<set>/<Alphabet>/<characterNN>"``) of the split's characters."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split = {split!r}: allowed: 'train', 'val', 'test'")
    held = {a: name for name, alphabets in SMALL_SPLIT.items() for a in alphabets}
    return [i for i, c in enumerate(characters) if held.get(c.split("/")[1], "train") == split]


def load_omniglot_small(root: str | os.PathLike[str] | None = None, *, verify_md5: bool = True) -> OmniglotData:
    """The 242 characters x 20 drawings of the two zips under ``root`` (default: :func:`shipped_root`).

    Raises ``FileNotFoundError`` for a missing zip and ``ValueError`` for one that is corrupt, has another
    md5 (unless ``verify_md5`` is off), holds an unreadable image, or disagrees with the other zip about
    a character both hold; each message is one line naming the file.
    """
    return _load(str(require_omniglot_small(root)), verify_md5)


def require_omniglot_small(root: str | os.PathLike[str] | None = None) -> Path:
    """The folder (``root``, default :func:`shipped_root`), checked to hold both zips without reading them: the
    one-line ``FileNotFoundError`` :func:`load_omniglot_small` raises first."""
    folder = shipped_root() if root is None else Path(root).expanduser()
    for name in SMALL_ZIPS:
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{folder / name}: no such file; the Omniglot small subsets need {' and '.join(SMALL_ZIPS)} in {folder}"
            )
    return folder


@functools.cache
def _load(folder: str, verify_md5: bool) -> OmniglotData:
    drawings: dict[str, dict[str, bytes]] = {}  # character name -> {file name: PNG bytes}
    for name, md5 in SMALL_ZIPS.items():
        path = Path(folder) / name
        blob = path.read_bytes()
        digest = hashlib.md5(blob).hexdigest()
        if verify_md5 and digest != md5:
            raise ValueError(f"{path}: md5 {digest} is not the published {md5} (set verify_md5 false to read it anyway)")
        for character, file, png in _pngs(path, blob):
            seen = drawings.setdefault(character, {})
            if seen.get(file, png) != png:
                raise ValueError(f"{path}: {character}/{file} differs from the copy in the other zip")
            seen[file] = png
    if not drawings:
        raise ValueError(f"{folder}: the zips hold no <alphabet>/<character>/<drawing>.png images")
    characters = sorted(drawings)
    counts = {len(files) for files in drawings.values()}
    if len(counts) != 1:
        raise ValueError(f"{folder}: every character must have the same number of drawings, found {sorted(counts)}")
    images = torch.empty(len(characters), counts.pop(), 28, 28, dtype=torch.uint8)
    for c, character in enumerate(characters):
        for d, file in enumerate(sorted(drawings[character])):
            images[c, d] = torch.from_numpy(np.asarray(_decode(drawings[character][file], character, file), dtype=np.uint8).copy())
    return OmniglotData(images, characters)


def _pngs(path: Path, blob: bytes) -> list[tuple[str, str, bytes]]:
    """(character name, file name, PNG bytes) of every image in one zip."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            out = []
            for info in archive.infolist():
                parts = PurePosixPath(info.filename).parts
                if info.is_dir() or len(parts) != 4 or not parts[3].endswith(".png"):
                    continue
                out.append((f"{_SET}/{parts[1]}/{parts[2]}", parts[3], archive.read(info)))
            return out
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as error:
        raise ValueError(f"{path}: not a readable zip file ({error})") from None


def _decode(png: bytes, character: str, file: str) -> Image.Image:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(png)) as image:
            return to_28px(image)
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{character}/{file}: not a readable PNG ({error})") from None
