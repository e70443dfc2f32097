"""The server: global algorithm state, cohort sampling, the round program, evaluation and checkpoints.

The same class runs in-process (local backend) and inside the Ray server actor; only the federation it
is given differs. Its whole mutable state -- global state, round index, counters and the clients' private
states -- is what :meth:`Server.checkpoint` returns, so a restored server continues with identical numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fedcomp.platform.accelerator import one_thread
from fedcomp.platform.algorithms.base import Federation, Tensors
from fedcomp.platform.config import Config
from fedcomp.platform.counters import Counters
from fedcomp.platform.errors import AlgorithmError, ConfigError, NotThisRun, TaskError
from fedcomp.platform.federation import build_algorithm, build_task
from fedcomp.platform.problems import PROTOCOLS, lacks
from fedcomp.platform.results import checkpoint_bytes
from fedcomp.platform.rng import generator
from fedcomp.platform.rounds import GlobalBuffers, Round
from fedcomp.platform.server_like import RoundReply
from fedcomp.platform.state import State
from fedcomp.platform.tasks.base import Task


def sample_cohort(seed: int, round: int, clients: int, size: int, sub: int = 0) -> list[int]:
    """The cohort of sub-round ``sub`` of round ``round``: all clients, or ``size`` of them without replacement."""
    if size >= clients:
        return list(range(clients))
    key = (round,) if sub == 0 else (round, sub)
    return sorted(torch.randperm(clients, generator=generator(seed, "cohort", *key))[:size].tolist())


class Server:
    """Runs rounds of ``config``'s algorithm over ``federation``; evaluates the global model x."""

    def __init__(self, config: Config, federation: Callable[[Config], Federation], task: Task | None = None) -> None:
        """``task``: the task to evaluate with and to read the problem from, if one of this config on the CPU is at
        hand (a client actor's, where the server is replicated on them: one copy of the data, not two)."""
        self.config = config
        with one_thread(config.run.deterministic):  # a task's construction, like its evaluation, as on a Ray actor
            task = build_task(config) if task is None else task
            params = task.init_params(generator(config.run.seed, "init"))
        if not (isinstance(params, dict) and "x" in params and all(isinstance(v, torch.Tensor) for v in params.values())):
            raise TaskError(f"task {config.task_name!r}'s init_params returned {type(params).__name__}, not a dict of "
                            f"flat tensors with 'x' (and 'y' for two-level problems)")
        self.algorithm = build_algorithm(config)
        self.state: State = self.algorithm.init(params)
        """The global state: the algorithm's typed ``Server`` record (before round 0: what ``init`` returns,
        which ``Algorithm.start`` completes in round 0)."""
        for name, given in params.items():  # a user's init that reshapes or casts the task's variables
            made = getattr(self.state, name, None)
            if isinstance(made, torch.Tensor) and (made.shape != given.shape or made.dtype != given.dtype):
                raise AlgorithmError(
                    f"{type(self.algorithm).__qualname__}.init: its {name} is {made.dtype} of shape {tuple(made.shape)}, "
                    f"the task's {name} {given.dtype} of shape {tuple(given.shape)}; start from the task's variables "
                    f"as they are (variables[{name!r}].clone())")
        self.counters = Counters()
        self.train_loss = float("nan")
        with one_thread(config.run.deterministic):  # what the evaluator computes once (a task's optimum) too
            self._evaluate = task.evaluator()
        self.problem = task.problem(self.algorithm.kind)
        missing = lacks(self.problem, self.algorithm.kind)
        if missing:
            raise TaskError(f"task {config.task_name!r} offers the {self.algorithm.kind!r} problem kind, but its problem "
                            f"lacks {', '.join(missing)} ({PROTOCOLS[self.algorithm.kind].__name__} in "
                            f"fedcomp.platform.problems: what algorithm {config.algorithm_name!r} calls)")
        self.algorithm.check_problem(self.problem)
        self._stats_model = task.running_statistics()
        self.buffers = (
            None if self._stats_model is None
            else GlobalBuffers(self._stats_model.initial_buffers(), task.batchnorm == "averaged")
        )  # fmt: skip
        """The model's running statistics (BatchNorm), where it keeps them: what the server evaluates with."""
        self.federation = federation(config)
        self.round_s = 0.0
        """Seconds spent in round programs so far (federation calls included)."""

    def run_round(self) -> dict[str, Any]:
        """One communication round; returns the cumulative counters and the round's training loss."""
        with one_thread(self.config.run.deterministic):
            return self._run_round()

    def _run_round(self) -> dict[str, Any]:
        fed, run = self.config.federation, self.config.run
        r = self.counters.round
        cohort = lambda sub=0: sample_cohort(run.seed, r, fed.clients, fed.cohort_size, sub)  # noqa: E731
        rng = lambda *ids: generator(run.seed, "server", r, *ids)  # noqa: E731
        started = time.perf_counter()
        round_ = Round(self.federation, r, cohort, rng, self.problem, fed.clients, self.buffers)
        state = self.algorithm.start(round_, self.state) if r == 0 else self.state
        self.state = self.algorithm.round(round_, state)
        record = round_.finish()
        self.round_s += time.perf_counter() - started
        self.counters.add(record)
        self.train_loss = record.train_loss
        return {**self.counters.as_dict(), "train_loss": record.train_loss}

    def one_round(self, evaluate: bool) -> RoundReply:
        """:meth:`run_round`, then (``evaluate``) :meth:`evaluate`: the round's record, the evaluation and the
        seconds it took -- one call for a round and its evaluation, so that a server behind a hop (the Ray
        server actor) pays the hop once."""
        record = self.run_round()
        if not evaluate:
            return record, None, 0.0
        started = time.perf_counter()
        metrics = self.evaluate()
        return record, metrics, time.perf_counter() - started

    def run_rounds(self, evaluated: Sequence[bool]) -> Iterator[RoundReply]:
        """One round after another (see :meth:`ServerLike.run_rounds`); in-process there is no hop to hide."""
        for evaluate in evaluated:
            yield self.one_round(evaluate)

    def tensors(self) -> Tensors:
        """The global state as named tensors (what is evaluated and checkpointed)."""
        return self.state.tensors()

    def evaluate(self) -> dict[str, float]:
        """The task's metrics of the global model, computed with one torch thread under ``run.deterministic`` as
        on a client actor (:func:`~fedcomp.platform.accelerator.one_thread`): a mean over 50,000 test samples is
        split across threads, and the driver's 2 threads ended quickstart's test loss in other last bits than the
        replicated server's one."""
        if self._stats_model is not None and self.buffers is not None:
            self._stats_model.running = self.buffers.value
        with one_thread(self.config.run.deterministic):
            return self._evaluate(self.tensors())

    def model(self) -> torch.Tensor:
        return self.tensors()["x"].detach().clone()

    def checkpoint(self) -> dict[str, Any]:
        return {
            "state": {k: v.detach().cpu().clone() for k, v in self.tensors().items()},
            "counters": self.counters.as_dict(),
            "train_loss": self.train_loss,
            "private": self.federation.private_states(),
            "buffers": None if self.buffers is None else self.buffers.value.detach().cpu().clone(),
        }

    def checkpoint_file(self, extra: dict[str, Any]) -> bytes:
        return checkpoint_bytes({"server": self.checkpoint(), **extra})

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Take the server's state, counters and the clients' private states from ``checkpoint`` (its identity
        checked already: :func:`~fedcomp.platform.run_checks.open_checkpoint`).

        Raises:
            NotThisRun: it does not hold this run's state (a field missing, the model of another size).
        """
        try:
            state = {k: v.clone() for k, v in checkpoint["state"].items()}
            counters = Counters(**checkpoint["counters"])
            record = self.algorithm.Server if counters.round > 0 else type(self.state)  # round 0: init's record
            restored = record.of(state)
        except (KeyError, TypeError, AttributeError) as error:
            raise NotThisRun(f"the checkpoint does not hold this run's server state ({type(error).__name__}: "
                             f"{error})") from None
        for name in ("x", "y"):  # the variables keep their size; other fields may take theirs as the run goes
            fresh, kept = self.state.tensors().get(name), restored.tensors().get(name)
            if fresh is not None and kept is not None and fresh.shape != kept.shape:
                raise NotThisRun(f"the checkpoint's {name} has shape {tuple(kept.shape)}, this run's "
                                 f"{tuple(fresh.shape)}: it is not this run's checkpoint")
        self.counters, self.state = counters, restored
        self.train_loss = checkpoint["train_loss"]
        if self.buffers is not None:
            if checkpoint.get("buffers") is None:
                raise ConfigError(
                    "task.batchnorm: the checkpoint holds no BatchNorm running statistics (written with batchnorm: "
                    "batch or before they were kept); resume with task.batchnorm: batch"
                )
            self.buffers.value = checkpoint["buffers"].clone()
        self.federation.load_private_states(checkpoint["private"])

    def profile(self) -> dict[str, float]:
        """Seconds per phase of the rounds so far: the federation's phases (where it keeps them) and the
        round program's own time outside federation calls."""
        phases = dict(getattr(self.federation, "profile", {}))
        phases["server round program"] = self.round_s - sum(phases.values())
        return phases

    def describe(self) -> dict[str, Any]:
        """The backend the clients run on (recorded in ``run.json``)."""
        return self.federation.describe()

    def close(self) -> None:
        self.federation.close()
