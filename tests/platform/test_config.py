"""Config loading, overrides and every bad input the issue lists: one line naming field, value, allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedcomp.platform import catalog, environment
from fedcomp.platform.config import _preset, load_config, parse_value, preset_names
from fedcomp.platform.errors import ConfigError


def test_quickstart_preset_loads_with_paper_defaults():
    config = load_config("quickstart")
    assert config.task_name == "invariant-logreg"
    assert config.algorithm_name == "fcsg-m"
    assert config.algorithm.local_steps == 50
    assert config.federation.backend == "ray"
    assert "quickstart" in preset_names()


def test_overrides_are_typed_and_round_trip():
    config = load_config("quickstart", {"algorithm.lr": parse_value("0.005"), "run__seed": 3})
    assert config.algorithm.lr == 0.005 and config.run.seed == 3
    again = load_config(config.to_dict())
    assert again == config
    assert config.replace(**{"algorithm.inner_batch": 100}).algorithm.inner_batch == 100


def test_a_preset_is_read_once_and_no_run_changes_it_for_the_next():
    first = load_config("quickstart", {"algorithm.lr": 0.5, "federation.clients": 8, "run.rounds": 3})
    assert (first.algorithm.lr, first.federation.clients, first.run.rounds) == (0.5, 8, 3)
    again = load_config("quickstart")
    assert (again.algorithm.lr, again.federation.clients, again.run.rounds) == (0.01, 16, 40)
    assert _preset.cache_info().hits >= 1


def test_parse_value_types():
    assert parse_value("0.01") == 0.01 and parse_value("true") is True and parse_value("10") == 10
    assert parse_value("ray") == "ray"


@pytest.mark.parametrize(
    "source, overrides, needle",
    [
        ("no-such-preset", {}, "preset 'no-such-preset' is unknown; allowed: "),
        ("quickstart", {"algorithm.lrr": 0.1}, "algorithm.lrr: unknown key (did you mean algorithm.lr?); allowed keys: name, lr,"),
        ("quickstart", {"federation.clientz": 3}, "federation.clientz: unknown key"),
        ("quickstart", {"bogus.key": 1}, "override 'bogus.key' is not of the form section.key"),
        ("quickstart", {"algorithm.lr": "fast"}, "algorithm.lr = 'fast': Input should be a valid number"),
        ("quickstart", {"algorithm.lr": 0}, "algorithm.lr = 0: Input should be greater than 0"),
        ("quickstart", {"algorithm.lr": -0.1}, "algorithm.lr = -0.1: Input should be greater than 0"),
        ("quickstart", {"algorithm.beta": 0}, "algorithm.beta = 0: Input should be greater than 0"),
        ("quickstart", {"algorithm.beta": 1.5}, "algorithm.beta = 1.5: Input should be less than or equal to 1"),
        ("quickstart", {"algorithm.inner_batch": 0}, "algorithm.inner_batch = 0: Input should be greater than or equal to 1"),
        ("quickstart", {"algorithm.local_steps": 2.5}, "algorithm.local_steps = 2.5: Input should be a valid integer"),
        ("quickstart", {"federation.clients_per_round": 17}, "federation.clients_per_round = 17: must be <= federation.clients (16)"),
        ("quickstart", {"federation.backend": "mpi"}, "federation.backend = 'mpi': Input should be 'ray' or 'local'"),
        ("quickstart", {"federation.gpus_per_client": -1}, "federation.gpus_per_client = -1.0: must be 'auto' or a number >= 0"),
        ("quickstart", {"run.rounds": 0}, "run.rounds = 0: Input should be greater than or equal to 1"),
        ("quickstart", {"algorithm.name": "sgd2"}, "algorithm.name = 'sgd2' is unknown; allowed: acc-fcsg-m, coda, coda-plus, fcsg, fcsg-m, fedadam, fedavg"),
        ("quickstart", {"task.name": "mnist9"}, "task.name = 'mnist9' is unknown; allowed: "),
        ("quickstart", {"task.noise_ratio": -2}, "task.noise_ratio = -2: Input should be greater than 0"),
        ("quickstart", {"task.objective": "mine"}, "task.objective = 'mine': Input should be 'paper' or 'official-code'"),
        (
            {"task": {"name": "synthetic-classification", "noise_ratio": 2}, "algorithm": {"name": "fedavg"}},
            {},
            "task.noise_ratio: unknown key; allowed keys: name, features, classes",
        ),
    ],
)
def test_bad_input_is_one_clear_line(source, overrides, needle):
    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_algorithm_whose_kind_the_task_lacks():
    raw = load_config("quickstart").to_dict()
    raw["task"] = {"name": "synthetic-classification"}
    plain = sorted(name for name, algorithm in catalog.algorithms().items() if algorithm.kind == "plain")
    assert plain[:2] == ["fedadam", "fedavg"]  # and whatever this process registered besides (other tests, examples)
    with pytest.raises(ConfigError) as refused:
        load_config(raw)
    assert str(refused.value) == (f"algorithm.name = 'fcsg-m' needs a 'conditional' problem but task "
                                  f"'synthetic-classification' offers plain; algorithms that run on it: {', '.join(plain)}")


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))


def test_user_yaml_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("task: {name: invariant-logreg, noise_ratio: 1.5}\nalgorithm: {name: fcsg, lr: 0.005}\n")
    config = load_config(str(path), {"run.rounds": 7})
    assert config.task.noise_ratio == 1.5 and config.algorithm.lr == 0.005 and config.run.rounds == 7
    assert config.federation.clients == 16  # schema default


def test_switching_algorithm_drops_only_the_presets_keys():
    config = load_config("quickstart", {"algorithm.name": "fcsg"})  # the preset's beta belongs to fcsg-m
    assert config.algorithm_name == "fcsg" and not hasattr(config.algorithm, "beta")
    with pytest.raises(ConfigError, match=r"algorithm\.beta: unknown key"):
        load_config("quickstart", {"algorithm.name": "fcsg", "algorithm.beta": 0.5})


def test_torch_compile_on_a_torch_before_2_7_is_refused_in_one_line(monkeypatch):
    """``federation.torch_compile`` needs torch 2.7 (:data:`~fedcomp.platform.config.TORCH_COMPILE_SINCE`)."""
    monkeypatch.setattr(environment, "torch_release", lambda: (2, 6))
    monkeypatch.setattr(environment, "torch_build", lambda: "2.6.0+cpu")
    with pytest.raises(ConfigError) as refused:
        load_config("quickstart", {"federation.torch_compile": True})
    assert str(refused.value) == ("federation.torch_compile = true: needs torch 2.7 or later, whose compiler takes every "
                                  "algorithm's oracles; this is torch 2.6.0+cpu")
    assert load_config("quickstart").federation.torch_compile is False  # the rest of the platform runs there
    monkeypatch.setattr(environment, "torch_release", lambda: (2, 7))
    assert load_config("quickstart", {"federation.torch_compile": True}).federation.torch_compile is True


def test_torch_release_is_the_installed_torchs():
    assert environment.torch_release() == tuple(int(part) for part in torch.__version__.split(".")[:2])


@pytest.mark.parametrize("preset", ["auc-table1", "feddro-cifar10-st", "maml-omniglot-1shot", "fednest-hr",
                                    "feddro-adult"])
def test_a_data_root_is_kept_absolute_and_every_task_reading_files_takes_one(preset, tmp_path, monkeypatch):
    """``task.root=../data`` went into run.json as typed, so a verify or resume from another folder looked elsewhere;
    hyper-representation, loss-tuning and adult-fairness read $FEDCOMP_DATA only (task.root was an unknown key)."""
    monkeypatch.chdir(tmp_path)
    config = load_config(preset, {"task.root": "data"})
    assert config.task.root == str(tmp_path / "data")
    assert load_config(preset, {"task.root": "~/data"}).task.root == str(Path("~/data").expanduser())
    assert load_config(config.to_dict()).task.root == str(tmp_path / "data")  # as run.json gives it back
    assert load_config(preset).task.root is None  # $FEDCOMP_DATA or the cache, decided where the data is read
