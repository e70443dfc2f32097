"""Progress output: a tqdm bar on a terminal, log lines otherwise -- also between evaluations and at least
every LOG_EVERY_S seconds -- and status lines such as "starting local Ray" that follow run.progress."""

from __future__ import annotations

import io

import pytest

import fedcomp
from fedcomp.platform.progress import RunProgress, announce, duration, output_mode, resolve
from tests.conftest import small


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def row(r: int, acc: float) -> dict:
    return {"round": r, "test_accuracy": acc, "train_loss": 1.0 / (r + 1)}


class KernelStream(io.StringIO):
    """As a Jupyter kernel's stderr is: ipykernel's stream, no terminal."""


KernelStream.__module__ = "ipykernel.iostream"


def test_auto_is_a_bar_on_a_terminal_and_log_lines_elsewhere():
    assert resolve("auto", Terminal()) == "bar"
    assert resolve("auto", KernelStream()) == "bar"  # a notebook: tqdm draws its bar there (it got log lines)
    assert resolve("auto", io.StringIO()) == "log"
    assert resolve("none", Terminal()) == "none"
    with pytest.raises(ValueError):
        resolve("fancy")


def test_log_lines_every_tenth_of_the_run_also_between_evaluations_with_eta():
    out, clock = io.StringIO(), FakeClock()
    progress = RunProgress(20, 0, "test_accuracy", "log", stream=out, clock=clock)
    latest = row(0, 0.5)
    for r in range(1, 21):
        clock.now += 2.0
        if r % 5 == 0:  # evaluates every 5 rounds only
            latest = row(r, 0.5 + r / 100)
        progress.update(r, latest)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == [f"{r}/20" for r in range(2, 21, 2)]
    assert lines[0] == "round 2/20 (10%)  eval @0: test_accuracy=0.5000  train_loss=1.0000  elapsed 4.0s  eta 36s"
    assert lines[4] == "round 10/20 (50%)  test_accuracy=0.6000  train_loss=0.0909  elapsed 20s  eta 20s"
    assert "eval @10: test_accuracy=0.6000" in lines[5]
    assert lines[-1] == "round 20/20 (100%)  test_accuracy=0.7000  train_loss=0.0476  elapsed 40s"


def test_slow_rounds_still_get_a_line_every_log_every_s():
    out, clock = io.StringIO(), FakeClock()
    progress = RunProgress(1000, 0, "test_accuracy", "log", stream=out, clock=clock, log_every_s=30.0)
    for r in range(1, 21):  # 20 rounds of 10 s: far from 10 % of the run
        clock.now += 10.0
        progress.update(r, row(0, 0.5))
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["3/1000", "6/1000", "9/1000", "12/1000",
                                                                          "15/1000", "18/1000"]


def test_a_resumed_run_counts_its_eta_from_the_rounds_it_ran():
    out, clock = io.StringIO(), FakeClock()
    progress = RunProgress(10, 6, "test_accuracy", "log", stream=out, clock=clock)
    clock.now += 4.0
    progress.update(7, row(6, 0.9))
    assert progress.eta(7) == pytest.approx(12.0)  # 4 s per round since the resume, 3 rounds left


def test_the_bar_shows_round_metric_and_eta():
    out = Terminal()
    progress = RunProgress(4, 0, "test_accuracy", "auto", label="fcsg-m", stream=out)
    for r in range(1, 5):
        progress.update(r, row(r, 0.25 * r))
    progress.close()
    text = out.getvalue()
    assert "fcsg-m" in text and "4/4" in text and "round/s" in text and "test_accuracy=1.0000" in text
    assert "<" in text  # tqdm's elapsed<remaining


def test_each_frame_of_the_bar_shows_its_own_rounds_evaluation():
    """At 2/4 the bar showed round 1's value: it was drawn before the round's evaluation was set."""
    out = Terminal()
    progress = RunProgress(4, 0, "test_accuracy", "auto", label="fcsg-m", stream=out)
    progress.bar.mininterval, progress.bar.miniters = 0, 1  # every update drawn (tqdm draws ten a second at most)
    for r in range(1, 5):
        progress.update(r, row(r, 0.25 * r))
    progress.close()
    frames = [frame for frame in out.getvalue().split("\r") if "test_accuracy" in frame]
    assert [frame.split("|")[2].split()[0] for frame in frames][:4] == ["1/4", "2/4", "3/4", "4/4"]
    assert all(f"test_accuracy={0.25 * r:.4f}" in frame for r, frame in zip(range(1, 5), frames, strict=False))


def test_announce_follows_run_progress(capsys):
    with output_mode("log"):
        announce("starting local Ray ...")
    with output_mode("none"):
        announce("not shown")
    assert capsys.readouterr().err == "fedcomp: starting local Ray ...\n"


def test_a_metric_below_a_thousandth_keeps_its_significant_digits():
    """A distance to the saddle point of 4.95e-16 showed as 0.0000 in the lines and 0.0 in the closing line."""
    from fedcomp.platform.progress import _value, rounded_metric

    assert [_value(v) for v in (0.93926, 4.951e-16, -2.5e-4, 0.0, 12.3456789, float("nan"))] == [
        "0.9393", "4.95e-16", "-0.00025", "0.0000", "12.3457", "nan"]
    assert rounded_metric(4.951e-16) == 4.95e-16 and rounded_metric(0.93926) == 0.9393


def test_durations_read_well():
    assert [duration(s) for s in (4.25, 42, 185, 7380)] == ["4.2s", "42s", "3m05s", "2h03m"]


def test_a_run_that_evaluates_rarely_says_which_round_it_is_at(tmp_path, capsys):
    fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "run.rounds": 10, "run.eval_every": 5,
                                       "run.progress": "log"}))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in lines] == [f"{r}/10" for r in range(1, 11)]
    assert "eval @0:" in lines[0] and "eval @5:" in lines[5] and "eval @" not in lines[4]
