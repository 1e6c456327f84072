"""Inference folding is exact: the folded model computes what the trained one does, with fewer scalars."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fixup.fold import fold_after, fold_for_inference
from fixup.models import create_model
from fixup.nn import Bias, Scale
from fixup.ops import set_lean


def _trained_like(**kwargs) -> nn.Module:
    """A model whose scalars are far from their initial values, as after training."""
    model = create_model("resnet_cifar", depth=14, generator=torch.Generator().manual_seed(0), **kwargs)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


@pytest.mark.parametrize("shortcut", ["A", "B"])
@pytest.mark.parametrize("lean", [True, False])
def test_folded_model_equals_the_original(shortcut, lean):
    model = set_lean(_trained_like(shortcut=shortcut), lean).eval()
    result = fold_for_inference(model)
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        ref, out = model(x), result.model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    blocks = 6  # depth 14: 2 blocks per stage
    assert result.folded == 3 * blocks + 2  # b1b, scale, b2b per block; the stem's and the head's bias
    assert result.kept == 2 * blocks  # b1a and b2a sit before padded convolutions
    assert not any(isinstance(m, Scale) for m in result.model.modules())
    assert sum(isinstance(m, Bias) for m in result.model.modules()) == result.kept
    assert not result.model.training
    assert any(isinstance(m, Scale) for m in model.modules())  # the original is untouched


def test_fold_after_is_scale_then_bias_including_the_layer_bias():
    conv = nn.Conv2d(3, 4, 3, padding=1, bias=True)
    scale, bias = Scale(), Bias()
    with torch.no_grad():
        scale.scale.fill_(-1.7)
        bias.bias.fill_(0.4)
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        ref = bias(scale(conv(x)))
        assert fold_after(conv, scale, bias) == 2
        torch.testing.assert_close(conv(x), ref)


def test_batchnorm_model_is_left_as_it_is():
    model = create_model("resnet20", norm="batchnorm").eval()
    result = fold_for_inference(model)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), model(x))
    assert result.folded == 0 and result.unsupported == []


def test_unknown_block_with_scalars_is_named():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = Bias()
            self.lin = nn.Linear(2, 2)

        def residual_branches(self):
            return []

        def forward(self, x):
            return x + self.lin(self.bias(x))

    result = fold_for_inference(nn.Sequential(Odd()))
    assert result.unsupported == ["Odd"] and result.folded == 0 and result.kept == 1
