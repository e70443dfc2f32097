"""Sinewave regression with MAML -- the Local-SCGDM paper's experiment (``EXPERIMENTS.md`` E4), federated.

A task is y = A sin(x - phi) with inputs x ~ U[-5, 5], amplitude A ~ U[0.1, 5] and phase phi ~ U[0, pi]:
the standard MAML benchmark's ranges (Finn et al. 2017, ``cbfinn/maml``). The slides give no model, clients
or task distribution, so the federated setting is ours (a **reconstruction**), chosen by ``heterogeneity``:

* ``amplitude-bands`` (default): client k draws A from the k-th of K equal sub-intervals of [0.1, 5]
  (device-dependent task distributions whose union is the standard one), phi and x as above;
* ``iid``: every client draws from the standard distribution;
* ``fcsg-repo``: the unused ``SineWave`` generator of the FCSG repository (inferred to descend from the
  Local-SCGDM experiment): client k has ``tasks_per_client`` discrete tasks y = A_k sin(x + Phi pi / 5),
  Phi = 1, 2, ..., with A_k = 1 + 4 k / (K - 1) (A = k + 1 for K = 5 devices, as there); held-out tasks
  draw A and Phi from U(1, 5).

Each episode has ``shots`` support and ``queries`` query points, drawn fresh. Model: MLP 1-40-40-1 (ReLU,
1,761 parameters, as in MAML), PyTorch's default initialisation drawn from the run seed. Metrics on
``eval_tasks`` fixed held-out tasks from the standard distribution (``eval_queries`` query points each):
``test_loss`` -- query MSE after ``eval_steps`` adaptation steps -- and ``test_loss_unadapted``, the
same tasks' query MSE of the meta-parameters themselves.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedcomp.models.functional import FlatModel
from fedcomp.models.mlp import mlp
from fedcomp.platform.registry import register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.builtins import SINEWAVE, SinewaveParams
from fedcomp.platform.tasks.meta import Episodes, MetaTask, mse

AMPLITUDE = (0.1, 5.0)
PHASE = (0.0, math.pi)
INPUT = (-5.0, 5.0)


def _uniform(n: int, bounds: tuple[float, float], gen: torch.Generator) -> Tensor:
    low, high = bounds
    return low + (high - low) * torch.rand(n, generator=gen)


@register_task(SINEWAVE)
class Sinewave(MetaTask):
    vmappable = True  # an MLP without BatchNorm; adaptation is a fixed number of torch.func.grad steps

    def __init__(self, params: SinewaveParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        self.model = FlatModel(mlp([1, params.hidden, params.hidden, 1]).to(self.device))
        self.loss_fn = mse

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        # PyTorch's default Linear initialisation (uniform +-1/sqrt(fan_in) for weights and biases), from gen.
        parts = []
        for layer in self.model.module.modules():
            if isinstance(layer, torch.nn.Linear):
                bound = 1 / math.sqrt(layer.in_features)
                for p in (layer.weight, layer.bias):
                    parts.append(((torch.rand(p.shape, generator=gen) * 2 - 1) * bound).reshape(-1))
        return {"x": torch.cat(parts)}

    def _client_tasks(self, client: int, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor, float]:
        """(amplitudes, phases, sign) of n tasks of the client: y = A sin(x + sign * phase)."""
        p = self.params
        if p.heterogeneity == "fcsg-repo":
            amplitude = 1.0 + 4.0 * client / max(self.clients - 1, 1)
            phase_index = torch.randint(p.tasks_per_client, (n,), generator=gen) + 1
            return torch.full((n,), amplitude), phase_index.float() * math.pi / 5, 1.0
        if p.heterogeneity == "iid":
            return _uniform(n, AMPLITUDE, gen), _uniform(n, PHASE, gen), -1.0
        width = (AMPLITUDE[1] - AMPLITUDE[0]) / self.clients
        band = (AMPLITUDE[0] + client * width, AMPLITUDE[0] + (client + 1) * width)
        return _uniform(n, band, gen), _uniform(n, PHASE, gen), -1.0

    @staticmethod
    def _episodes(amplitude: Tensor, phase: Tensor, sign: float, shots: int, queries: int, gen: torch.Generator) -> Episodes:
        n = amplitude.numel()
        points = INPUT[0] + (INPUT[1] - INPUT[0]) * torch.rand(n, shots + queries, 1, generator=gen)
        values = amplitude.view(n, 1) * torch.sin(points.squeeze(-1) + sign * phase.view(n, 1))
        return Episodes(points[:, :shots], values[:, :shots], points[:, shots:], values[:, shots:])

    def episodes(self, client: int, n: int, gen: torch.Generator) -> Episodes:
        amplitude, phase, sign = self._client_tasks(client, n, gen)
        return self._episodes(amplitude, phase, sign, self.params.shots, self.params.queries, gen)

    def eval_episodes(self) -> Episodes:
        p = self.params
        gen = generator(p.data_seed, "sinewave-eval")
        if p.heterogeneity == "fcsg-repo":
            amplitude, phase = _uniform(p.eval_tasks, (1.0, 5.0), gen), _uniform(p.eval_tasks, (1.0, 5.0), gen) * math.pi / 5
            return self._episodes(amplitude, phase, 1.0, p.shots, p.eval_queries, gen)
        amplitude, phase = _uniform(p.eval_tasks, AMPLITUDE, gen), _uniform(p.eval_tasks, PHASE, gen)
        return self._episodes(amplitude, phase, -1.0, p.shots, p.eval_queries, gen)

    def metrics_of(self, x: Tensor, episodes: Episodes, steps: int) -> dict[str, float]:
        adapted, _ = self.evaluate_episodes(x, episodes, steps)
        unadapted, _ = self.evaluate_episodes(x, episodes, 0)
        return {"test_loss": sum(adapted) / len(adapted), "test_loss_unadapted": sum(unadapted) / len(unadapted)}
