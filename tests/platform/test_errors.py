"""How fedcomp's messages name what to do next: as the ``fedcomp`` command line does inside the command, as Python
does from the API -- and an empty results folder is a fedcomp error that is still a ``FileNotFoundError``."""

from __future__ import annotations

import shlex

import pytest

import fedcomp
from fedcomp.cli import main
from fedcomp.platform.errors import NoResults, PlatformError, command_line, resuming, to_continue


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
