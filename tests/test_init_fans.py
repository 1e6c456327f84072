"""He, Xavier and orthonormal draws of grouped and depthwise convolutions use the per-group fan.

torch's fan helper counts a convolution's fan-out as out_channels x k^2 whatever its groups; an input unit of
a grouped convolution feeds only its own group, (out_channels / groups) x k^2 outputs. The stds below are
computed by hand from the layer's shape, independently of the library's helpers.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import fixup
from fixup.branch import Branch
from fixup.init import fans, he_init_, he_std, orthonormal_, orthonormal_init_, xavier_init_, xavier_std


@pytest.mark.parametrize(("cin", "cout", "groups", "k"), [(16, 32, 1, 3), (32, 32, 32, 3), (16, 48, 4, 1),
                                                          (24, 24, 8, 5)])
def test_fans_are_per_group(cin: int, cout: int, groups: int, k: int) -> None:
    conv = nn.Conv2d(cin, cout, k, groups=groups)
    assert fans(conv.weight, groups) == ((cin // groups) * k * k, (cout // groups) * k * k)
    assert he_std(conv.weight, "fan_out", groups) == pytest.approx(math.sqrt(2 / ((cout // groups) * k * k)))
    assert he_std(conv.weight, "fan_in", groups) == pytest.approx(math.sqrt(2 / ((cin // groups) * k * k)))
    expected = math.sqrt(2 / ((cin // groups) * k * k + (cout // groups) * k * k))
    assert xavier_std(conv.weight, groups) == pytest.approx(expected)


def test_a_bad_group_count_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"groups must be a positive divisor.*got 5"):
        fans(torch.empty(32, 1, 3, 3), 5)


def test_orthonormal_draw_is_orthonormal_within_each_group() -> None:
    w = torch.empty(64, 4, 3, 3)
    orthonormal_(w, 16, torch.Generator().manual_seed(0))
    rows = w.view(16, 4, 36)
    gram = rows @ rows.transpose(1, 2)
    assert torch.allclose(gram, torch.eye(4).expand(16, 4, 4), atol=1e-5)
    depthwise = orthonormal_(torch.empty(8, 1, 3, 3), 8)
    assert torch.allclose(depthwise.flatten(1).norm(dim=1), torch.ones(8), atol=1e-6)


class _Depthwise(nn.Module):
    """A stem, one residual block whose branch is depthwise then pointwise, a depthwise trunk layer, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.dw = nn.Conv2d(64, 64, 3, padding=1, groups=64)
        self.pw = nn.Conv2d(64, 64, 1)
        self.trunk_dw = nn.Conv2d(64, 64, 3, padding=1, groups=64)
        self.head = nn.Linear(64, 10)

    def residual_branches(self) -> list[Branch]:
        return [Branch([self.dw, self.pw], "dw")]

    def classifier_layers(self) -> list[nn.Module]:
        return [self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.pw(torch.relu(self.dw(x)))
        return self.head(self.trunk_dw(x).mean((2, 3)))


def test_fixup_draws_depthwise_layers_from_their_per_group_fan() -> None:
    torch.manual_seed(0)
    model = _Depthwise()
    fixup.fixup_init_(model, expect_biases=False, expect_scale=False)
    # One branch, m = 2: L^-1/2 = 1. Depthwise fan-out = 9, so the std is sqrt(2/9), not sqrt(2/(64*9)).
    assert model.dw.weight.std().item() == pytest.approx(math.sqrt(2 / 9), rel=0.1)
    # The trunk's depthwise layer is drawn from its fan-in, also 9.
    assert model.trunk_dw.weight.std().item() == pytest.approx(math.sqrt(2 / 9), rel=0.1)


def test_baseline_initialisers_use_the_per_group_fan() -> None:
    torch.manual_seed(0)
    model = _Depthwise()
    he_init_(model, mode="fan_out")
    assert model.dw.weight.std().item() == pytest.approx(math.sqrt(2 / 9), rel=0.1)
    xavier_init_(model)
    assert model.dw.weight.std().item() == pytest.approx(math.sqrt(2 / 18), rel=0.1)
    orthonormal_init_(model)
    assert torch.allclose(model.dw.weight.flatten(1).norm(dim=1), torch.ones(64), atol=1e-5)
