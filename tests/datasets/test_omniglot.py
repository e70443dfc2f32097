"""Omniglot in torchvision's format: generated files load through the real loader with the Vinyals split sizes,
and the omniglot task runs on them."""

from __future__ import annotations

import pytest
import torch

import fedcomp
from fedcomp.datasets.omniglot import OMNIGLOT_ALPHABETS, load_omniglot, vinyals_split, write_omniglot
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import build_task
from fedcomp.platform.rng import generator


def test_generated_tree_loads_with_the_vinyals_split_sizes(tmp_path):
    write_omniglot(tmp_path, drawings=1, size=20)
    data = load_omniglot(tmp_path, verify_md5=False)
    assert data.images.shape == (1623, 1, 28, 28) and data.images.dtype == torch.uint8
    assert data.characters == sorted(data.characters)
    sizes = {s: vinyals_split(data.characters, s) for s in ("train", "val", "test")}
    assert [len(sizes[s]) for s in ("train", "val", "test")] == [1028, 172, 423]
    assert sorted(c for split in sizes.values() for c in split) == list(range(1623))  # disjoint and complete
    assert data.images.float().mean() < 128  # inverted: the generated black strokes are bright
    assert sum(sum(t.values()) for t in OMNIGLOT_ALPHABETS.values()) == 1623


def test_missing_files_and_md5_are_one_clear_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="Omniglot not found"):
        load_omniglot(tmp_path / "nothing", verify_md5=False)
    write_omniglot(tmp_path, {"images_background": {"Latin": 1}, "images_evaluation": {"Kannada": 1}}, size=8)
    with pytest.raises(FileNotFoundError, match="md5"):
        load_omniglot(tmp_path, verify_md5=True)


SMALL = {"images_background": {"Latin": 10, "Hebrew": 5}, "images_evaluation": {"Angelic": 5, "Kannada": 6}}


def test_omniglot_task_on_generated_files(tmp_path):
    write_omniglot(tmp_path, SMALL, drawings=20, size=12)
    overrides = {"task.name": "omniglot", "task.root": str(tmp_path), "task.verify_md5": False, "task.eval_tasks": 3,
                 "algorithm.name": "fcsg-m", "algorithm.first_batch": 2, "algorithm.outer_batch": 2,
                 "algorithm.inner_batch": 5, "algorithm.local_steps": 2, "federation.clients": 3,
                 "federation.backend": "local", "run.rounds": 1, "run.progress": "none", "run.out": str(tmp_path / "r")}
    task = build_task(load_config("quickstart", overrides))
    assert len(task.train_classes) == (10 + 5) * 4 and len(task.eval_classes) == 6 * 4  # rotations as classes
    owned = [set(classes) for classes, _ in task._shares]
    assert all(not (a & b) for i, a in enumerate(owned) for b in owned[i + 1:])
    assert set().union(*owned) == set(task.train_classes)
    episodes = task.episodes(1, 2, generator(0, "e"))
    assert episodes.support_x.shape == (2, 5, 1, 28, 28) and episodes.query_x.shape == (2, 75, 1, 28, 28)
    result = fedcomp.run(load_config("quickstart", overrides))
    assert 0.0 <= result.final["test_accuracy"] <= 1.0
    with pytest.raises(ConfigError, match=r"task\.client_split = 'classes'"):
        build_task(load_config("quickstart", {**overrides, "federation.clients": 16}))
    with pytest.raises(ConfigError, match=r"task\.root"):
        build_task(load_config("quickstart", {**overrides, "task.root": str(tmp_path / "none")}))


TINY = {"images_background": {"Latin": 2, "Hebrew": 1}, "images_evaluation": {"Kannada": 2}}


@pytest.mark.parametrize("damage", ["cut", "empty", "a-list", "other-shape"])
def test_a_damaged_cache_is_ignored_and_rebuilt_as_a_fresh_build(tmp_path, damage):
    from fedcomp.datasets import omniglot

    folder = write_omniglot(tmp_path, TINY, drawings=3, size=10)
    fresh = load_omniglot(tmp_path, verify_md5=False)
    cache = folder / ".fedcomp-28px.pt"
    assert cache.is_file()
    if damage == "cut":
        cache.write_bytes(cache.read_bytes()[:100])
    elif damage == "empty":
        cache.write_bytes(b"")
    elif damage == "a-list":
        torch.save([1, 2], cache)
    else:
        torch.save({"characters": fresh.characters, "images": torch.zeros(2, 2, dtype=torch.uint8)}, cache)
    omniglot._load.cache_clear()  # as a new process would: read the cache again
    rebuilt = load_omniglot(tmp_path, verify_md5=False)
    assert rebuilt.characters == fresh.characters and torch.equal(rebuilt.images, fresh.images)
    saved = torch.load(cache, weights_only=True)  # rewritten whole, and no temporary file left beside it
    assert saved["characters"] == fresh.characters and torch.equal(saved["images"], fresh.images)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".fedcomp")] == [".fedcomp-28px.pt"]


