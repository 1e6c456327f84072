"""NF-ResNets (Brock, De & Smith 2021): each block's input has the variance its beta says (the block as analysed,
``nf_resnet_nozero``), the standardised convolutions have zero-mean rows of unit fan-scaled norm, the report
accounts for every block, and the families it does not apply to refuse it. ``nf_resnet`` against the authors'
released code (deepmind-research nfnets): each branch's skip gain at 0, AGC on every tensor but the classifier's
weight with the gains clipped as vectors, gains and biases undecayed."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch import nn

import fixup
from fixup.init.nf_resnet import CLASSIFIER_STD
from fixup.models.nf_blocks import NF_ALPHA, NFBasicBlock, NFBottleneck, expected_stds
from fixup.nn import RELU_GAMMA, Gate, ScaledStdConv2d
from fixup.report import NFReport

NF_BLOCKS = (NFBasicBlock, NFBottleneck)
FAMILIES = {  # the smallest model of each family the method applies to
    "resnet_cifar": {"depth": 14},
    "wide_resnet": {"depth": 16, "width": 2},
    "resnet_imagenet_tiny": {},
    "resnet_imagenet_bottleneck_tiny": {},
}


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, NF_BLOCKS)]


def _block_input_variances(model: nn.Module, x: torch.Tensor) -> list[float]:
    """The variance of each block's input h (per channel over batch and positions, averaged over channels), on
    the central half of each map: positions whose receptive field misses the zero padding, which the paper's
    analysis (independent inputs, no borders) does not model."""
    seen: dict[nn.Module, torch.Tensor] = {}
    hooks = [b.register_forward_pre_hook(lambda mod, args: seen.__setitem__(mod, args[0])) for b in _blocks(model)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    out = []
    for block in _blocks(model):
        h = seen[block]
        q = h.shape[-1] // 4
        out.append(float(h[:, :, q:-q, q:-q].var(dim=(0, 2, 3)).mean()))
    return out


@pytest.mark.parametrize(("name", "kwargs"), [("resnet_cifar", {"depth": 26}), ("wide_resnet", {"depth": 22})])
def test_measured_variance_of_each_block_input_follows_beta_squared(name: str, kwargs: dict) -> None:
    """On unit Gaussian images each h_i has variance beta_i^2 (growing by alpha^2 per block, reset at transitions),
    within 5 standard errors of the mean over 6 independently drawn models and batches."""
    seeds = range(6)
    runs = []
    for seed in seeds:
        model = fixup.create_model(name, method="nf_resnet_nozero", generator=torch.Generator().manual_seed(seed),
                                   **kwargs).eval()
        x = torch.randn(8, 3, 96, 96, generator=torch.Generator().manual_seed(100 + seed))
        runs.append(_block_input_variances(model, x))
    betas = [b.beta for b in _blocks(model)]
    assert max(betas) > 1.05  # the test can tell growth from none
    for i, beta in enumerate(betas):
        values = [run[i] for run in runs]
        mean, se = statistics.mean(values), statistics.stdev(values) / math.sqrt(len(values))
        assert abs(mean - beta**2) < 5 * se + 1e-3, (i, beta**2, mean, se)


def test_betas_grow_by_alpha_squared_and_reset_at_each_transition() -> None:
    model = fixup.create_model("resnet_imagenet", depth=50, method="nf_resnet", width=8, num_classes=10)
    blocks = _blocks(model)
    assert len(blocks) == 16 and [b.transition for b in blocks].count(True) == 4  # the first block of each stage
    var = 1.0
    for block in blocks:
        assert block.beta == pytest.approx(math.sqrt(var), rel=1e-12) and block.alpha == NF_ALPHA == 0.2
        var = (1.0 if block.transition else var) + NF_ALPHA**2
    # ResNet-20: the first stage's first block keeps the width, so the variance grows through it (no reset).
    assert expected_stds([False, False, False, True, False])[:4] == pytest.approx(
        [1.0, math.sqrt(1.04), math.sqrt(1.08), math.sqrt(1.12)])
    assert RELU_GAMMA == pytest.approx(1 / math.sqrt(0.5 * (1 - 1 / math.pi)))


def test_scaled_relu_and_a_standardised_convolution_keep_unit_variance() -> None:
    conv = ScaledStdConv2d(32, 64, 3, padding=1)
    nn.init.normal_(conv.weight, 0.0, 5.0)  # any raw scale: standardisation removes it
    x = torch.randn(16, 32, 24, 24, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = conv(fixup.nn.ScaledReLU()(x))[:, :, 1:-1, 1:-1]
    assert float(y.var()) == pytest.approx(1.0, abs=0.08)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_standardised_convolutions_have_zero_mean_rows_of_unit_fan_scaled_norm(name: str) -> None:
    """Every convolution of the NF form is standardised: each output unit's row has mean 0 and variance 1/fan_in
    (norm 1) times its gain, at initialisation and after the raw weights and gains have moved."""
    model = fixup.create_model(name, method="nf_resnet", num_classes=5, generator=torch.Generator().manual_seed(0),
                               **FAMILIES[name])
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(isinstance(c, ScaledStdConv2d) for c in convs)
    assert not [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm))]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(4, 3, 32, 32)
    for _step in range(2):
        for conv in convs:
            w = conv.standardized_weight().detach()
            rows = w.flatten(1)
            gain = conv.gain.detach().flatten()
            torch.testing.assert_close(rows.mean(1), torch.zeros_like(gain), atol=1e-6, rtol=0)
            torch.testing.assert_close(rows.var(1, correction=0) * rows.shape[1], gain**2, rtol=1e-4, atol=1e-6)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), torch.arange(4) % 5).backward()
        opt.step()
    assert any(not torch.equal(c.gain, torch.ones_like(c.gain)) for c in convs)  # the gains learnt


def test_the_report_names_the_method_and_accounts_for_every_block() -> None:
    model = fixup.create_model("resnet_imagenet_bottleneck_tiny", method="nf_resnet")
    report = model.init_report
    assert isinstance(report, NFReport) and report.method == "nf_resnet"
    text = str(report)
    assert text.startswith("Accounting report: method nf_resnet") and "alpha = 0.2" in text and "gamma = 1.71" in text
    blocks = _blocks(model)
    assert report.num_branches == len(report.blocks) == len(blocks)
    assert [r.beta for r in report.blocks] == [b.beta for b in blocks]
    assert [r.transition for r in report.blocks] == [b.transition for b in blocks]
    assert report.num_standardized == sum(isinstance(m, ScaledStdConv2d) for m in model.modules())
    for rec in report.blocks:
        block = model.get_submodule(rec.name)
        assert [layer.name for layer in rec.layers] == [f"{rec.name}.conv{i + 1}" for i in range(3)]
        assert (rec.shortcut is not None) == (block.projection is not None) and rec.gate == f"{rec.name}.scale.scale"
    [cls] = report.classifier
    assert cls.std == CLASSIFIER_STD and float(model.fc.weight.detach().std()) == pytest.approx(CLASSIFIER_STD, rel=0.1)
    assert report.output_std == pytest.approx(math.sqrt(1.04))
    assert not report.warnings and not report.normalization
    assert NFReport.from_dict(report.to_dict()) == report


def test_nf_resnet_starts_every_block_as_its_shortcut_with_the_skip_gains_at_the_weights_rate_undecayed() -> None:
    """The authors' NF_ResNet: ``skip_gain`` initialised by ``jnp.zeros`` on every block (their default)."""
    model = fixup.create_model("resnet_cifar", depth=14, method="nf_resnet").eval()
    gains = [m for m in model.modules() if isinstance(m, Gate)]
    assert len(gains) == len(_blocks(model)) == 6 and all(float(g.scale) == 0.0 for g in gains)
    x = torch.randn(2, 16, 16, 16)
    block = model.layer1[1]
    with torch.no_grad():
        assert torch.equal(block(x), x)
    groups = {g["name"]: g for g in fixup.param_groups(model, lr=0.1, weight_decay=5e-4)}
    assert len(groups["gates"]["params"]) == 6 and groups["gates"]["lr"] == 0.1
    assert groups["gates"]["weight_decay"] == 0.0
    assert all(r.gate for r in model.init_report.blocks)
    nozero = fixup.create_model("resnet_cifar", depth=14, method="nf_resnet_nozero")
    assert not [m for m in nozero.modules() if isinstance(m, Gate)]
    assert not any(r.gate for r in nozero.init_report.blocks)


def test_families_it_does_not_apply_to_refuse_it_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="not available for the Transformer"):
        fixup.create_model("transformer_tiny", method="nf_resnet")
    with pytest.raises(ValueError, match=r"shortcut='A' has no NF form; use shortcut='B'"):
        fixup.create_model("resnet20", method="nf_resnet", shortcut="A")
    with pytest.raises(ValueError, match=r"nf_resnet is not available for CifarResNet: it needs NF-ResNet blocks"):
        fixup.init.initialise_(fixup.create_model("resnet20"), "nf_resnet")


def test_its_recipe_is_adaptive_gradient_clipping_and_a_step_at_batchnorm_s_rate_stays_finite() -> None:
    method = fixup.METHODS["nf_resnet"]
    assert method.clip == "agc" and method.nf and method.norm == "none" and method.family == "resnet"
    model = fixup.create_model("resnet_imagenet_bottleneck_tiny", method=method, num_classes=10,
                               generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(fixup.param_groups(model, lr=0.1, weight_decay=5e-4), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 10
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        fixup.adaptive_clip_grad_(model)
        opt.step()
        assert torch.isfinite(loss)
