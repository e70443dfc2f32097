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
"""

from __future__ import annotations

import logging

AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
ENABLED_NOTICE = "Token authentication is enabled for this Ray cluster"


class DropTokenAuthEnabledNotice(logging.Filter):
    """Drops Ray's "token authentication is enabled ... set RAY_AUTH_MODE=disabled to opt out" record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(ENABLED_NOTICE)


def quiet_ray_start() -> None:
    """Install the filter on Ray's authentication logger (once; safe to call before every ``ray.init``)."""
    logger = logging.getLogger(AUTH_LOGGER)
    if not any(isinstance(f, DropTokenAuthEnabledNotice) for f in logger.filters):
        logger.addFilter(DropTokenAuthEnabledNotice())
