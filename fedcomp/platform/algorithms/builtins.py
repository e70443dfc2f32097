"""The built-in algorithms as the config and ``fedcomp list`` see them: each one's hyperparameter model, the
problem kind it needs, its description and the module that implements it.

Apart from the implementations, which import torch, so that validating a config (or listing what there is)
imports no torch: this module imports only pydantic and torch-free leaves of fedcomp. Each implementation registers
its class with its declaration here (``@register_algorithm(FEDAVG)``), which gives the class its ``HParams``,
``kind`` and ``description``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from fedcomp.platform.kinds import (
    BILEVEL,
    COMPOSITIONAL,
    COMPOSITIONAL_GLOBAL,
    COMPOSITIONAL_MINIMAX,
    CONDITIONAL,
    MINIMAX,
    PLAIN,
)
from fedcomp.platform.params import Params
from fedcomp.platform.registry import AlgorithmDeclaration, declare_algorithm

# --------------------------------------------------------------------------------- what every local-steps algorithm has


class CommonHParams(Params):
    """Hyperparameters every local-steps algorithm has (the design card's grid axes)."""

    lr: float = Field(0.01, gt=0, description="step size (alpha)")
    local_steps: int = Field(50, ge=1, description="local steps per communication round (q / p / I)")
    outer_batch: int = Field(1, ge=1, description="outer samples (or examples) per local step (b)")


# --------------------------------------------------------------------------------------------- FedAvg, FedAvgM, FedAdam


class FedAvgHParams(CommonHParams):
    """lr, q (``local_steps``) and the batch size (``outer_batch``)."""


class FedAvgMHParams(FedAvgHParams):
    """FedAvg's plus the server step eta and the server momentum beta."""

    server_lr: float = Field(1.0, gt=0, description="server step eta on the momentum")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="server momentum beta in [0, 1) (0 = FedAvg)")


class FedAdamHParams(FedAvgHParams):
    """FedAvg's plus the server Adam's step eta, decay rates and adaptivity tau (Reddi et al.'s defaults)."""

    server_lr: float = Field(0.01, gt=0, description="server step eta")
    server_beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay beta1")
    server_beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay beta2")
    server_tau: float = Field(1e-3, gt=0, description="adaptivity tau (added to sqrt(v))")


# -------------------------------------------------------------------------------------------------------------- FedProx


class FedProxHParams(CommonHParams):
    """lr, p (``local_steps``), batch (``outer_batch``) and the proximal weight mu."""

    mu: float = Field(0.01, ge=0, description="proximal weight mu >= 0 (unknown in the paper; 0 = FedAvg)")


# ------------------------------------------------------------------------------------------------------------- SCAFFOLD


class ScaffoldHParams(CommonHParams):
    """Local step lr (eta_l), p (``local_steps``), batch, the server step eta_g and the control update."""

    server_lr: float = Field(1.0, gt=0, description="eta_g, the server step on the averaged model change")
    control: Literal["option2", "option1"] = Field(
        "option2", description="c_i+ from the local progress (option II, the paper's default) or grad f_i(x) (option I)"
    )
    control_batch: int | None = Field(
        None, ge=1, description="option I: examples of the extra batch at x; null = outer_batch"
    )

    @model_validator(mode="after")
    def _check(self) -> ScaffoldHParams:
        if self.control_batch is not None and self.control != "option1":
            raise ValueError(f"control_batch = {self.control_batch}: only option1 draws a control batch (control = {self.control!r})")
        return self


# ---------------------------------------------------------------------------------------------- LocalSGDM, LocalSGDM_RL


class LocalSGDMHParams(CommonHParams):
    """lr, period p (``local_steps``), batch (``outer_batch``), momentum mu and what is averaged."""

    momentum: float = Field(0.9, ge=0, lt=1, description="mu in [0, 1) (the paper's value is unknown; 0 = FedAvg)")
    average: Literal["all", "model"] = Field(
        "all", description="'all': x and the momentum buffer averaged (Yu et al.); 'model': x only (S10)"
    )


