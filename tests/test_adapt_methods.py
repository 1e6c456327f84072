"""``fixup.adapt(model, x, method=...)``: the gated methods (SkipInit, ReZero) on models written elsewhere, the
methods adapt refuses (each naming what works), and the zoo's real classes under every method adapt applies."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F

import fixup
from adapt_zoo import ZOO
from fixup.branch import find_branches
from test_adapt import BasicBlock, ResNet
from test_adapt_trunk import TinyEfficientNet
from test_adapt_zoo import _needs, as_inputs


def _x() -> torch.Tensor:
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _branch_outputs(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Each branch's output after its gate: the last layer's output once its forward hooks have run."""
    outs: list[torch.Tensor] = []
    last = [b.layers[-1] for _, b in find_branches(model)]
    # Registered after adapt's gate hook, so it sees the gated output.
    # A clone: the model may add its shortcut in place (``out += identity``) to the very tensor the layer returned.
    hooks = [m.register_forward_hook(lambda m, a, o: outs.append(o.detach().clone())) for m in last]
    with torch.no_grad():
        model.eval()(x)
    for h in hooks:
        h.remove()
    return outs


@pytest.mark.parametrize("method", ["skipinit", "rezero"])
@pytest.mark.parametrize("build", [TinyEfficientNet, lambda: ResNet(BasicBlock, [1, 1, 1])], ids=["mbconv", "resnet"])
def test_gated_adapt_starts_every_block_as_its_shortcut_with_unscaled_weights(method: str, build) -> None:
    model, report = fixup.adapt(build(), _x(), method=method)
    assert isinstance(report, fixup.GateAdaptReport) and report.method == method
    branches = find_branches(model)
    assert len(branches) == report.num_branches > 0
    assert all(isinstance(b.scale, fixup.Gate) and float(b.scale.scale.detach()) == 0.0 for _, b in branches)
    # The gate, not the weights, switches the branch off: no layer zeroed, the last layer's weight drawn.
    assert all(b.layers[-1].weight.abs().sum() > 0 for _, b in branches)
    assert all(torch.count_nonzero(o) == 0 for o in _branch_outputs(model, _x()))
    # No scalar bias of Fixup's rule 3 was added: the scalars added are the gates.
    assert len(report.scalars_added) == report.num_branches
    assert report.trunk_rule == "lsuv" and report.stream


@pytest.mark.parametrize("method", ["skipinit", "rezero"])
def test_gated_adapt_removes_every_norm_without_a_bias_unless_asked(method: str) -> None:
    """Neither paper adds a bias where the normalisation was (docs/methods.md measured the biases: no better)."""
    model, report = fixup.adapt(ResNet(BasicBlock, [1, 1, 1]), _x(), method=method)
    assert report.norms_replaced and all(n.action == "removed" for n in report.norms_replaced)
    assert not [m for m in model.modules() if isinstance(m, fixup.nn.Bias)]
    assert {g["name"] for g in fixup.param_groups(model, lr=0.1)} <= {"weights", "gates", "gains_biases"}
    biased, report = fixup.adapt(ResNet(BasicBlock, [1, 1, 1]), _x(), method=method, gate_biases=True)
    assert any(n.action == "bias" for n in report.norms_replaced)
    assert [m for m in biased.modules() if isinstance(m, fixup.nn.Bias)]
    with pytest.raises(ValueError, match=r"gate_biases=True applies to the gated methods"):
        fixup.adapt(ResNet(BasicBlock, [1, 1, 1]), _x(), gate_biases=True)


def test_gated_adapt_draws_by_the_method_skipinit_s_classifier_at_zero() -> None:
    si, _ = fixup.adapt(ResNet(BasicBlock, [1, 1, 1]), _x(), method="skipinit")
    rz, _ = fixup.adapt(ResNet(BasicBlock, [1, 1, 1]), _x(), method="rezero")
    [cls_si], [cls_rz] = (fixup.branch.find_classifier(m) for m in (si, rz))
    assert not cls_si.weight.any() and cls_rz.weight.any()


def test_adapted_skipinit_trains_by_its_authors_recipe_gates_and_biases_undecayed() -> None:
    """SkipInit's authors decay neither gains nor biases (Method.decay_gains): the adapted copy declares its method,
    so fixup.param_groups leaves the gates and the layers' biases undecayed; ReZero, and SkipInit with Fixup's
    biases added, keep the scalars' decay."""
    def decays(model):
        return {g["name"]: g["weight_decay"] for g in fixup.param_groups(model, lr=0.1, weight_decay=5e-4)
                if g["params"]}

    si, _ = fixup.adapt(ResNet(BasicBlock, [1, 1, 1]), _x(), method="skipinit")
    assert fixup.method.model_method(si).name == "skipinit"
    assert decays(si) == {"weights": 5e-4, "gates": 0.0, "gains_biases": 0.0}  # the classifier's bias undecayed
    rz, _ = fixup.adapt(ResNet(BasicBlock, [1, 1, 1]), _x(), method="rezero")
    assert fixup.method.model_method(rz) is None and decays(rz)["gates"] == 5e-4
    biased, _ = fixup.adapt(ResNet(BasicBlock, [1, 1, 1]), _x(), method="skipinit", gate_biases=True)
    assert fixup.method.model_method(biased) is None


