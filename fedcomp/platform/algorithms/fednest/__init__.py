"""FedNest and its variants -- "FedNest: Federated Bilevel, Minimax, and Compositional Optimization"
(Tarzanagh et al., ICML 2022), Algorithms 1-4, as restated in ``reference/ALGORITHMS.md`` section 7.

One round here is one FedNest *epoch* (outer iteration k), made of communication sub-rounds, each counted
and each on a fresh cohort. The sub-rounds are the functions below, and each algorithm's round composes them:

* FedInn by SVRG (2 rounds, :func:`fedinn_svrg`): q = <grad_y g_i(x, y)>; every client runs ``inner_steps``
  steps y_i <- y_i - beta (grad_y g_i(x, y_i; z) - grad_y g_i(x, y; z) + q) on one batch z per step;
  y = <y_i>. By local SGD instead (1 round, :func:`fedinn_sgd`): y_i <- y_i - beta grad_y g_i(x, y_i; z).
* FedIHGP: ``paper`` (1 + N' rounds): p_0 = (N / l) <grad_y f_i(x, y)>, then N' ~ U{0..N-1} rounds of
  p_n = <(I - H_i / l) p_{n-1}> with H_i = grad^2_yy g_i -- an unbiased truncated Neumann estimate of
  [grad^2_yy g]^{-1} grad_y f. ``deterministic``: p = (1/l) sum_{n=0..N} (I - H/l)^n grad_y f in 1 + N
  rounds. ``code``: the authors' code -- fixed N rounds, no N/l factor, each client multiplying its own
  counter by (I - H_i / l), the server adding (1/n) <counter> -- **[derived from the code reading in
  ALGORITHMS.md 7.5; reconstruction]**, with the indirect term scaled by 1/l as in the
  hyper-representation code.
* FedOut by SVRG (2 rounds): h = <grad_x f_i(x, y) - grad^2_xy g_i(x, y) p>; every client runs
  ``local_steps`` (tau) steps x_i <- x_i - alpha (grad_x f_i(x_i, y; z) - grad_x f_i(x, y; z) + h); x = <x_i>.
  For minimax problems (g = -f) the indirect term vanishes and FedIHGP is skipped.

Rounds per epoch: FedNest 2T + N' + 3 (2T + N + 3 with a fixed N), FedNest_SGD T + N' + 3, LFedNest T + 1
(local hypergradients with each client's own Hessian, tau local outer steps, then x averaged),
LFedNest_SVRG 2T + 2 **[inferred]**. The paper's minimax baseline FedAvg-S is in :mod:`fedcomp.platform.algorithms.fedavg_s`.
Anchors, grad_y f, Hessian products and hypergradients use each client's full local data unless
``oracle_batch`` is set (the code's choice; pitfall N4).

A FedNest client keeps nothing between sub-rounds (except the ``code`` variant's counter): each client
program reads the typed message its sub-round broadcasts -- the type of its ``view`` parameter -- and
returns the vector the server averages.

Modules: :mod:`.base` (hyperparameters, messages), :mod:`.fedinn`, :mod:`.fedihgp`, :mod:`.fedout` (each sub-round:
what the server does and the client programs it calls), :mod:`.algorithms` (the four epochs).
"""

from fedcomp.platform.algorithms.fednest.algorithms import FedNest, FedNestSGD, LFedNest, LFedNestSVRG
from fedcomp.platform.algorithms.fednest.base import FedNestHParams, Point, epoch_batch, fresh_cohorts
from fedcomp.platform.algorithms.fednest.fedinn import fedinn_sgd, fedinn_svrg

__all__ = [
    "FedNest", "FedNestHParams", "FedNestSGD", "LFedNest", "LFedNestSVRG", "Point", "fedinn_sgd", "fedinn_svrg",
    "epoch_batch", "fresh_cohorts",
]