class LocalSGDMRLHParams(LocalSGDMHParams):
    """LocalSGDM's hyperparameters plus the Ratio Loss weights w_c = alpha_rl + beta_rl * Ra_c."""

    alpha_rl: float = Field(1.0, ge=0, description="alpha of the Ratio Loss weights (inferred default)")
    beta_rl: float = Field(0.1, ge=0, description="beta of the Ratio Loss weights (inferred default)")
    weights: Literal["monitor", "prior"] = Field(
        "monitor", description="'monitor': Ra from auxiliary gradients each round; 'prior': Ra from the class prior"
    )
    ratio: Literal["magnitude", "entry-mean"] = Field(
        "magnitude", description="monitor's Ra: ratio of gradient magnitudes, or the re-implementations' mean of entry ratios"
    )


# --------------------------------------------------------------------------------------------- FCSG, FCSG-M, Acc-FCSG-M


class FCSGHParams(CommonHParams):
    """Step size alpha (``lr``), q (``local_steps``), m (``inner_batch``), b (``outer_batch``), B (``first_batch``)."""

    inner_batch: int = Field(10, ge=1, description="inner samples per outer sample (m)")
    first_batch: int = Field(32, ge=1, description="outer samples of the first estimate (B)")


class FCSGMHParams(FCSGHParams):
    """FCSG's hyperparameters plus the momentum weight beta in (0, 1] (beta = 1 is FCSG)."""

    beta: float = Field(0.1, gt=0, le=1, description="momentum weight, in (0, 1]")


# ---------------------------------------------------------------------------------------------- Local-SCGD, Local-SCGDM


class LocalSCGDHParams(CommonHParams):
    """Step size ``lr``, period p (``local_steps``), draws per step b (``outer_batch``), inner-state weight gamma."""

    gamma: float = Field(0.5, gt=0, le=1, description="inner-state weight (moving average of g), in (0, 1]")
    inner_state: Literal["moving-average", "per-task-mix"] = Field(
        "moving-average", description="slides' single inner estimate, or the FCSG code's per-task mixture"
    )
    sync_inner: bool = Field(True, description="u averaged at each communication (the slides), or kept on each client")


class LocalSCGDMHParams(LocalSCGDHParams):
    """Local-SCGD's hyperparameters plus the momentum weight beta in (0, 1] (beta = 1 is Local-SCGD)."""

    beta: float = Field(0.1, gt=0, le=1, description="momentum weight, in (0, 1]")


# ---------------------------------------------------------------------------------------------- LocalSCGDAM, LocalSGDAM


class MomentumGDAHParams(CommonHParams):
    """eta (``lr``), the multipliers gamma_x, gamma_y, beta_x, beta_y, p (``local_steps``) and the batch."""

    lr: float = Field(0.1, gt=0, description="eta, the global step: x moves by gamma_x * eta, y by gamma_y * eta")
    local_steps: int = Field(4, ge=1, description="p, local steps per communication round (the paper: 4, 8, 16)")
    outer_batch: int = Field(32, ge=1, description="examples in the batch zeta of f's gradients, per step")
    gamma_x: float = Field(1.0, gt=0, description="x step multiplier (x step = gamma_x * eta)")
    gamma_y: float = Field(1.0, gt=0, description="y step multiplier (y step = gamma_y * eta)")
    beta_x: float = Field(9.0, gt=0, description="x-momentum weight multiplier: beta_x * eta in (0, 1]")
    beta_y: float = Field(9.0, gt=0, description="y-momentum weight multiplier: beta_y * eta in (0, 1]")
    dual: Literal["unconstrained", "clamp"] = Field(
        "unconstrained", description="'clamp': y kept in [0, 999] after each ascent step (LibAUC margin form, S7)"
    )

    def _check_weights(self, names: tuple[str, ...]) -> None:
        for name in names:
            value = getattr(self, name)
            if not 0 < value * self.lr <= 1:
                raise ValueError(
                    f"{name} = {value!r}: {name} * lr = {value * self.lr:g} must be in (0, 1] (lr = {self.lr!r})"
                )


class LocalSCGDAMHParams(MomentumGDAHParams):
    """LocalSCGDAM's hyperparameters (Algorithm 1): eta, gamma_x, gamma_y, beta_x, beta_y, alpha, p, batches."""

    alpha: float = Field(9.0, gt=0, description="inner-estimate weight multiplier: alpha * eta in (0, 1]")
    inner_batch: int = Field(32, ge=1, description="examples in the batch xi of g and its Jacobian, per step")
    jacobian: Literal["exact", "identity"] = Field(
        "exact", description="J_g^T by a vector-Jacobian (Hessian-vector) product, or the identity (S3)"
    )
    batches: Literal["independent", "shared"] = Field(
        "independent", description="independent draws xi and zeta per step, or one draw for both (S5)"
    )

    @model_validator(mode="after")
    def _check(self) -> LocalSCGDAMHParams:
        self._check_weights(("alpha", "beta_x", "beta_y"))
        return self


