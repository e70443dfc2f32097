"""A single run's curves.png: the headline metric and the training loss against rounds and against floats
communicated, next to metrics.parquet."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pandas as pd

import fedcomp
from fedcomp.platform.curves import build_figure, floats_communicated
from tests.conftest import small


def test_run_writes_a_png_of_its_curves(tmp_path):
    result = fedcomp.run("quickstart", small(**{"run.out": str(tmp_path), "run.rounds": 4}))
    png = result.run_dir / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(png).shape
    assert (width, height) == (900, 600)
    assert not list(result.run_dir.glob(".*"))  # written atomically, no temporary file left


def test_the_figure_has_metric_and_loss_against_rounds_and_floats():
    df = pd.DataFrame({
        "round": [0, 2, 4], "floats_up": [0, 20, 40], "floats_down": [0, 20, 40],
        "embedding_floats_up": [0, 1, 2], "embedding_floats_down": [0, 1, 2],
        "train_loss": [np.nan, 0.8, 0.6], "test_auroc": [0.5, 0.7, 0.8],
    })
    fig = build_figure(df, "test_auroc", title="a run")
    axes = fig.get_axes()
    assert [(ax.get_ylabel(), ax.get_xlabel()) for ax in axes] == [
        ("test auroc", "round"), ("", "floats communicated per client (up + down)"),
        ("train loss", "round"), ("", "floats communicated per client (up + down)"),
    ]
    shared = axes[0].get_shared_y_axes()  # each row one y axis, labelled on the left
    assert shared.joined(axes[0], axes[1]) and shared.joined(axes[2], axes[3]) and not shared.joined(axes[0], axes[2])
    assert [ax.yaxis.get_tick_params()["labelleft"] for ax in axes] == [True, False, True, False]
    np.testing.assert_array_equal(floats_communicated(df), [0, 42, 84])
    (metric_vs_rounds,) = axes[0].get_lines()
    np.testing.assert_array_equal(metric_vs_rounds.get_xdata(), [0, 2, 4])
    np.testing.assert_array_equal(metric_vs_rounds.get_ydata(), [0.5, 0.7, 0.8])
    (loss_vs_floats,) = axes[3].get_lines()  # round 0 has no training loss yet: left out, not drawn as a gap
    np.testing.assert_array_equal(loss_vs_floats.get_xdata(), [42, 84])
    np.testing.assert_array_equal(loss_vs_floats.get_ydata(), [0.8, 0.6])
    assert fig._suptitle.get_text() == "a run"
