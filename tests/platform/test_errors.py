"""How fedcomp's messages name what to do next: as the ``fedcomp`` command line does inside the command, as Python
does from the API -- and an empty results folder is a fedcomp error that is still a ``FileNotFoundError``."""

from __future__ import annotations

import shlex

import pytest

import fedcomp
from fedcomp.cli import main
from fedcomp.platform.errors import NoResults, PlatformError, command_line, did_you_mean, nearest, resuming, to_continue


def test_how_to_continue_is_said_in_the_language_of_the_caller(tmp_path):
    folder = tmp_path / "a run"
    assert to_continue("run", folder) == f"fedcomp.resume({str(folder)!r})"
    assert to_continue("sweep", folder) == f"fedcomp.resume_sweep({str(folder)!r})"
    assert resuming("run", folder) == f"fedcomp.resume({str(folder)!r})"
    with command_line():
        assert shlex.split(to_continue("run", folder)) == ["fedcomp", "run", "--resume", str(folder)]
        assert shlex.split(to_continue("sweep", folder)) == ["fedcomp", "sweep", "--resume", str(folder)]
        assert resuming("sweep", folder) == f"--resume {str(folder)!r}"
        with command_line():
            pass
        assert to_continue("run", folder).startswith("fedcomp run")  # nested: still the command's
    assert to_continue("run", folder).startswith("fedcomp.resume(")  # and Python's again once it ends


def test_a_folder_to_resume_is_named_as_the_caller_gave_it(tmp_path, capsys):
    missing = tmp_path / "nothing"
    with pytest.raises(PlatformError, match=rf"^fedcomp.resume\({str(missing)!r}\): no run.json there; not a fedcomp run"):
        fedcomp.resume(missing)
    assert main(["run", "--resume", str(missing)]) == 2
    assert capsys.readouterr().err == f"fedcomp: error: --resume {str(missing)!r}: no run.json there; not a fedcomp run folder\n"


def test_no_results_is_a_platform_error_and_still_a_file_not_found_error(tmp_path):
    with pytest.raises(NoResults, match=r"^no fedcomp run results under") as raised:
        fedcomp.load_results(tmp_path)
    assert isinstance(raised.value, PlatformError) and isinstance(raised.value, FileNotFoundError)
    assert raised.value.exit_code == 2
    assert fedcomp.NoResults is NoResults


@pytest.mark.parametrize(("call", "message"), [
    (lambda: fedcomp.load_results(None), r"^path = None: must be a folder's path"),
    (lambda: fedcomp.load_sweep(3), r"^path = 3: must be a folder's path"),
    (lambda: fedcomp.resume_sweep(None), r"^path = None: must be a folder's path"),
    (lambda: fedcomp.verify(None), r"^run_dir = None: must be a folder's path"),
    (lambda: fedcomp.verify(".", out=7), r"^out = 7: must be a folder's path"),
    (lambda: fedcomp.run("quickstart", {1: 2}), r"^overrides key 1: must be a 'section.key' string"),
    (lambda: fedcomp.resume(".", ["a"]), r"^overrides = \['a'\]: must be a mapping of 'section.key' to values"),
    (lambda: fedcomp.sweep("quick", overrides=["a"]), r"^overrides = \['a'\]: must be a mapping"),
    (lambda: fedcomp.sweep("quick", ray_address=5), r"^ray_address = 5: must be an address"),
    (lambda: fedcomp.sweep("quick", verbose=9), r"^verbose = 9: allowed 0, 1, 2$"),
    (lambda: fedcomp.sweep("quick", seeds=True), r"^sweep seeds = True: a boolean where a number or a word is wanted"),
    (lambda: fedcomp.check("quickstart", ray="no"), r"^ray = 'no': must be True or False$"),
], ids=["load_results", "load_sweep", "resume_sweep", "verify", "verify-out", "run-key", "resume-overrides",
        "sweep-overrides", "sweep-address", "sweep-verbose", "sweep-seeds", "check-ray"])
def test_the_python_apis_wrong_arguments_are_one_line_before_any_work(call, message):
    """They were AttributeErrors and TypeErrors from deep inside, or taken (seeds=True ran one seed)."""
    with pytest.raises(PlatformError, match=message):
        call()


def test_paths_may_be_pathlib_paths_wherever_a_path_is_wanted(tmp_path):
    from pathlib import Path

    from fedcomp.platform.config import load_config

    examples = Path(__file__).resolve().parents[2] / "examples"
    config = load_config(examples / "extension.yaml", {"algorithm.module": examples / "extension.py",
                                                       "run.out": tmp_path})
    assert config.algorithm_name == "fedavg-hb" and config.run.out == str(tmp_path)
    rooted = load_config("auc-table1", {"task.root": tmp_path})
    assert rooted.task.root == str(tmp_path)


def test_an_errors_first_line_is_cut_after_a_whole_word():
    from fedcomp.platform.errors import first_line

    reason = RuntimeError("The actor died because its node died. " * 8 + "\nsecond line")
    cut = first_line(reason, 60)
    assert cut == "The actor died because its node died. The actor died ..." and len(cut) <= 60
    assert first_line(RuntimeError("short\nmore")) == "short" and first_line(RuntimeError()) == "RuntimeError"
    assert first_line(RuntimeError("x" * 300), 50) == "x" * 46 + " ..."  # no space to cut at: still 50 at most


def test_a_long_text_is_shortened_after_a_whole_word_and_a_short_one_kept():
    from fedcomp.platform.errors import shortened

    line = "cifar10 not found: extract the python-version archive into the data root"
    assert shortened(line, len(line)) == line
    assert shortened(line, 70) == "cifar10 not found: extract the python-version archive into the ..."
    assert all(len(shortened(line, n)) <= n for n in range(8, len(line) + 1))


@pytest.mark.parametrize(("word", "choices", "near"), [
    ("quikstart", ["quick", "quickstart"], "quickstart"),
    ("round", ["seed", "rounds", "out"], "rounds"),
    ("grdi", ["grid", "space"], "grid"),
    ("noise_ratio", ["separation", "features"], None),  # shares "ratio", no typo of it
    ("zzz", ["lr", "beta"], None),
    (["fcsg"], ["fcsg"], None),  # not a word
])
def test_a_suggestion_is_the_nearest_choice_of_a_typo_and_none_otherwise(word, choices, near):
    assert nearest(word, choices) == near
    assert did_you_mean(word, choices) == (f" (did you mean {near!r}?)" if near else "")
