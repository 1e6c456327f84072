"""Every registered model under every method it accepts: the modules present match the method, and the
weights match the report. Measured on the weights, never read back from the report alone."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import fixup
from fixup.branch import find_branches
from fixup.nn import DyT, Gate
from fixup.report import FixupReport, GateReport, LayerRecord, NFReport, TFixupReport, describe_norm

# Builders small enough to initialise for real in a test (the others are checked on the meta device).
SMALL = {"resnet_cifar": {"depth": 8}, "resnet20": {}, "wide_resnet": {"depth": 10, "width": 2},
         "resnet_imagenet_tiny": {}, "resnet_imagenet_bottleneck_tiny": {}, "transformer_tiny": {}}


# One method per combination of what decides the modules (norm, biases, multiplier, stream bias).
STRUCTURAL = ("fixup", "fixup_no_stream_bias", "fixup_no_bias", "fixup_no_scale", "he", "batchnorm", "groupnorm",
              "layernorm", "rezero", "dyt")


def _accepts(name: str, methods: tuple[str, ...] | None = None) -> list[str]:
    """The methods (of ``methods``, default all) ``name`` builds under (meta device: nothing is allocated)."""
    ok = []
    for method in methods or fixup.METHODS:
        try:
            with torch.device("meta"):
                fixup.create_model(name, method=method)
        except ValueError as err:
            assert "not available for" in str(err), err
            continue
        ok.append(method)
    return ok


def _check_modules(model: nn.Module, method: fixup.Method) -> None:
    biases = [m for m in model.modules() if isinstance(m, fixup.Bias)]
    scales = [m for m in model.modules() if isinstance(m, fixup.Scale) and not isinstance(m, Gate)]
    gates = [m for m in model.modules() if isinstance(m, Gate)]
    branches = [b for _, b in find_branches(model)]
    norms = [m for m in model.modules() if describe_norm("", m) is not None]
    assert bool(biases) == (method.fixup and method.biases), f"{method.name}: {len(biases)} Bias modules"
    assert bool(scales) == (method.fixup and method.scale), f"{method.name}: {len(scales)} Scale modules"
    if method.fixup and method.scale:
        assert all(b.scale is not None for b in branches)
    assert len(gates) == (len(branches) if method.gate else 0), f"{method.name}: {len(gates)} gates"
    assert all(b.gate is not None for b in branches) == method.gate
    streams = [b.stream_bias for b in branches if b.stream_bias is not None]
    assert len(streams) == (len(branches) if method.has_stream_bias and branches[0].kind in
                            ("basic", "bottleneck", "wide-basic") else 0)
    assert bool(norms) == (method.norm in ("batchnorm", "groupnorm", "layernorm"))
    assert any(isinstance(m, DyT) for m in model.modules()) == (method.norm == "dyt")
    report = model.init_report
    assert report.method == method.init if method.fixup else report.method == method.name
    assert isinstance(report, FixupReport) == method.fixup
    if isinstance(report, FixupReport):
        assert report.num_stream_biases == len(streams)
        assert report.stream_bias == (method.stream_bias if streams else "none")
        assert all(b.num_biases == len(br.all_biases) for b, br in zip(report.branches, branches))


def _weight(model: nn.Module, rec: LayerRecord) -> torch.Tensor:
    return model.get_submodule(rec.name).weight.detach()


def _check_stats(model: nn.Module) -> int:
    """Every weight layer in the report has the std the report says (zero exactly where it says 0)."""
    report = model.init_report
    records = list(report.other_layers)
    if isinstance(report, GateReport):
        records += list(report.classifier)
        for b in report.branches:
            records += [*b.layers, *([b.shortcut] if b.shortcut else [])]
            assert float(model.get_parameter(b.gate)) == 0.0, b.gate
    if isinstance(report, FixupReport):
        records += list(report.classifier)
        for b in report.branches:
            records += [*b.scaled, b.zeroed, *([b.shortcut] if b.shortcut else [])]
    if isinstance(report, NFReport):  # the raw weights of the standardised layers
        records += list(report.classifier)
        for block in report.blocks:
            records += [*block.layers, *([block.shortcut] if block.shortcut else [])]
    if isinstance(report, TFixupReport):
        records += [*report.classifier, *report.scaled, *report.embeddings]
    for rec in records:
        w = _weight(model, rec)
        assert list(w.shape) == rec.shape, rec
        if rec.std == 0.0:
            assert torch.count_nonzero(w) == 0, f"{rec.name} should be zero"
        elif w.numel() >= 512:
            # the sample std of n draws is within a few times 1/sqrt(2n) of the true one
            assert float(w.std()) == pytest.approx(rec.std, rel=max(0.05, 6 / math.sqrt(2 * w.numel()))), rec
    return len(records)


# ResNet-1202 (600 blocks) takes half a minute of CPU per method even on the meta device: a slow test.
REGISTRY = [pytest.param(n, marks=pytest.mark.slow) if n == "resnet1202" else n for n in fixup.list_models()]


@pytest.mark.parametrize("name", REGISTRY)
def test_every_registered_model_builds_each_accepted_method_with_matching_modules(name: str) -> None:
    accepted = _accepts(name, STRUCTURAL)
    assert "fixup" in accepted
    for method in accepted:
        with torch.device("meta"):
            model = fixup.create_model(name, method=method)
        _check_modules(model, fixup.METHODS[method])


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_registered_models_have_the_weights_their_report_states(name: str) -> None:
    for method in _accepts(name):
        model = fixup.create_model(name, method=method, generator=torch.Generator().manual_seed(0), **SMALL[name])
        _check_modules(model, fixup.METHODS[method])
        assert _check_stats(model) > 0


def test_transformer_ablations_remove_the_scalars_they_name() -> None:
    """The bug this file exists for: the Transformer built its scalars from its norm alone."""
    for init, bias, scale in (("fixup_no_bias", 0, 11), ("fixup_no_scale", 26, 0), ("fixup", 26, 11)):
        model = fixup.create_model("transformer_tiny", norm="fixup", init=init)
        assert sum(isinstance(m, fixup.Bias) for m in model.modules()) == bias
        assert sum(isinstance(m, fixup.Scale) for m in model.modules()) == scale
