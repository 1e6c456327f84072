"""``fixup.adapt(model, x, method="nf_resnet")``: the NF-ResNet form (Brock, De & Smith 2021) of residual networks
written elsewhere: no norm left, every convolution standardised, the stream at the analytic variance, the branches
switched off by their skip gains, the activations' gammas, the method's recipe, and what it refuses."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
from adapt_zoo import timm_model
from fixup._adapt._gammas import gamma_of
from fixup._adapt._nf_modules import NFBranchOut
from fixup.branch import find_branches
from fixup.clip import agc_exempt, agc_rule
from fixup.nn import RELU_GAMMA, ScaledStdConv2d
from test_adapt import BasicBlock, Bottleneck, ResNet
from test_adapt_zoo import _needs


def _adapt(model: nn.Module, x: torch.Tensor, method: str = "nf_resnet") -> tuple[nn.Module, fixup.NFAdaptReport]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)
        return fixup.adapt(model, x, method=method)  # type: ignore[return-value]


def _x(n: int = 8, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


class _PreActBlock(nn.Module):
    """A pre-activation block, ``h + F(relu(bn(h)))``, its projection reading the activated input (He et al. 2016)."""

    def __init__(self, inp: int, out: int, stride: int = 1) -> None:
        super().__init__()
        self.bn1, self.act1 = nn.BatchNorm2d(inp), nn.ReLU()
        self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
        self.bn2, self.act2 = nn.BatchNorm2d(out), nn.ReLU()
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.shortcut = nn.Conv2d(inp, out, 1, stride, bias=False) if (inp, stride) != (out, 1) else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = self.act1(self.bn1(h))
        shortcut = h if self.shortcut is None else self.shortcut(a)
        return shortcut + self.conv2(self.act2(self.bn2(self.conv1(a))))


class _PreActNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        w = width
        self.blocks = nn.Sequential(_PreActBlock(w, w), _PreActBlock(w, w), _PreActBlock(w, w),
                                    _PreActBlock(w, 2 * w), _PreActBlock(2 * w, 2 * w), _PreActBlock(2 * w, 2 * w))
        self.bn, self.act, self.fc = nn.BatchNorm2d(2 * w), nn.ReLU(), nn.Linear(2 * w, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.bn(self.blocks(self.stem(x)))).mean((2, 3)))


_MODELS = {
    "torchvision BasicBlock": lambda: ResNet(BasicBlock, [2, 2, 2, 2], width=8),
    "torchvision Bottleneck": lambda: ResNet(Bottleneck, [1, 1, 1, 1], width=4),
    "pre-activation": _PreActNet,
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_no_norm_is_left_and_every_convolution_is_standardised(name: str) -> None:
    original = _MODELS[name]()
    model, report = _adapt(original, _x())
    convs = [n for n, m in original.named_modules() if isinstance(m, nn.Conv2d)]
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert all(isinstance(model.get_submodule(n), ScaledStdConv2d) for n in convs)
    assert len(report.standardised) == len(convs) and len(report.norms_replaced) == sum(
        isinstance(m, nn.BatchNorm2d) for m in original.modules())
    kept = set(model.state_dict())
    assert {f"{n}.weight" for n in convs} | {"fc.weight", "fc.bias"} <= kept  # the weight layers' keys stay
    for n in convs:  # each standardised row has mean 0 and norm equal to its gain (1)
        w = model.get_submodule(n).standardized_weight().flatten(1)
        assert torch.allclose(w.mean(1), torch.zeros(len(w)), atol=1e-6)
        assert torch.allclose(w.norm(dim=1), torch.ones(len(w)), atol=1e-3)


def test_timm_resnet18_is_standardised_without_norms() -> None:
    _needs("timm")
    original = timm_model("resnet18")
    model, report = _adapt(original, _x())
    convs = [n for n, m in original.named_modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 20 and all(isinstance(model.get_submodule(n), ScaledStdConv2d) for n in convs)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert report.num_branches == 8 and [r.transition for r in report.residuals].count(True) == 3
    # stage 1 is the stem's max pooling of an activated map (about 2.5x), which NF-ResNet stems do not have
    assert all(0.5 <= s.ratio <= 2.0 for s in report.stream[1:]), report.stream


@pytest.mark.parametrize(("build", "needs"), [
    (lambda: ResNet(BasicBlock, [2, 2, 2], width=16, small_input=True), None), (_PreActNet, None),
    (lambda: timm_model("regnetx_002"), "timm")], ids=["torchvision", "preact", "regnetx"])
def test_the_stream_stays_within_half_and_twice_the_input_at_every_stage(build, needs: str | None) -> None:
    """At 64 pixels: at 32, RegNetX's last stage runs at 1x1, where a standardised 3x3 convolution sees one tap of
    nine (0.4x measured; docs/adapt.md)."""
    _needs(needs)
    _, report = _adapt(build(), _x(4, 64))
    assert report.stream and all(0.5 <= s.ratio <= 2.0 for s in report.stream), report.stream


def _block_input_variances(model: nn.Module, x: torch.Tensor, blocks: list[nn.Module]) -> list[float]:
    """Each block's input variance over the central half of its maps (zero padding lowers the borders'), then the
    output's."""
    seen: list[torch.Tensor] = []

    def centre(t: torch.Tensor) -> torch.Tensor:
        h, w = t.shape[-2:]
        return t[..., h // 4: h - h // 4, w // 4: w - w // 4]

    hooks = [b.register_forward_pre_hook(lambda _m, a: seen.append(centre(a[0]))) for b in blocks]
    hooks.append(blocks[-1].register_forward_hook(lambda _m, _a, out: seen.append(centre(out))))
    with torch.no_grad():
        model.eval()(x)
    for h in hooks:
        h.remove()
    return [float(t.var()) for t in seen]


def test_the_stream_variance_follows_the_analytic_beta_squared() -> None:
    """nf_resnet_nozero (the block as the paper analyses it, every branch live): on unit Gaussian images, each
    block's input variance is beta_i^2 (alpha^2 more per block, 1 + alpha^2 after the transition)."""
    torch.manual_seed(0)
    model, report = _adapt(_PreActNet(width=32), _x(4, 32), method="nf_resnet_nozero")
    betas = [r.beta for r in report.residuals]
    assert betas == pytest.approx([1.0, math.sqrt(1.04), math.sqrt(1.08), math.sqrt(1.12), math.sqrt(1.04),
                                   math.sqrt(1.08)])
    measured = _block_input_variances(model, _x(32, 32, seed=1), list(model.blocks))
    expected = [b * b for b in betas] + [report.output_std ** 2]
    assert measured == pytest.approx(expected, rel=0.08), (measured, expected)
    # the check can fail: without the 1/beta and alpha the variance grows by a whole unit per block
    assert not measured[-1] == pytest.approx(len(betas) + 1.0, rel=0.08)


def test_zero_started_branches_leave_the_model_its_trunk() -> None:
    torch.manual_seed(0)
    model, report = _adapt(ResNet(BasicBlock, [2, 2, 2], width=8, small_input=True), _x())
    x = _x(4, seed=3)
    outs = [m for m in model.modules() if isinstance(m, NFBranchOut)]
    assert len(outs) == report.num_branches == 6 and all(r.gain for r in report.residuals)
    before = model.eval()(x).detach()
    with torch.no_grad():  # a branch contributes nothing at init: any change inside it leaves the output exactly
        for _, branch in find_branches(model):
            branch.layers[0].weight.add_(torch.randn_like(branch.layers[0].weight))
    assert torch.equal(model(x).detach(), before)
    with torch.no_grad():
        for out in outs:
            out.gain.scale.fill_(1.0)
    assert not torch.allclose(model(x).detach(), before)  # switched on, the same change shows


def test_a_few_sgd_steps_under_the_method_s_recipe_reduce_the_loss() -> None:
    torch.manual_seed(0)
    model, _ = _adapt(ResNet(BasicBlock, [1, 1, 1], width=8, small_input=True), _x())
    x, y = _x(32, 16, seed=4), torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(5))
    groups = {g["name"]: g for g in fixup.param_groups(model, lr=0.1, weight_decay=5e-4)}
    assert groups["gains_biases"]["weight_decay"] == 0 and groups["gates"]["weight_decay"] == 0
    opt = torch.optim.SGD(list(groups.values()), lr=0.1, momentum=0.9)
    model.train()
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        fixup.adaptive_clip_grad_(model)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.9 * losses[0], losses
    assert any(m.gain.scale.detach().abs().item() > 0 for m in model.modules() if isinstance(m, NFBranchOut))