class LocalSGDAMHParams(MomentumGDAHParams):
    """LocalSGDAM's hyperparameters: eta, gamma_x, gamma_y, beta_x, beta_y, p, the batch and what is averaged."""

    average: Literal["all", "model"] = Field(
        "all", description="'all': x, y, u, v averaged (inferred default); 'model': x and y only (S10)"
    )

    @model_validator(mode="after")
    def _check(self) -> LocalSGDAMHParams:
        self._check_weights(("beta_x", "beta_y"))
        return self


# ---------------------------------------------------------------------------------------------------------- CoDA, CODA+


StageAverage = Literal["global", "local", "per-round"]


class StagewiseHParams(CommonHParams):
    lr: float = Field(0.1, gt=0, description="eta_0, the first stage's step size (divided by 3 at each new stage)")
    outer_batch: int = Field(32, ge=1, description="examples per local step")
    gamma: float = Field(2000.0, gt=0, description="proximal weight: the term is (1/gamma)(v - v_ref)")
    stage_steps: int = Field(5000, ge=1, description="T0: local steps of the first stage (rounded up to whole rounds)")
    stage_average: StageAverage = Field(
        "global", description="a new stage's v_ref: every client's time average, averaged at the stage's end (the "
        "papers), each client's own (the reference code), or the per-round cohort means' (2d + 1 floats a round)",
    )
    restart_from: Literal["average", "last"] = Field(
        "average", description="a stage starts from the previous stage's time average (the code) or its last iterate"
    )


class CoDAHParams(StagewiseHParams):
    """CoDA: eta_0 (``lr``), I (``local_steps``), T0 (``stage_steps``), gamma and the restart's options."""

    local_steps: int = Field(2, ge=1, description="I, local steps between averages (the reference code: 2)")
    coda_mode: Literal["stagewise", "plain_local_sgda"] = Field(
        "stagewise", description="the stagewise algorithm with dual restarts, or plain local SGDA"
    )
    restart_batches: int | None = Field(
        None, ge=1, description="batches each client scores at a dual restart; null = 3^s at stage s (the code)"
    )


class CODAPlusHParams(StagewiseHParams):
    """CODA+: eta_0 (``lr``), I (``local_steps``), T0 (``stage_steps``), gamma, clip, weight decay, dual step."""

    local_steps: int = Field(8, ge=1, description="I, local steps between averages (the reference code: 8)")
    gamma: float = Field(500.0, gt=0, description="proximal weight: the term is (1/gamma)(v - v_ref)")
    stage_steps: int = Field(4000, ge=1, description="T0: local steps per stage (rounded up to whole rounds)")
    clip: float | None = Field(1.0, gt=0, description="elementwise clip of the primal gradient; null = none")
    weight_decay: float = Field(1e-4, ge=0, description="wd: the primal direction gains wd * v")
    dual_step: Literal["gradient", "closed-form"] = Field(
        "gradient", description="alpha ascends the batch gradient, or LibAUC's 2(m + b - a) - 2 alpha"
    )
    restart_from: Literal["average", "last"] = Field(
        "last", description="a stage continues from the last iterate (LibAUC) or restarts from the time average"
    )
    period_growth: int = Field(1, ge=1, description="g: the period of stage s is min(I g^(s-1), T0); 1 = constant")


# ---------------------------------------------------------------------------------------------------- FedNest, FedAvg-S


