"""A user's algorithm with a round program of its own (``examples/two_phase_gda.py``): its two calls a round make
the updates its docstring writes (checked against a plain loop of them), count what they send, reach the quadratic
minimax's closed-form saddle point, and give the same numbers on the local backend, on Ray packed two ways and
stopped and resumed. ``test_user_modules.py`` checks the module machinery on ``examples/extension.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedcomp
from fedcomp.conformance import check
from fedcomp.platform import catalog
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import build_task
from tests.conftest import results_root

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "two_phase_gda.py"
EXAMPLE_YAML = REPO / "examples" / "two_phase_gda.yaml"
QUIET = {"run.progress": "none", "run.track": "none", "federation.backend": "local"}


def run(**overrides: object) -> fedcomp.RunResult:
    return fedcomp.run(EXAMPLE_YAML, {**QUIET, "run.out": results_root(), **overrides})


def test_the_config_names_the_module_beside_it():
    config = load_config(EXAMPLE_YAML)
    assert (config.task_name, config.algorithm_name) == ("minimax-quadratic", "two-phase-gda")
    assert config.to_dict()["algorithm"]["module"] == str(EXAMPLE)


def test_a_round_is_the_docstrings_two_phases_written_as_a_plain_loop():
    """Three rounds of the run against the updates written out with the quadratic's gradients in closed form:
    grad_y f_k = -y + b_k - t_k x, grad_x f_k = -t_k y + lambda x."""
    over = {"run.rounds": 3, "run.eval_every": 1, "federation.clients": 5, "algorithm.ascent_steps": 4,
            "algorithm.local_steps": 3}
    config = load_config(EXAMPLE_YAML, {**QUIET, **over})
    task = build_task(config)
    hp, lam = config.algorithm, config.task.lam
    x = torch.full((config.task.dim,), config.task.init)
    y = x.clone()
    expected = []
    for _ in range(3):
        ys = []
        for t, b in zip(task.t, task.b):
            yk = y.clone()
            for _ in range(hp.ascent_steps):
                yk = yk + hp.inner_lr * (-yk + b - t * x)
            ys.append(yk)
        y = torch.stack(ys).mean(0)
        xs = []
        for t in task.t:
            xk = x.clone()
            for _ in range(hp.local_steps):
                xk = xk - hp.lr * (-t * y + lam * xk)
            xs.append(xk)
        x = torch.stack(xs).mean(0)
        expected.append((float(((x - task.x_star) ** 2).sum()), float(((y - task.y_star) ** 2).sum())))
    metrics = run(**over).metrics
    got = [v for pair in zip(metrics["x_dist_sq"].iloc[1:], metrics["y_dist_sq"].iloc[1:]) for v in pair]
    assert got == pytest.approx([v for pair in expected for v in pair], rel=1e-5)


def test_its_two_calls_a_round_count_what_they_send_and_the_steps_they_take():
    """Each call broadcasts (x, y) and each client sends back one of them: d = 10 floats up and 2d down a call."""
    metrics = run(**{"run.rounds": 4, "run.eval_every": 1}).metrics.set_index("round")
    rounds = metrics.index.to_numpy()
    assert (metrics["comm_rounds"].to_numpy() == 2 * rounds).all()
    assert (metrics["floats_up"].to_numpy() == 2 * 10 * rounds).all()
    assert (metrics["floats_down"].to_numpy() == 2 * 2 * 10 * rounds).all()
    assert (metrics["local_steps"].to_numpy() == (10 + 5) * rounds).all()  # ascent_steps + local_steps a round
    assert (metrics["samples"].to_numpy() == 20 * (10 + 5) * rounds).all()  # 20 clients, one example a step


def test_it_reaches_the_closed_form_saddle_point():
    metrics = run().metrics
    assert metrics["x_dist_sq"].iloc[0] == pytest.approx(1000.0) and metrics["y_dist_sq"].iloc[0] == pytest.approx(1000.0)
    assert metrics["x_dist_sq"].iloc[-1] < 1e-12 and metrics["y_dist_sq"].iloc[-1] < 1e-12


def test_a_wrong_hyperparameter_is_one_line_naming_it():
    with pytest.raises(fedcomp.ConfigError, match=r"^algorithm.ascent_steps = 0: Input should be greater than or "
                                                  r"equal to 1$"):
        load_config(EXAMPLE_YAML, {"algorithm.ascent_steps": 0})


@pytest.mark.ray
@pytest.mark.slow
def test_fedcomp_check_finds_it_conformant_on_every_backend_packing_and_resume(keeping):
    """The same seed gives the same numbers again, on Ray packed two ways, and stopped and resumed: bit for bit."""
    catalog.import_source(str(EXAMPLE))
    outcome = check(EXAMPLE_YAML, {"run.rounds": 6, "run.eval_every": 2, "federation.clients": 4})
    assert [c.what.split(" (")[0] for c in outcome.checks] == [
        "the same seed again, local backend", "ray", "ray", "stopped at round 2 and resumed from its checkpoint"]
    assert outcome.identical and outcome.skipped == [], outcome.report()
