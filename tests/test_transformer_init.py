"""fixup_init_(base=...): the standard initialisation rule 2 scales (He: ResNets, Xavier: Transformers)."""

from __future__ import annotations

import math

import pytest
import torch

import fixup
from fixup.init import base_std, xavier_std


def test_xavier_std_is_glorot():
    w = torch.empty(30, 20)
    assert xavier_std(w) == pytest.approx(math.sqrt(2 / 50))
    assert base_std(w, "xavier") == xavier_std(w)
    assert base_std(w, "he", "fan_in") == pytest.approx(math.sqrt(2 / 20))
    with pytest.raises(ValueError, match="base must be one of"):
        base_std(w, "lecun")


@pytest.mark.parametrize("base", ["he", "xavier"])
def test_base_init_applies_before_depth_scaling(base):
    model = fixup.create_model("resnet20")
    report = fixup.fixup_init_(model, base=base, generator=torch.Generator().manual_seed(0))
    assert report.base_init == base
    factor = 9 ** -0.5  # resnet20: L = 9 branches of m = 2 convolutions, L^(-1/(2m-2)) = 1/3
    assert len(report.branches) == 9
    for rec in report.branches:
        for layer in rec.scaled:
            conv = model.get_submodule(layer.name)
            out_ch, in_ch, kh, kw = conv.weight.shape
            # The draw's std written out here: He from the fan-out (the default mode), Glorot from both fans.
            std = math.sqrt(2 / (out_ch * kh * kw)) if base == "he" else math.sqrt(2 / ((in_ch + out_ch) * kh * kw))
            # Measured on the drawn weight: n >= 2304 normal draws, so the sample std is within
            # 5 standard errors (1/sqrt(2n) relative) of the truth.
            n = conv.weight.numel()
            assert conv.weight.std().item() == pytest.approx(std * factor, rel=5 / math.sqrt(2 * n)), layer.name
            assert abs(conv.weight.mean().item()) < 5 * std * factor / math.sqrt(n)
            assert layer.std == pytest.approx(std * factor)  # and the report says what was drawn
    assert ("Xavier" in report.format()) == (base == "xavier")
    assert fixup.FixupReport.from_dict(report.to_dict()).base_init == base


def test_default_base_is_he_and_unknown_base_is_refused():
    model = fixup.create_model("resnet20")
    assert fixup.fixup_init_(model).base_init == "he"
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="base must be one of"):
        fixup.fixup_init_(model, base="orthogonal")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
