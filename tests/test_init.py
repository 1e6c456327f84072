"""Properties of the Fixup rule as `fixup_init_` applies it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import fixup
from fixup import Bias, Branch, Scale, branch_scale, fixup_init_
from fixup.init import he_std
from fixup.report import FixupReport


def test_branch_scale_matches_hand_computed_values() -> None:
    assert branch_scale(9, 2) == pytest.approx(1 / 3)
    assert branch_scale(54, 2) == pytest.approx(54 ** -0.5)
    assert branch_scale(16, 3) == pytest.approx(0.5)  # 16^(-1/4)
    assert branch_scale(64, 4) == pytest.approx(0.5)  # 64^(-1/6)
    assert branch_scale(1000, 1) == 1.0  # m = 1: nothing to scale, no division by zero
    assert branch_scale(1, 2) == 1.0


@pytest.mark.parametrize("bad", [(0, 2), (-3, 2), (10, 0), (2.5, 2)])
def test_branch_scale_rejects_impossible_arguments(bad: tuple) -> None:
    with pytest.raises(ValueError, match="positive whole number"):
        branch_scale(*bad)


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, fixup.ResidualBlock)]


@pytest.mark.parametrize("depth", [8, 20, 56])
def test_every_block_is_the_identity_and_logits_are_zero(depth: int) -> None:
    model = fixup.create_model("resnet_cifar", depth=depth, norm="fixup").eval()
    inputs: dict[nn.Module, torch.Tensor] = {}
    outputs: dict[nn.Module, torch.Tensor] = {}
    def record(mod: nn.Module, args: tuple, out: torch.Tensor) -> None:
        inputs[mod], outputs[mod] = args[0].clone(), out

    handles = [b.register_forward_hook(record) for b in _blocks(model)]
    x = torch.randn(4, 3, 16, 16)
    logits = model(x)
    for h in handles:
        h.remove()
    assert torch.equal(logits, torch.zeros_like(logits))
    for block in _blocks(model):
        # The block's output is exactly its shortcut of the input: the input itself, or (at a stage
        # change, option A) the subsampled input with zero channels appended.
        assert torch.equal(outputs[block], block.shortcut(inputs[block]))


@pytest.mark.parametrize("depth", [20, 110, 1202])
def test_scaled_layers_have_he_std_times_the_factor(depth: int) -> None:
    model = fixup.create_model("resnet_cifar", depth=depth)
    L = (depth - 2) // 2
    report = model.init_report
    assert report.num_branches == L
    factor = L ** -0.5
    # Each conv1 has He std sqrt(2 / fan_out); stages differ in fan, so normalise per layer.
    normalised = torch.cat([blk.conv1.weight.flatten() / he_std(blk.conv1.weight) for blk in _blocks(model)])
    assert normalised.std().item() == pytest.approx(factor, rel=0.03)
    assert normalised.mean().item() == pytest.approx(0.0, abs=factor * 0.05)
    for blk in _blocks(model):
        assert torch.count_nonzero(blk.conv2.weight) == 0
    assert torch.count_nonzero(model.fc.weight) == 0 and torch.count_nonzero(model.fc.bias) == 0
    for b in report.branches:
        assert b.factor == pytest.approx(factor)
        assert b.scaled[0].std == pytest.approx(he_std(torch.empty(b.scaled[0].shape)) * factor)


def test_outside_layers_are_plain_he_and_scalars_are_reset() -> None:
    model = fixup.create_model("resnet20")
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, Bias):
                mod.bias.fill_(3.0)
            if isinstance(mod, Scale):
                mod.scale.fill_(5.0)
    report = fixup_init_(model)
    assert [r.name for r in report.other_layers] == ["conv1"]
    # the stem is drawn from its fan-in under our default (the model's method), as the report says
    assert report.stem_fan_mode == "fan_in" and "He with fan_in" in str(report)
    assert report.other_layers[0].std == pytest.approx(he_std(model.conv1.weight, "fan_in"))
    assert model.conv1.weight.std().item() == pytest.approx(he_std(model.conv1.weight, "fan_in"), rel=0.1)
    assert all(m.bias.item() == 0 for m in model.modules() if isinstance(m, Bias))
    assert all(m.scale.item() == 1 for m in model.modules() if isinstance(m, Scale))
    # 4 biases and 1 multiplier per branch, plus the stem and classifier biases.
    assert report.num_scalars == 9 * 5 + 2


@pytest.mark.parametrize(("method", "stem_mode"), [("fixup", "fan_in"), ("fixup_no_depth_scale", "fan_in"),
                                                    ("fixup_paper", "fan_out")])
def test_the_stem_follows_the_method_and_can_be_overridden(method, stem_mode) -> None:
    model = fixup.create_model("resnet_cifar", depth=8, method=method)
    conv = model.conv1
    # He's std written out from the layer itself: sqrt(2 / fan), fan_in = in x kh x kw, fan_out = out x kh x kw.
    fans = {"fan_in": conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1],
            "fan_out": conv.out_channels * conv.kernel_size[0] * conv.kernel_size[1]}
    assert fans == {"fan_in": 27, "fan_out": 144}  # 3 -> 16 channels, 3x3: the two modes differ 2.3-fold in std
    # The sample std of n normal draws is within 5 standard errors (1/sqrt(2n) relative) of the truth.
    tol = 5 / math.sqrt(2 * conv.weight.numel())

    def measured() -> float:
        return conv.weight.std().item()

    assert model.init_report.stem_fan_mode == stem_mode
    assert measured() == pytest.approx(math.sqrt(2 / fans[stem_mode]), rel=tol)
    assert model.init_report.other_layers[0].std == pytest.approx(math.sqrt(2 / fans[stem_mode]))
    other = "fan_out" if stem_mode == "fan_in" else "fan_in"
    report = fixup_init_(model, stem_mode=other, generator=torch.Generator().manual_seed(1))
    assert measured() == pytest.approx(math.sqrt(2 / fans[other]), rel=tol)
    assert report.other_layers[0].std == pytest.approx(math.sqrt(2 / fans[other]))
    with pytest.raises(ValueError, match="stem_mode must be one of"):
        fixup_init_(model, stem_mode="fan_avg")


def test_the_fan_in_stem_hands_the_stream_the_inputs_scale() -> None:
    # Every block is the identity at init, so the classifier sees the stem's output scale. One input channel into
    # 16: a fan-in draw keeps the He scale (mean square 2 for unit input), a fan-out draw shrinks it 16-fold.
    x = torch.randn(256, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    inner = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    inner[..., [0, -1], :] = inner[..., :, [0, -1]] = False  # away from the zero padding
    for method, expected in (("fixup", 2.0), ("fixup_paper", 2.0 / 16)):
        model = fixup.create_model("resnet_cifar", depth=8, in_channels=1, method=method,
                                   generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            out = model.conv1(x)
        mean_square = out.pow(2).mean(1, keepdim=True).masked_select(inner).mean().item()
        assert mean_square == pytest.approx(expected, rel=0.15), method


def test_second_application_gives_same_report_and_distribution() -> None:
    model = fixup.create_model("resnet56")
    first = fixup_init_(model).to_dict()
    w1 = torch.cat([b.conv1.weight.flatten() for b in _blocks(model)])
    second = fixup_init_(model).to_dict()
    w2 = torch.cat([b.conv1.weight.flatten() for b in _blocks(model)])
    assert first == second
    assert not torch.equal(w1, w2)  # fresh draw, not a second multiplication by the factor
    assert w2.std().item() == pytest.approx(w1.std().item(), rel=0.05)


def test_generator_makes_it_reproducible() -> None:
    a, b = fixup.create_model("resnet20"), fixup.create_model("resnet20")
    fixup_init_(a, generator=torch.Generator().manual_seed(0))
    fixup_init_(b, generator=torch.Generator().manual_seed(0))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_report_round_trips_through_json() -> None:
    report = fixup.create_model("resnet_cifar", depth=14, shortcut="B").init_report
    data = json.loads(json.dumps(report.to_dict()))
    again = FixupReport.from_dict(data)
    assert again == report
    assert len(report.shortcuts) == 2  # two stage transitions with 1x1 projections
    assert all(s.std == pytest.approx(he_std(torch.empty(s.shape))) for s in report.shortcuts)
    text = str(report)
    assert "L = 6 residual branches" in text and "shortcut projections" in text


class _Mixed(nn.Module):
    """Two basic-like branches (m=2) and one bottleneck-like branch (m=3) in one model."""

    class Block(nn.Module):
        def __init__(self, m: int, width: int = 8) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(m))
            self.biases = nn.ModuleList(Bias() for _ in range(m))
            self.scale = Scale()
            self.kind = "bottleneck" if m == 3 else "basic"

        def residual_branches(self) -> list[Branch]:
            return [Branch(list(self.layers), self.kind, biases=list(self.biases), scale=self.scale)]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = x
            for i, (b, lin) in enumerate(zip(self.biases, self.layers)):
                out = lin(b(out))
                if i < len(self.layers) - 1:
                    out = torch.relu(out)
            return x + self.scale(out)

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.blocks = nn.Sequential(self.Block(2), self.Block(2), self.Block(3))
        self.head = nn.Linear(8, 3)

    def classifier_layers(self) -> list[nn.Module]:
        return [self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def test_report_counts_mixed_branch_types() -> None:
    model = _Mixed()
    report = fixup_init_(model)
    assert report.num_branches == 3
    assert [b.m for b in report.branches] == [2, 2, 3]
    assert [b.factor for b in report.branches] == pytest.approx([3 ** -0.5, 3 ** -0.5, 3 ** -0.25])
    assert [len(b.scaled) for b in report.branches] == [1, 1, 2]
    assert report.branches[2].zeroed.name == "blocks.2.layers.2"
    assert torch.count_nonzero(model(torch.randn(5, 4))) == 0
    assert report.warnings == []


def test_ablation_settings_change_only_the_factor() -> None:
    model = fixup.create_model("resnet20")
    assert fixup_init_(model, depth_scaling=False).branches[0].factor == 1.0
    assert fixup_init_(model, rescale=10.0).branches[0].factor == pytest.approx(10 / 3)
    assert fixup_init_(model, rescale=0.1).method == "fixup (ablation)"
    with pytest.raises(ValueError, match="rescale"):
        fixup_init_(model, rescale=0.0)


def test_normalisation_left_in_the_model_is_reported_and_refused_when_strict() -> None:
    model = fixup.create_model("resnet20", norm="batchnorm")
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"strict=True"):
        fixup_init_(model, strict=True)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing half-initialised
    report = fixup_init_(model)
    assert len(report.normalization) == 1 + 2 * 9
    bn = report.normalization[0]
    assert (bn.type, bn.eps, bn.affine, bn.running_stats) == ("BatchNorm2d", 1e-5, True, True)
    assert any("normalisation layer 'norm1'" in w for w in report.warnings)
    assert any("no scalar multiplier" in w for w in report.warnings)


def test_model_without_branches_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"declares no residual branch.*fixup.adapt"):
        fixup_init_(nn.Sequential(nn.Linear(3, 3)))


def test_branch_without_weight_layer_is_an_error_and_changes_nothing() -> None:
    model = _Mixed()
    model.blocks[1].residual_branches = lambda: [Branch([], "empty")]
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="declares no weight layer"):
        fixup_init_(model)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_shared_and_non_weight_layers_are_errors() -> None:
    model = _Mixed()
    shared = model.blocks[0].layers[0]
    model.blocks[1].residual_branches = lambda: [Branch([shared, model.blocks[1].layers[1]])]
    with pytest.raises(ValueError, match="declared in two residual branches"):
        fixup_init_(model)
    model = _Mixed()
    model.blocks[1].residual_branches = lambda: [Branch([nn.ReLU()])]
    with pytest.raises(ValueError, match="has no `weight` tensor"):
        fixup_init_(model)


def test_missing_scalars_are_warned_and_refused_when_strict() -> None:
    model = _Mixed()
    model.blocks[0].residual_branches = lambda: [Branch(list(model.blocks[0].layers), "basic")]
    report = fixup_init_(model)
    assert any("blocks.0" in w and "multiplier" in w for w in report.warnings)
    with pytest.raises(ValueError, match="no scalar biases"):
        fixup_init_(model, strict=True)


def test_he_std_fan_conventions() -> None:
    w = torch.empty(32, 16, 3, 3)
    assert he_std(w, "fan_out") == pytest.approx(math.sqrt(2 / (32 * 9)))
    assert he_std(w, "fan_in") == pytest.approx(math.sqrt(2 / (16 * 9)))
    with pytest.raises(ValueError, match="fan_in"):
        he_std(w, "fan_avg")


def test_identity_shortcut_carries_the_unshifted_input() -> None:
    """Only subsampling/projection shortcuts see x + b1a; the identity path carries no bias (reference code)."""
    model = fixup.create_model("resnet_cifar", depth=14, shortcut="B").eval()
    for block in _blocks(model):
        with torch.no_grad():
            block.bias1a.bias.fill_(0.5)
    x = torch.rand(2, 16, 8, 8)
    block = model.layer1[0]  # identity shortcut; the branch is zero at init
    assert torch.equal(block(x), x)
    block = model.layer2[0]  # the projection shortcut sees x + 0.5
    with torch.no_grad():
        expected = torch.relu(block.projection(x + 0.5))
    torch.testing.assert_close(block(x), expected)
