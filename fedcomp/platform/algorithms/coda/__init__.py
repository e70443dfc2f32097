"""CoDA and CODA+: stagewise proximal primal-dual local SGD for the min-max AUC surrogate -- the schedule and
dual restart (:mod:`.stages`), what the two share (:mod:`.stagewise`), and one module per paper (:mod:`.coda`,
:mod:`.coda_plus`). Importing the package registers ``coda`` and ``coda-plus``."""

from fedcomp.platform.algorithms.coda.coda import CoDA, CoDAHParams, PlainLocalSGDA
from fedcomp.platform.algorithms.coda.coda_plus import CODAPlus, CODAPlusHParams
from fedcomp.platform.algorithms.coda.stages import MarginAUCProblem, ScoredProblem, StagePlan, dual_restart_value

__all__ = [
    "CoDA",
    "CoDAHParams",
    "CODAPlus",
    "CODAPlusHParams",
    "MarginAUCProblem",
    "PlainLocalSGDA",
    "ScoredProblem",
    "StagePlan",
    "dual_restart_value",
]