def test_a_drawing_changed_since_the_cache_was_written_is_decoded_again(tmp_path):
    """The cache was kept while its characters' names matched: a drawing replaced in place (or another variant of the
    set under the same folder names) served the old pixels, and a truncated drawing went unnoticed."""
    import os

    from fedcomp.datasets import omniglot

    folder = write_omniglot(tmp_path, TINY, drawings=3, size=10)
    before = load_omniglot(tmp_path, verify_md5=False)
    drawings = sorted((folder / "images_background" / "Latin" / "character01").iterdir())
    other = folder / "images_evaluation" / "Kannada" / "character02" / "0005_01.png"
    drawings[0].write_bytes(other.read_bytes())
    stat = drawings[0].stat()
    os.utime(drawings[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a later write on a coarse clock
    omniglot._load.cache_clear()  # as a new process would
    after = load_omniglot(tmp_path, verify_md5=False)
    latin = before.characters.index("images_background/Latin/character01")
    kannada = before.characters.index("images_evaluation/Kannada/character02")
    assert torch.equal(after.images[latin, 0], before.images[kannada, 0])
    assert not torch.equal(after.images[latin, 0], before.images[latin, 0])
    drawings[1].write_bytes(drawings[1].read_bytes()[:60])
    omniglot._load.cache_clear()
    with pytest.raises(ValueError, match="image file is truncated"):
        load_omniglot(tmp_path, verify_md5=False)


def test_a_data_root_that_takes_no_cache_still_loads_and_keeps_nothing_beside_it(tmp_path, monkeypatch):
    """torch.save raises RuntimeError, not OSError, on a read-only or full folder: the load failed with its
    traceback. A read-only mount cannot be made here; the write fails as it does there."""
    from fedcomp.datasets import omniglot

    def read_only(obj, path, *args, **kwargs):
        open(path, "wb").close()  # torch.save opens the file first, as it does on a full disk
        raise RuntimeError("[enforce fail at inline_container.cc:747] . open file failed with strerror: Read-only "
                           "file system")

    folder = write_omniglot(tmp_path, TINY, drawings=3, size=10)
    monkeypatch.setattr(torch, "save", read_only)
    data = load_omniglot(tmp_path, verify_md5=False)
    assert data.images.shape == (5, 3, 28, 28)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".fedcomp")] == []
    monkeypatch.undo()
    omniglot._load.cache_clear()
    assert torch.equal(load_omniglot(tmp_path, verify_md5=False).images, data.images)


def test_macos_appledouble_files_are_not_drawings_and_an_odd_character_is_named(tmp_path):
    """A copy made on a Mac held ._<name>.png beside each drawing: "found [20, 21]" and no character named."""
    folder = write_omniglot(tmp_path, TINY, drawings=3, size=10)
    expected = load_omniglot(tmp_path, verify_md5=False)
    character = folder / "images_background" / "Latin" / "character01"
    (character / "._0001_01.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    from fedcomp.datasets import omniglot

    omniglot._load.cache_clear()
    assert torch.equal(load_omniglot(tmp_path, verify_md5=False).images, expected.images)
    next(iter(character.glob("0*.png"))).unlink()
    omniglot._load.cache_clear()
    with pytest.raises(ValueError, match=r"found \[2, 3\]: images_background/Latin/character01 has 2, most have 3$"):
        load_omniglot(tmp_path, verify_md5=False)


@pytest.mark.parametrize("damage", ["text", "cut"])
def test_an_unreadable_png_is_one_line_naming_it(tmp_path, damage):
    folder = write_omniglot(tmp_path, TINY, drawings=2, size=10)
    png = folder / "images_evaluation" / "Kannada" / "character02" / "0005_02.png"
    png.write_bytes(b"not a png" if damage == "text" else png.read_bytes()[:60])
    detail = "UnidentifiedImageError: cannot identify image file" if damage == "text" else "OSError: image file is truncated"
    with pytest.raises(ValueError) as raised:
        load_omniglot(tmp_path, verify_md5=False)
    assert str(raised.value).startswith(f"{png}: cannot be read ({detail}")  # PIL's own words may grow
    assert str(raised.value).endswith("); expected a PNG image (an Omniglot drawing)")
    assert not (folder / ".fedcomp-28px.pt").exists()
