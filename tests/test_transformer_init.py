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
    for rec in report.branches:
        for layer in rec.scaled:
            w = torch.empty(layer.shape)
            he = math.sqrt(2 / (layer.shape[0] * 9))  # fan_out of a 3x3 convolution
            expected = (xavier_std(w) if base == "xavier" else he) * rec.factor
            assert layer.std == pytest.approx(expected)
    assert ("Xavier" in report.format()) == (base == "xavier")
    assert fixup.FixupReport.from_dict(report.to_dict()).base_init == base


def test_default_base_is_he_and_unknown_base_is_refused():
    model = fixup.create_model("resnet20")
    assert fixup.fixup_init_(model).base_init == "he"
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="base must be one of"):
        fixup.fixup_init_(model, base="orthogonal")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
