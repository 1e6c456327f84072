"""Each method's default against its authors' released code, from their formulas (issue 41).

NF-ResNet: deepmind-research ``nfnets/nf_resnet.py`` (the model: ``skip_gain`` initialised at 0, weight-
standardised convolutions drawn N(0, 1/fan_in) with gains 1 and biases 0, the classifier N(0, 0.01) with bias 0)
and ``experiment_nfnets.py`` (the recipe: AGC on every tensor but the classifier's weight, vectors and scalars as
one unit; gains and biases without weight decay). SkipInit: ``nfnets/skipinit_resnet.py`` (haiku's default
initialiser, a truncated normal of std 1/sqrt(fan_in); the classifier at 0; gains and biases undecayed by the
same experiment's filter). A change that drifts from these numbers fails here.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import fixup
from fixup.clip import AGC_CLIPPING, AGC_EPS, adaptive_clip_grad_, agc_exempt, agc_rule
from fixup.init._layers import TRUNCATED_STD
from fixup.init.nf_resnet import CLASSIFIER_STD
from fixup.nn import Gate, ScaledStdConv2d


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _std_within(w: torch.Tensor, std: float) -> None:
    """The sample std of ``w`` equals ``std`` within 5 standard errors (the std of a sample std is about
    std / sqrt(2 n) for a near-normal draw)."""
    n = w.numel()
    assert abs(float(w.std()) - std) < 5 * std / math.sqrt(2 * n) + 1e-12, (float(w.std()), std, n)


# --- NF-ResNet ------------------------------------------------------------------------------------------


def test_nf_resnet_initialises_as_the_authors_model() -> None:
    model = fixup.create_model("resnet_imagenet_bottleneck_tiny", method="nf_resnet", num_classes=10,
                               generator=_gen())
    convs = [m for m in model.modules() if isinstance(m, ScaledStdConv2d)]
    assert convs
    for conv in convs:  # WSConv2D: raw weights N(0, 1/fan_in), gain 1, bias 0
        fan_in = conv.weight[0].numel()
        _std_within(conv.weight.detach(), 1.0 / math.sqrt(fan_in))
        assert torch.equal(conv.gain, torch.ones_like(conv.gain))
        assert conv.bias is None or not conv.bias.any()
    gates = [m for m in model.modules() if isinstance(m, Gate)]
    assert len(gates) == model.init_report.num_branches and all(float(g.scale.detach()) == 0.0 for g in gates)
    _std_within(model.fc.weight.detach(), CLASSIFIER_STD)
    assert CLASSIFIER_STD == 0.01 and not model.fc.bias.any()


@pytest.mark.parametrize("method", ["nf_resnet", "nf_resnet_nozero"])
def test_nf_resnet_agc_clips_every_tensor_but_the_classifier_weight_gains_as_vectors(method: str) -> None:
    model = fixup.create_model("resnet_cifar", depth=14, method=method, num_classes=10, generator=_gen())
    assert fixup.METHODS[method].clip == "agc" and agc_rule(model) == "classifier"
    assert [id(p) for p in agc_exempt(model)] == [id(model.fc.weight)]
    gen = _gen(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) * 100.0  # far above lambda times every unit's norm
    before = {id(p): p.grad.clone() for p in model.parameters()}
    adaptive_clip_grad_(model)  # the rule's own treatment of the classifier: unclipped
    assert torch.equal(model.fc.weight.grad, before[id(model.fc.weight)])
    gains = {id(m.gain) for m in model.modules() if isinstance(m, ScaledStdConv2d)}
    checked = 0
    for p in model.parameters():
        if p is model.fc.weight:
            continue
        g, w = p.grad, p.detach()
        if p.ndim <= 1 or id(p) in gains:  # one unit: the whole tensor, scaled as one
            limit = AGC_CLIPPING * max(float(w.norm()), AGC_EPS)
            assert float(g.norm()) == pytest.approx(limit, rel=1e-4)
            torch.testing.assert_close(g, before[id(p)] * (g.norm() / before[id(p)].norm()))
        else:  # one unit per output row / filter
            limits = AGC_CLIPPING * w.flatten(1).norm(dim=1).clamp_min(AGC_EPS)
            torch.testing.assert_close(g.flatten(1).norm(dim=1), limits, rtol=1e-4, atol=0)
        checked += 1
    assert checked == sum(1 for _ in model.parameters()) - 1


def test_nf_resnet_decays_the_weights_only() -> None:
    model = fixup.create_model("resnet_cifar", depth=14, method="nf_resnet", num_classes=10)
    groups = {g["name"]: g for g in fixup.param_groups(model, lr=0.1, weight_decay=5e-4)}
    decayed = {id(p) for g in groups.values() if g["weight_decay"] for p in g["params"]}
    weights = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    assert decayed == weights and groups["weights"]["weight_decay"] == 5e-4
    undecayed = {id(p) for g in groups.values() if not g["weight_decay"] for p in g["params"]}
    expected = {id(m.gain) for m in model.modules() if isinstance(m, ScaledStdConv2d)}
    expected |= {id(m.bias) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None}
    expected |= {id(m.scale) for m in model.modules() if isinstance(m, Gate)}
    assert undecayed == expected
    assert all(g["lr"] == 0.1 for g in groups.values())  # every group at the weights' rate, as the authors'


@pytest.mark.parametrize(("init", "exempt_norm"), [("nf_resnet", None), ("fixup", 1.0)])
def test_the_engine_leaves_the_nf_classifier_unclipped_and_clips_fixup_s_zero_started_tensors(
        monkeypatch, init: str, exempt_norm: float | None) -> None:
    from fixup.train import TrainConfig, engine, fit

    calls = []

    def spy(model, clipping, **kw):
        calls.append((agc_rule(model), kw["exempt_max_norm"]))
        return adaptive_clip_grad_(model, clipping, **kw)

    monkeypatch.setattr(engine, "adaptive_clip_grad_", spy)
    fit(TrainConfig(init=init, depth=8, batch_size=64, max_updates=1, clip="agc", checkpoint=False), progress=False)
    assert calls == [("classifier" if init == "nf_resnet" else "zero_started", exempt_norm)]


def test_fixup_s_zero_started_tensors_are_clipped_together_to_norm_1_by_default() -> None:
    fx = fixup.create_model("resnet_cifar", depth=8, method="fixup")
    for p in fx.parameters():
        p.grad = torch.full_like(p, 10.0)
    adaptive_clip_grad_(fx)  # auto: the zero-started tensors together at global norm 1
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in agc_exempt(fx)]))
    assert float(norm) == pytest.approx(1.0, rel=1e-4)


# --- SkipInit -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kwargs"), [("resnet_cifar", {"depth": 14}), ("wide_resnet", {"depth": 16}),
                                              ("resnet_imagenet_bottleneck_tiny", {})])
def test_skipinit_draws_every_weight_layer_as_the_authors_code(name: str, kwargs: dict) -> None:
    model = fixup.create_model(name, method="skipinit", num_classes=10, generator=_gen(), **kwargs)
    stds = {r.name: r.std for r in model.init_report.other_layers}
    for b in model.init_report.branches:
        stds.update({r.name: r.std for r in b.layers})
        if b.shortcut is not None:
            stds[b.shortcut.name] = b.shortcut.std
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear)) and m is not model.fc]
    assert sorted(stds) == sorted(n for n, _ in layers)  # every weight layer but the classifier, accounted for
    for lname, layer in layers:
        std = 1.0 / math.sqrt(layer.weight[0].numel())  # fan_in: in_channels (per group) x kernel size
        assert stds[lname] == pytest.approx(std, rel=1e-12)
        w = layer.weight.detach()
        assert float(w.abs().max()) <= 2.0 * std / TRUNCATED_STD + 1e-7  # truncated at 2 std of the wide normal
        if w.numel() >= 500:
            _std_within(w, std)
        assert layer.bias is None or not layer.bias.any()
    assert not model.fc.weight.any() and not model.fc.bias.any()  # fc_init=jnp.zeros
    assert all(float(m.scale.detach()) == 0.0 for m in model.modules() if isinstance(m, Gate))
    groups = {g["name"]: g for g in fixup.param_groups(model, lr=0.1, weight_decay=5e-4)}
    assert groups["gates"]["weight_decay"] == 0.0 and groups["gates"]["lr"] == 0.1
    assert [id(p) for p in groups["gains_biases"]["params"]] == [id(model.fc.bias)]


def test_truncated_normal_constant_is_the_std_of_a_normal_cut_at_two_stds() -> None:
    x = torch.randn(2_000_000, generator=_gen())
    assert float(x[x.abs() <= 2].std()) == pytest.approx(TRUNCATED_STD, abs=2e-3)


def test_skipinit_refuses_a_base_and_names_the_variant() -> None:
    model = fixup.create_model("resnet_cifar", depth=8, method="skipinit")
    with pytest.raises(ValueError, match=r"base='xavier' does not apply.*'skipinit_he'"):
        fixup.init.initialise_(model, base="xavier")


def test_skipinit_he_keeps_the_he_draw_from_the_fan_out_and_pytorch_s_classifier() -> None:
    model = fixup.create_model("resnet_cifar", depth=14, method="skipinit_he", num_classes=10, generator=_gen())
    conv = model.layer1[0].conv1
    fan_out = conv.weight.shape[0] * conv.weight[0, 0].numel()
    assert model.init_report.branches[0].layers[0].std == pytest.approx(math.sqrt(2.0 / fan_out))
    assert model.fc.weight.any() and fixup.METHODS["skipinit_he"].decay_gains
