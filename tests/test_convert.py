"""``fixup.convert``: a trained model without normalisation that computes the same function.

Every model of tests/adapt_zoo.py with BatchNorm converts with eval outputs within 1e-5 of the output's RMS in
float32, and within 1e-10 when converted and run in float64 (the fold is exact in real arithmetic: the float32
bound is rounding, about 1e-7 per layer). The BatchNorms' statistics and affines are drawn at random first, so
that the fold is not the identity a fresh model's (mean 0, variance 1) nearly is. LayerNorm models are refused by
default and converted with a measured change on request; bad inputs give a named error or warning; a saved
converted model loads with ``weights_only=True``.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
from adapt_zoo import ZOO, as_inputs, trained_statistics_
from fixup import (
    Bias,
    ConvertError,
    FixupWarning,
    Gate,
    Scale,
    SharedNormWarning,
    StatisticsWarning,
    TrainModeWarning,
    convert,
    load_converted,
    save_converted,
)
from fixup._convert import ChannelAffine, DynamicTanh
from test_adapt import BasicBlock, ResNet
from test_adapt_zoo import _logits, _needs

_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)
# The zoo's models with BatchNorm (the test checks they have some).
BN_MODELS = [n for n, e in ZOO.items() if e.family in ("ResNet", "RegNet", "MobileNet", "EfficientNet")]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over the RMS of a."""
    return float((a.double() - b.double()).abs().max() / a.double().pow(2).mean().sqrt())


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        return fn(*args, **kwargs)


@pytest.mark.parametrize("name", BN_MODELS)
def test_zoo_batchnorm_models_keep_their_function(name: str, one_thread: None) -> None:
    entry = ZOO[name]
    _needs(entry.needs)
    torch.manual_seed(0)
    original = trained_statistics_(entry.build()).eval()
    assert any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in original.modules())
    before = {k: v.clone() for k, v in original.state_dict().items()}
    example = as_inputs(entry.example())
    model, report = convert(original, example)
    # The user's model is untouched.
    assert original.state_dict().keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in original.state_dict().items())
    assert not any(isinstance(m, _NORMS) for m in model.modules())
    assert report.exact and report.max_change <= 1e-5
    assert {f.fate for f in report.norms} <= {"folded", "affine"} and report.norms
    # Held-out inputs of another seed and batch size, float32: within 1e-5 of the output's RMS.
    x = torch.randn(3, *example[0].shape[1:], generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert _relative(_logits(original(x)), _logits(model(x))) <= 1e-5
    # Fixup's scalars at identity, one multiplier per residual branch, and their optimiser group.
    scales = [m for m in model.modules() if isinstance(m, Scale)]
    assert len(report.branches) == entry.L == len(scales)
    assert all(s.scale.item() == 1.0 for s in scales)
    assert all(b.bias.item() == 0.0 for b in model.modules() if isinstance(b, Bias))
    assert {g["name"] for g in fixup.param_groups(model, 0.01)} == {"weights", "scalars"}
    # Exact in real arithmetic: converted and run in float64 the outputs agree to rounding of float64.
    double, _ = convert(original.double(), tuple(t.double() for t in example))
    with torch.no_grad():
        assert _relative(_logits(original(x.double())), _logits(double(x.double()))) <= 1e-10


def test_gated_methods_start_their_gates_at_one(one_thread: None) -> None:
    original = trained_statistics_(ResNet(BasicBlock, [1, 1, 1, 1], width=8)).eval()
    x = torch.randn(2, 3, 32, 32)
    model, report = convert(original, x, method="rezero")
    assert not any(m.training for m in model.modules())  # the added modules too take the model's mode
    gates = [m for m in model.modules() if isinstance(m, Gate)]
    assert len(gates) == len(report.branches) == 4 and all(g.scale.item() == 1.0 for g in gates)
    assert not any(isinstance(m, Bias) for m in model.modules())  # gated methods add no biases
    assert report.max_change <= 1e-5
    assert "gates" in {g["name"] for g in fixup.param_groups(model, 0.01)}


class PreAct(nn.Module):
    """A norm whose output feeds both the branch and the projection shortcut (bn1, after the stem: it folds), one
    inside the branch (bn2: folds) and a pre-activation norm on the stream (bn3, after the add: no layer before it)."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.bn1, self.conv1 = nn.BatchNorm2d(c), nn.Conv2d(c, c, 3, padding=1)
        self.bn2, self.conv2 = nn.BatchNorm2d(c), nn.Conv2d(c, c, 3, padding=1)
        self.proj = nn.Conv2d(c, c, 1)
        self.bn3, self.fc = nn.BatchNorm2d(c), nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        h = F.relu(self.bn1(x))
        x = self.proj(h) + self.conv2(F.relu(self.bn2(self.conv1(h))))
        return self.fc(F.relu(self.bn3(x)).mean((2, 3)))


def test_norms_feeding_two_branches_or_after_an_add_convert_exactly(one_thread: None) -> None:
    original = trained_statistics_(PreAct()).eval()
    model, report = convert(original, torch.randn(2, 3, 16, 16))
    fates = {f.name: f.fate for f in report.norms}
    assert fates == {"bn1": "folded", "bn2": "folded", "bn3": "affine"}
    assert isinstance(model.bn3, ChannelAffine) and isinstance(model.bn2, nn.Identity)
    assert "no weight layer before it" in report.norms[-1].why
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert _relative(original(x), model(x)) <= 1e-5


class Odd(nn.Module):
    """A norm module called twice, a norm registered under two names, a conv whose output is read twice, and
    Linear + BatchNorm1d on 2-D (folds) and on 3-D inputs (cannot: its channels are not the Linear's features)."""

    def __init__(self, c: int = 6) -> None:
        super().__init__()
        self.conv1, self.conv2, self.shared = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1), \
            nn.BatchNorm2d(c)
        self.tied = nn.BatchNorm2d(c)
        self.tied_again = self.tied
        self.conv3, self.bn3 = nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)
        self.fc1, self.bn_fc = nn.Linear(c, c), nn.BatchNorm1d(c)
        self.fc_seq, self.bn_seq = nn.Linear(4, 4), nn.BatchNorm1d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.shared(self.conv1(x)))
        x = F.relu(self.shared(self.conv2(x)))
        y = self.conv3(x)
        x = self.tied_again(self.bn3(y) + y)
        s = self.bn_seq(self.fc_seq(x.flatten(2)[..., :4]))  # (N, C, 4): BatchNorm1d on channels, Linear on the last
        return self.bn_fc(self.fc1(x.mean((2, 3)))) + s.mean(2)


