"""Architecture facts: published parameter counts, the Fixup accounting of each block type, shapes, depths."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import fixup
from fixup.models.resnet_imagenet import LAYERS, Bottleneck, ImageNetResNet
from fixup.models.wide_resnet import WideBlock, WideResNet
from fixup.nn import Bias, Scale

# Every registered image model with an input size it runs at; a new image builder must be added here.
IMAGE_MODELS = {
    "resnet_cifar": 8, "resnet20": 8, "resnet32": 8, "resnet44": 8, "resnet56": 8, "resnet110": 8, "resnet1202": 8,
    "wide_resnet": 8, "wrn28_10": 8, "wrn40_10": 8,
    "resnet_imagenet": 32, "resnet18": 32, "resnet34": 32, "resnet50": 32, "resnet101": 32, "resnet152": 32,
    "resnet_imagenet_tiny": 32, "resnet_imagenet_bottleneck_tiny": 32,
}


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_every_registered_image_model_is_covered() -> None:
    image = {n for pattern in ("resnet*", "wrn*", "wide_resnet*") for n in fixup.list_models(pattern)}
    assert image == set(IMAGE_MODELS)


# The largest take seconds each on a CPU; the same classes run in the default suite at smaller sizes.
LARGE = {"resnet101", "resnet152", "wrn40_10", "resnet1202"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n
                                  for n in sorted(IMAGE_MODELS)])
def test_every_registered_image_model_runs_forward_and_backward(name: str) -> None:
    model = fixup.create_model(name, num_classes=7)
    size = IMAGE_MODELS[name]
    out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, 7) and torch.equal(out, torch.zeros_like(out))  # Fixup: logits exactly 0
    torch.nn.functional.cross_entropy(out, torch.tensor([1, 2])).backward()
    assert model.fc.weight.grad.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("depth", sorted(LAYERS))
def test_imagenet_parameter_counts_are_torchvisions(depth: int) -> None:
    published = {18: 11_689_512, 34: 21_797_672, 50: 25_557_032, 101: 44_549_160, 152: 60_192_808}
    with torch.device("meta"):  # counted without allocating or initialising anything
        bn = ImageNetResNet(*LAYERS[depth], method="batchnorm")
        fx = ImageNetResNet(*LAYERS[depth], method="fixup")
    assert _params(bn) == published[depth]
    norm_params = sum(p.numel() for m in bn.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters())
    scalars = sum(p.numel() for m in fx.modules() if isinstance(m, (Bias, Scale)) for p in m.parameters())
    blocks = sum(LAYERS[depth][1])
    assert scalars == blocks * (7 if LAYERS[depth][0] == "bottleneck" else 5) + 2
    assert _params(fx) == published[depth] - norm_params + scalars
    if depth == 50:
        assert _params(fx) == 25_504_026


def test_wide_resnet_parameter_counts() -> None:
    with torch.device("meta"):
        assert _params(WideResNet(28, 10, method="batchnorm")) == 36_479_194  # "36.5 M" (Zagoruyko & Komodakis)
        assert _params(WideResNet(28, 10, method="fixup")) == pytest.approx(36.5e6, rel=0.01)
        assert _params(WideResNet(16, 8, method="batchnorm")) == pytest.approx(11.0e6, rel=0.01)


def test_bottleneck_branches_have_m_3_and_factor_l_to_the_minus_quarter() -> None:
    model = fixup.create_model("resnet50", generator=torch.Generator().manual_seed(0))
    report = model.init_report
    assert report.num_branches == 16 and {b.m for b in report.branches} == {3}
    assert all(b.factor == pytest.approx(16 ** -0.25) for b in report.branches)
    block = model.layer3[2]
    assert not block.conv3.weight.any()
    he = math.sqrt(2 / (256 * 9))  # conv2: 256 planes, 3x3, fan_out
    assert float(block.conv2.weight.detach().std()) == pytest.approx(he * 0.5, rel=0.03)
    # projections: He, not depth-scaled, one per stage
    assert len(report.shortcuts) == 4
    proj = model.layer2[0].projection
    assert report.shortcuts[1].std == pytest.approx(math.sqrt(2 / 512))
    assert float(proj.weight.detach().std()) == pytest.approx(math.sqrt(2 / 512), rel=0.03)


def test_basic_imagenet_branches_have_m_2() -> None:
    report = fixup.create_model("resnet18").init_report
    assert report.num_branches == 8 and {b.m for b in report.branches} == {2}
    assert report.branches[0].factor == pytest.approx(8 ** -0.5) and len(report.shortcuts) == 3


def test_stride_is_on_the_3x3_convolution_of_a_bottleneck() -> None:
    block = Bottleneck(256, 128, stride=2)
    assert block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2) and block.conv3.stride == (1, 1)
    assert block(torch.randn(1, 256, 8, 8)).shape == (1, 512, 4, 4)


def test_wide_resnet_projects_only_where_width_or_stride_change() -> None:
    model = fixup.create_model("wide_resnet", depth=16, width=1)
    projected = [n for n, m in model.named_modules() if isinstance(m, WideBlock) and m.projection is not None]
    assert projected == ["layer2.0", "layer3.0"]  # width 1: stage 1 keeps 16 channels
    assert model.init_report.num_branches == 6 and len(model.init_report.shortcuts) == 2
    wide = fixup.create_model("wide_resnet", depth=16, width=4)
    assert [n for n, m in wide.named_modules() if isinstance(m, WideBlock) and m.projection is not None] == [
        "layer1.0", "layer2.0", "layer3.0"]


def test_wide_resnet_dropout_sits_in_the_branch_and_only_acts_in_training() -> None:
    model = fixup.create_model("wide_resnet", depth=10, width=1, dropout=0.5, norm="none")
    assert all(isinstance(b.dropout, nn.Dropout) and b.dropout.p == 0.5 for b in model.modules()
               if isinstance(b, WideBlock))
    x = torch.randn(2, 3, 8, 8)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))


@pytest.mark.parametrize(("depth", "message"), [(12, "10 and 16"), (9, "6n\\+4"), (28.0, "6n\\+4")])
def test_wide_resnet_depth_must_be_6n_plus_4(depth: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fixup.create_model("wide_resnet", depth=depth)


def test_bad_imagenet_options_are_errors() -> None:
    with pytest.raises(ValueError, match=r"one of \[18, 34, 50, 101, 152\]"):
        fixup.create_model("resnet_imagenet", depth=20)
    with pytest.raises(ValueError, match="choose one of fixup, batchnorm, groupnorm, none"):
        fixup.create_model("resnet50", norm="layernorm")


def test_groupnorm_uses_32_groups_on_imagenet() -> None:
    with torch.device("meta"):
        model = ImageNetResNet(*LAYERS[50], method="groupnorm")
    assert {m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)} == {32}


@pytest.mark.slow
def test_ten_thousand_layer_wide_resnet_builds_and_runs() -> None:
    model = fixup.create_model("wide_resnet", depth=10_000, width=1)
    assert model.init_report.num_branches == 4998
    assert model.init_report.branches[0].factor == pytest.approx(4998 ** -0.5)
    with torch.no_grad():
        out = model(torch.randn(2, 3, 8, 8))
    assert torch.equal(out, torch.zeros(2, 10))


def test_residual_shape_mismatch_names_the_block_in_every_family() -> None:
    wrn = fixup.create_model("wide_resnet", depth=10, width=1)
    wrn.layer2[0].projection = nn.Conv2d(16, 32, 1, bias=False)  # forgets the stride
    with pytest.raises(ValueError, match=r"layer2\.0: residual branch output has shape \(1, 32, 4, 4\) but the "
                                         r"shortcut has shape \(1, 32, 8, 8\)"):
        wrn(torch.randn(1, 3, 8, 8))
    net = fixup.create_model("resnet_imagenet_bottleneck_tiny")
    net.layer3[0].shortcut = nn.Identity()
    with pytest.raises(ValueError, match=r"layer3\.0: residual branch output has shape \(1, 128, 2, 2\)"):
        net(torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize(("name", "kwargs", "size"), [("resnet_cifar", {"depth": 8, "shortcut": "B"}, 8),
                                                      ("wide_resnet", {"depth": 16, "width": 2}, 8),
                                                      ("resnet_imagenet_tiny", {}, 32),
                                                      ("resnet_imagenet_bottleneck_tiny", {}, 32)])
@pytest.mark.parametrize("norm", ["batchnorm", "groupnorm"])
def test_zeroing_the_last_norm_gain_makes_every_normalised_branch_zero(name, kwargs, size, norm) -> None:
    model = fixup.create_model(name, norm=norm, zero_init_last_norm=True, **kwargs)  # training mode
    blocks = [m for m in model.modules() if hasattr(m, "last_norm")]
    assert len(model.init_report.zeroed) == len(blocks) > 0
    io: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [b.register_forward_hook(lambda m, a, y: io.append((a[0].clone(), y.clone())) and None) for b in blocks]
    model(torch.randn(4, 3, size, size))
    for h in hooks:
        h.remove()
    same = [(x, y) for x, y in io if x.shape == y.shape]
    assert same and all(torch.equal(x, y) for x, y in same)
