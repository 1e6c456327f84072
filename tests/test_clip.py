"""Gradient clipping (adaptive, Brock et al. 2021) and the errors of ``fixup.param_groups``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fixup
from test_adapt import BasicBlock, ResNet


def test_param_groups_given_adapts_pair_says_to_unpack_it() -> None:
    pair = fixup.adapt(ResNet(BasicBlock, [1, 1], width=8, in_channels=1, small_input=True),
                       torch.randn(2, 1, 8, 8))
    with pytest.raises(TypeError, match=r"model, report = fixup\.adapt"):
        fixup.param_groups(pair, lr=0.1)
    model, _ = pair
    assert fixup.param_groups(model, lr=0.1)  # the fix the message names works


@pytest.mark.parametrize("bad", [[nn.Linear(2, 2)], "resnet20", None, iter(nn.Linear(2, 2).parameters())])
def test_param_groups_refuse_anything_but_a_module_naming_its_type(bad: object) -> None:
    with pytest.raises(TypeError, match=f"expected an nn.Module.*got {type(bad).__name__}"):
        fixup.param_groups(bad, lr=0.1)  # type: ignore[arg-type]
