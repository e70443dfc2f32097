"""Sweep specs: grids and their union, seeds, default metric direction, presets, and every bad input as one
line that names the field, the value and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fedcomp.platform
from fedcomp.platform.errors import ConfigError
from fedcomp.sweeps.spec import SweepSpec, load_spec, preset_names

BASE = {"base": "quickstart", "set": {"federation.backend": "local", "run.rounds": 2}}


def spec(**changes):
    return load_spec({**BASE, **changes})


def test_union_of_grids_and_seeds():
    s = spec(
        grid=[{"algorithm.name": ["fcsg"], "algorithm.lr": [0.1, 0.01]},
              {"algorithm.name": ["fcsg-m"], "algorithm.lr": [0.1], "algorithm.beta": [0.1, 0.9]}],
        seeds=3,
    )
    assert s.points() == [
        {"algorithm.name": "fcsg", "algorithm.lr": 0.1},
        {"algorithm.name": "fcsg", "algorithm.lr": 0.01},
        {"algorithm.name": "fcsg-m", "algorithm.lr": 0.1, "algorithm.beta": 0.1},
        {"algorithm.name": "fcsg-m", "algorithm.lr": 0.1, "algorithm.beta": 0.9},
    ]
    assert s.seed_values() == [0, 1, 2]
    assert s.axes() == ["algorithm.name", "algorithm.lr", "algorithm.beta", "run.seed"]
    trial = {"point": s.points()[3], "run.seed": 2}
    config = s.trial_config(trial)
    assert (config.algorithm_name, config.algorithm.beta, config.run.seed, config.run.rounds) == ("fcsg-m", 0.9, 2, 2)


def test_seeds_start_at_the_base_seed_and_optuna_repeats_map_to_them():
    s = spec(set={**BASE["set"], "run.seed": 7}, seeds=2, search="optuna", space={"algorithm.lr": {"loguniform": [1e-3, 1e-1]}})
    assert s.seed_values() == [7, 8]
    assert s.trial_config({"algorithm.lr": 0.02, "__trial_index__": 1}).run.seed == 8


def test_metric_defaults_to_task_headline_and_direction_from_its_name():
    assert spec().resolved_metric() == ("test_accuracy", "max")
    assert spec(metric="test_loss").resolved_metric() == ("test_loss", "min")
    assert spec(metric="test_loss", mode="max").resolved_metric() == ("test_loss", "max")
    assert load_spec({"base": "feddro-negative-result"}).resolved_metric() == ("grad_norm_sq", "min")  # task's mode


@pytest.mark.parametrize("name", preset_names())
def test_presets_validate(name):
    s = load_spec(name)
    assert s.points() and s.seeds >= 1


def test_paper_grid_preset_is_the_papers_grid():
    s = load_spec("fcsg-invariant-lr")
    assert len(s.points()) == 3 * 9 + 3 * 5 * 9
    assert {p["algorithm.lr"] for p in s.points()} == {0.01, 0.005, 0.001}
    assert {p.get("algorithm.beta") for p in s.points() if p["algorithm.name"] == "fcsg-m"} == {0.001, 0.01, 0.1, 0.5, 0.9}
    assert s.base_config().algorithm.local_steps == 50


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"grdi": {}}, "sweep key 'grdi' is unknown (did you mean 'grid'?); allowed: name, description, base"),
        ({"grid": []}, "grid = []: an empty list of grids has no points"),
        ({"grid": {"algorithm.lr": []}}, "grid axis algorithm.lr = []: must be a non-empty list of values"),
        ({"grid": {"algorithm.lr": 0.1}}, "grid axis algorithm.lr = 0.1: must be a non-empty list of values"),
        ({"grid": {"algorithm.lr,algorithm.lr": [[0.1, 0.2]]}}, "grid axis algorithm.lr,algorithm.lr: a joint axis names "
                                                               "each key once"),
        ({"grid": {"run.seed": [0, 1]}, "seeds": 3}, "grid axis run.seed with seeds = 3: seeds repeats every "
                                                     "configuration at run.seed, run.seed + 1, ...; give the seeds one way"),
        ({"grid": {"algorithm.momentum": [0.1]}}, "sweep point {'algorithm.momentum': 0.1}: algorithm.momentum: unknown key; allowed keys: name,"),
        ({"grid": {"optimiser.lr": [0.1]}}, "grid axis 'optimiser.lr': not of the form section.key"),
        ({"grid": {"algorithm.lr": [0.1, -1.0]}}, "sweep point {'algorithm.lr': -1.0}: algorithm.lr = -1.0:"),
        ({"grid": {"algorithm.name": ["fednest"]}}, "algorithm.name = 'fednest' needs a 'bilevel' problem"),
        ({"num_samples": -1}, "sweep num_samples = -1: Input should be greater than or equal to 1"),
        ({"num_samples": 4}, "num_samples = 4: a grid search tries every point once; repeat it with seeds"),
        ({"seeds": 0}, "sweep seeds = 0: Input should be greater than or equal to 1"),
        ({"search": "random"}, "sweep search = 'random': Input should be 'grid' or 'optuna'"),
        ({"search": "optuna", "grid": {"algorithm.lr": [0.1, 0.01]}},
         "search = 'optuna' cannot take grid axes (algorithm.lr): Optuna proposes every value itself"),
        ({"search": "optuna"}, "search = 'optuna' needs a `space:` with at least one axis"),
        ({"space": {"algorithm.lr": {"uniform": [0.1, 0.2]}}}, "space: (algorithm.lr) gives distributions for --search optuna"),
        ({"search": "optuna", "space": {"algorithm.lr": {"normal": [0, 1]}}}, "space algorithm.lr = {normal: [0, 1]}: must be one of"),
        ({"search": "optuna", "space": {"algorithm.lr": {"loguniform": [0, 1]}}}, "needs 0 < low < high"),
        ({"search": "optuna", "space": {"algorithm.lr": {"uniform": [1, 0.5]}}}, "needs low < high"),
        ({"search": "optuna", "space": {"algorithm.lr": {"uniform": [-1.0, 0.1]}}}, "sweep point {'algorithm.lr': -1.0}"),
        ({"metric": "auroc"}, "metric = 'auroc' is not reported by task 'invariant-logreg'; allowed: test_accuracy"),
        ({"panels": ["algorithm.lr"]}, "panels: 'algorithm.lr' is not an axis of this sweep"),
        ({"set": {"run.rounds": 0}}, "run.rounds = 0:"),
        ({"set": {"run.roundz": 3}}, "^run.roundz: unknown key (did you mean run.rounds?); allowed keys: seed,"),  # the set's, not a point's
        ({"set": {"rounds": 3}}, "set key 'rounds': not of the form section.key"),
        ({"base": "nosuch"}, "preset 'nosuch' is unknown; allowed:"),
    ],
)
def test_bad_specs_are_one_clear_line(changes, message):
    with pytest.raises(ConfigError) as info:
        spec(**changes)
    text = str(info.value)
    assert (text.startswith(message[1:]) if message.startswith("^") else message in text) and "\n" not in text


def test_unknown_sweep_preset_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"sweep 'nosuch' is unknown; allowed: .*quick"):
        load_spec("nosuch")
    with pytest.raises(ConfigError, match=r"sweep file .* does not exist"):
        load_spec(str(tmp_path / "missing.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_spec(str(tmp_path / "list.yaml"))


def test_joint_axis_sets_its_keys_together():
    s = spec(grid={"algorithm.name": ["fcsg"], "algorithm.local_steps,run.rounds": [[4, 8], [8, 4]]})
    assert s.points() == [
        {"algorithm.name": "fcsg", "algorithm.local_steps": 4, "run.rounds": 8},
        {"algorithm.name": "fcsg", "algorithm.local_steps": 8, "run.rounds": 4},
    ]
    assert s.axes() == ["algorithm.name", "algorithm.local_steps", "run.rounds", "run.seed"]
    with pytest.raises(ConfigError, match=r"grid axis algorithm.local_steps,run.rounds = \[\[4, 8\], \[8\]\]: a joint axis of 2 keys takes lists of 2 values"):
        spec(grid={"algorithm.local_steps,run.rounds": [[4, 8], [8]]})
    with pytest.raises(ConfigError, match=r"grid axis 'rounds': not of the form section.key"):
        spec(grid={"algorithm.local_steps,rounds": [[4, 8]]})


def test_the_readmes_sweep_files_are_valid_with_the_flags_it_shows_them_with(tmp_path, monkeypatch):
    """Each ``fedcomp sweep my-*.yaml ...`` line of the README, on the sweep file the README shows, parsed by the
    command line's own parser: every trial a valid run config."""
    import re
    import shlex
    from pathlib import Path

    from fedcomp.cli import _overrides, build_parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", readme, re.S):
        if block.startswith("# my-"):
            (tmp_path / block.split(":")[0][2:]).write_text(block)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-optuna.yaml", "my-sweep.yaml"]
    monkeypatch.chdir(tmp_path)
    lines = [line.split("#")[0] for line in readme.splitlines() if line.startswith("fedcomp sweep my-")]
    assert len(lines) == 3
    for line in lines:
        args = build_parser().parse_args(shlex.split(line)[1:])
        spec = load_spec(args.spec, search=args.search, num_samples=args.num_samples, seeds=args.seeds,
                         scheduler=args.scheduler, max_concurrent=args.max_concurrent, pack=args.pack,
                         set=_overrides(args.set))
        assert spec.points() or spec.search == "optuna", line


