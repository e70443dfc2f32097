"""``fed.exchange``: a client program written as a generator exchanges values with the cohort every step and
returns its outputs at the end -- what comes back, how it is counted, and what happens out of step."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from pydantic import Field
from torch import Tensor

from fedcomp.platform.algorithms.base import Algorithm, ClientContext, Exchange, StepInfo, Tensors
from fedcomp.platform.config import load_config
from fedcomp.platform.federation import LocalFederation, build_task
from fedcomp.platform.kinds import COMPOSITIONAL_GLOBAL
from fedcomp.platform.params import Params
from fedcomp.platform.registry import ALGORITHMS, register_algorithm
from fedcomp.platform.rng import generator
from fedcomp.platform.rounds import Round
from fedcomp.platform.state import Model


class TalkParams(Params):
    yields: int = Field(3, ge=0)


@dataclass(frozen=True)
class Talker(Model):
    heard: Tensor
    """Answers received over all rounds (private)."""


class Talk(Algorithm):
    """Each client yields (its id, the step) ``yields`` times and outputs the sum of the means it got back."""

    kind = COMPOSITIONAL_GLOBAL
    HParams = TalkParams
    Client, Server = Talker, Model

    def init(self, variables: Tensors) -> Model:
        return Model(x=variables["x"].clone())

    def join(self, broadcast: Tensors) -> Talker:
        return Talker(x=broadcast["x"].clone(), heard=torch.zeros(1))

    def talk(self, problem: object, client: Talker, ctx: ClientContext) -> Exchange[Talker]:
        total = torch.zeros(2)
        for s in range(self.hp.yields):
            total = total + (yield {"v": torch.tensor([float(ctx.client), float(s)])}).v
        return client.replace(heard=client.heard + self.hp.yields), {"total": total}, StepInfo(1, float(ctx.client))

    def round(self, fed: Round, server: Model) -> Model:
        return server


if "test-talk" not in ALGORITHMS:  # a second import of this module must not register a second class
    register_algorithm("test-talk")(Talk)


def federation(yields: int = 3, clients: int = 4) -> tuple[LocalFederation, Tensor]:
    cfg = load_config(
        {"task": {"name": "heterogeneous-composition"}, "algorithm": {"name": "test-talk", "yields": yields},
         "federation": {"clients": clients, "backend": "local"}, "run": {"progress": "none", "out": "/tmp/fedcomp-test-exchange"}}
    )
    x0 = build_task(cfg).init_params(generator(0, "init"))["x"]
    return LocalFederation(cfg), x0


def a_round(fed: LocalFederation, number: int = 0) -> Round:
    return Round(fed, number, lambda k=0: [0, 1, 3], lambda *ids: generator(0, "server", number, *ids), None, 4)


def test_each_yield_is_averaged_over_the_cohort_and_sent_back():
    fed, x0 = federation()
    r = a_round(fed)
    means = r.exchange("talk", r.cohort(), {"x": x0}, 3)
    cohort_mean = (0 + 1 + 3) / 3
    # every client received [mean id, s] for s = 0, 1, 2 and output their sum
    torch.testing.assert_close(means.total, torch.tensor([3 * cohort_mean, 0.0 + 1 + 2]), rtol=0, atol=1e-6)
    torch.testing.assert_close(means.v, torch.tensor([cohort_mean, 2.0]), rtol=0, atol=1e-6)  # the last mean
    assert r.train_loss == pytest.approx(cohort_mean) and r.record.samples == 3
    assert fed.private_states()[3]["heard"].item() == 3  # private state saved at the end
    r = a_round(fed, 1)
    r.exchange("talk", r.cohort(), {"x": x0}, 3)
    assert fed.private_states()[3]["heard"].item() == 6  # and carried into the next round


def test_it_counts_one_model_round_and_one_exchange_per_yield():
    fed, x0 = federation()
    r = a_round(fed)
    r.exchange("talk", r.cohort(), {"x": x0, "extra": torch.zeros(5)}, 3, resent=("extra",))
    record = r.finish()
    d = x0.numel()
    assert (record.comm_rounds, record.floats_down, record.floats_up) == (1, d, 2)  # 'extra' is not charged
    assert (record.embedding_exchanges, record.embedding_floats_up, record.embedding_floats_down) == (3, 6, 6)


def test_a_program_without_yields_is_a_plain_model_round():
    fed, x0 = federation(yields=0)
    r = a_round(fed)
    assert r.exchange("talk", r.cohort(), {"x": x0}, 0).total.tolist() == [0.0, 0.0]
    assert (r.record.comm_rounds, r.record.embedding_exchanges) == (1, 0)


@pytest.mark.parametrize("yields, steps", [(2, 3), (3, 2), (0, 1)])
def test_a_program_out_of_step_with_the_round_is_an_error_naming_it(yields, steps):
    fed, x0 = federation(yields=yields)
    r = a_round(fed)
    with pytest.raises(RuntimeError, match="client program 'talk' is out of step") as raised:
        r.exchange("talk", r.cohort(), {"x": x0}, steps)
    assert fed.host.session is None  # and nothing is left half-run
    [note] = raised.value.__notes__  # named as the exchange was, though it ended as it raised
    assert note.startswith("fedcomp: raised in client program 'talk' of algorithm ")
