"""Real Omniglot offline: the two small background subsets shipped in the package load straight out of their
zips (242 distinct characters x 20 drawers, Greek and Latin read once), split by alphabet, and drive the
omniglot task and its offline presets."""

from __future__ import annotations

import io
import shutil
import zipfile
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

import fedcomp
from fedcomp.datasets.omniglot import to_28px
from fedcomp.datasets.omniglot_small import (
    SMALL_ALPHABETS,
    SMALL_SPLIT,
    SMALL_ZIPS,
    load_omniglot_small,
    shipped_root,
    small_split,
)
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import build_task
from fedcomp.platform.rng import generator


def _zip_pngs(name: str) -> dict[str, bytes]:
    """'<Alphabet>/<characterNN>/<file>' -> PNG bytes of one shipped zip."""
    with zipfile.ZipFile(shipped_root() / name) as archive:
        return {"/".join(i.filename.split("/")[1:]): archive.read(i) for i in archive.infolist() if i.filename.endswith(".png")}


def test_shipped_zips_and_licence_are_in_the_package():
    root = shipped_root()
    assert sorted(p.name for p in root.iterdir() if p.suffix == ".zip") == sorted(SMALL_ZIPS)
    assert "MIT License" in (root / "LICENSE").read_text() and "Brenden Lake" in (root / "LICENSE").read_text()


def test_loader_reads_242_characters_of_20_drawings_with_greek_and_latin_once():
    data = load_omniglot_small()
    assert data.images.shape == (242, 20, 28, 28) and data.images.dtype == torch.uint8
    assert data.characters == sorted(set(data.characters))
    assert Counter(c.split("/")[1] for c in data.characters) == SMALL_ALPHABETS
    assert all(c.startswith("images_background/") for c in data.characters)  # the full set's names
    first, second = _zip_pngs("images_background_small1.zip"), _zip_pngs("images_background_small2.zip")
    shared = first.keys() & second.keys()
    assert {k.split("/")[0] for k in shared} == {"Greek", "Latin"} and all(first[k] == second[k] for k in shared)
    assert len(first) + len(second) - len(shared) == data.images[:, :, 0, 0].numel()  # 5,840 files, 4,840 drawings
    # a drawing: a 105 x 105 PNG in the zip, 28 x 28 with bright strokes in the pool
    character = data.characters.index("images_background/Latin/character01")
    key = min(k for k in first if k.startswith("Latin/character01/"))
    with Image.open(io.BytesIO(first[key])) as image:
        assert image.size == (105, 105)
        expected = np.asarray(to_28px(image), dtype=np.uint8)
    assert torch.equal(data.images[character, 0], torch.from_numpy(expected.copy()))
    assert data.images.float().mean() < 64  # mostly background, which inversion makes dark


def test_alphabet_split_is_fixed_disjoint_and_complete():
    characters = load_omniglot_small().characters
    parts = {s: small_split(characters, s) for s in ("train", "val", "test")}
    assert [len(parts[s]) for s in ("train", "val", "test")] == [163, 22, 57]
    assert sorted(i for idx in parts.values() for i in idx) == list(range(242))
    alphabets = {s: {characters[i].split("/")[1] for i in idx} for s, idx in parts.items()}
    assert alphabets["test"] == set(SMALL_SPLIT["test"]) and alphabets["val"] == set(SMALL_SPLIT["val"])
    assert not alphabets["train"] & (alphabets["test"] | alphabets["val"])
    assert small_split(list(reversed(characters)), "test") == [241 - i for i in reversed(parts["test"])]
    with pytest.raises(ValueError, match="split = 'dev'"):
        small_split(characters, "dev")


def test_missing_corrupt_and_altered_zips_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"images_background_small1\.zip: no such file") as error:
        load_omniglot_small(tmp_path)
    assert "\n" not in str(error.value)
    for name in SMALL_ZIPS:
        shutil.copy(shipped_root() / name, tmp_path / name)
    (tmp_path / "images_background_small2.zip").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ValueError, match=r"md5 \w+ is not the published b75a71a5"):
        load_omniglot_small(tmp_path)
    with pytest.raises(ValueError, match=r"images_background_small2\.zip: not a readable zip file"):
        load_omniglot_small(tmp_path, verify_md5=False)
    # a second zip whose copy of a shared character differs from the first zip's
    with zipfile.ZipFile(tmp_path / "images_background_small2.zip", "w") as archive:
        blank = io.BytesIO()
        Image.new("1", (105, 105), 1).save(blank, format="PNG")
        archive.writestr("images_background_small2/Greek/character01/0394_01.png", blank.getvalue())
    with pytest.raises(ValueError, match=r"Greek/character01/0394_01\.png differs from the copy in the other zip"):
        load_omniglot_small(tmp_path, verify_md5=False)


