"""The base of every frozen, validated parameter model: task parameters, algorithm hyperparameters and the
config's sections. A leaf module (it imports nothing of fedcomp), so algorithms and tasks can subclass it
without importing the config loader or the registry."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Params(BaseModel):
    """Frozen, forbids unknown keys, validates defaults, and rejects infinite and NaN floats (``lr=inf`` would
    otherwise run to a NaN loss) in every float field of every section, task and algorithm."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)