def test_a_sweep_files_base_is_the_run_file_beside_it_kept_absolute_and_its_first_comment_describes_it(tmp_path,
                                                                                                         monkeypatch):
    """As a config file's modules are found beside it: from any working directory the sweep file finds its base, and
    its folder's sweep.json names that file wherever a report or a resume runs; one written for the working directory
    it was started in still works there."""
    (tmp_path / "mine").mkdir()
    run = (Path(fedcomp.platform.__file__).parent / "presets" / "quickstart.yaml").read_text()
    (tmp_path / "mine" / "run.yaml").write_text(run.replace("rounds:", "rounds: 2 #", 1))
    (tmp_path / "mine" / "sweep.yaml").write_text("# my learning rates\nbase: run.yaml\ngrid: {algorithm.lr: [0.1]}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    beside = load_spec(tmp_path / "mine" / "sweep.yaml")
    assert beside.base == str(tmp_path / "mine" / "run.yaml")
    assert beside.description == "my learning rates" and beside.base_config().run.rounds == 2
    assert load_spec(beside.model_dump()) == beside  # as sweep.json gives it back, from anywhere

    (tmp_path / "mine" / "old.yaml").write_text("base: mine/run.yaml\n")  # written for the folder above
    monkeypatch.chdir(tmp_path)
    assert load_spec("mine/old.yaml").base == str(tmp_path / "mine" / "run.yaml")
    assert load_spec({"base": "mine/run.yaml"}).base == str(tmp_path / "mine" / "run.yaml")
    assert load_spec({"base": "quickstart"}).base == "quickstart"
    with pytest.raises(ConfigError, match=rf"config file '{tmp_path / 'mine' / 'gone.yaml'}' does not exist"):
        load_spec(_written(tmp_path / "mine" / "gone-base.yaml", "base: gone.yaml\n"))
    assert load_spec("quick").description.startswith("Small README sweep: FCSG vs FCSG-M")


def test_a_sweep_files_modules_in_set_grid_and_modules_are_the_files_beside_it(tmp_path, monkeypatch):
    """Two algorithms of the user's, each in its own file beside the sweep file, compared on a grid axis: from another
    working directory the sweep looked for them there ("no such file '/a.py'")."""
    example = (Path(__file__).resolve().parents[2] / "examples" / "extension.py").read_text()
    mine = tmp_path / "mine"
    mine.mkdir()
    for tag in ("a", "b"):
        (mine / f"algo_{tag}.py").write_text(example.replace('"least-squares"', f'"least-squares-{tag}"')
                                            .replace('"fedavg-hb"', f'"fedavg-hb-{tag}"'))
    (mine / "sweep.yaml").write_text(
        "base: {task: {name: least-squares-a, module: algo_a.py, dim: 10, rows: 200}}\n"
        "modules: [algo_b.py]\n"
        "set: {algorithm.module: algo_a.py, algorithm.name: fedavg-hb-a, federation.backend: local}\n"
        "grid:\n"
        "  - {algorithm.name: [fedavg-hb-a], algorithm.module: [algo_a.py], algorithm.lr: [0.01]}\n"
        "  - {algorithm.name: [fedavg-hb-b], algorithm.module: [algo_b.py], algorithm.lr: [0.01]}\n")
    monkeypatch.chdir(tmp_path)
    spec = load_spec(mine / "sweep.yaml")
    assert spec.set["algorithm.module"] == str(mine / "algo_a.py") and spec.modules[0] == str(mine / "algo_b.py")
    assert spec.base["task"]["module"] == str(mine / "algo_a.py")
    assert [spec.trial_config(point).algorithm_name for point in spec.points()] == ["fedavg-hb-a", "fedavg-hb-b"]
    assert {p["algorithm.module"] for p in spec.points()} == {str(mine / "algo_a.py"), str(mine / "algo_b.py")}
    assert load_spec(spec.model_dump()) == spec  # as sweep.json gives it back, from anywhere


def _written(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("raw", [
    {"base": "quickstart", "search": "optuna", "space": {"algorithm.lr": {"loguniform": [0.001, 0.1]}}},
    {"base": "quickstart"},  # no grid: one trial of the base
    {"base": "quickstart", "grid": {"algorithm.lr": [0.1, 0.01]}, "seeds": 2},
], ids=["optuna", "no-grid", "grid"])
def test_a_spec_read_back_from_its_json_is_the_same_sweep(raw):
    """What a trial and a resume do (a grid-less spec failed there once: its unset grid came back as the [] the grid
    validator refuses)."""
    spec = load_spec(raw)
    again = SweepSpec.model_validate_json(spec.model_dump_json())  # as trial_process and stored_spec read it
    assert again.points() == spec.points() and again.space == spec.space and again.seeds == spec.seeds
    # a resume validates the stored spec (sweep.json) and hands its dump to the trials: it failed every trial of a
    # grid-less sweep, whose grid {} the validation made into the [] it refuses
    resumed = SweepSpec.model_validate(json.loads(again.model_dump_json()))
    assert SweepSpec.model_validate_json(resumed.model_dump_json()).points() == spec.points()
