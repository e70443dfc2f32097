"""The FCSG authors' invariant-logistic-regression code, replayed beside our ``official-code`` variant.

Source read: github.com/xidongwu/Federated-Minimax-and-Conditional-Stochastic-Optimization at commit
353356ae6062546537f80df1a05808101c0a22d2, folder "Invariant Logistic Regression/":

* ``main.py``: every one of the ``--worker-size`` (16) processes calls ``torch.manual_seed(args.seed)`` and builds
  its model and its data stream from the global RNG, so every worker starts from the same model and draws the
  same samples (pitfall F2); both ``--method fcsg`` and ``fcsgm`` call one routine, FCSG being its momentum
  weight ``--alpha`` = 1.
* ``dataset.py``: ``getdata(bz)`` draws bz outer features a ~ N(0, I) and, for each, ``--inbs`` inner samples
  eta ~ N(a, std^2 I), stacked one outer sample's rows after another, each row labelled sign(teacher(a));
  ``LogModel`` is Linear(d, 1) with a Xavier-normal weight and bias 1.
* ``FCSGM.py``: per step, loss = -mean over all bz * inbs rows of log sigmoid(label * model(row)) (the mean of
  the inner samples sits outside the nonlinearity: pitfall F1) + lmd * sum over weight and bias of
  gamma p^2 / (1 + gamma p^2); the very first step draws 32 outer samples and starts the momentum at that
  gradient, later steps draw 1; m <- (1 - alpha) m + alpha grad; p <- p - lr m. After ``--inLoop`` steps every
  worker all-reduces (sums, then divides by the worker count) its parameters and its momentum. Every 5 epochs
  worker 0 prints the accuracy sign(model(a)) == label of its own model, before that epoch's averaging (F4).

The replay below writes these rules in plain torch, 16 workers each with its own model and momentum. The code's
draws come from the global RNG one scalar vector at a time, which no keyed stream can reproduce, so both sides are
fed the same draws: each worker's step t takes the outer and inner samples our run draws for its stream (stream 0
for every client under ``identical_client_streams``) at step t, and the replay starts from our initial x (drawn as
the code draws its own: Xavier-normal weight, bias 1). Settings are the code's defaults and usage line (16
workers, inbs 10, gamma 10, lmd 0.001, std 1, 5,000 test samples, first batch 32), scaled down for speed to 2
epochs (of 1,000) of 50 local steps (the paper's q; the code's default inLoop is 100), with lr = 0.01 from the
paper's grid (the usage line's 1e-4 barely moves x in so few steps).
"""

from __future__ import annotations

import pytest
import torch

from fedcomp.datasets.synthetic import gaussian_outer
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server
from fedcomp.platform.tasks.invariant_logreg import InvariantLogReg

WORKERS, IN_LOOP, INBS, LR, EPOCHS = 16, 50, 10, 0.01, 2
GAMMA, LMD, FIRST_BATCH = 10.0, 0.001, 32
TOL = 1e-6
"""Iterates agree to float32 rounding (the code's log(sigmoid) vs our softplus, sums in another order)."""


def official_setting(algorithm: str, **overrides: object) -> dict[str, object]:
    """Our overrides for the code's setting: its objective, one stream for every client, its defaults."""
    return {
        "algorithm.name": algorithm, "algorithm.lr": LR, "algorithm.local_steps": IN_LOOP,
        "algorithm.inner_batch": INBS, "algorithm.outer_batch": 1, "algorithm.first_batch": FIRST_BATCH,
        "task.objective": "official-code", "task.identical_client_streams": True, "task.noise_ratio": 1.0,
        "task.reg_gamma": GAMMA, "task.reg_lambda": LMD, "task.test_samples": 5000,
        "federation.clients": WORKERS, "federation.backend": "local", "run.rounds": EPOCHS, "run.progress": "none",
        **overrides,
    }  # fmt: skip


