"""The authors'-code options of FedNest's hyper-representation (issue 18, 5(b)): shuffled local passes
(``algorithm.inner_sampling: epochs``), a fresh dropout mask per evaluation (``task.dropout_masks: evaluation``)
and torch's own initial point (``task.init: torch``). Behaviour, no Ray."""

from __future__ import annotations

import pytest
import torch

from fedcomp.platform.algorithms.fednest import epoch_batch
from fedcomp.platform.config import load_config
from fedcomp.platform.errors import ConfigError
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.rng import generator
from fedcomp.platform.server import Server


def hr_task(**params):
    cfg = load_config("fednest-hr-offline", {"federation.backend": "local", "federation.clients": 4,
                                             "federation.clients_per_round": 2, "federation.clients_per_actor": 2,
                                             "task.per_client": 40, "task.hidden": 8, "run.seed": 3,
                                             **{f"task.{k}": v for k, v in params.items()}})  # fmt: skip
    return build_task(cfg)


def test_shuffled_epochs_visit_every_local_example_once_per_pass_in_batches_of_64_and_36():
    n, size, passes = 100, 64, 5
    rng = lambda e: generator(0, "test-epochs", e)  # noqa: E731
    batches = [epoch_batch(n, size, step, rng) for step in range(2 * passes)]
    assert [len(b) for b in batches] == [64, 36] * passes  # the DataLoader's 64 + 36 of 100
    for e in range(passes):
        assert sorted(torch.cat(batches[2 * e : 2 * e + 2]).tolist()) == list(range(n))  # each example once
    assert not torch.equal(batches[0], batches[2])  # a new shuffle every pass


def test_the_task_serves_the_batch_at_given_positions_of_a_clients_split():
    task = hr_task(dropout=0.0)
    positions = torch.tensor([3, 0, 7])
    features, _, labels = task.sample_at(1, "inner", positions, torch.Generator().manual_seed(0))
    everything = task.sample_at(1, "inner", None, torch.Generator().manual_seed(0))
    assert task.local_size(1, "inner") == 20 and task.local_size(1, "outer") == 20
    torch.testing.assert_close(features, everything[0][positions], rtol=0, atol=0)
    torch.testing.assert_close(labels, everything[2][positions], rtol=0, atol=0)


def test_separate_masks_differ_between_evaluations_and_shared_masks_do_not():
    for masks, differ in (("batch", False), ("evaluation", True)):
        task = hr_task(dropout_masks=masks)
        p = task.init_params(generator(0, "init"))
        batch = task.sample(0, "inner", 16, torch.Generator().manual_seed(5))
        first, second = (task.inner_loss(p["x"], p["y"], batch) for _ in range(2))
        assert bool(first != second) == differ, masks
        # either way the same stream gives the same run: a batch drawn again repeats its masks
        again = task.sample(0, "inner", 16, torch.Generator().manual_seed(5))
        torch.testing.assert_close(task.inner_loss(p["x"], p["y"], again), first, rtol=0, atol=0)


def test_torch_init_is_the_codes_mlp_after_manual_seed_and_leaves_the_global_stream_alone():
    task = hr_task(init="torch")
    state = torch.random.get_rng_state()
    params = task.init_params(generator(0, "init"))
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(3)  # the run seed
    first, head = torch.nn.Linear(784, 8), torch.nn.Linear(8, 10)  # the code's MLP: layer_input, then header
    torch.testing.assert_close(params["x"], torch.cat([first.weight.detach().reshape(-1), first.bias.detach()]))
    torch.testing.assert_close(params["y"], torch.cat([head.weight.detach().reshape(-1), head.bias.detach()]))
    keyed = hr_task().init_params(generator(0, "init"))
    assert not torch.equal(keyed["x"], params["x"])


def test_shuffled_epochs_need_a_task_with_local_datasets(tmp_path):
    cfg = load_config("fednest-minimax", {"federation.backend": "local", "algorithm.inner_sampling": "epochs",
                                          "run.out": str(tmp_path)})  # fmt: skip
    with pytest.raises(ConfigError, match=r"algorithm\.inner_sampling = 'epochs' needs a task whose clients hold local"):
        Server(cfg, LocalFederation)  # when the server is built, before any run folder
