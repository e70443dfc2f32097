"""Model builders: parameter counts, output shapes, flat-parameter calls with batch-statistics BatchNorm."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcomp.models.convnets import cifar_conv, densenet121, fashion_conv, mnist_conv, output_weight_slice
from fedcomp.models.functional import FlatModel
from fedcomp.models.resnet import init_flat, resnet20


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(
    "build, shape, params",
    [
        # D-AUPRC MnistModel: 20*1*25+20 + 50*20*25+50 + 800*500+500 + 500+1
        (mnist_conv, (3, 1, 28, 28), 520 + 25_050 + 400_500 + 501),
        # D-AUPRC CIFARModel: 3 convs + 1024*512+512 + 512*64+64 + 64+1
        (cifar_conv, (3, 3, 32, 32), 448 + 4_640 + 18_496 + 524_800 + 32_832 + 65),
        (fashion_conv, (3, 1, 28, 28), 320 + 18_496 + 401_536 + 129),
        (lambda: resnet20(1), (3, 3, 32, 32), 269_137),  # LibAUC's ResNet20 count with one output
        (lambda: resnet20(1, in_channels=1), (3, 1, 28, 28), 269_137 - 2 * 9 * 16),
    ],
)
def test_parameter_counts_and_one_logit(build, shape, params):
    module = build()
    assert count(module) == params
    model = FlatModel(module)
    x = init_flat(module, torch.Generator().manual_seed(0), "xavier")
    out = model(x, torch.randn(shape))
    assert out.shape == (shape[0], 1) and torch.isfinite(out).all()


def test_conv_nets_follow_the_image_size_and_reject_too_small_images():
    assert mnist_conv(image_size=32)[7].in_features == 50 * 5 * 5
    assert cifar_conv(in_channels=1, image_size=8)[10].in_features == 64
    assert FlatModel(fashion_conv(image_size=8))(init_flat(fashion_conv(image_size=8), torch.Generator()),
                                                 torch.randn(2, 1, 8, 8)).shape == (2, 1)
    with pytest.raises(ValueError, match=r"image_size = 8: too small for mnist-conv"):
        mnist_conv(image_size=8)
    with pytest.raises(ValueError, match=r"in_channels = 0: must be a positive integer"):
        cifar_conv(in_channels=0)


def test_densenet121_has_one_output_no_running_stats_and_works_flat():
    module = densenet121(1)
    # torchvision's 7,978,856 parameters with 1000 classes, less the classifier's 1024*999 + 999
    assert count(module) == 7_978_856 - 1024 * 999 - 999 == 6_954_881
    assert list(module.buffers()) == []  # batch statistics only: the flat vector is the whole state
    x = init_flat(module, torch.Generator().manual_seed(0), "xavier")
    images = torch.randn(2, 3, 32, 32)
    out = FlatModel(module)(x, images)
    assert out.shape == (2, 1) and torch.isfinite(out).all()
    module.eval()  # without running statistics, eval mode still normalises with the batch's
    torch.testing.assert_close(FlatModel(module)(x, images), out)
    gray = densenet121(1, in_channels=1)
    assert count(gray) == count(module) - 2 * 64 * 49
    assert len(list(densenet121(1, running_stats=True).buffers())) > 0


def test_output_weight_slice_points_at_the_last_linear_weight():
    cases = ((mnist_conv(), "9.weight"), (resnet20(1), "linear.weight"), (densenet121(1), "classifier.weight"))
    for module, name in cases:
        x = torch.arange(count(module), dtype=torch.float32)
        weight = FlatModel(module).unflatten(x)[name]
        torch.testing.assert_close(x[output_weight_slice(module)], weight.reshape(-1))
    with pytest.raises(ValueError, match=r"without an nn\.Linear layer"):
        output_weight_slice(nn.Conv2d(1, 1, 3))