def code_loss(params: list[torch.Tensor], rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """FCSGM.py's loss: -mean log sigmoid(label * (w . row + c)) over every (outer, inner) row, plus the regulariser."""
    w, c = params
    pred_score = torch.sigmoid((rows @ w + c) * labels)
    reg = sum((GAMMA * p**2 / (1 + GAMMA * p**2)).sum() for p in params)
    return -torch.log(pred_score).mean() + LMD * reg


def code_draws(task: InvariantLogReg, stream: int, seed: int, step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows and labels in ``getdata``'s layout (an outer sample's inner rows together), from our draws at ``step``."""
    gen = generator(seed, "client-step", stream, step)
    outer = task.sample_outer(stream, n, gen)
    inner = task.sample_inner(stream, outer, INBS, gen)  # [n, inbs, d]
    return inner.reshape(n * INBS, -1), outer[1].repeat_interleave(INBS)


def official_replay(
    task: InvariantLogReg, x0: torch.Tensor, alpha: float, seed: int, streams: list[int]
) -> list[dict[str, torch.Tensor]]:
    """The code's epochs, one record per epoch: worker 0's model before the averaging and the averaged model.

    Worker k draws from our stream ``streams[k]`` (all 0: the code's identical streams). The workers are one batch
    of models [K, d + 1] here: the sum of their losses has each worker's own gradient in its row."""
    weights, biases = x0[:-1].repeat(len(streams), 1), x0[-1:].repeat(len(streams), 1)
    momenta: list[torch.Tensor] | None = None
    records = []
    for epoch in range(EPOCHS):
        for s in range(IN_LOOP):
            step = epoch * IN_LOOP + s
            draws = {k: code_draws(task, k, seed, step, FIRST_BATCH if momenta is None else 1) for k in set(streams)}
            rows = torch.stack([draws[k][0] for k in streams])  # [K, rows, d]
            labels = torch.stack([draws[k][1] for k in streams])
            params = [weights.requires_grad_(True), biases.requires_grad_(True)]
            loss = sum(code_loss([w, c], r, lab) for w, c, r, lab in zip(*params, rows, labels, strict=True))
            grads = torch.autograd.grad(loss, params)
            m = list(grads) if momenta is None else momenta  # the first step starts the momentum at its gradient
            momenta = [(1 - alpha) * mi + alpha * g for mi, g in zip(m, grads, strict=True)]
            weights, biases = ((p - LR * mi).detach() for p, mi in zip(params, momenta, strict=True))
        worker0 = torch.cat([weights[0], biases[0]])
        # all_reduce(SUM), then div_(size), of every parameter and momentum
        weights, biases, *momenta = (t.sum(0, keepdim=True).expand_as(t) / len(streams)
                                     for t in (weights, biases, *momenta))
        records.append({"worker0": worker0, "averaged": torch.cat([weights[0], biases[0]])})
    return records


def code_accuracy(x: torch.Tensor, task: InvariantLogReg) -> float:
    """FCSGM.py's printed accuracy, sign(model(a)) == label, on our test set (the code's is a file of 5,000 such
    samples), drawn as the task's evaluator draws it."""
    p = task.params
    a, b = gaussian_outer(task.teacher, p.test_samples, p.sigma1, generator(p.teacher_seed, "test"))
    return float((torch.sign(a @ x[:-1] + x[-1]) == b).float().mean())


def ours(overrides: dict[str, object]) -> tuple[Server, list[torch.Tensor], list[float]]:
    """Our local-backend run: the server, x after every round and test accuracy after every round."""
    server = Server(load_config("fig1-fcsg", overrides), LocalFederation)
    xs, accuracies = [], []
    for _ in range(EPOCHS):
        server.run_round()
        xs.append(server.state.x.clone())
        accuracies.append(server.evaluate()["test_accuracy"])
    return server, xs, accuracies


@pytest.mark.parametrize("algorithm, alpha", [("fcsg", 1.0), ("fcsg-m", 0.1)])
def test_the_official_code_variant_replays_the_authors_code(algorithm, alpha):
    """Our FCSG (the code's alpha = 1) and FCSG-M (the code's default alpha = 0.1) with the ``official-code``
    objective and identical client streams take the code's iterates at every epoch, and report the accuracy
    the code prints (worker 0's model before averaging: with identical streams the averaging changes nothing)."""
    overrides = official_setting(algorithm, **({"algorithm.beta": alpha} if algorithm == "fcsg-m" else {}))
    server, xs, accuracies = ours(overrides)
    task = build_task(server.config)
    x0 = task.init_params(generator(server.config.run.seed, "init"))["x"]
    assert float(x0[-1]) == 1.0  # the code's LogModel: bias 1
    records = official_replay(task, x0, alpha, server.config.run.seed, [0] * WORKERS)
    for epoch, (x, accuracy, record) in enumerate(zip(xs, accuracies, records, strict=True)):
        torch.testing.assert_close(record["worker0"], record["averaged"], rtol=0, atol=1e-6)
        torch.testing.assert_close(x, record["averaged"], rtol=0, atol=TOL, msg=f"epoch {epoch}")
        assert accuracy == code_accuracy(record["worker0"], task)
    assert float((xs[-1] - x0).norm()) > 0.1  # the run moved: the agreement is not that of two resting points


def test_the_replay_tells_the_variants_apart():
    """The replay is sharp: our paper objective (mean inside) leaves it by far more than the tolerance; with
    independent client streams ours leaves the identical-stream replay too, and instead takes the iterates of
    the replay whose worker k draws client k's stream -- there the code's all-reduce of x and the momentum
    averages 16 different models, as ours does."""
    alpha = 0.1
    official = official_setting("fcsg-m", **{"algorithm.beta": alpha})
    server, _, _ = ours(official)
    task, seed = build_task(server.config), server.config.run.seed
    x0 = task.init_params(generator(seed, "init"))["x"]
    identical = official_replay(task, x0, alpha, seed, [0] * WORKERS)[-1]["averaged"]
    distinct = official_replay(task, x0, alpha, seed, list(range(WORKERS)))[-1]
    _, paper_xs, _ = ours({**official, "task.objective": "paper"})
    _, independent_xs, _ = ours({**official, "task.identical_client_streams": False})
    assert float((paper_xs[-1] - identical).abs().max()) > 100 * TOL
    assert float((independent_xs[-1] - identical).abs().max()) > 100 * TOL
    assert float((distinct["worker0"] - distinct["averaged"]).abs().max()) > 100 * TOL  # averaging now matters
    torch.testing.assert_close(independent_xs[-1], distinct["averaged"], rtol=0, atol=TOL)
