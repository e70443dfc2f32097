"""What the driver and the client actors' group (:mod:`fedcomp.actors.collective`) agree on: how long the actors
may take to meet, and the error a broken group raises. Apart from the group itself, which imports torch, so that
a Ray run's driver does not.
"""

from __future__ import annotations

JOIN_TIMEOUT_S = 20.0
"""How long the actors wait for each other at the group's rendezvous and for their connections (e.g. a cluster
whose firewall blocks the ports): the federation then makes its exchanges by calls."""


class GroupBroken(RuntimeError):
    """A gather of the exchange failed: another actor of the group died or left it (after an error of its own)."""