def small_task(**overrides):
    base = {"task.name": "omniglot", "task.source": "omniglot-small", "task.eval_tasks": 4,
            "algorithm.name": "fcsg-m", "algorithm.first_batch": 1, "algorithm.outer_batch": 1,
            "algorithm.inner_batch": 5, "algorithm.local_steps": 1, "federation.clients": 2,
            "federation.backend": "local", "run.rounds": 1, "run.eval_every": 1, "run.progress": "none",
            "run.track": "none"}
    return load_config("quickstart", {**base, **overrides})


def test_task_builds_rotated_classes_and_episodes_from_the_split():
    task = build_task(small_task(**{"federation.clients": 16}))
    characters = load_omniglot_small().characters
    assert len(task.train_classes) == 163 * 4 and len(task.eval_classes) == 57 * 4  # rotations as classes
    train_chars = {c // 4 for c in task.train_classes}
    assert train_chars == set(small_split(characters, "train")) and not train_chars & {c // 4 for c in task.eval_classes}
    owned = [set(classes) for classes, _ in task._shares]
    assert all(not (a & b) for i, a in enumerate(owned) for b in owned[i + 1:]) and set().union(*owned) == set(task.train_classes)
    episodes = task.episodes(3, 2, generator(0, "e"))
    assert episodes.support_x.shape == (2, 5, 1, 28, 28) and episodes.query_x.shape == (2, 75, 1, 28, 28)
    assert torch.equal(episodes.query_y[0], torch.arange(5).repeat_interleave(15))
    assert episodes.support_x.max() <= 1.0 and episodes.support_x.max() > 0.9  # real strokes, scaled to [0, 1]
    val = build_task(small_task(**{"task.eval_split": "val", "task.shots": 5, "algorithm.inner_batch": 25}))
    assert len(val.eval_classes) == 22 * 4 and val.eval_episodes().support_x.shape == (4, 25, 1, 28, 28)


def test_short_training_run_on_real_omniglot_offline(tmp_path):
    result = fedcomp.run(small_task(**{"run.out": str(tmp_path), "run.rounds": 2}))
    assert result.metrics["round"].tolist() == [0, 1, 2]
    accuracy = result.metrics["test_accuracy"]
    assert accuracy.between(0.0, 1.0).all() and np.isfinite(result.metrics["train_loss"].iloc[1:]).all()
    assert result.config.task.source == "omniglot-small"


def test_a_missing_root_for_the_small_set_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"task.root = '.*': .*images_background_small1.zip: no such file"):
        build_task(small_task(**{"task.root": str(tmp_path)}))


@pytest.mark.parametrize("shots", [1, 5])
def test_offline_presets_keep_the_paper_protocol(shots):
    config = load_config(f"maml-omniglot-small-{shots}shot")
    task, algorithm = config.task, config.algorithm
    assert (task.source, task.root, task.shots, task.ways, task.queries, task.adapt_lr) == ("omniglot-small", None, shots, 5, 15, 0.4)
    assert (task.adapt_steps, task.eval_steps, task.rotations, task.client_split) == (1, 3, True, "classes")
    assert (config.federation.clients, algorithm.local_steps, algorithm.outer_batch, algorithm.inner_batch) == (16, 10, 5, 5 * shots)
    full = load_config(f"maml-omniglot-{shots}shot")
    assert full.task.source == "omniglot"  # the paper presets still read the full set from the data root


def test_a_missing_data_root_names_the_source_not_an_unset_root(tmp_path, monkeypatch):
    """With ``task.root`` unset the data root is ``$FEDCOMP_DATA``: the line named "task.root = None"."""
    monkeypatch.setenv("FEDCOMP_DATA", str(tmp_path))
    config = small_task(**{"task.source": "omniglot"})
    with pytest.raises(ConfigError, match=rf"^task.source = 'omniglot': Omniglot not found: {tmp_path}/omniglot-py "):
        build_task(config)
