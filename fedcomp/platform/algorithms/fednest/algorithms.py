"""The FedNest family's algorithms, one epoch (outer iteration k) per round, each composing the sub-rounds of
:mod:`.fedinn`, :mod:`.fedihgp` and :mod:`.fedout` on a fresh cohort per sub-round."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from fedcomp.platform.algorithms.base import Tensors
from fedcomp.platform.algorithms.builtins import FEDNEST, FEDNEST_SGD, LFEDNEST, LFEDNEST_SVRG
from fedcomp.platform.algorithms.fednest.base import Cohorts, Counter, Point, WithP, fresh_cohorts
from fedcomp.platform.algorithms.fednest.fedihgp import FEDIHGP, FedIHGP
from fedcomp.platform.algorithms.fednest.fedinn import FedInn, fedinn_sgd, fedinn_svrg
from fedcomp.platform.algorithms.fednest.fedout import FedOut, fedout_svrg
from fedcomp.platform.params import Params
from fedcomp.platform.registry import register_algorithm
from fedcomp.platform.rounds import Round


class _FedNestFamily(FedInn, FedIHGP, FedOut):
    """Every FedNest client program; each algorithm below writes its round from the sub-rounds."""


@register_algorithm(FEDNEST)
class FedNest(_FedNestFamily):
    """FedNest: T x FedInn (SVRG), FedIHGP, FedOut (SVRG); 2T + N' + 3 rounds per epoch."""

    fedinn = staticmethod(fedinn_svrg)

    def __init__(self, hparams: Params) -> None:
        super().__init__(hparams)
        if self.hp.ihgp == "code":
            self.Client = Counter  # type: ignore[misc]

    def join(self, broadcast: Tensors) -> Point:
        x, y = broadcast["x"].clone(), broadcast["y"].clone()
        if self.hp.ihgp == "code":
            return Counter(x, y, counter=torch.zeros_like(y), counter_epoch=torch.tensor(-1.0))
        return Point(x, y)

    def fedihgp(self, fed: Round, cohorts: Cohorts, x: Tensor, y: Tensor) -> Tensor:
        """FedIHGP by the configured variant (``ihgp``): p ~ [grad^2_yy g]^{-1} grad_y f."""
        return FEDIHGP[self.hp.ihgp](fed, cohorts, x, y, self.hp.neumann_terms, self.hp.neumann_lr)

    def round(self, fed: Round, server: Point) -> Point:
        hp, (x, y), cohorts = self.hp, (server.x, server.y), fresh_cohorts(fed)
        for _ in range(hp.inner_rounds):
            y = self.fedinn(fed, next(cohorts), x, y)
        if hp.cohorts == "shared":  # the authors' code: FedIHGP, the hypergradient and FedOut on one cohort
            cohorts = itertools.repeat(next(cohorts))
        if fed.problem.minimax:  # g = -f: no indirect term, no FedIHGP
            cohort = next(cohorts)
            h = fed.call("direct_gradient", cohort, Point(x, y)).h
        else:
            p = self.fedihgp(fed, cohorts, x, y)
            cohort = next(cohorts)
            h = fed.call("hypergradient", cohort, WithP(x, y, p)).h
        fed.train_loss = fed.record.train_loss  # the round reports f(x, y) as the hypergradient call measured it
        x = fedout_svrg(fed, cohort, x, y, h)
        fed.count(local_steps=hp.inner_rounds * hp.inner_steps + hp.local_steps)
        return Point(x, y)


@register_algorithm(FEDNEST_SGD)
class FedNestSGD(FedNest):
    """FedNest with FedInn by local SGD (1 round per call); T + N' + 3 rounds per epoch."""

    fedinn = staticmethod(fedinn_sgd)


@register_algorithm(LFEDNEST)
class LFedNest(_FedNestFamily):
    """Light FedNest: local SGD on y, then local hypergradient steps on x; T + 1 rounds per epoch."""


    def round(self, fed: Round, server: Point) -> Point:
        hp, (x, y), cohorts = self.hp, (server.x, server.y), fresh_cohorts(fed)
        for _ in range(hp.inner_rounds):
            y = fedinn_sgd(fed, next(cohorts), x, y)
        x = fed.call("local_outer", next(cohorts), Point(x, y)).x  # tau local hypergradient steps, x averaged
        fed.count(local_steps=hp.inner_rounds * hp.inner_steps + hp.local_steps)
        return Point(x, y)


@register_algorithm(LFEDNEST_SVRG)
class LFedNestSVRG(_FedNestFamily):
    """LFedNest with SVRG FedInn, averaged local hypergradients and SVRG outer steps; 2T + 2 rounds."""


    def round(self, fed: Round, server: Point) -> Point:
        hp, (x, y), cohorts = self.hp, (server.x, server.y), fresh_cohorts(fed)
        for _ in range(hp.inner_rounds):
            y = fedinn_svrg(fed, next(cohorts), x, y)
        cohort = next(cohorts)
        h = fed.call("local_hypergradient", cohort, Point(x, y)).h
        fed.train_loss = fed.record.train_loss  # f(x, y) as the hypergradient call measured it (FedOut does not)
        x = fedout_svrg(fed, cohort, x, y, h)
        fed.count(local_steps=hp.inner_rounds * hp.inner_steps + hp.local_steps)
        return Point(x, y)


__all__ = ["FedNest", "FedNestSGD", "LFedNest", "LFedNestSVRG"]
