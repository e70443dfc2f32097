"""The platform's exceptions: every user-facing failure is one of these, with a one-line message."""

from __future__ import annotations


class PlatformError(Exception):
    """Base of every error fedcomp raises on purpose."""


class ConfigError(PlatformError, ValueError):
    """A configuration value is unknown, mistyped or out of range (raised before any work starts)."""


class ResourceError(PlatformError):
    """The cluster cannot host what the configuration asks for (GPUs, CPUs, actors that never start)."""


class ClientFailure(PlatformError):
    """A client kept failing after the configured number of retries."""
