"""Single-logit image models of the imbalanced-binary experiments (EXPERIMENTS.md E3 "Model", E10, 7.6).

* :func:`mnist_conv` -- D-AUPRC's ``MnistModel`` (``xidongwu/D-AUPRC``, ``utils.py``): conv 1->20 5x5,
  ReLU, max-pool 2, conv 20->50 5x5, ReLU, max-pool 2, fc 800->500, ReLU, fc 500->1 (800 = 50 x 4 x 4 for
  28 x 28 inputs; other sizes change the first fc's width). 426,571 parameters at 28 x 28.
* :func:`cifar_conv` -- D-AUPRC's ``CIFARModel``: three padded 3x3 conv blocks 3->16->32->64, each with
  ReLU and max-pool 2, then fc 1024->512, ReLU, 512->64, ReLU, 64->1 (1024 = 64 x 4 x 4 for 32 x 32).
* :func:`fashion_conv` -- a small CNN for FashionMNIST. **The LocalSCGDAM paper's FashionMNIST model is
  in its Appendix B, which is not available; this one is our choice, not a reconstruction**: conv 1->32
  3x3 padded, ReLU, max-pool 2, conv 32->64 3x3 padded, ReLU, max-pool 2, fc 3136->128, ReLU, 128->1.
* :func:`densenet121` -- torchvision's DenseNet121 with ``outputs`` logits, built **without pre-trained
  weights** (they would be downloaded, and the paper does not say whether Melanoma used ImageNet
  pre-training, EXPERIMENTS.md E10). On running statistics see below.
* ResNet20 (CIFAR, option A, 269,137 parameters with one output) is
  :func:`fedcomp.models.resnet.resnet20` with ``num_outputs=1``.

BatchNorm: :func:`densenet121` keeps torchvision's running statistics with ``running_stats=True``
(:class:`~fedcomp.models.functional.FlatModel` carries them as explicit state) and converts its layers to
batch statistics only otherwise (:func:`without_running_stats`).

Weights are not initialised here: draw a flat vector with :func:`fedcomp.models.resnet.init_flat`
(``"xavier"`` is D-AUPRC's and LibAUC's scheme). :func:`output_weight_slice` locates the last linear
layer's weight matrix in that flat vector.
"""

from __future__ import annotations

from torch import nn

__all__ = ["cifar_conv", "densenet121", "fashion_conv", "mnist_conv", "output_weight_slice", "without_running_stats"]


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} = {value!r}: must be a positive integer")


def _pooled(size: int, model: str, steps: list[tuple[int, int]]) -> int:
    """Spatial size after ``steps`` of (conv shrink, pool factor); a clear error when it drops below 1."""
    out = size
    for shrink, pool in steps:
        out = (out - shrink) // pool
        if out < 1:
            raise ValueError(f"image_size = {size}: too small for {model}")
    return out


def mnist_conv(in_channels: int = 1, image_size: int = 28) -> nn.Sequential:
    """D-AUPRC's MNIST model (module docstring); one logit."""
    _check_positive("in_channels", in_channels)
    _check_positive("image_size", image_size)
    side = _pooled(image_size, "mnist-conv (needs at least 16 x 16)", [(4, 2), (4, 2)])
    return nn.Sequential(
        nn.Conv2d(in_channels, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(50 * side * side, 500), nn.ReLU(), nn.Linear(500, 1),
    )  # fmt: skip


def cifar_conv(in_channels: int = 3, image_size: int = 32) -> nn.Sequential:
    """D-AUPRC's CIFAR model (module docstring); one logit."""
    _check_positive("in_channels", in_channels)
    _check_positive("image_size", image_size)
    side = _pooled(image_size, "cifar-conv (needs at least 8 x 8)", [(0, 2), (0, 2), (0, 2)])
    layers: list[nn.Module] = []
    for fan_in, fan_out in ((in_channels, 16), (16, 32), (32, 64)):
        layers += [nn.Conv2d(fan_in, fan_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(
        *layers, nn.Flatten(),
        nn.Linear(64 * side * side, 512), nn.ReLU(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 1),
    )  # fmt: skip


def fashion_conv(in_channels: int = 1, image_size: int = 28) -> nn.Sequential:
    """A small FashionMNIST CNN of our choosing (the paper's is unknown; module docstring); one logit."""
    _check_positive("in_channels", in_channels)
    _check_positive("image_size", image_size)
    side = _pooled(image_size, "fashion-conv (needs at least 4 x 4)", [(0, 2), (0, 2)])
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * side * side, 128), nn.ReLU(), nn.Linear(128, 1),
    )  # fmt: skip


def without_running_stats(module: nn.Module) -> nn.Module:
    """Switch every BatchNorm layer of ``module`` (in place) to batch statistics only and drop its buffers."""
    for mod in module.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.track_running_stats = False
            mod.running_mean = None
            mod.running_var = None
            mod.num_batches_tracked = None
    return module


def densenet121(outputs: int = 1, *, in_channels: int = 3, running_stats: bool = False) -> nn.Module:
    """torchvision's DenseNet121 with ``outputs`` logits and no pre-trained weights (module docstring).

    ``in_channels`` other than 3 replaces the stem convolution (7 x 7, stride 2, 64 channels) by one of the
    same shape with that many input channels. Inputs must be at least 32 x 32 (five halvings).
    """
    _check_positive("outputs", outputs)
    _check_positive("in_channels", in_channels)
    from torchvision.models import densenet121 as tv_densenet121

    model = tv_densenet121(weights=None, num_classes=outputs)
    if in_channels != 3:
        model.features.conv0 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model if running_stats else without_running_stats(model)


def output_weight_slice(module: nn.Module) -> slice:
    """Positions, in the flat parameter vector (``named_parameters`` order), of the weight matrix of the
    module's last ``nn.Linear`` layer (the output layer of every model here)."""
    last = None
    for mod in module.modules():
        if isinstance(mod, nn.Linear):
            last = mod
    if last is None:
        raise ValueError(f"a {type(module).__name__} without an nn.Linear layer has no output weight matrix")
    offset = 0
    for param in module.parameters():
        if param is last.weight:
            return slice(offset, offset + param.numel())
        offset += param.numel()
    raise ValueError("the last nn.Linear layer's weight is not among the module's parameters")
