"""pfl 0.6 runner of ``benchmarks/peers.py``: FedAvg with pfl's ``SimulatedBackend`` on the harness's data.

pfl trains the cohort's users one after another in one process (with ``workers`` > 1 the harness starts
this script under ``torchrun`` and pfl splits each cohort over the processes, summing with gloo).
A pfl "user" here is one (round, cohort slot) pair of the workload: the user sampler yields them in
round order, so round r trains exactly the harness's cohort r on its batches; local training is
``local_steps`` SGD steps of ``batch`` examples (one epoch of the user's ``local_steps * batch``
rows, in order); the central optimiser is SGD with step 1 on the averaged model difference, which
is FedAvg's plain average of the clients' models.

Usage (the harness does this): ``python pfl_runner.py --workload SPEC.json --out RESULT.json``.
"""

from __future__ import annotations

import argparse
import itertools
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import _peer_common as common


class Classifier(nn.Module):
    """The workload's MLP with the ``loss``/``metrics`` methods pfl's ``PyTorchModel`` asks for."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.net = common.mlp(sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict[str, Any]:
        return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    common.one_thread()
    logging.getLogger("pfl").setLevel(logging.WARNING)

    import pfl
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.internal.ops.selector import get_default_framework_module
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    spec = common.load_spec(args.workload)
    data = common.load_data(spec["data"])
    rounds, cohort = int(spec["rounds"]), int(spec["cohort"])
    clock = common.Clock()

    def make_user(key: int) -> Any:
        r, slot = divmod(key, cohort)
        x = torch.from_numpy(data["features"][r, slot])
        y = torch.from_numpy(data["labels"][r, slot])
        return Dataset(raw_data=[x, y], user_id=int(data["cohorts"][r, slot]))

    # (round, slot) keys in order; every process steps its own copy of this sampler in lockstep
    keys = itertools.count()
    training = FederatedDataset(make_user, lambda: next(keys))
    # pfl wants a validation population; it is never sampled (evaluation_frequency > rounds)
    validation = FederatedDataset(make_user, lambda: 0)

    module = Classifier(list(spec["sizes"]))
    common.set_flat(module.net, data["init"])
    model = PyTorchModel(
        model=module,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0),
    )

    class Timer(TrainingProcessCallback):
        def on_train_begin(self, *, model: Any) -> Metrics:
            clock.start()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics: Metrics, model: Any, *,
                                    central_iteration: int) -> tuple[bool, Metrics]:
            clock.end_round()
            return False, Metrics()

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=rounds,
            evaluation_frequency=rounds + 1,
            train_cohort_size=cohort,
            val_cohort_size=None,
        ),
        backend=SimulatedBackend(training_data=training, val_data=validation),
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=float(spec["lr"]),
            local_num_epochs=1,
            local_batch_size=int(spec["batch"]),
        ),
        callbacks=[Timer()],
    )
    if get_default_framework_module().distributed.global_rank == 0:
        versions = {"pfl": pfl.__version__ if hasattr(pfl, "__version__") else _pfl_version(),
                    "torch": torch.__version__}
        common.write_result(args.out, clock, common.get_flat(module.net), versions)
    if torch.distributed.is_initialized():
        # a gloo group left to the interpreter's teardown sometimes aborts the process ("terminate called")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def _pfl_version() -> str:
    from importlib.metadata import version

    return version("pfl")


if __name__ == "__main__":
    main()