class FedNestHParams(Params):
    """alpha (``lr``), beta (``inner_lr``), tau (``local_steps``), T (``inner_rounds``), N, 1/l and batches."""

    lr: float = Field(0.01, gt=0, description="outer step size alpha")
    inner_lr: float = Field(0.01, gt=0, description="inner step size beta")
    local_steps: int = Field(1, ge=1, description="local outer steps tau in FedOut")
    inner_rounds: int = Field(1, ge=1, description="FedInn calls per epoch (T)")
    inner_steps: int = Field(5, ge=1, description="local steps per FedInn call")
    neumann_terms: int = Field(5, ge=1, description="Neumann terms N")
    neumann_lr: float = Field(0.01, gt=0, description="Neumann step 1/l (l bounds the Hessian of g in y)")
    ihgp: Literal["paper", "deterministic", "code"] = Field("paper", description="FedIHGP variant")
    cohorts: Literal["fresh", "shared"] = Field(
        "fresh", description="FedNest: a cohort per sub-round (the paper), or one for FedIHGP, hypergradient and FedOut (the code)"
    )
    inner_batch: int | None = Field(64, ge=1, description="batch of local inner steps; null = all local data")
    inner_sampling: Literal["replacement", "epochs"] = Field(
        "replacement",
        description="FedInn's local batches: drawn with replacement (the paper), or shuffled passes over the local "
        "training part cut into inner_batch-sized batches and a smaller rest (the code's DataLoader: 64 + 36 of 100)",
    )
    outer_batch: int | None = Field(None, ge=1, description="batch of local outer steps; null = all local data")
    oracle_batch: int | None = Field(None, ge=1, description="batch of anchors, HVPs, hypergradients; null = all")


class FedAvgSHParams(Params):
    """alpha (``lr``), beta (``inner_lr``), the period (``local_steps``) and the batch."""

    lr: float = Field(0.01, gt=0, description="descent step on x")
    inner_lr: float = Field(0.01, gt=0, description="ascent step on y")
    local_steps: int = Field(1, ge=1, description="simultaneous local steps per round")
    outer_batch: int | None = Field(None, ge=1, description="batch per step; null = all local data")
    update: Literal["simultaneous", "alternating"] = Field(
        "simultaneous", description="simultaneous (Hou et al.), or y first and x at the new y (the FedNest notebook)"
    )


# --------------------------------------------------------------------------------------------- FedDRO and its baselines


class CompositionalHParams(Params):
    """eta (``lr``) with an optional step schedule, I (``local_steps``) and the batch |b| per client."""

    lr: float = Field(0.01, gt=0, description="step size eta")
    local_steps: int = Field(1, ge=1, description="local steps I between model rounds")
    outer_batch: int | None = Field(16, ge=1, description="batch |b| per client and step; null = all local data")
    lr_milestones: list[int] = Field(default_factory=list, description="rounds after which lr is multiplied by lr_factor")
    lr_factor: float = Field(0.1, gt=0, description="lr multiplier at each milestone (the paper: 0.1 after 90 rounds)")

    def lr_at(self, round: int) -> float:
        """The step size of round ``round`` (a schedule of the round index, not a mutable state)."""
        return self.lr * self.lr_factor ** sum(round >= m for m in self.lr_milestones)


class SharedEstimateHParams(CompositionalHParams):
    kl: Literal["shifted", "plain"] = Field(
        "shifted",
        description="shifted: a running shift keeps a log-scalable inner value (KL-DRO) in float range, identical "
        "to plain while |log y_bar| <= 16; plain: the task's constant shift only",
    )


class FedDROHParams(SharedEstimateHParams):
    beta: float = Field(0.1, gt=0, le=1, description="momentum weight of the y estimator, in (0, 1]")


class _NoMomentumHParams(SharedEstimateHParams):
    """Modified FedAvg has no beta: its estimate is the plain batch value g_k(x_k; b)."""


class ParallelHParams(CompositionalHParams):
    """eta (``lr``, with FedDRO's schedule) and the batch per client; one step per round (I = 1)."""

    local_steps: int = Field(1, ge=1, le=1, description="parallel baselines synchronise every step: I = 1 only")