def test_skipinit_and_rezero_adapt_to_the_same_structure() -> None:
    _, a = fixup.adapt(TinyEfficientNet(), _x(), method="skipinit")
    _, b = fixup.adapt(TinyEfficientNet(), _x(), method="rezero")
    assert [(r.name, r.kind, r.m, r.gate) for r in a.branches] == [(r.name, r.kind, r.m, r.gate) for r in b.branches]


def test_gates_learn_at_the_weights_rate_and_the_report_round_trips() -> None:
    torch.manual_seed(0)
    model, report = fixup.adapt(TinyEfficientNet(), _x(), method="rezero")
    groups = {g["name"]: g for g in fixup.param_groups(model, lr=0.1)}
    assert groups["gates"]["lr"] == pytest.approx(0.1) and len(groups["gates"]["params"]) == report.num_branches
    opt = torch.optim.SGD(list(groups.values()), lr=0.1)
    model.train()
    F.cross_entropy(model(_x()), torch.arange(4)).backward()
    opt.step()
    assert all(float(b.scale.scale) != 0.0 for _, b in find_branches(model))
    again = type(report).from_dict(json.loads(json.dumps(report.to_dict())))
    assert isinstance(again, fixup.GateAdaptReport) and again == report


def test_an_unsupported_method_is_refused_with_the_list() -> None:
    with pytest.raises(ValueError, match=r"applies the methods \('fixup', 'skipinit', 'rezero', 'nf_resnet', "
                                         r"'nf_resnet_nozero', 't_fixup', 'dyt'\), got method='lsuv'"):
        fixup.adapt(TinyEfficientNet(), _x(), method="lsuv")
    assert fixup.ADAPT_METHODS == ("fixup", "skipinit", "rezero", "nf_resnet", "nf_resnet_nozero", "t_fixup", "dyt")


def _small_x() -> torch.Tensor:
    return torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))






@pytest.mark.parametrize("method", [m for m in fixup.METHODS if m not in fixup.ADAPT_METHODS])
def test_a_method_adapt_cannot_apply_is_refused_naming_what_works(method: str) -> None:
    with pytest.raises(ValueError, match=f"got method='{method}': ") as err:
        fixup.adapt(TinyEfficientNet(), _small_x(), method=method)
    assert f"method={method!r}" in str(err.value)


def test_an_unknown_method_lists_the_table() -> None:
    with pytest.raises(ValueError, match="unknown method 'nfnet'; choose among fixup, "):
        fixup.adapt(TinyEfficientNet(), _small_x(), method="nfnet")


# The real classes of docs/adapt.md's training table (timm: skipped where it is not installed), and torchvision's
# ResNet-18 and ResNet-50 layouts, which run everywhere.
_TABLE = [n for n in ZOO if n.split(" ")[0] in ("resnet18", "regnetx_002", "efficientnet_b0", "mobilenetv3_small_050",
                                                  "convnext_atto", "vit_tiny_patch16_224", "resnet50")
          and ZOO[n].source in ("timm", "torchvision (architecture)")]


# The methods that rewrite residual branches (DyT changes only the LayerNorms: tests/test_dyt.py runs it on the table).
_BRANCH_METHODS = [m for m in fixup.ADAPT_METHODS if fixup.METHODS[m].adapt != "dyt"]


