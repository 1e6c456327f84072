"""The methods of the paper's comparisons: combinations, ablations, LSUV and the data-init hook, reports."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

import fixup
from fixup import Bias, Scale
from fixup.init import data_init_, initialise_, lsuv_
from fixup.method import METHODS, resolve_method
from fixup.report import FixupReport, InitReport


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _branch_convs(model: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    return [(b.conv1, b.conv2) for b in model.modules() if isinstance(b, fixup.models.resnet_cifar.BasicBlock)]


@pytest.mark.parametrize(("norm", "init", "own"), [
    ("batchnorm", "fixup_no_bias", "fixup"), ("batchnorm", "lsuv", "none"), ("none", "fixup", "fixup"),
    ("fixup", "he", "none"), ("groupnorm", "sqrt2", "none")])
def test_a_method_given_a_norm_it_does_not_have_is_refused_naming_its_own(norm: str, init: str, own: str) -> None:
    with pytest.raises(ValueError, match=rf"init='{init}' is the method '{init}', which has norm='{own}', not "
                                         rf"norm='{norm}'; leave the norm out .* or give norm='{own}'"):
        fixup.create_model("resnet20", norm=norm, init=init)


def test_an_unknown_init_is_refused_with_the_list() -> None:
    with pytest.raises(ValueError, match=r"does not combine.*norm='fixup' with init in .*'fixup_no_scale'.*"
                                         r"norm='none' with init in \('he', 'xavier', 'lsuv', 'sqrt2', 'skipinit', "
                                         r"'skipinit_he', 'rezero', 'nf_resnet', 'nf_resnet_nozero', 't_fixup'\)"):
        fixup.create_model("resnet20", norm="fixup", init="fixup_scale_x2")


def test_every_listed_combination_resolves_and_defaults_are_fixup_and_he() -> None:
    assert resolve_method("fixup").init == "fixup" and resolve_method("none").init == "he"
    assert resolve_method("batchnorm", None).init == "he"
    for name, method in METHODS.items():
        assert resolve_method(method.norm, method.init) is method and method.name == name
    with pytest.raises(ValueError, match="unknown norm='weightnorm'"):
        resolve_method("weightnorm")


def test_zero_init_last_norm_only_with_a_normalised_model() -> None:
    model = fixup.create_model("resnet20", norm="batchnorm", zero_init_last_norm=True)
    zeroed = [b.norm2.weight for b in model.modules() if isinstance(b, fixup.models.resnet_cifar.BasicBlock)]
    assert len(zeroed) == 9 and all(torch.equal(w, torch.zeros_like(w)) for w in zeroed)
    assert len(model.init_report.zeroed) == 9 and model.layer1[0].norm1.weight.eq(1).all()
    assert fixup.create_model("resnet20", norm="batchnorm").layer1[0].norm2.weight.eq(1).all()  # off by default
    with pytest.raises(ValueError, match="zero_init_last_norm applies to norm='batchnorm' or 'groupnorm'"):
        fixup.create_model("resnet20", norm="fixup", zero_init_last_norm=True)


def test_depth_scale_ablations_change_only_the_factor_of_the_inner_layer() -> None:
    L, stds = 9, {}
    for init in ("fixup", "fixup_no_depth_scale", "fixup_scale_x0.1", "fixup_scale_x10"):
        model = fixup.create_model("resnet20", init=init, generator=_gen())
        conv1, conv2 = model.layer2[1].conv1, model.layer2[1].conv2
        assert torch.equal(conv2.weight, torch.zeros_like(conv2.weight))
        stds[init] = model.init_report.branches[4].scaled[0].std
        assert float(conv1.weight.detach().std()) == pytest.approx(stds[init], rel=0.05)  # 9216 draws
        assert model.init_report.method == init
    assert stds["fixup_no_depth_scale"] == pytest.approx(stds["fixup"] * math.sqrt(L))  # L^(-1/2) removed
    assert stds["fixup_scale_x0.1"] == pytest.approx(stds["fixup"] * 0.1)
    assert stds["fixup_scale_x10"] == pytest.approx(stds["fixup"] * 10)


def test_zero_branch_ablation_zeroes_every_branch_weight_but_keeps_scalars_and_stem() -> None:
    model = fixup.create_model("resnet20", init="fixup_zero_branch")
    for conv1, conv2 in _branch_convs(model):
        assert not conv1.weight.any() and not conv2.weight.any()
    assert model.conv1.weight.abs().sum() > 0
    assert sum(isinstance(m, Bias) for m in model.modules()) == 4 * 9 + 2
    assert all(b.factor == 0.0 for b in model.init_report.branches)
    assert len([z for z in model.init_report.zeroed if "branch weight" in z]) == 18


def test_no_bias_and_no_scale_ablations_are_built_without_those_scalars() -> None:
    no_bias = fixup.create_model("resnet20", init="fixup_no_bias")
    assert not any(isinstance(m, Bias) for m in no_bias.modules())
    assert sum(isinstance(m, Scale) for m in no_bias.modules()) == 9
    assert all(b.num_biases == 0 and b.has_scale for b in no_bias.init_report.branches)
    no_scale = fixup.create_model("resnet20", init="fixup_no_scale")
    assert not any(isinstance(m, Scale) for m in no_scale.modules())
    assert sum(isinstance(m, Bias) for m in no_scale.modules()) == 4 * 9 + 2
    assert all(b.num_biases == 4 and not b.has_scale for b in no_scale.init_report.branches)
    # the rest of the rule is unchanged: same factor, same zeroed layers
    assert no_scale.init_report.branches[0].factor == pytest.approx(9 ** -0.5)


def test_he_and_xavier_draw_their_distributions() -> None:
    he = fixup.create_model("resnet20", norm="none", init="he", generator=_gen())
    conv = he.layer3[0].conv1  # 64 x 32 x 3 x 3, fan_out = 64 * 9
    assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.05)
    xavier = fixup.create_model("resnet20", norm="none", init="xavier", generator=_gen())
    conv = xavier.layer3[0].conv1
    assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(2 / (32 * 9 + 64 * 9)), rel=0.05)
    assert float(xavier.fc.weight.detach().std()) == pytest.approx(math.sqrt(2 / (64 + 10)), rel=0.15)
    assert not any(isinstance(m, (Bias, Scale)) for m in xavier.modules())


def test_generator_makes_every_method_reproducible() -> None:
    for norm, init in (("fixup", None), ("none", "xavier"), ("none", "lsuv"), ("batchnorm", "he")):
        a, b = (fixup.create_model("resnet20", norm=norm, init=init, generator=_gen(3)) for _ in range(2))
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def _layer_output_variances(model: nn.Module, batch: torch.Tensor) -> dict[str, float]:
    out: dict[str, float] = {}

    def record(name: str, output: torch.Tensor) -> None:
        out.setdefault(name, float(output.var()))

    hooks = [m.register_forward_hook(lambda mod, a, y, n=n: record(n, y))
             for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model.eval()(batch)
    for h in hooks:
        h.remove()
    return out


def test_lsuv_brings_every_layer_output_variance_to_one_within_tol_on_its_batch() -> None:
    model = fixup.create_model("resnet_cifar", depth=14, norm="none", init="he", generator=_gen())
    batch = torch.randn(16, 3, 8, 8, generator=_gen(1)) * 3 + 1
    before = _layer_output_variances(model, batch)
    assert any(abs(v - 1) > 0.5 for v in before.values())  # the point: He alone does not give unit variance
    records = lsuv_(model, batch, tol=0.05, generator=_gen(2))
    after = _layer_output_variances(model, batch)
    assert [r.name for r in records] == list(after)  # every weight layer, in execution order
    assert all(r.converged for r in records)
    for name, var in after.items():
        assert abs(var - 1) < 0.05, name
    # orthonormal start: conv1 of a block is rescaled from an orthonormal matrix (rows orthogonal)
    w = model.layer1[0].conv1.weight.detach().flatten(1)
    gram = w @ w.T
    assert torch.allclose(gram, gram[0, 0] * torch.eye(16), atol=1e-4 * float(gram[0, 0]))


def test_lsuv_reports_layers_it_cannot_rescale() -> None:
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 2, bias=False))
    records = lsuv_(model, torch.zeros(8, 4))
    assert [r.converged for r in records] == [False, False] and records[0].variance == 0.0
    with pytest.raises(ValueError, match="tol must be positive"):
        lsuv_(model, torch.zeros(8, 4), tol=0)


def test_data_init_runs_lsuv_once_for_lsuv_models_and_nothing_otherwise() -> None:
    batch = (torch.randn(8, 3, 8, 8, generator=_gen(1)), torch.zeros(8, dtype=torch.long))
    he = fixup.create_model("resnet20", norm="none", init="he")
    state = {k: v.clone() for k, v in he.state_dict().items()}
    assert data_init_(he, batch) == []
    assert all(torch.equal(state[k], v) for k, v in he.state_dict().items())
    model = fixup.create_model("resnet20", norm="none", init="lsuv", generator=_gen())
    assert model.init_report.data_init_pending and "PENDING" in str(model.init_report)
    records = data_init_(model, batch)
    assert len(records) == 20 and all(r.converged for r in records)
    assert not model.init_report.data_init_pending and model.init_report.data_init == records
    assert not model.init_report.warnings and "LSUV on a batch of 8" in model.init_report.scheme
    frozen = [p.clone() for p in model.parameters()]
    assert data_init_(model, batch) == []  # a second call changes nothing
    assert all(torch.equal(a, b) for a, b in zip(frozen, model.parameters()))


@pytest.mark.parametrize(("norm", "init", "scheme"), [("none", "he", "He normal"), ("none", "xavier", "Xavier"),
                                                      ("none", "lsuv", "orthonormal"), ("none", "sqrt2", "He normal"),
                                                      ("batchnorm", "he", "He normal"), ("groupnorm", "he", "He")])
def test_every_method_has_an_accounting_report(norm: str, init: str, scheme: str) -> None:
    report = fixup.create_model("resnet20", norm=norm, init=init).init_report
    assert isinstance(report, InitReport) and not isinstance(report, FixupReport) and not report.is_fixup
    assert report.num_branches == 9 and len(report.other_layers) == 20
    assert scheme in report.scheme and scheme in str(report)
    assert len(report.normalization) == {"none": 0, "batchnorm": 19, "groupnorm": 19}[norm]
    assert report.output_scale == (1 / math.sqrt(2) if init == "sqrt2" else 1.0)
    again = InitReport.from_dict(report.to_dict())
    assert again == report and type(again) is InitReport


def test_lsuv_report_round_trips_through_json() -> None:
    model = fixup.create_model("resnet20", norm="none", init="lsuv")
    data_init_(model, torch.randn(4, 3, 8, 8))
    report = InitReport.from_dict(model.init_report.to_dict())
    assert report == model.init_report and "all within tolerance" in str(report)


def test_output_scale_must_match_the_method() -> None:
    model = fixup.models.resnet_cifar.CifarResNet(8, method="he")
    with pytest.raises(ValueError, match=r"output_scale 1 but init='sqrt2' needs 0\.707107"):
        initialise_(model, fixup.METHODS["sqrt2"])


@pytest.mark.parametrize(("name", "depths"), [("resnet_cifar", (8, 20, 56, 110, 200)),
                                              ("wide_resnet", (10, 22, 58, 112, 202))])
def test_sqrt2_keeps_forward_variance_bounded_with_depth_while_plain_he_grows(name: str, depths: tuple) -> None:
    """Measured on one input batch: the variance of the last stage's output as the network gets deeper."""
    x = torch.randn(2, 3, 8, 8, generator=_gen(1))
    var: dict[str, list[float]] = {"he": [], "sqrt2": []}
    for init in var:
        for depth in depths:
            model = fixup.create_model(name, depth=depth, norm="none", init=init, generator=_gen(2))
            with torch.no_grad():
                var[init].append(float(model.forward_features(x).var()))
    he, sqrt2 = var["he"], var["sqrt2"]
    assert all(b > 3 * a for a, b in itertools.pairwise(he))  # plain He: grows at every step of depth ...
    assert he[-1] > 1e12 * he[0]  # ... exponentially (about 1.8x per block)
    assert max(sqrt2) <= 1.5 * sqrt2[0]  # 1/sqrt(2): never grows
    assert all(math.isfinite(v) and v > 0 for v in sqrt2)


def test_ablations_note_the_scalars_they_leave_out_once_and_warn_nothing(recwarn) -> None:
    report = fixup.create_model("resnet20", init="fixup_no_bias").init_report
    assert report.notes == ["9 branches have no scalar biases (rule 3): the fixup_no_bias ablation leaves them out"]
    report = fixup.create_model("resnet20", init="fixup_no_scale").init_report
    assert report.notes == ["9 branches have no scalar multiplier (rule 3): the fixup_no_scale ablation leaves "
                            "them out"]
    assert report.warnings == [] and fixup.create_model("resnet20").init_report.warnings == []
    assert not [w for w in recwarn if issubclass(w.category, fixup.FixupWarning)]


def test_report_warnings_reach_the_user_as_fixup_warnings() -> None:
    model = fixup.create_model("resnet20", norm="batchnorm")
    with pytest.warns(fixup.FixupWarning, match="normalisation layer 'norm1' .* is still present"):
        report = fixup.fixup_init_(model)
    # It says that it applied Fixup, not the model's own method; then the norms; each branch lacks its scalars.
    assert report.warnings[0].startswith("CifarResNet was built for method 'batchnorm'; fixup_init_ applied 'fixup'")
    assert len(report.warnings) == 1 + 19 + 2 * 9