class FastDROHParams(ParallelHParams):
    """The uncertainty set (``geometry``, ``size``) and penalty ``reg`` of FastDRO's batch robust loss."""

    outer_batch: int = Field(16, ge=1, description="batch b per client and step (pooled: K x b losses)")
    geometry: Literal["cvar", "chi2", "kl"] = Field("chi2", description="uncertainty set of the robust loss")
    size: float | None = Field(
        1.0, gt=0, description="cvar: alpha in (0, 1]; chi2: rho > 0, null = unconstrained (needs reg > 0); kl: null"
    )
    reg: float = Field(0.0, ge=0, description="penalty on the divergence from uniform (KL for cvar and kl, chi2 for chi2)")

    @model_validator(mode="after")
    def _check(self) -> FastDROHParams:
        if self.geometry == "cvar" and (self.size is None or self.size > 1):
            raise ValueError(f"size = {self.size!r}: for geometry 'cvar' it is alpha and must be in (0, 1]")
        if self.geometry == "chi2" and self.size is None and self.reg == 0:
            raise ValueError("size = None: an unconstrained chi2 set needs reg > 0")
        if self.geometry == "kl" and self.size is not None:
            raise ValueError(f"size = {self.size!r}: the 'kl' set is the whole simplex; set size to null")
        if self.geometry == "kl" and self.reg == 0:
            raise ValueError("reg = 0: the 'kl' geometry needs reg = lambda > 0")
        return self

    @property
    def robust(self) -> dict[str, Any]:
        """Keyword arguments of :func:`robust_weights` / :func:`robust_loss`."""
        return {"geometry": self.geometry, "size": float("inf") if self.size is None else self.size, "reg": self.reg}


class GCIVRHParams(ParallelHParams):
    """GCIVR's options: step rule, periodic refresh and initial estimates (code vs paper, see module doc)."""

    outer_batch: int | None = Field(16, ge=1, description="batch b per client and step; null = all local data (the code)")
    optimizer: Literal["sgd", "adagrad"] = Field("sgd", description="'adagrad' as in the code (with lr 0.01)")
    adagrad_eps: float = Field(1e-10, gt=0, description="Adagrad's epsilon (torch.optim.Adagrad's default)")
    refresh_every: int | None = Field(
        None, ge=1, description="fresh estimates of G and J every this many steps (the paper); null = never (the code)"
    )
    refresh_batch: int | None = Field(
        None, ge=1, description="batch per client for fresh estimates (initial and refresh); null = all local data"
    )
    init: Literal["estimate", "code"] = Field(
        "estimate", description="'estimate': G, J fresh at x_0; 'code': G ~ U(0, 1), J = 0 (mlscientist/GCIVR)"
    )


class PDSGDHParams(ParallelHParams):
    """The DRO game (``divergence``, ``lam``; by default the task's) and the relative dual step tau."""

    outer_batch: int = Field(16, ge=1, description="batch b per client and step (pooled: K x b examples)")
    divergence: Literal["task", "kl", "chi2"] = Field(
        "task", description="D(p, uniform) of the game; 'task' = the task's objective (its dual_penalty)"
    )
    lam: float | None = Field(None, gt=0, description="lambda of the game; null = the task's (needs divergence 'task')")
    dual_step: float = Field(
        0.05, gt=0, le=1, description="tau in (0, 1]: the dual step as a fraction of the way to the best response"
    )

    @model_validator(mode="after")
    def _check(self) -> PDSGDHParams:
        if self.divergence == "task" and self.lam is not None:
            raise ValueError(f"lam = {self.lam!r}: give it together with divergence 'kl' or 'chi2' ('task' uses the task's lambda)")
        if self.divergence != "task" and self.lam is None:
            raise ValueError(f"lam = None: divergence {self.divergence!r} needs lam > 0 (or divergence 'task')")
        return self


# ---------------------------------------------------------------------------- the declarations: one per registered name

# FedAvg, FedAvgM, FedAdam, FedProx, SCAFFOLD, LocalSGDM, LocalSGDM_RL
FEDAVG = declare_algorithm(AlgorithmDeclaration(
    "fedavg", FedAvgHParams, PLAIN,
    "FedAvg: local SGD, model averaged every q steps (plain problems)",
    "fedcomp.platform.algorithms.fedavg",
))
FEDAVGM = declare_algorithm(AlgorithmDeclaration(
    "fedavgm", FedAvgMHParams, PLAIN,
    "FedAvgM (Hsu et al. 2019): FedAvg with server momentum on the averaged update",
    "fedcomp.platform.algorithms.fedavg",
))
FEDADAM = declare_algorithm(AlgorithmDeclaration(
    "fedadam", FedAdamHParams, PLAIN,
    "FedAdam (Reddi et al. 2021): FedAvg with a server Adam step on the averaged update",
    "fedcomp.platform.algorithms.fedavg",
))
FEDPROX = declare_algorithm(AlgorithmDeclaration(
    "fedprox", FedProxHParams, PLAIN,
    "FedProx (Li et al. 2020): local SGD with a proximal term to the global model; x averaged (A23)",
    "fedcomp.platform.algorithms.fedprox",
))
SCAFFOLD = declare_algorithm(AlgorithmDeclaration(
    "scaffold", ScaffoldHParams, PLAIN,
    "SCAFFOLD (Karimireddy et al. 2020): control variates correct the client drift (A22)",
    "fedcomp.platform.algorithms.scaffold",
))
LOCAL_SGDM = declare_algorithm(AlgorithmDeclaration(
    "local-sgdm", LocalSGDMHParams, PLAIN,
    "LocalSGDM (Yu et al. 2019): local SGD with momentum; x and the momentum averaged (A20)",
    "fedcomp.platform.algorithms.local_sgdm",
))
LOCAL_SGDM_RL = declare_algorithm(AlgorithmDeclaration(
    "local-sgdm-rl", LocalSGDMRLHParams, PLAIN,
    "LocalSGDM_RL (Wang et al. 2021, reconstruction): LocalSGDM on a monitor-weighted CE (A21)",
    "fedcomp.platform.algorithms.local_sgdm_rl",
))

