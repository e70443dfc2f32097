"""Keyed random streams.

Every random draw in a run comes from a generator keyed by ``(seed, stream, *ids)`` -- e.g.
``("client-step", client, step)`` or ``("cohort", round)``. Nothing depends on how many draws happened
before, on which process makes the draw, or on how clients are packed into actors; this is what makes
runs identical on every backend and after a resume. Draws are made on the CPU, so a GPU run sees the same
numbers too.
"""

from __future__ import annotations

import hashlib

import torch


def key_seed(seed: int, stream: str, *ids: int) -> int:
    """A 63-bit integer derived from ``(seed, stream, *ids)`` by a cryptographic hash."""
    text = "/".join([str(seed), stream, *map(str, ids)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(seed: int, stream: str, *ids: int) -> torch.Generator:
    """A fresh CPU ``torch.Generator`` for the stream ``(seed, stream, *ids)``."""
    gen = torch.Generator()
    gen.manual_seed(key_seed(seed, stream, *ids))
    return gen
