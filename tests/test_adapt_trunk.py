"""The trunk rule of ``fixup.adapt`` and the signal-propagation measurement (``fixup.lab.signal``).

The model below is an EfficientNet in miniature: a stem, then stages whose first block has no skip (expand,
depthwise, squeeze-excite, project, SiLU everywhere), followed by residual blocks of the same kind. With
He draws alone its stream shrinks stage after stage, as the real EfficientNet-B0's does; the trunk rule must
hold it at the input's scale while the branches still start at exactly zero.
"""

from __future__ import annotations

import json
import math
from itertools import pairwise

import pytest
import torch
from torch import nn

import fixup
from fixup import adapt
from fixup.branch import find_branches
from fixup.lab.signal import SIGNAL_BAND, stage_names, stream_signal


class SE(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(c, max(1, c // 4), 1)
        self.expand = nn.Conv2d(max(1, c // 4), c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True)))))


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        mid = 4 * cin
        self.pw = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.dw = nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.se = SE(mid)
        self.pwl = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.skip = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.silu(self.bn1(self.pw(x)))
        h = self.se(nn.functional.silu(self.bn2(self.dw(h))))
        h = self.bn3(self.pwl(h))
        return x + h if self.skip else h


class TinyEfficientNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (8, 16, 24, 32), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        self.blocks = nn.Sequential(*[nn.Sequential(MBConv(a, b, 2), MBConv(b, b)) for a, b in pairwise(widths)])
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(nn.functional.silu(self.bn(self.stem(x)))).mean((2, 3)))


def _batch(seed: int = 0) -> torch.Tensor:
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _outputs(model: nn.Module, layers: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of ``layers`` on ``x``, captured by hooks written here (not the library's records)."""
    seen: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda m, a, o: seen.setdefault(id(m), o.detach())) for m in layers]
    with torch.no_grad():
        model.eval()(x)
    for h in hooks:
        h.remove()
    return [seen[id(m)] for m in layers]


def test_trunk_is_every_stream_layer_outside_the_branches_and_no_gate_or_classifier() -> None:
    model, report = adapt(TinyEfficientNet(), _batch())
    trunk = {n for n, m in model.named_modules() if any(m is t for t in model.trunk_layers())}
    # The stem and the three layers on the data path of each stage's skip-less first block; not their SE layers.
    assert trunk == {"stem", *(f"blocks.{i}.0.{c}" for i in range(3) for c in ("pw", "dw", "pwl"))}
    assert [t.name for t in report.trunk] == ["stem", *(f"blocks.{i}.0.{c}" for i in range(3)
                                                        for c in ("pw", "dw", "pwl"))]  # execution order
    assert report.trunk_rule == "lsuv" and all(t.rule == "lsuv" and not t.note for t in report.trunk)


def test_lsuv_trunk_gives_every_trunk_layer_unit_output_rms_and_branches_still_start_at_zero() -> None:
    x = _batch()
    model, report = adapt(TinyEfficientNet(), x)
    outs = _outputs(model, model.trunk_layers(), x)
    assert [float(o.pow(2).mean().sqrt()) for o in outs] == pytest.approx([1.0] * len(outs), abs=0.01)
    assert [t.rms_after for t in report.trunk] == pytest.approx([1.0] * len(outs), abs=0.01)
    last = [b.layers[-1] for _, b in find_branches(model)]
    assert all(torch.count_nonzero(o) == 0 for o in _outputs(model, last, x))
    assert torch.count_nonzero(model(x)) == 0  # the classifier starts at zero


def test_the_stream_stays_in_band_with_the_trunk_rule_and_leaves_it_without() -> None:
    x = _batch()
    _, with_rule = adapt(TinyEfficientNet(), x)
    assert with_rule.stream and all(SIGNAL_BAND[0] <= s.ratio <= SIGNAL_BAND[1] for s in with_rule.stream)
    with pytest.warns(fixup.FixupWarning, match=r"stream leaves \[0.5, 2.0\]x"):
        _, without = adapt(TinyEfficientNet(), x, trunk="none")
    ratios = [s.ratio for s in without.stream]
    assert ratios[-1] < SIGNAL_BAND[0] and ratios == sorted(ratios, reverse=True)  # it shrinks stage by stage
    assert any("stream leaves" in w for w in without.warnings)


def test_fan_in_rule_draws_he_fan_in_per_group() -> None:
    torch.manual_seed(0)
    model, report = adapt(TinyEfficientNet(widths=(32, 64, 64, 64)), _batch(), trunk="fan_in")
    dw = model.get_submodule("blocks.0.0.dw")  # depthwise: fan-in 9 whatever the width
    assert dw.weight.std().item() == pytest.approx(math.sqrt(2 / 9), rel=0.1)
    assert report.trunk_rule == "fan_in"


def test_report_round_trips_with_trunk_and_stream() -> None:
    _, report = adapt(TinyEfficientNet(), _batch())
    data = json.loads(json.dumps(report.to_dict()))
    again = type(report).from_dict(data)
    assert again.trunk == report.trunk and again.stream == report.stream
    text = report.format()
    assert "trunk (lsuv): 10 layers" in text and "stream RMS at initialisation" in text


def test_bad_trunk_rule_and_undeclared_trunk_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"trunk must be one of \('lsuv', 'fan_in', 'none'\), got 'bn'"):
        adapt(TinyEfficientNet(), _batch(), trunk="bn")
    with pytest.raises(ValueError, match="declares no trunk_layers"):
        fixup.trunk_init_(nn.Linear(2, 2), torch.randn(1, 2))


def test_stream_signal_measures_each_stage_output_and_leaves_running_stats_alone() -> None:
    model = TinyEfficientNet()
    adapted, _ = adapt(model, _batch())
    blocks = [n for n, m in adapted.named_modules() if n and callable(getattr(m, "residual_branches", None))]
    assert stage_names(adapted, blocks) == ["blocks.0", "blocks.1", "blocks.2"]
    before = model.bn.running_mean.clone()
    x = _batch(1)
    sig = stream_signal(model, x, blocks=blocks)  # the normalised model, in train mode
    assert torch.equal(model.bn.running_mean, before)
    model.train()
    stages = [model.get_submodule(f"blocks.{i}") for i in range(3)]
    with torch.no_grad():
        seen: dict[int, torch.Tensor] = {}
        hooks = [m.register_forward_hook(lambda m, a, o: seen.setdefault(id(m), o)) for m in stages]
        model(x)
        for h in hooks:
            h.remove()
    ref = float(x.pow(2).mean().sqrt())
    expected = [float(seen[id(m)].pow(2).mean().sqrt()) / ref for m in stages]
    assert [s.ratio for s in sig.stages] == pytest.approx(expected, rel=1e-5)


def test_lab_signal_command_prints_both_forms_and_writes_json(tmp_path, capsys) -> None:
    from fixup.cli import main

    out = tmp_path / "signal.json"
    assert main(["lab", "signal", "resnet18", "--trunk", "lsuv,none", "--input-shape", "4,3,32,32",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "normalised" in text and "adapted (trunk lsuv)" in text and "adapted (trunk none)" in text
    data = json.loads(out.read_text())
    assert [s["name"] for s in data["normalised"]["stages"]] == ["layer1", "layer2", "layer3", "layer4"]
    assert all(0.5 <= s["ratio"] <= 2 for s in data["adapted (trunk lsuv)"]["stages"])
    assert data["adapted (trunk none)"]["stages"][-1]["ratio"] < 0.5  # He fan-out projections shrink it


def test_lab_signal_compares_methods_and_names_a_refusal(tmp_path, capsys) -> None:
    from fixup.cli import main

    out = tmp_path / "signal.json"
    assert main(["lab", "signal", "resnet18", "--method", "rezero,nf_resnet,dyt", "--input-shape", "4,3,32,32",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "adapted (rezero)" in text and "adapted (nf_resnet)" in text and "dyt: refused (" in text
    data = json.loads(out.read_text())
    assert set(data) == {"model", "normalised", "adapted (rezero)", "adapted (nf_resnet)"}
    assert all(0.5 <= s["ratio"] <= 2 for s in data["adapted (rezero)"]["stages"])
    assert all(0.5 <= s["ratio"] <= 2 for s in data["adapted (nf_resnet)"]["stages"][1:])
    assert main(["lab", "signal", "resnet18", "--method", "dyt", "--input-shape", "4,3,32,32"]) != 0
    assert "every method refused resnet18" in capsys.readouterr().err


def test_parameter_free_shortcuts_are_outside_any_trunk_rule_and_say_so() -> None:
    """A CIFAR ResNet's option-A shortcut (subsample, zero channels) halves the stream's second moment at each
    stage; it has no weight layer to rescale, so the report warns instead of hiding it."""
    model = fixup.create_model("resnet20", norm="batchnorm")
    with pytest.warns(fixup.FixupWarning, match="stream leaves"):
        _, report = adapt(model, torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0)))
    ratios = [s.ratio for s in report.stream]
    assert ratios[1] / ratios[0] == pytest.approx(math.sqrt(0.5), rel=0.2)
