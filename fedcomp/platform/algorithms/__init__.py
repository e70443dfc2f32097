"""Built-in algorithms, one module per paper family; importing this package registers them."""

from fedcomp.platform.algorithms import (  # noqa: F401
    coda,
    dro_baselines,
    fcsg,
    fedavg,
    fedavg_s,
    feddro,
    fednest,
    fedprox,
    gcivr,
    local_scgdam,
    local_sgdam,
    local_sgdm,
    local_sgdm_rl,
    pdsgd,
    scaffold,
    scgd,
)
from fedcomp.platform.algorithms.base import Algorithm, CommonHParams, LocalSteps, StepInfo

__all__ = ["Algorithm", "CommonHParams", "LocalSteps", "StepInfo"]
