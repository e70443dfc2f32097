"""Replay of the authors' FedNest hyper-representation update rules (ucr-optml/FedNest: ``main_hr.py``,
``core/ClientManage_hr.py``, ``core/Client_hr.py``, ``core/SVRGClient_hr.py``), written here in plain torch from
reading that code, against our FedNest with the code's options (issue 18, 5(b)).

Their settings: beta = hlr = 0.01, N = 5 Neumann terms with step hlr, T = 1, tau = 1, ``local_ep`` = 5 passes
over the local training split, FedIHGP ``global_batch`` (each client's private counter, the server's list of
replies that is never emptied), the indirect term scaled by hlr, SVRG in FedInn and FedOut, one cohort for
FedIHGP, the hypergradient and FedOut. On a tiny slice (4 clients x 10 + 10 images, hidden width 8, all clients
every sub-round, 2 epochs) with dropout off (masks are random draws of two different streams) and one batch per
pass (batch 16 >= 10 local images, so the shuffle order does not matter). Tolerance: float32 round-off,
rtol 1e-5 / atol 1e-7 on x and y."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation
from fedcomp.platform.server import Server

CLIENTS, HIDDEN, HLR, LR, NEUMANN, PASSES = 4, 8, 0.01, 0.01, 5, 5


def forward(x, y, features):
    w1, b1 = x[: 784 * HIDDEN].view(HIDDEN, 784), x[784 * HIDDEN :]
    w2, b2 = y[: 10 * HIDDEN].view(10, HIDDEN), y[10 * HIDDEN :]
    return F.relu(features @ w1.T + b1) @ w2.T + b2


def train_loss(x, y, data):  # cross_entropy_reg: CE + 0.5 * 0.1 * (||W_header|| + ||b_header||)
    return F.cross_entropy(forward(x, y, data[0]), data[1]) + 0.5 * 0.1 * (y[: 10 * HIDDEN].norm() + y[10 * HIDDEN :].norm())


def val_loss(x, y, data):
    return F.cross_entropy(forward(x, y, data[0]), data[1])


def grad(loss, wrt, *, graph=False):
    (g,) = torch.autograd.grad(loss, wrt, create_graph=graph)
    return g


def grad_y(loss, x, y, data):
    y = y.detach().requires_grad_(True)
    return grad(loss(x, y, data), y)


def fed_in(x, y, train):
    """SVRG FedInn: anchors q_i on the whole split, averaged; ``PASSES`` corrected steps; y averaged."""
    q = torch.stack([grad_y(train_loss, x, y, d) for d in train]).mean(0)
    ys = []
    for d in train:
        yi = y.clone()
        for _ in range(PASSES):
            yi = yi - LR * (grad_y(train_loss, x, yi, d) - grad_y(train_loss, x, y, d) + q)
        ys.append(yi)
    return torch.stack(ys).mean(0)


def fed_out(x, y, train, val):
    """FedIHGP (global_batch), the hypergradient (direct - hlr * indirect), one SVRG outer step; x averaged."""
    xs, ys = x.detach().requires_grad_(True), y.detach().requires_grad_(True)
    p = torch.stack([grad(val_loss(x, ys, d), ys) for d in val]).mean(0)  # p_0, no N / l factor
    d_in_d_y = [grad(train_loss(x, ys, d), ys, graph=True) for d in train]  # each client's, kept for its HVPs
    counters, replies = [p.clone() for _ in train], []
    for _ in range(NEUMANN):
        for i, g in enumerate(d_in_d_y):
            counters[i] = counters[i] - HLR * torch.autograd.grad(g, ys, counters[i], retain_graph=True)[0]
            replies.append(p + counters[i])  # the client returns the current p plus its counter
        p = torch.stack(replies).mean(0)  # the server averages every reply so far (the list is never emptied)
    hg = []
    for tr, va in zip(train, val):
        direct = grad(val_loss(xs, y, va), xs)
        indirect = torch.autograd.grad(grad(train_loss(xs, ys, tr), ys, graph=True), xs, p)[0]
        hg.append(direct - HLR * indirect)
    h = torch.stack(hg).mean(0)
    # tau = 1: x_i = x - hlr (grad f_i(x_i) - grad f_i(x) + h) with x_i = x, the same batch and no dropout
    steps = [x - HLR * (grad(val_loss(xs, y, va), xs) - grad(val_loss(xs, y, va), xs) + h) for va in val]
    return torch.stack(steps).mean(0).detach()


def test_official_hyper_representation_rules_match_fednest_with_the_codes_options(tmp_path):
    cfg = load_config("fednest-hr-offline", {
        "algorithm.ihgp": "code", "algorithm.cohorts": "shared", "algorithm.inner_sampling": "epochs",
        "algorithm.inner_batch": 16, "algorithm.inner_steps": PASSES, "algorithm.neumann_terms": NEUMANN,
        "algorithm.lr": HLR, "algorithm.inner_lr": LR, "algorithm.neumann_lr": HLR, "algorithm.local_steps": 1,
        "task.per_client": 20, "task.hidden": HIDDEN, "task.dropout": 0.0, "task.dropout_masks": "evaluation",
        "federation.clients": CLIENTS, "federation.clients_per_round": CLIENTS, "federation.clients_per_actor": CLIENTS,
        "federation.backend": "local", "run.out": str(tmp_path),
    })  # fmt: skip
    server = Server(cfg, LocalFederation)
    x, y = server.state.x.clone(), server.state.y.clone()
    start = x.clone()
    gen = torch.Generator()
    split = lambda s: [(b[0], b[2]) for b in (server.problem.sample_at(c, s, None, gen) for c in range(CLIENTS))]  # noqa: E731
    train, val = split("inner"), split("outer")
    for _ in range(2):
        server.run_round()
        y = fed_in(x, y, train)
        x = fed_out(x, y, train, val)
        torch.testing.assert_close(server.state.y, y, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(server.state.x, x, rtol=1e-5, atol=1e-7)
    assert (x - start).abs().max() > 1e-5  # x moved: the replay checks real updates
