"""Branch layers declared as blocks of a fused parameter (``WeightSlice``), e.g. attention's Q, K, V."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fixup import Bias, Branch, Scale, WeightSlice, fixup_init_
from fixup.init import branch_scale


class AttentionBlock(nn.Module):
    """x + scale * MHA(x + b): the branch is Q, K, V (rows of in_proj_weight) then out_proj: m = 4."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.bias, self.scale = Bias(), Scale()

    def residual_branches(self) -> list[Branch]:
        e = self.attn.embed_dim
        qkv = [WeightSlice(self.attn, "in_proj_weight", (i * e, (i + 1) * e), "in_proj_bias")
               for i in range(3)]
        return [Branch([*qkv, self.attn.out_proj], "attention", biases=[self.bias], scale=self.scale)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bias(x)
        return x + self.scale(self.attn(h, h, h, need_weights=False)[0])


class Net(nn.Module):
    def __init__(self, depth: int = 3, dim: int = 16) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[AttentionBlock(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, 5)

    def classifier_layers(self) -> list[nn.Module]:
        return [self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x).mean(1))


def test_slices_are_initialised_with_their_own_fan_and_the_attention_factor() -> None:
    torch.manual_seed(0)
    model = Net(depth=3, dim=64)
    report = fixup_init_(model, generator=torch.Generator().manual_seed(0))
    assert report.num_branches == 3 and all(b.m == 4 for b in report.branches)
    factor = branch_scale(3, 4)
    assert math.isclose(factor, 3 ** (-1 / 6))
    branch = report.branches[0]
    assert [s.name for s in branch.scaled] == [f"blocks.0.attn.in_proj_weight[{a}:{b}]"
                                              for a, b in ((0, 64), (64, 128), (128, 192))]
    assert branch.scaled[0].type == "MultiheadAttention.in_proj_weight" and branch.scaled[0].shape == [64, 64]
    # He fan_out of one 64x64 projection, not of the fused 192x64 parameter.
    assert math.isclose(branch.scaled[0].std, math.sqrt(2 / 64) * factor)
    assert branch.zeroed.name == "blocks.0.attn.out_proj"
    attn = model.blocks[0].attn
    for i in range(3):
        rows = attn.in_proj_weight[i * 64:(i + 1) * 64]
        assert abs(rows.std().item() / branch.scaled[i].std - 1) < 0.05
    assert torch.count_nonzero(attn.in_proj_bias) == 0 and torch.count_nonzero(attn.out_proj.weight) == 0
    # The attention module is accounted for, not listed as left alone.
    assert not any("attn" in u for u in report.untouched)
    x = torch.randn(2, 5, 64)
    assert torch.equal(model.blocks(x), x)


def test_a_slice_declared_in_two_branches_is_refused() -> None:
    model = Net(depth=2)
    shared = model.blocks[0].attn

    def branches() -> list[Branch]:
        return [Branch([WeightSlice(shared, "in_proj_weight", (0, 16)), shared.out_proj])]

    model.blocks[1].residual_branches = branches
    model.blocks[0].residual_branches = branches
    with pytest.raises(ValueError, match=r"in_proj_weight\[0:16\].*two residual branches"):
        fixup_init_(model)


def test_a_slice_must_name_real_rows_of_a_real_parameter() -> None:
    attn = nn.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match="no tensor parameter 'qkv'"):
        WeightSlice(attn, "qkv")
    with pytest.raises(ValueError, match="outside in_proj_weight"):
        WeightSlice(attn, "in_proj_weight", (0, 40))