@pytest.mark.parametrize("name", _TABLE)
@pytest.mark.parametrize("method", _BRANCH_METHODS)
def test_every_method_adapt_applies_adapts_the_training_tables_models(name: str, method: str) -> None:
    entry = ZOO[name]
    _needs(entry.needs)
    x = entry.example()
    nf = fixup.METHODS[method].adapt == "nf"
    if nf and set(entry.branches) - {"conv"}:  # NF-ResNets define convolutional branches only
        with pytest.raises(fixup.AdaptError, match="NF-ResNets standardise convolutions and define no other branch"):
            fixup.adapt(entry.build(), x, method=method)
        return
    if fixup.METHODS[method].adapt == "t_fixup" and set(entry.branches) != {"attention", "mlp"}:  # Transformers only
        with pytest.raises(fixup.AdaptError, match=r"[Uu]se method='fixup'"):
            fixup.adapt(entry.build(), x, method=method)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, report = fixup.adapt(entry.build(), x, method=method)
    assert report.num_branches == entry.L and report.to_dict()["method"] == method
    for other in (m for m in fixup.METHODS if m not in fixup.ADAPT_METHODS):
        with pytest.raises(ValueError, match=f"got method='{other}'"):
            fixup.adapt(entry.build(), x, method=other)
    out = model(*as_inputs(x))
    assert all(torch.isfinite(t).all() for t in (out if isinstance(out, tuple) else (out,)) if torch.is_tensor(t))
    if nf:  # every convolution standardised, but those of the squeeze-excite gates (ordinary layers, He fan-in)
        assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
        assert {n for n, m in model.named_modules() if type(m) is torch.nn.Conv2d} <= set(report.other_layers)


# --- every option of adapt under every method: it applies, or it is refused naming the option and the fix ---

class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 16), _Block(), _Block(), torch.nn.Linear(16, 3))


# option -> (value, how the report shows that it applied)
_OPTIONS = {
    "mode": ("fan_in", lambda r: r.fan_mode == "fan_in"),
    "base": ("xavier", lambda r: r.base_init == "xavier"),
    "stem_mode": ("fan_out", lambda r: r.stem_fan_mode == "fan_out"),
    "depth_scaling": (False, lambda r: not r.depth_scaling and all(b.factor == 1.0 for b in r.branches)),
    "rescale": (0.5, lambda r: r.rescale == 0.5 and r.branches[0].factor == pytest.approx(0.5 * 2 ** -0.5)),
    "expect_biases": (False, lambda r: True),  # it only silences a warning the adapted model never needs
    "expect_scale": (False, lambda r: True),
}
# (method, option) -> the words its refusal must hold; every pair not listed applies.
_REFUSED = {
    **{("skipinit", o): ("truncated at 2 std", "method='rezero'") for o in ("mode", "base", "stem_mode")},
    **{(m, o): ("scales no weight by depth", "method='fixup'") for m in ("skipinit", "rezero")
       for o in ("depth_scaling", "rescale")},
    **{(m, o): ("a gate, not Fixup's scalars", "method='fixup'") for m in ("skipinit", "rezero")
       for o in ("expect_biases", "expect_scale")},
    **{("dyt", o): ("changes nothing else", "method='fixup'") for o in _OPTIONS},
    **{(m, o): ("standardises every convolution", "method='fixup'") for m in ("nf_resnet", "nf_resnet_nozero")
       for o in _OPTIONS},
    **{("t_fixup", o): ("T-Fixup's own rule", "method='fixup'") for o in _OPTIONS},
}


@pytest.mark.parametrize("option", list(_OPTIONS))
@pytest.mark.parametrize("method", fixup.ADAPT_METHODS)
def test_each_option_applies_under_the_method_or_is_refused_naming_it(method: str, option: str) -> None:
    value, shows = _OPTIONS[option]
    words = _REFUSED.get((method, option))
    if words is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fixup.FixupWarning)
            _model, report = fixup.adapt(_mlp(), torch.randn(2, 4), method=method, **{option: value})
        assert report.method.startswith(method) and shows(report)
        return
    with pytest.raises(ValueError) as err:
        fixup.adapt(_mlp(), torch.randn(2, 4), method=method, **{option: value})
    text = str(err.value)
    assert text.startswith(f"{option}= sets ") and f"method={method!r}" in text
    assert all(w in text for w in words), text


class _Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the model ran before its options were checked")


@pytest.mark.parametrize("method", fixup.ADAPT_METHODS)
def test_options_are_checked_before_the_model_runs(method: str) -> None:
    """Unknown options, and ones no method of adapt takes, are ValueErrors naming them, whatever the method."""
    with pytest.raises(ValueError, match=r"no option 'stem_mod' \(did you mean 'stem_mode'\?\)"):
        fixup.adapt(_Raises(), torch.randn(2, 4), method=method, stem_mod="fan_in")
    with pytest.raises(ValueError, match=r"stream_bias= does not apply to fixup.adapt: .*fixup.param_groups"):
        fixup.adapt(_Raises(), torch.randn(2, 4), method=method, stream_bias="paper")
    with pytest.raises(ValueError, match=r"mode must be one of \('fan_in', 'fan_out'\), got 'fanin'"):
        fixup.adapt(_Raises(), torch.randn(2, 4), method=method, mode="fanin")
    with pytest.raises(ValueError, match=r"trunk must be one of"):
        fixup.adapt(_Raises(), torch.randn(2, 4), method=method, trunk="he")
