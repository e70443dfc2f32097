"""ResNet20 for 32 x 32 images (He et al. 2016, CIFAR variant) and the flat initialisation of conv nets.

The network: a 3 x 3 conv to 16 channels, three stages of three basic blocks at 16, 32 and 64 channels
(the first block of stages 2 and 3 halves the resolution), global average pooling and a linear layer to
``num_outputs``. Shortcuts are option A (parameter-free): a strided subsample padded with zero channels,
implemented by the module :class:`ShortcutA` rather than a lambda so the model pickles (Ray ships it).
With 10 outputs it has 269,722 parameters (269,137 with 1), the count of the RECOVER and LibAUC versions.

BatchNorm: ``running_stats=True`` is standard BatchNorm with running statistics, which
:class:`~fedcomp.models.functional.FlatModel` keeps as explicit state outside the module (the platform
carries them per client and averages them with the model, see ``task.batchnorm``); ``running_stats=False``
normalises with the batch's statistics in training and evaluation alike (evaluate in large batches then,
since predictions depend on the evaluation batch).

Initialisation (:func:`init_flat`) draws from an explicit generator: ``"kaiming"`` (He-normal, fan-in, on
conv and linear weights; RECOVER's ``resnet20.py``) or ``"xavier"`` (Xavier-normal; LibAUC's version);
linear bias uniform(+-1/sqrt(fan_in)) as PyTorch's default; BatchNorm weight 1, bias 0.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["BasicBlock", "ResNet20", "ShortcutA", "init_flat", "resnet20"]

Init = Literal["kaiming", "xavier"]


class ShortcutA(nn.Module):
    """Option-A shortcut: keep every second pixel and pad ``pad`` zero channels on each side."""

    def __init__(self, pad: int) -> None:
        super().__init__()
        self.pad = pad

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))

    def extra_repr(self) -> str:
        return f"pad={self.pad}"


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus shortcut, then ReLU."""

    def __init__(self, in_planes: int, planes: int, stride: int, running_stats: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes, track_running_stats=running_stats)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, track_running_stats=running_stats)
        if stride != 1 or in_planes != planes:
            if stride != 2 or planes - in_planes != 2 * (planes // 4):
                raise ValueError(
                    f"option-A shortcut: needs stride 2 and planes = 2 * in_planes, got {in_planes}->{planes}"
                )
            self.shortcut: nn.Module = ShortcutA(planes // 4)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """CIFAR ResNet20 (3 stages x 3 basic blocks, 16/32/64 channels, option-A shortcuts)."""

    def __init__(self, num_outputs: int = 10, *, running_stats: bool = False, in_channels: int = 3) -> None:
        super().__init__()
        for name, value in (("num_outputs", num_outputs), ("in_channels", in_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r}: must be a positive integer")
        if not isinstance(running_stats, bool):
            raise ValueError(f"running_stats = {running_stats!r}: must be True or False")
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16, track_running_stats=running_stats)
        stages = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for s in (stride, 1, 1):
                blocks.append(BasicBlock(in_planes, planes, s, running_stats))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.linear = nn.Linear(64, num_outputs)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


def resnet20(num_outputs: int = 10, *, running_stats: bool = False, in_channels: int = 3) -> ResNet20:
    """A :class:`ResNet20`; ``running_stats=False`` normalises with batch statistics only (module docstring)."""
    return ResNet20(num_outputs, running_stats=running_stats, in_channels=in_channels)


def init_flat(module: nn.Module, gen: torch.Generator, scheme: Init = "kaiming") -> Tensor:
    """A fresh flat float32 parameter vector for ``module`` (in ``named_parameters`` order), drawn from ``gen``.

    Conv and linear weights: He-normal (fan-in, gain sqrt(2)) for ``"kaiming"``, Xavier-normal for
    ``"xavier"``; linear biases uniform(+-1/sqrt(fan_in)); BatchNorm weights 1 and biases 0. The module
    itself is not modified.
    """
    if scheme not in ("kaiming", "xavier"):
        raise ValueError(f"scheme = {scheme!r}: allowed: 'kaiming', 'xavier'")
    owners = {}
    for mod_name, mod in module.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            owners[f"{mod_name}.{p_name}" if mod_name else p_name] = (mod, p_name)
    parts = []
    for name, param in module.named_parameters():
        mod, p_name = owners[name]
        value = torch.empty(param.shape, dtype=torch.float32)
        if isinstance(mod, (nn.Conv2d, nn.Linear)) and p_name == "weight":
            if scheme == "kaiming":
                nn.init.kaiming_normal_(value, mode="fan_in", nonlinearity="relu", generator=gen)
            else:
                nn.init.xavier_normal_(value, generator=gen)
        elif isinstance(mod, (nn.Conv2d, nn.Linear)) and p_name == "bias":
            fan_in = math.prod(mod.weight.shape[1:])
            bound = 1 / math.sqrt(fan_in)
            value = (torch.rand(param.shape, generator=gen) * 2 - 1) * bound
        elif isinstance(mod, nn.modules.batchnorm._BatchNorm):
            value.fill_(1.0 if p_name == "weight" else 0.0)
        else:
            raise ValueError(
                f"parameter {name!r} of a {type(mod).__name__}: init_flat knows conv, linear and BatchNorm only"
            )
        parts.append(value.reshape(-1))
    return torch.cat(parts)