def test_shared_tied_and_unfoldable_norms_are_named_and_exact(one_thread: None) -> None:
    original = trained_statistics_(Odd()).eval()
    with pytest.warns(SharedNormWarning) as caught:
        model, report = convert(original, torch.randn(2, 3, 8, 8))
    text = " ".join(str(w.message) for w in caught)
    assert "shared" in text and "tied" in text
    fates = {f.name: (f.fate, f.into) for f in report.norms}
    assert fates["shared"] == ("affine", "") and fates["tied"][0] == "affine" and fates["bn3"][0] == "affine"
    assert fates["bn_fc"] == ("folded", "fc1") and fates["bn_seq"][0] == "affine"
    assert "also read by" in next(f.why for f in report.norms if f.name == "bn3")
    assert model.tied is model.tied_again and isinstance(model.tied, ChannelAffine)
    x = torch.randn(5, 3, 8, 8)
    with torch.no_grad():
        assert _relative(original(x), model(x)) <= 1e-5


def test_train_mode_is_a_named_warning_and_the_eval_function_is_kept(one_thread: None) -> None:
    original = trained_statistics_(ResNet(BasicBlock, [1, 1, 1, 1], width=8))  # train mode, as constructed
    with pytest.warns(TrainModeWarning, match="eval"):
        model, report = convert(original, torch.randn(2, 3, 32, 32))
    assert model.training and original.training  # modes kept, the original's too
    assert report.max_change <= 1e-5


def test_untrained_statistics_are_a_named_warning(one_thread: None) -> None:
    with pytest.warns(StatisticsWarning, match="initial running statistics"):
        convert(ResNet(BasicBlock, [1, 1, 1, 1], width=8).eval(), torch.randn(2, 3, 32, 32))


def test_refusals_name_the_layer_and_the_fix(one_thread: None) -> None:
    model = ResNet(BasicBlock, [1, 1, 1, 1], width=8)
    model.layer1[0].bn1 = nn.BatchNorm2d(8, track_running_stats=False)
    with pytest.raises(ConvertError, match=r"layer1\.0\.bn1 .*track_running_stats"):
        convert(model.eval(), torch.randn(2, 3, 32, 32))

    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc(F.layer_norm(x, (8,)))

    with pytest.raises(ConvertError, match="computed by a function"):
        convert(Functional().eval(), torch.randn(2, 8))
    class Normalize(nn.Module):  # an input transform, not a normalisation layer: left alone
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - 0.5) / 0.25

    model, _ = convert(nn.Sequential(Normalize(), nn.Linear(8, 8)).eval(), torch.randn(2, 8))
    assert isinstance(model[0], Normalize)
    rms = nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8))
    with pytest.raises(ConvertError, match=r"RMSNorm.*does not know"):
        convert(rms.eval(), torch.randn(2, 8))
    half = trained_statistics_(ResNet(BasicBlock, [1, 1, 1, 1], width=8)).eval().to(torch.bfloat16)
    with pytest.raises(ConvertError, match=r"bfloat16.*convert the float32 model"):
        convert(half, torch.randn(2, 3, 32, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="per_example_norms must be one of"):
        convert(rms.eval(), torch.randn(2, 8), per_example_norms="groupnorm")


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0), 2,
                                 enable_nested_tensor=False).eval()


