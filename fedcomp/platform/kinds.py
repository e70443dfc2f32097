"""The problem kinds' names and what each one is (their oracles' protocols are in :mod:`fedcomp.platform.problems`).

A leaf module without torch: the config checks an algorithm's kind against a task's kinds, and ``fedcomp list``
shows them, before any implementation is imported.
"""

from __future__ import annotations

PLAIN = "plain"
CONDITIONAL = "conditional"
BILEVEL = "bilevel"
MINIMAX = "minimax"
COMPOSITIONAL_GLOBAL = "compositional-global"
COMPOSITIONAL = "compositional"
COMPOSITIONAL_MINIMAX = "compositional-minimax"

KIND_DESCRIPTIONS = {
    PLAIN: "(1/K) sum_k E l_k(x): stochastic gradients of a single-level loss",
    CONDITIONAL: "(1/K) sum_k E_xi f_xi(E_{eta|xi} g_eta(x, xi)): outer sample, then inner samples given it",
    BILEVEL: "min_x (1/K) sum_k f_k(x, y*(x)), y*(x) = argmin_y (1/K) sum_k g_k(x, y): gradients and Hessian products",
    MINIMAX: "min_x max_y (1/K) sum_k f_k(x, y): the bilevel case g_k = -f_k",
    COMPOSITIONAL_GLOBAL: "h(x) + f((1/K) sum_k g_k(x)): a low-dimensional inner value averaged across clients",
    COMPOSITIONAL: "(1/K) sum_k f_k(g_k(x)), g_k = E_xi g_k(x; xi), f_k = E_zeta f_k(y; zeta): inner function local to each client",
    COMPOSITIONAL_MINIMAX: "min_x max_y (1/K) sum_k f_k((1/K) sum_k' g_k'(x), y): an inner value averaged across clients",
}
