"""Flower 1.42 runner of ``benchmarks/peers.py``: its message-based FedAvg on the Ray simulation backend.

Runs in the harness's own virtualenv for Flower (``.bench/flower-venv``: Flower pins its own Ray).
``clients`` virtual SuperNodes are registered; ``workers`` Ray actors run the ClientApp (the Ray
cluster has 2 CPUs and each ClientApp asks for ``2 / workers``). The strategy is Flower's ``FedAvg``
with one change: ``configure_train`` sends round r to the harness's cohort r instead of a random
sample (client c is the c-th registered node in node-id order) and names the client in the message's
config, so the ClientApp trains on exactly that client's batches of round r; federated evaluation is
off (``fraction_evaluate=0``). Aggregation is Flower's own weighted average (all weights equal).

Usage (the harness does this): ``python flower_runner.py --workload SPEC.json --out RESULT.json``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import _peer_common as common

common.one_thread()

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    common.one_thread()
    config = msg.content["config"]
    data = common.load_data(str(config["data"]))
    model = common.mlp(list(config["sizes"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
    r, slot = int(config["server-round"]) - 1, int(config["slot"])
    for x, y in common.batches(data, r, slot, int(config["batch"])):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    examples = int(data["features"].shape[2])
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": examples})})
    return Message(content=content, reply_to=msg)


class CohortFedAvg(FedAvg):
    """Flower's FedAvg, sending each round to the workload's cohort and timing the rounds."""

    def __init__(self, spec: dict[str, Any], cohorts: np.ndarray, clock: common.Clock) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1)
        self.spec, self.cohorts, self.clock = spec, cohorts, clock

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.clock.start()
        nodes = sorted(grid.get_node_ids())
        # the simulation registers its SuperNodes while the ServerApp starts: wait for all (as Flower's own
        # sample_nodes does, polling), with a deadline
        deadline = time.monotonic() + 300
        while len(nodes) < int(self.spec["clients"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(nodes)} of {self.spec['clients']} SuperNodes registered after 300 s")
            time.sleep(0.05)
            nodes = sorted(grid.get_node_ids())
        messages = []
        for slot, client in enumerate(self.cohorts[server_round - 1]):
            cfg = ConfigRecord({
                "server-round": server_round, "slot": slot, "data": self.spec["data"],
                "sizes": [int(s) for s in self.spec["sizes"]], "lr": float(self.spec["lr"]),
                "batch": int(self.spec["batch"]),
            })
            record = RecordDict({"arrays": arrays, "config": cfg})
            messages.append(Message(content=record, message_type=MessageType.TRAIN, dst_node_id=nodes[int(client)]))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        replies = list(replies)
        failed = [m for m in replies if m.has_error()]
        if failed:
            raise RuntimeError(f"round {server_round}: {len(failed)} ClientApp failure(s): {failed[0].error.reason}")
        result = super().aggregate_train(server_round, replies)
        self.clock.end_round()
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import flwr
    from flwr.simulation import run_simulation

    spec = common.load_spec(args.workload)
    data = common.load_data(spec["data"])
    clock = common.Clock()
    final: dict[str, np.ndarray] = {}
    server_app = ServerApp()

    @server_app.main()
    def server_main(grid: Grid, context: Context) -> None:
        model = common.mlp(list(spec["sizes"]))
        common.set_flat(model, data["init"])
        strategy = CohortFedAvg(spec, data["cohorts"], clock)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                                num_rounds=int(spec["rounds"]))
        model.load_state_dict(result.arrays.to_torch_state_dict())
        final["x"] = common.get_flat(model)

    cpus = 2
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=int(spec["clients"]),
        backend_config={
            "client_resources": {"num_cpus": cpus / int(spec["workers"]), "num_gpus": 0.0},
            "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False},
        },
    )
    if "x" not in final or len(clock.round_ends) != int(spec["rounds"]):
        raise SystemExit(f"flower run did not finish: {len(clock.round_ends)} of {spec['rounds']} rounds")
    versions = {"flwr": flwr.__version__, "torch": torch.__version__, "ray": _version("ray")}
    common.write_result(args.out, clock, final["x"], versions)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    main()
