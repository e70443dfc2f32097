"""A quiet start: no notices a newcomer has nothing to do about, and nothing about security weakened.

Ray 2.5x turns token authentication on by default for a local instance ``ray.init()`` starts (it writes
a random token to ``~/.ray/auth_token`` and every process of the instance authenticates with it), and
then logs "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt
out" on every start. That record's only advice is to turn a protection off, so fedcomp drops exactly
that record and nothing else: token authentication stays on, and Ray's warning for an instance started
*without* authentication ("Token authentication is disabled ...") still shows.

Setting ``RAY_AUTH_MODE=token`` ourselves would also silence it, but ``ray.init()`` without an address
may join an instance someone started with ``ray start`` on this machine; forcing token mode there
fails when that instance runs without a token. So the record filter is the narrower fix.

Through a Ray Client (``ray://``), the cluster's process that serves the job logs, as it starts, that it set no
SIGTERM handler (:data:`SIGTERM_NOTICE`), and Ray forwards that to the driver's console: dropped too.
"""

from __future__ import annotations

import logging

AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
ENABLED_NOTICE = "Token authentication is enabled for this Ray cluster"
CLIENT_LOGS_LOGGER = "ray.util.client.logsclient"
"""Where a Ray Client connection's driver logs what the cluster's processes for the job log."""
SIGTERM_NOTICE = "SIGTERM handler is not set because current thread is not the main thread"
"""What the Ray Client server's process for the job logs as it starts (its own ``ray.init`` runs in a thread), and
every ``ray://`` run printed: nothing to do about, of a process not the user's."""


class Drop(logging.Filter):
    """Drops a logger's records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


QUIET = {AUTH_LOGGER: ENABLED_NOTICE, CLIENT_LOGS_LOGGER: SIGTERM_NOTICE}
"""Logger -> the one notice of Ray's dropped from it."""


def quiet_ray_start() -> None:
    """Install the filters on Ray's loggers (once; safe to call before every ``ray.init``)."""
    for name, notice in QUIET.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, Drop) and f.prefixes == (notice,) for f in logger.filters):
            logger.addFilter(Drop(notice))