def test_the_copy_declares_its_method_for_the_recipe() -> None:
    model, _ = _adapt(ResNet(BasicBlock, [1, 1], width=8), _x())
    assert fixup.method.model_method(model) is fixup.METHODS["nf_resnet"]
    assert agc_rule(model) == "classifier" and agc_exempt(model) == [model.fc.weight]  # the authors' rule
    fixup_model, _ = _adapt(ResNet(BasicBlock, [1, 1], width=8), _x(), method="fixup")
    assert agc_rule(fixup_model) == "zero_started"
    from fixup.train.config import TrainConfig
    from fixup.train.recipe import apply_recipe
    config, recipe = apply_recipe(TrainConfig(adapt="tests/adapt_zoo.py:timm_regnet", init="nf_resnet"))
    assert config.clip == "agc" and recipe.clip_from == "method"


def test_gamma_is_the_activation_s_own() -> None:
    assert gamma_of(F.relu) == pytest.approx(RELU_GAMMA, rel=1e-7)
    # the NF-Nets authors' sampled table (deepmind-research nfnets/base.py): ours agrees within 0.1%
    published = {F.gelu: 1.7015043497085571, F.silu: 1.7881293296813965, F.elu: 1.2716004848480225,
                 F.selu: 1.0008515119552612, torch.tanh: 1.5939117670059204, F.softplus: 1.9203323125839233,
                 F.leaky_relu: 1.70590341091156, F.relu6: 1.7131484746932983, torch.sigmoid: 4.803835391998291}
    for f, value in published.items():
        assert gamma_of(f) == pytest.approx(value, rel=1e-3), f
    _, report = _adapt(_WithAct(nn.LeakyReLU(0.2)), _x())
    leaky = [a.gamma for a in report.activations if a.type == "LeakyReLU"]
    assert leaky == [pytest.approx(gamma_of(lambda z: F.leaky_relu(z, 0.2)))]  # its own slope's gamma
    assert leaky[0] != pytest.approx(gamma_of(F.leaky_relu), rel=1e-3)  # not the default slope's