# FCSG, FCSG-M, Acc-FCSG-M
FCSG = declare_algorithm(AlgorithmDeclaration(
    "fcsg", FCSGHParams, CONDITIONAL,
    "FCSG: federated conditional stochastic gradient (Wu et al. 2023, Alg. 1)",
    "fedcomp.platform.algorithms.fcsg",
))
FCSG_M = declare_algorithm(AlgorithmDeclaration(
    "fcsg-m", FCSGMHParams, CONDITIONAL,
    "FCSG-M: FCSG with momentum; x and u averaged (Wu et al. 2023, Alg. 1)",
    "fedcomp.platform.algorithms.fcsg",
))
ACC_FCSG_M = declare_algorithm(AlgorithmDeclaration(
    "acc-fcsg-m", FCSGMHParams, CONDITIONAL,
    "Acc-FCSG-M: STORM-type variance-reduced FCSG-M (Wu et al. 2023, Alg. 2)",
    "fedcomp.platform.algorithms.fcsg",
))

# Local-SCGD, Local-SCGDM, LocalSCGDAM, LocalSGDAM
LOCAL_SCGD = declare_algorithm(AlgorithmDeclaration(
    "local-scgd", LocalSCGDHParams, COMPOSITIONAL,
    "Local-SCGD: local stochastic compositional gradient descent; x and u averaged (A4)",
    "fedcomp.platform.algorithms.scgd",
))
LOCAL_SCGDM = declare_algorithm(AlgorithmDeclaration(
    "local-scgdm", LocalSCGDMHParams, COMPOSITIONAL,
    "Local-SCGDM: Local-SCGD with momentum; x, u and m averaged (Gao et al. 2022, Alg. 1; A5)",
    "fedcomp.platform.algorithms.scgd",
))
LOCAL_SCGDAM = declare_algorithm(AlgorithmDeclaration(
    "local-scgdam", LocalSCGDAMHParams, COMPOSITIONAL_MINIMAX,
    "LocalSCGDAM: compositional minimax GDA with momentum; x, y, h, u, v averaged (Zhang et al. 2023)",
    "fedcomp.platform.algorithms.local_scgdam",
))
LOCAL_SGDAM = declare_algorithm(AlgorithmDeclaration(
    "local-sgdam", LocalSGDAMHParams, MINIMAX,
    "LocalSGDAM: local minimax GDA with momentum; x, y, u, v averaged [inferred] (Sharma et al. 2022)",
    "fedcomp.platform.algorithms.local_sgdam",
))

# CoDA, CODA+
CODA = declare_algorithm(AlgorithmDeclaration(
    "coda", CoDAHParams, MINIMAX,
    "CoDA: stagewise proximal local SGDA with dual restarts; x, y averaged (Guo et al. 2020; A19)",
    "fedcomp.platform.algorithms.coda.coda",
))
CODA_PLUS = declare_algorithm(AlgorithmDeclaration(
    "coda-plus", CODAPlusHParams, MINIMAX,
    "CODA+: stagewise proximal local primal-dual SGD, alpha >= 0; x, y averaged (Yuan et al. 2021; A7)",
    "fedcomp.platform.algorithms.coda.coda_plus",
))