def test_layernorm_is_refused_by_default_and_replaced_with_its_change_on_request(one_thread: None) -> None:
    original = _encoder()
    x = torch.randn(4, 6, 16)
    with pytest.raises(ConvertError, match=r"layers\.0\.norm1 .*per_example_norms='affine'.*'dyt'"):
        convert(original, x)
    calibration = [torch.randn(8, 6, 16, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    for option, cls in (("affine", ChannelAffine), ("dyt", DynamicTanh)):
        model, report = _quiet(convert, original, x, per_example_norms=option, calibration=calibration)
        assert not any(isinstance(m, _NORMS) for m in model.modules())
        assert [f.name for f in report.norms] == ["layers.0.norm1", "layers.0.norm2", "layers.1.norm1",
                                                  "layers.1.norm2"]
        assert all(f.fate == option and not f.exact and 0 < f.change < 1 for f in report.norms)
        assert all(isinstance(model.get_submodule(f.name), cls) for f in report.norms)
        assert not report.exact and 0 < report.rms_change < float("inf")
        assert len(report.branches) == 4 and f"{option}" in str(report)


def test_the_fits_are_fits() -> None:
    """The affine recovers a LayerNorm exactly where every token has the same statistics; DyT's fitted alpha does
    better than its paper's starting 0.5."""
    ln = nn.LayerNorm(8)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.normal_()
    base = torch.randn(8)
    tokens = torch.stack([base[torch.randperm(8)] for _ in range(64)])  # same mean and std in every token
    from fixup._convert._norms import fit
    _, change = fit(ln, "affine", [tokens], 8, -1)
    assert change < 1e-6
    x = [torch.randn(64, 8) * 3]
    new, fitted = fit(ln, "dyt", x, 8, -1)
    with torch.no_grad():
        new.alpha.fill_(0.5)
        y = ln(x[0])
        start = float((new(x[0]) - y).pow(2).mean().sqrt() / y.pow(2).mean().sqrt())
    assert fitted < start


def test_saved_models_load_with_weights_only(tmp_path, one_thread: None) -> None:
    build = functools.partial(ResNet, BasicBlock, [1, 1, 1, 1], width=8)
    original = trained_statistics_(build()).eval()
    model, report = convert(original, torch.randn(2, 3, 32, 32))
    with torch.no_grad():  # as if fine-tuned: the scalars moved
        for m in model.modules():
            if isinstance(m, Scale):
                m.scale.fill_(0.7)
    path = tmp_path / "converted.pt"
    save_converted(path, model, report)
    assert torch.load(path, weights_only=True)["format"] == "fixup-converted/1"
    loaded, loaded_report = load_converted(path, build)
    assert type(loaded) is type(model) and loaded_report.to_dict() == report.to_dict()
    x = torch.randn(2, 3, 32, 32)
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
    with pytest.raises(ValueError, match="does not fit the model build returned"):
        load_converted(path, functools.partial(ResNet, BasicBlock, [1, 1, 1, 1], width=16))
    # A per-example option replays too (its fitted values come from the file).
    enc = _encoder()
    model, report = _quiet(convert, enc, torch.randn(2, 6, 16), per_example_norms="dyt")
    save_converted(tmp_path / "enc.pt", model, report)
    loaded, _ = load_converted(tmp_path / "enc.pt", _encoder)
    y = torch.randn(3, 6, 16)
    with torch.no_grad():
        assert torch.equal(model(y), loaded.eval()(y))


FACTORY = '''
import torch
from torch import nn


def trained():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    with torch.no_grad():
        model[1].running_var.uniform_(0.5, 2.0)
        model[1].num_batches_tracked += 1
    return model.eval(), torch.randn(2, 3, 4, 4)


def layernorm():
    return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)).eval()
'''


def test_command_line_converts_saves_and_refuses_without_a_traceback(tmp_path, capsys, one_thread: None) -> None:
    from fixup.cli import main

    (tmp_path / "factories.py").write_text(FACTORY)
    out, report = tmp_path / "converted.pt", tmp_path / "report.json"
    assert main(["convert", f"{tmp_path / 'factories.py'}:trained", "--out", str(out), "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "1 BatchNorm2d -> folded" in printed and "exact" in printed
    import json
    assert json.loads(report.read_text())["report"]["norms"][0]["into"] == "0"
    assert torch.load(out, weights_only=True)["spec"]["method"] == "fixup"
    assert main(["convert", f"{tmp_path / 'factories.py'}:layernorm", "--input-shape", "2,8"]) == 2
    err = capsys.readouterr().err
    assert "per_example_norms='affine'" in err and "Traceback" not in err


def test_opacus_computes_per_example_gradients_of_every_parameter(one_thread: None) -> None:
    """The point of converting for private training: Opacus refuses the original (BatchNorm) and takes the
    converted model, with a per-example gradient for every parameter (affines and Fixup's scalars included)."""
    try:
        from opacus import GradSampleModule
        from opacus.validators import ModuleValidator
    except ImportError as err:  # not installed, or torchvision (which it imports) fails to
        pytest.skip(f"opacus does not import here ({err})")
    original = trained_statistics_(PreAct()).eval()
    assert ModuleValidator.validate(original.train(), strict=False)  # BatchNorm: refused
    model, _ = convert(original.eval(), torch.randn(2, 3, 16, 16))
    model.train()
    assert ModuleValidator.validate(model, strict=False) == []
    x = torch.randn(4, 3, 16, 16)
    GradSampleModule(model)(x).pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad_sample is not None, name
        assert torch.allclose(p.grad_sample.sum(0) / 4, p.grad, rtol=1e-4, atol=1e-6), name  # mean reduction


class GroupNormNet(nn.Module):
    """GroupNorm on a residual branch (channels on dim 1), and an InstanceNorm with running statistics (exact)."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.inorm = nn.InstanceNorm2d(c, affine=True, track_running_stats=True)
        self.conv1, self.gn = nn.Conv2d(c, c, 3, padding=1), nn.GroupNorm(2, c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.fc = nn.Linear(c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inorm(self.stem(x))
        x = x + self.conv2(F.relu(self.gn(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


def test_groupnorm_options_act_on_channels_and_instancenorm_with_statistics_is_exact(one_thread: None) -> None:
    original = GroupNormNet()
    with torch.no_grad():
        original.inorm.running_mean.normal_(0, 0.3)
        original.inorm.running_var.uniform_(0.5, 2.0)
        original.gn.weight.uniform_(0.5, 1.5)
    original.eval()
    x = torch.randn(4, 3, 8, 8)
    for option, cls in (("affine", ChannelAffine), ("dyt", DynamicTanh)):
        model, report = _quiet(convert, original, x, per_example_norms=option)
        fates = {f.name: f for f in report.norms}
        assert fates["inorm"].fate == "folded" and fates["inorm"].exact
        assert fates["gn"].fate == option and 0 < fates["gn"].change < 1
        assert isinstance(model.gn, cls) and model.gn.dim == 1 and model.gn.weight.shape == (8,)
        if option == "dyt":
            assert torch.equal(model.gn.weight, original.gn.weight)  # the norm's own gamma and beta
    # With the GroupNorm's change taken out (its replacement undone), the rest is exact.
    model, _ = _quiet(convert, original, x, per_example_norms="affine")
    model.gn = original.gn
    with torch.no_grad():
        assert _relative(original(x), model(x)) <= 1e-5


def test_frozen_batchnorm_becomes_its_frozen_affine(one_thread: None) -> None:
    try:
        from torchvision.ops.misc import FrozenBatchNorm2d
    except Exception as err:  # not installed, or failing to import
        pytest.skip(f"torchvision does not import here ({err})")
    model = ResNet(BasicBlock, [1, 1, 1, 1], width=8)
    frozen = FrozenBatchNorm2d(8)
    frozen.load_state_dict(trained_statistics_(nn.Sequential(nn.BatchNorm2d(8)))[0].state_dict(), strict=False)
    model.bn1 = frozen
    model = trained_statistics_(model).eval()
    converted, report = convert(model, torch.randn(2, 3, 32, 32))
    fate = next(f for f in report.norms if f.name == "bn1")
    assert fate.fate == "affine" and fate.exact and "frozen" in fate.why
    assert isinstance(converted.bn1, ChannelAffine) and not converted.bn1.weight.requires_grad
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert _relative(model(x), converted(x)) <= 1e-5


def test_a_models_own_gates_keep_their_trained_values(one_thread: None) -> None:
    original = fixup.create_model("resnet20", method="skipinit", num_classes=3)
    with torch.no_grad():
        for g in original.modules():
            if isinstance(g, Gate):
                g.scale.fill_(0.3)
    model, report = convert(original.eval(), torch.randn(2, 3, 32, 32), method="rezero")
    values = [g.scale.item() for g in model.modules() if isinstance(g, Gate)]
    assert sorted(set(values)) == [pytest.approx(0.3), 1.0] and report.max_change <= 1e-5
