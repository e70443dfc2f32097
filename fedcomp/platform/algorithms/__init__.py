"""Built-in algorithms, one module per paper family; importing this package registers them."""

from fedcomp.platform.algorithms import dro_baselines, fcsg, fedavg, feddro, fednest, scgd  # noqa: F401
from fedcomp.platform.algorithms import fedprox, local_sgdm, scaffold  # noqa: F401  (plain-loss baselines, A20-A23)
from fedcomp.platform.algorithms import coda, local_scgdam  # noqa: F401  (minimax AUC: A7, A17-A19)
from fedcomp.platform.algorithms.base import Algorithm, CommonHParams, State, StepInfo

__all__ = ["Algorithm", "CommonHParams", "State", "StepInfo"]