# FedNest, FedAvg-S
FEDNEST = declare_algorithm(AlgorithmDeclaration(
    "fednest", FedNestHParams, BILEVEL,
    "FedNest: federated bilevel/minimax with SVRG FedInn, FedIHGP, FedOut (Tarzanagh et al. 2022)",
    "fedcomp.platform.algorithms.fednest.algorithms",
))
FEDNEST_SGD = declare_algorithm(AlgorithmDeclaration(
    "fednest-sgd", FedNestHParams, BILEVEL,
    "FedNest_SGD: FedNest with local SGD in FedInn (ablation)",
    "fedcomp.platform.algorithms.fednest.algorithms",
))
LFEDNEST = declare_algorithm(AlgorithmDeclaration(
    "lfednest", FedNestHParams, BILEVEL,
    "LFedNest: local FedInn and local hypergradients, T+1 rounds (reconstructed from the code)",
    "fedcomp.platform.algorithms.fednest.algorithms",
))
LFEDNEST_SVRG = declare_algorithm(AlgorithmDeclaration(
    "lfednest-svrg", FedNestHParams, BILEVEL,
    "LFedNest_SVRG: SVRG FedInn, averaged local hypergradients (code only; inferred)",
    "fedcomp.platform.algorithms.fednest.algorithms",
))
FEDAVG_S = declare_algorithm(AlgorithmDeclaration(
    "fedavg-s", FedAvgSHParams, MINIMAX,
    "FedAvg-S: local simultaneous gradient descent-ascent, x and y averaged (minimax)",
    "fedcomp.platform.algorithms.fedavg_s",
))

# FedDRO and its baselines
FEDDRO = declare_algorithm(AlgorithmDeclaration(
    "feddro", FedDROHParams, COMPOSITIONAL_GLOBAL,
    "FedDRO: y (d_g floats) averaged every local step, x every I steps (FedDRO Alg. 2)",
    "fedcomp.platform.algorithms.feddro",
))
FEDAVG_CO_SHARED_Y = declare_algorithm(AlgorithmDeclaration(
    "fedavg-co-shared-y", _NoMomentumHParams, COMPOSITIONAL_GLOBAL,
    "Modified FedAvg for compositional problems: g_k values averaged every step (FedDRO Thm 4.2)",
    "fedcomp.platform.algorithms.feddro",
))
FEDAVG_CO_1 = declare_algorithm(AlgorithmDeclaration(
    "fedavg-co-1", CompositionalHParams, COMPOSITIONAL_GLOBAL,
    "Vanilla FedAvg for CO, case I: only x shared (FedDRO Alg. 1; stalls for I > 1)",
    "fedcomp.platform.algorithms.feddro",
))
FEDAVG_CO_2 = declare_algorithm(AlgorithmDeclaration(
    "fedavg-co-2", CompositionalHParams, COMPOSITIONAL_GLOBAL,
    "Vanilla FedAvg for CO, case II: x and <g_k(x_bar)> shared at model rounds (FedDRO Alg. 1)",
    "fedcomp.platform.algorithms.feddro",
))
PARALLEL_MBSGD = declare_algorithm(AlgorithmDeclaration(
    "parallel-mbsgd", ParallelHParams, COMPOSITIONAL_GLOBAL,
    "MBSGD (Ghadimi & Lan) in parallel: <g_k(x; b)> exchanged, grad on fresh b', 1 round/step",
    "fedcomp.platform.algorithms.dro_baselines",
))
PARALLEL_FASTDRO = declare_algorithm(AlgorithmDeclaration(
    "parallel-fastdro", FastDROHParams, COMPOSITIONAL_GLOBAL,
    "FastDRO (Levy et al. 2020) in parallel: robust weights over pooled K x b losses, 1 round/step",
    "fedcomp.platform.algorithms.dro_baselines",
))
GCIVR = declare_algorithm(AlgorithmDeclaration(
    "gcivr", GCIVRHParams, COMPOSITIONAL_GLOBAL,
    "GCIVR (Haddadpour et al. 2022) in parallel: SARAH estimates of g and its Jacobian, 1 round/step",
    "fedcomp.platform.algorithms.gcivr",
))
PARALLEL_PDSGD = declare_algorithm(AlgorithmDeclaration(
    "parallel-pdsgd", PDSGDHParams, COMPOSITIONAL_GLOBAL,
    "Primal-dual SGD (reconstruction of the paper's PDSGD) in parallel: x SGD, p on the server, 1 round/step",
    "fedcomp.platform.algorithms.pdsgd",
))
