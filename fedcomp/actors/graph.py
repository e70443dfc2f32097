"""A compiled Ray graph over the client actors (``federation.transport: graph``).

An ordinary actor call costs about a millisecond of Ray's task machinery (submission, scheduling, the reply's
object); a compiled graph (``ray.dag``) is set up once and then passes each message through shared-memory
channels to a loop each actor runs on a background thread: a round trip to two actors takes about a quarter of
the calls' time on the 2-core machine of ``benchmarks/RAY_DAG.md``. That pays where calls are many and small --
FedDRO's per-step exchange, FedNest's sub-rounds on small problems -- and costs where the actors' cores are few:
an idle graph's channel readers poll (half a core to a whole one per idle actor there).

The graph is one node per actor (``ClientActor.graph_step``, bound to the actor's index) fed the same input
-- the pickled call, every actor's cohort members and the call's number -- so that one graph serves every
call of a run whatever its cohort. When an actor dies, reading the graph fails for every actor, the ones that
finished included; each actor therefore keeps its last reply under the call's number
(``ClientActor.graph_reply``), and the federation tears the graph down, takes the survivors' replies from there
with ordinary calls and runs only the dead actor's share again on its replacement, as with calls.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ray.dag import InputNode, MultiOutputNode
from ray.exceptions import RayActorError

DAG_LOGGER = "ray.dag.compiled_dag_node"
CHANNEL_BYTES = 256 * 1024
"""Initial size of each channel's buffer (the federation sends inline payloads only: under 100 KB)."""


class QuietTeardown(logging.Filter):
    """Drops what Ray's compiled-graph logger says below WARNING (its teardown logs each step at INFO, and an actor
    process forwards that to the user's terminal), and its traceback for an actor that could not be stopped because
    it died (the federation has already said so in one line of its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return False
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, RayActorError)


def quiet_teardown() -> None:
    """Install :class:`QuietTeardown` on Ray's compiled-graph logger (once): the graph's own monitor thread tears
    it down when an actor dies, so the filter has to be there before."""
    logger = logging.getLogger(DAG_LOGGER)
    if not any(isinstance(f, QuietTeardown) for f in logger.filters):
        logger.addFilter(QuietTeardown())


class ActorGraph:
    """One compiled graph over ``actors``: :meth:`execute` sends one input to all and gives one reference per actor."""

    def __init__(self, actors: Sequence[Any]) -> None:
        with InputNode() as sent:
            dag = MultiOutputNode([actor.graph_step.bind(sent, i) for i, actor in enumerate(actors)])
        quiet_teardown()
        # one call at a time, in channels sized for the inline payloads (they grow for a larger reply): Ray's
        # defaults (10 in flight, 1 MB each) allocate tens of MB of the object store per graph, which made
        # compiling stall for seconds when graphs were built run after run on kept actors
        self.compiled = dag.experimental_compile(_buffer_size_bytes=CHANNEL_BYTES, _max_inflight_executions=1)

    def execute(self, sent: tuple[bytes, dict[int, list[int]], int]) -> list[Any]:
        """Send ``sent`` to every actor; the references to their replies, in actor order."""
        refs = self.compiled.execute(sent)
        return list(refs)

    def teardown(self) -> None:
        """Stop the actors' graph loops (at once if the graph's monitor did it already, after an actor died)."""
        self.compiled.teardown()
