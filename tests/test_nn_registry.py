"""Scalar parameters, the checked residual sum, the CIFAR ResNet's shape rules and the registry."""

from __future__ import annotations

import pytest
import torch

import fixup
from fixup import Bias, Scale, residual_add
from fixup.models._registry import register_model


def test_scalars_start_at_identity_and_reset() -> None:
    x = torch.randn(2, 3)
    b, s = Bias(), Scale()
    assert torch.equal(b(x), x) and torch.equal(s(x), x)
    assert b.bias.numel() == 1 and s.scale.numel() == 1
    with torch.no_grad():
        b.bias.fill_(2.0)
        s.scale.fill_(3.0)
    assert torch.allclose(s(b(x)), 3 * (x + 2))
    b.reset_parameters()
    s.reset_parameters()
    assert b.bias.item() == 0.0 and s.scale.item() == 1.0


def test_residual_add_refuses_to_broadcast() -> None:
    with pytest.raises(ValueError, match=r"layer2\.0.*\(2, 1, 4, 4\).*\(2, 8, 4, 4\)"):
        residual_add(torch.zeros(2, 8, 4, 4), torch.zeros(2, 1, 4, 4), "layer2.0")


def test_broken_block_is_named_in_the_error() -> None:
    model = fixup.create_model("resnet20")
    block = model.layer2[1]
    block.conv2 = torch.nn.Conv2d(32, 16, 3, padding=1, bias=False)
    with pytest.raises(ValueError, match=r"layer2\.1: residual branch output has shape \(1, 16, 4, 4\)"):
        model(torch.randn(1, 3, 8, 8))


@pytest.mark.parametrize(("name", "params"), [("resnet20", 0.27e6), ("resnet56", 0.85e6), ("resnet110", 1.7e6)])
def test_parameter_counts_match_the_published_ones(name: str, params: float) -> None:
    model = fixup.create_model(name, norm="batchnorm")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.03)


@pytest.mark.parametrize("depth", [7, 21, 2, "20"])
def test_impossible_depth_is_an_error(depth: object) -> None:
    with pytest.raises(ValueError, match="6n\\+2"):
        fixup.create_model("resnet_cifar", depth=depth)


def test_unknown_norm_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown norm='layer'; the combinations that exist are: norm='fixup'"):
        fixup.create_model("resnet20", norm="layer")
    with pytest.raises(ValueError, match="not available for the CIFAR ResNet; choose one of fixup, batchnorm, "
                                         "groupnorm, none"):
        fixup.create_model("resnet20", norm="layernorm")


def test_plain_network_has_no_scalars() -> None:
    model = fixup.create_model("resnet20", norm="none")
    assert not any(isinstance(m, (Bias, Scale)) for m in model.modules())
    assert model(torch.randn(2, 3, 8, 8)).abs().sum() > 0


def test_registry_lists_and_suggests() -> None:
    assert {"resnet20", "resnet110", "resnet1202", "resnet_cifar"} <= set(fixup.list_models("resnet*"))
    with pytest.raises(ValueError, match="Did you mean resnet110"):
        fixup.create_model("resnet111")


def test_registry_refuses_a_duplicate_name() -> None:
    def resnet20() -> torch.nn.Module:  # same name as a registered builder
        return torch.nn.Identity()

    with pytest.raises(ValueError, match="already registered"):
        register_model(resnet20)


def test_deep_network_builds_and_runs() -> None:
    model = fixup.create_model("resnet_cifar", depth=1202, in_channels=1, num_classes=10)
    assert model.init_report.num_branches == 600
    out = model(torch.randn(2, 1, 8, 8))
    assert torch.equal(out, torch.zeros(2, 10))