class _WithAct(nn.Module):
    """A tiny residual network whose branch has the activation ``act``."""

    def __init__(self, act: nn.Module, conv: type[nn.Module] = nn.Conv2d) -> None:
        super().__init__()
        self.stem, self.conv1, self.act = nn.Conv2d(3, 8, 3, 1, 1), conv(8, 8, 3, 1, 1), act
        self.conv2, self.fc = nn.Conv2d(8, 8, 3, 1, 1), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = h + self.conv2(self.act(self.conv1(h)))
        return self.fc(h.mean((2, 3)))


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(16, 32), nn.Linear(32, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x + self.fc2(torch.relu(self.fc1(x))))


def test_refusals_name_the_cause_and_the_fix() -> None:
    with pytest.raises(fixup.AdaptError, match=r"PReLU at .* learnt shape .*nn\.LeakyReLU\(0\.25\)"):
        fixup.adapt(_WithAct(nn.PReLU()), _x(), method="nf_resnet")
    with pytest.raises(fixup.AdaptError, match="found no residual sum"):
        fixup.adapt(_Plain(), _x(), method="nf_resnet")
    with pytest.raises(fixup.AdaptError, match=r"(?s)1 of its 1 residual branches is not convolutional \(1 branch "
                                               r"of linear layers; .*NF-ResNets standardise convolutions.*"
                                               r"method='fixup'"):
        fixup.adapt(_MLP(), torch.randn(2, 16), method="nf_resnet")


