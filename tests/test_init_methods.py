"""Re-initialising a model uses its own method, or says that it does not (fixup.init, one module per method)."""

from __future__ import annotations

import math

import pytest
import torch

import fixup
from fixup.init import INITIALISERS, initialise_


def _branch_std(model: torch.nn.Module) -> float:
    return float(model.layer2[1].conv1.weight.std())


def test_every_method_names_an_initialiser_of_the_package() -> None:
    assert {m.initialiser for m in fixup.METHODS.values()} == set(INITIALISERS)


def test_a_method_naming_no_initialiser_is_refused_with_the_registry() -> None:
    import dataclasses

    typo = dataclasses.replace(fixup.METHODS["he"], initialiser="baseline")
    with pytest.raises(ValueError, match=r"names the initialiser 'baseline', which fixup.init does not have; "
                                         r"choose one of fixup, baselines"):
        initialise_(fixup.create_model("resnet20"), typo)


def test_fixup_init_on_an_ablation_keeps_the_ablation() -> None:
    """The bug: fixup_init_(model) on init="fixup_no_depth_scale" re-applied depth scaling (std 0.117 -> 0.039)."""
    model = fixup.create_model("resnet110", init="fixup_no_depth_scale", generator=torch.Generator().manual_seed(0))
    he = math.sqrt(2 / (32 * 9))  # conv1 of a stage-2 block: fan_out 32 x 3 x 3, no depth factor
    assert _branch_std(model) == pytest.approx(he, rel=0.05)
    report = fixup.fixup_init_(model)
    assert report.method == "fixup_no_depth_scale" and not report.depth_scaling
    assert _branch_std(model) == pytest.approx(he, rel=0.05)
    # A keyword override still changes it, and the report says so.
    report = fixup.fixup_init_(model, depth_scaling=True)
    assert report.method == "fixup_no_depth_scale (ablation)"
    assert _branch_std(model) == pytest.approx(he / math.sqrt(54), rel=0.05)  # L = 54 branches, m = 2


def test_fixup_init_on_a_model_of_another_method_says_it_applied_fixup() -> None:
    model = fixup.create_model("resnet20", init="rezero")
    with pytest.warns(fixup.FixupWarning, match="built for method 'rezero'; fixup_init_ applied 'fixup'"):
        report = fixup.fixup_init_(model)
    assert report.method == "fixup"
    with pytest.raises(ValueError, match="fixup_init_ applies the Fixup forms; method 'he' is not one"):
        fixup.fixup_init_(model, "he")


@pytest.mark.parametrize("init", ["fixup_no_depth_scale", "fixup_scale_x10", "fixup_zero_branch", "sqrt2", "rezero"])
def test_initialise_by_default_re_initialises_by_the_model_s_own_method(init: str) -> None:
    model = fixup.create_model("resnet20", init=init, generator=torch.Generator().manual_seed(0))
    first = model.init_report.to_dict()
    weights = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    again = initialise_(model, generator=torch.Generator().manual_seed(0))
    assert again.to_dict() == first
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def test_the_transformer_is_re_initialised_from_its_own_base() -> None:
    model = fixup.create_model("transformer_tiny")
    assert model.init_report.base_init == "xavier"
    assert fixup.fixup_init_(model).base_init == "xavier"  # no longer He by default
    assert fixup.fixup_init_(model, base="he").base_init == "he"


def test_initialise_needs_a_method_for_a_model_built_elsewhere() -> None:
    with pytest.raises(ValueError, match=r"was not built for a method of fixup\.METHODS"):
        initialise_(torch.nn.Linear(2, 2))
