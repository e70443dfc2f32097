"""Adult: UCI text files through the real parser, one-hot width, label parsing, groups, split direction."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from fedcomp.datasets.adult import (
    CATEGORIES,
    COLUMNS,
    GROUPS,
    fake_adult_rows,
    feature_names,
    load_adult,
    write_adult,
)

ROW = (
    39, "State-gov", 77516, "Bachelors", 13, "Never-married", "Adm-clerical", "Not-in-family", "White", "Male",
    2174, 0, 40, "United-States", "<=50K",
)  # fmt: skip


FAKE_ROWS = fake_adult_rows(60, 0), fake_adult_rows(40, 1)


@pytest.fixture
def fake_root(tmp_path):
    write_adult(tmp_path, *FAKE_ROWS)
    return tmp_path


def test_vocabulary_and_feature_width():
    sizes = {c: len(v) for c, v in CATEGORIES.items()}
    assert sizes == {
        "workclass": 9, "education": 16, "marital_status": 7, "occupation": 15, "relationship": 6,
        "race": 5, "gender": 2, "native_country": 42,
    }  # fmt: skip
    # 102 one-hots - race_White - race_Black + 5 continuous x 4 buckets + 3 proxies
    assert len(feature_names()) == 123 and len(feature_names(False)) == 120
    assert len(set(feature_names())) == 123
    assert "race_White" not in feature_names() and "race_Other" in feature_names()
    assert feature_names()[-3:] == ("proxy_White", "proxy_Black", "proxy_Other")


def test_written_files_have_the_uci_format(fake_root):
    data = (fake_root / "adult" / "adult.data").read_text().splitlines()
    test = (fake_root / "adult" / "adult.test").read_text().splitlines()
    assert test[0] == "|1x3 Cross validator" and data[-1] == "" and test[-1] == ""
    assert all(line.endswith(("<=50K.", ">50K.")) for line in test[1:-1])
    assert all(line.endswith(("<=50K", ">50K")) for line in data[:-1])
    assert data[0].count(", ") == 14


def test_loads_pooled_rows_split_twenty_eighty(fake_root):
    adult = load_adult(fake_root)
    assert adult.train.features.shape == (20, 123) and adult.test.features.shape == (80, 123)
    assert adult.feature_names == feature_names()
    for part in (adult.train, adult.test):
        assert part.features.dtype == torch.float32 and set(part.features.unique().tolist()) <= {0.0, 1.0}
        assert part.labels.dtype == torch.int64 and part.groups.dtype == torch.int64
        assert part.proxy_groups.dtype == torch.int64


def test_labels_groups_and_one_hots_follow_the_rows(tmp_path):
    rows = [
        ROW,
        (52, "Self-emp-inc", 287927, "HS-grad", 9, "Married-civ-spouse", "Exec-managerial", "Wife", "Black",
         "Female", 15024, 0, 40, "?", ">50K"),
        (17, "?", 304873, "10th", 6, "Never-married", "?", "Own-child", "Asian-Pac-Islander", "Female", 0, 0, 20,
         "Philippines", "<=50K"),
        (90, "Private", 51744, "Masters", 14, "Widowed", "Sales", "Unmarried", "Other", "Male", 0, 4356, 99, "Hong",
         ">50K"),
    ]  # fmt: skip
    test_rows = [ROW[:-1] + (">50K",), rows[2][:-1] + ("<=50K",)]
    write_adult(tmp_path, rows, test_rows)
    adult = load_adult(tmp_path, train_fraction=0.5, noise_level=0.0)
    perm = np.random.RandomState(12345).permutation(6)
    everything = torch.cat([adult.train.labels, adult.test.labels])
    pooled_labels = torch.tensor([0, 1, 0, 1, 1, 0])  # adult.test labels carry a period: ">50K." -> 1
    assert torch.equal(everything, pooled_labels[perm])
    groups = torch.cat([adult.train.groups, adult.test.groups])
    assert torch.equal(groups, torch.tensor([0, 1, 2, 2, 0, 2])[perm])
    assert torch.equal(groups, torch.cat([adult.train.proxy_groups, adult.test.proxy_groups]))  # no noise
    features = torch.cat([adult.train.features, adult.test.features])[np.argsort(perm)]
    names = adult.feature_names
    on = {names[j] for j in torch.nonzero(features[1]).flatten().tolist()}
    assert on == {
        "workclass_Self-emp-inc", "education_HS-grad", "marital_status_Married-civ-spouse",
        "occupation_Exec-managerial", "relationship_Wife", "gender_Female", "native_country_?",
        "age_2", "capital_gain_3", "capital_loss_0", "hours_per_week_1", "education_num_1", "proxy_Black",
    }  # fmt: skip  (race_Black is not a feature; age 52 lies between the 50 % and 75 % quartiles of 17/39/52/90)
    assert "race_Asian-Pac-Islander" in {names[j] for j in torch.nonzero(features[2]).flatten().tolist()}


def test_clean_and_code_variants_differ_only_at_the_outer_bucket_edges(tmp_path):
    rows = [ROW[:0] + (age,) + ROW[1:] for age in (17, 30, 40, 50, 90)]
    write_adult(tmp_path, rows, [ROW])
    clean = load_adult(tmp_path, noise_level=0.0, train_fraction=0.5)
    code = load_adult(tmp_path, noise_level=0.0, train_fraction=0.5, variant="code")
    age_cols = [i for i, n in enumerate(clean.feature_names) if n.startswith("age_")]
    x_clean = torch.cat([clean.train.features, clean.test.features])[:, age_cols]
    x_code = torch.cat([code.train.features, code.test.features])[:, age_cols]
    assert torch.equal(x_clean.sum(1), torch.ones(6))
    # the youngest adult.data age sits on the lowest edge: pandas.cut puts it in no bucket
    assert sorted(x_code.sum(1).tolist()) == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_proxy_noise_moves_the_documented_number_of_rows_and_is_seeded(fake_root):
    a = load_adult(fake_root, noise_level=0.3, proxy_seed=1)
    b = load_adult(fake_root, noise_level=0.3, proxy_seed=1)
    c = load_adult(fake_root, noise_level=0.3, proxy_seed=2)
    moved = lambda d: int(sum((p.groups != p.proxy_groups).sum() for p in (d.train, d.test)))  # noqa: E731
    assert moved(a) == int(0.3 * 100) == moved(c)
    assert torch.equal(a.train.proxy_groups, b.train.proxy_groups) and torch.equal(a.train.features, b.train.features)
    proxies = lambda d: torch.cat([d.train.proxy_groups, d.test.proxy_groups])  # noqa: E731
    assert not torch.equal(proxies(a), proxies(c))
    proxy_cols = a.train.features[:, -3:]
    assert torch.equal(proxy_cols.argmax(1), a.train.proxy_groups) and torch.equal(proxy_cols.sum(1), torch.ones(20))
    assert load_adult(fake_root, proxies_in_features=False).train.features.shape == (20, 120)


def test_split_is_gcivrs_seeded_permutation_of_the_pooled_rows(fake_root):
    adult = load_adult(fake_root, noise_level=0.0)
    pooled = [*FAKE_ROWS[0], *FAKE_ROWS[1]]  # adult.data rows first
    labels = torch.tensor([int(r[-1] == ">50K") for r in pooled])
    ages = torch.tensor([r[0] for r in pooled])
    perm = torch.from_numpy(np.random.RandomState(12345).permutation(100))  # GCIVR: np.random.seed(12345)
    assert torch.equal(adult.train.labels, labels[perm[:20]]) and torch.equal(adult.test.labels, labels[perm[20:]])
    oldest = adult.feature_names.index("age_3")
    third_quartile = np.quantile([r[0] for r in FAKE_ROWS[0]], 0.75)  # fitted on adult.data only
    assert torch.equal(adult.train.features[:, oldest] == 1, ages[perm[:20]] > third_quartile)


def test_missing_files_and_bad_lines_are_one_line_errors(tmp_path, fake_root):
    with pytest.raises(FileNotFoundError) as info:
        load_adult(tmp_path / "nowhere")
    assert "\n" not in str(info.value) and "adult.data, adult.test" in str(info.value)
    (fake_root / "adult" / "adult.test").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing: adult\.test"):
        load_adult(fake_root)
    bad = tmp_path / "bad"
    write_adult(bad, [ROW], [ROW])
    path = bad / "adult" / "adult.data"
    path.write_text(path.read_text().replace("<=50K", "<=50k"))
    with pytest.raises(ValueError, match=r"adult.data line 1: income '<=50k'"):
        load_adult(bad)
    path.write_text(path.read_text().replace("<=50k", "<=50K").replace("State-gov", "Space-gov"))
    with pytest.raises(ValueError, match="workclass 'Space-gov' is not in the UCI vocabulary"):
        load_adult(bad)
    path.write_text("39, State-gov\n")
    with pytest.raises(ValueError, match="2 comma-separated fields; expected 15"):
        load_adult(bad)
    test = bad / "adult" / "adult.test"
    write_adult(bad, [ROW], [ROW])
    for content, said in (("", "is empty (0 bytes)"), ("|1x3 Cross validator\n\n", "holds no data rows")):
        test.write_text(content)  # accepted before: the pool was adult.data's rows alone, no longer GCIVR's
        with pytest.raises(ValueError, match=rf"^{test}: {re.escape(said)}; expected lines of 15 comma-separated"):
            load_adult(bad)
    with pytest.raises(ValueError, match="train_fraction = 1"):
        load_adult(fake_root, train_fraction=1)
    with pytest.raises(ValueError, match="variant = 'pandas'"):
        load_adult(fake_root, variant="pandas")


def test_fake_rows_are_deterministic_and_valid():
    rows = fake_adult_rows(30, 7)
    assert rows == fake_adult_rows(30, 7) and rows != fake_adult_rows(30, 8)
    assert all(len(r) == len(COLUMNS) for r in rows)
    assert {r[8] for r in fake_adult_rows(200, 0)} >= {"White", "Black"} and len(GROUPS) == 3
