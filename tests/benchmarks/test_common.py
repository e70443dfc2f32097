"""``benchmarks/common.py``: what the scripts under benchmarks/ share (report files, revision, mean ± std)."""

from __future__ import annotations

import pandas as pd

import common


def test_rewriting_results_keeps_sections_other_scripts_published(tmp_path):
    results = tmp_path / "RESULTS.md"
    common.write_report(results, "# peers, first run")
    results.write_text(results.read_text() + f"\n{common.SECTION_MARK}vectorised.py -->\n## Vectorised\n| table |\n")
    common.write_report(results, "# peers, second run")
    text = results.read_text()
    assert text.startswith("# peers, second run") and "first run" not in text
    assert text.endswith(f"{common.SECTION_MARK}vectorised.py -->\n## Vectorised\n| table |\n")


def test_a_published_section_is_replaced_in_place_and_the_rest_is_kept(tmp_path):
    report = tmp_path / "REPORT.md"
    common.put_section(report, "b.py", "## B\nfirst\n")  # no report yet: the section alone
    assert report.read_text() == f"\n\n{common.section_mark('b.py')}\n## B\nfirst\n"
    common.write_report(report, "# owner\n")
    common.put_section(report, "c.py", "## C\n")
    common.put_section(report, "b.py", "## B\nsecond")
    text = report.read_text()
    b, c = text.index(common.section_mark("b.py")), text.index(common.section_mark("c.py"))
    assert text.startswith("# owner\n") and b < c  # replaced where it was, before c.py's section
    assert "first" not in text and text[b:c].rstrip().endswith("## B\nsecond")
    assert text.endswith(f"{common.section_mark('c.py')}\n## C\n")
    common.write_report(report, "# owner again")
    assert report.read_text() == "# owner again\n\n" + text[b:]


def test_mean_std_is_the_population_std_unless_asked():
    assert common.mean_std([1.0, 2.0, 3.0]) == "2.0000 ± 0.8165"
    assert common.mean_std([1.0, 2.0, 3.0], digits=2, ddof=1) == "2.00 ± 1.00"
    assert common.mean_std([1e-9, 3e-9], spec=".3g", std_spec=".2g") == "2e-09 ± 1e-09"


def test_the_claims_section_lists_the_claims_then_their_evidence():
    lines = common.claims_section(["- (a) holds"], ["- (a): 0.91 vs 0.90"])
    text = "\n".join(lines)
    assert lines[0] == "## The paper's claims, checked on these numbers" and lines[-1] == ""
    assert text.index("- (a) holds") < text.index("Details:") < text.index("- (a): 0.91 vs 0.90")


def test_a_table_report_is_title_intro_and_table_printed_and_written(tmp_path, capsys):
    text = common.table_report(tmp_path / "T.md", "# Title", "Ran here.", ["| a |", "|---|", "| 1 |"])
    assert text == "# Title\n\nRan here.\n\n| a |\n|---|\n| 1 |\n"
    assert (tmp_path / "T.md").read_text() == text and capsys.readouterr().out == text + "\n"


def test_trials_seconds_sums_each_trials_last_wall_time():
    trials = pd.DataFrame({"trial": ["a", "a", "b"], "round": [0, 1, 0], "wall_time": [1.0, 2.5, 4.0]})
    assert common.trials_seconds(trials) == 6.5


def test_a_report_names_revision_machine_and_command():
    line = common.generated_by("Tabulated", "python benchmarks/x.py --reuse")
    assert line.startswith("Tabulated by `python benchmarks/x.py --reuse` at revision ")
    rev = common.revision()
    assert len(rev.split()[0]) >= 7 and rev.split()[0] in line
    assert "cores" in common.machine() and "torch " in common.machine()


def test_stopwatch_stamps_progress_lines_with_the_seconds_since_the_start(capsys):
    clock = common.Stopwatch()
    clock.log("one run done")
    line = capsys.readouterr().out.strip()
    assert line.startswith("[") and line.endswith("s] one run done") and float(line[1:line.index("s]")]) >= 0
    assert clock.started_at.endswith(" UTC")