class _SameConv(nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 1.0


def test_a_convolution_with_a_forward_of_its_own_is_refused() -> None:
    with pytest.raises(fixup.AdaptError, match=r"conv1 is a _SameConv; .*replaces plain nn.Conv2d layers only"):
        fixup.adapt(_WithAct(nn.ReLU(), conv=_SameConv), _x(), method="nf_resnet")


def test_options_that_do_not_apply_are_refused_before_the_model_runs() -> None:
    for option, value in (("mode", "fan_in"), ("depth_scaling", False), ("base", "xavier")):
        with pytest.raises(ValueError, match=rf"^{option}= sets .*method='nf_resnet' standardises every convolution"):
            fixup.adapt(_Plain(), _x(), method="nf_resnet", **{option: value})
    with pytest.raises(ValueError, match=r"trunk='fan_in' .* does not apply: method='nf_resnet'"):
        fixup.adapt(_Plain(), _x(), method="nf_resnet", trunk="fan_in")


def test_the_copy_survives_deepcopy_and_torch_save(tmp_path) -> None:
    """The factors and the branch ends are child modules applied by module-level hooks; its state_dict, saved and
    loaded with weights_only=True into a fresh adapted copy, gives the same function."""
    import copy

    model, _ = _adapt(ResNet(BasicBlock, [1, 1], width=8, small_input=True), _x())
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, NFBranchOut):
                m.gain.scale.fill_(0.5)  # the branches live, so that every factor shows in the output
    x = _x(2, seed=6)
    torch.save(model.state_dict(), tmp_path / "nf.pt")
    loaded, _ = _adapt(ResNet(BasicBlock, [1, 1], width=8, small_input=True), _x())
    loaded.load_state_dict(torch.load(tmp_path / "nf.pt", weights_only=True))
    assert torch.equal(loaded.eval()(x), model.eval()(x)) and torch.equal(copy.deepcopy(model)(x), model(x))


def test_squeeze_excite_outputs_are_doubled_and_small_maps_are_named() -> None:
    """Each squeeze-excite output of EfficientNet-B0 is scaled by 2 (its gate's mean at initialisation is 0.5, as the
    NF-Nets authors' blocks have it): at 128 pixels the stream stays within 0.5x-2x at every stage, where without the
    factor it fell to 0.002x. At 32 pixels its last stages run on maps smaller than their kernels, and the report
    says so and names the methods that standardise nothing."""
    _needs("timm")
    model, report = _adapt(timm_model("efficientnet_b0"), _x(2, 128))
    assert len(report.gates) == 16 and all("x2 on the input of" in g for g in report.gates)
    assert report.stream and all(0.5 <= s.ratio <= 2.0 for s in report.stream), report.stream
    se = model.get_submodule("blocks.1.0.conv_pwl")  # reads blocks.1.0.se's output
    assert any(isinstance(m, fixup._adapt._nf_modules.NFFactor) and m.factor == 2.0 for m in se.modules())
    assert not any("smaller than" in w for w in report.warnings)
    _, small = _adapt(timm_model("efficientnet_b0"), _x(2, 32))
    why = [w for w in small.warnings if "smaller than their kernel" in w]
    assert min(s.ratio for s in small.stream) < 0.5 and len(why) == 1 and "'rezero'" in why[0], small.warnings
    _, resnet = _adapt(timm_model("resnet18"), _x())
    assert not resnet.gates and not any("smaller than" in w for w in resnet.warnings)


def test_a_layer_registered_under_two_names_is_replaced_under_both() -> None:
    """The library's own BatchNorm ResNet-18 registers each projection as ``projection`` and as ``shortcut[0]`` and
    calls the second: both names must hold the standardised layer (before, the called one stayed a He-drawn Conv2d
    and the stream grew to 7x by the last stage)."""
    original = fixup.create_model("resnet18", norm="batchnorm", num_classes=10)
    assert original.layer2[0].projection is original.layer2[0].shortcut[0]
    model, report = _adapt(original, _x(4))
    assert model.layer2[0].projection is model.layer2[0].shortcut[0]
    assert all(isinstance(m, ScaledStdConv2d) for m in model.modules() if isinstance(m, nn.Conv2d))
    assert all(0.5 <= s.ratio <= 2.0 for s in report.stream[1:]), report.stream  # stage 1: the stem's mean
