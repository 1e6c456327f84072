"""Private training under Opacus (``fixup.private``): every registered model with a Fixup, SkipInit or ReZero method
(and NF-ResNet, T-Fixup), and every adapted image model of tests/adapt_zoo.py, gives per-example gradients equal to
each example's own gradient, whose mean is the batch gradient, in Opacus's "hooks" and "functorch" modes; a full
``make_private`` and one DP-SGD step run. Opacus is the ``dp`` extra: its tests are skipped, saying so, without it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
import fixup.private as private
from fixup import FixupWarning
from fixup.nn import InplaceReLU

MODES = ("hooks", "functorch")
DTYPE = torch.float32
EPS = torch.finfo(DTYPE).eps


@pytest.fixture
def opacus():
    return pytest.importorskip("opacus", reason="opacus is not installed (the dp extra brings it)")


# --- our models: a tiny stand-in of each registered builder's class ---

def _cifar(**kw) -> nn.Module:
    return fixup.create_model("resnet_cifar", depth=8, **kw)


def _basic(**kw) -> nn.Module:
    return fixup.create_model("resnet_imagenet_tiny", num_classes=10, **kw)


def _bottleneck(**kw) -> nn.Module:
    return fixup.create_model("resnet_imagenet_bottleneck_tiny", num_classes=10, **kw)


def _wide(**kw) -> nn.Module:
    return fixup.create_model("wide_resnet", depth=10, width=1, **kw)


def _transformer(**kw) -> nn.Module:
    return fixup.create_model("transformer_tiny", d_model=32, ffn_dim=64, heads=4, src_vocab=40, tgt_vocab=40,
                              dropout=0.0, **kw)


FAMILIES: dict[str, Callable[..., nn.Module]] = {"cifar": _cifar, "basic": _basic, "bottleneck": _bottleneck,
                                                 "wide": _wide, "transformer": _transformer}
# Every registered builder, by the family of its class (the test below fails on a new name without one).
STAND_IN = {**{n: "cifar" for n in ("resnet_cifar", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110",
                                     "resnet1202")},
            **{n: "basic" for n in ("resnet18", "resnet34", "resnet_imagenet_tiny")},
            **{n: "bottleneck" for n in ("resnet50", "resnet101", "resnet152", "resnet_imagenet",
                                         "resnet_imagenet_bottleneck_tiny")},
            **{n: "wide" for n in ("wide_resnet", "wrn28_10", "wrn40_10")},
            **{n: "transformer" for n in ("transformer_tiny", "transformer_iwslt_de_en")}}
METHODS = {"cifar": ("fixup", "skipinit", "rezero", "nf_resnet"), "basic": ("fixup", "skipinit", "rezero", "nf_resnet"),
           "bottleneck": ("fixup", "skipinit", "rezero", "nf_resnet"), "wide": ("fixup", "skipinit", "rezero",
                                                                                "nf_resnet"),
           "transformer": ("fixup", "skipinit", "rezero", "t_fixup", "dyt")}


def _method(name: str) -> dict[str, str]:
    return {"norm": "fixup"} if name == "fixup" else {"init": name}


def _image_batch(n: int = 4) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(n, 3, 32, 32, generator=g),), torch.randint(0, 10, (n,), generator=g)


def _token_batch(n: int = 4) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return ((torch.randint(1, 40, (n, 6), generator=g), torch.randint(1, 40, (n, 5), generator=g)),
            torch.randint(1, 40, (n, 5), generator=g))


def _logits(out: object) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits  # type: ignore[attr-defined]


def _loss(out: object, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the examples (and tokens): Opacus's loss_reduction "mean"."""
    logits = _logits(out)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _perturb(model: nn.Module) -> None:
    """Move every parameter off its initial value: at initialisation a zeroed last layer stops the gradient of
    every layer before it, and a multiplier of exactly 1 would hide a missing factor."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            # 10% of a tensor's spread; a scalar (multiplier, bias, gate) by ~0.2, a zeroed layer by 0.05
            spread = 0.2 if p.numel() == 1 else 0.1 * float(p.std()) or 0.05
            p.add_(spread * torch.randn(p.shape, generator=g, dtype=p.dtype))
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0  # per-example and batch gradients must see the same function


def check_per_example_gradients(model: nn.Module, inputs: tuple[torch.Tensor, ...], target: torch.Tensor,
                                mode: str) -> None:
    """Opacus's per-example gradients of ``model`` (after fixup.private.prepare) against each example's own
    gradient from an unhooked copy, and their mean against the batch gradient."""
    from opacus import GradSampleModule

    private.register_grad_samplers()
    model = model.to(DTYPE).train()
    inputs = tuple(x.to(DTYPE) if x.is_floating_point() else x for x in inputs)
    _perturb(model)
    reference = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    ref_params = [p for p in reference.parameters() if p.requires_grad]
    report = private.prepare(model, inputs)
    assert report.ready, report.problems
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean", force_functorch=mode == "functorch")
    _loss(gsm(*inputs), target).backward()
    # Opacus's "mean" reduction multiplies the output gradients by the batch size, so grad_sample[i] is the
    # gradient of example i's own loss, and the batch gradient of the mean loss is their mean.
    missing = [i for i, p in enumerate(params) if getattr(p, "grad_sample", None) is None]
    assert not missing, f"no per-example gradient for {[names[i] for i in missing]}"
    per_example = [p.grad_sample for p in params]
    reference.zero_grad()
    _loss(reference(*inputs), target).backward()
    batch = [p.grad.clone() for p in ref_params]
    singles = []
    for i in range(target.shape[0]):
        reference.zero_grad()
        _loss(reference(*(x[i:i + 1] for x in inputs)), target[i:i + 1]).backward()
        singles.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in ref_params])
    # Float32: each gradient entry is a sum of up to B*H*W = 4,096 products, summed in a different order on each
    # path (a per-example formula, vmap, batched autograd), and carried back through up to ~50 layers; rounding
    # grows like sqrt(n) eps ~ 64 eps of the gradients' scale (measured: at most 21 eps, adapted EfficientNet-B0).
    # 1000 eps of the largest entry of any example's gradient is over 10x that bound, while a wrong per-example
    # gradient (a multiplier of ~1.2 missed, an example counted twice, a bias added twice) is off by 20-100%.
    scale = max(float(g.abs().max()) for g in (*batch, *(g for single in singles for g in single)))
    tol = 1000 * EPS * scale
    for k, (sample, total) in enumerate(zip(per_example, batch)):
        assert sample.shape == (target.shape[0], *total.shape)
        torch.testing.assert_close(sample.mean(0), total, rtol=0, atol=tol, msg=lambda m, k=k: f"{names[k]}: {m}")
        for i in range(target.shape[0]):
            torch.testing.assert_close(sample[i], singles[i][k], rtol=0, atol=tol,
                                       msg=lambda m, k=k, i=i: f"{names[k]}, example {i}: {m}")
    gsm._close()


def test_every_registered_model_has_a_stand_in() -> None:
    assert set(fixup.list_models()) == set(STAND_IN)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family,method", [(f, m) for f, ms in METHODS.items() for m in ms])
def test_our_models_give_exact_per_example_gradients(opacus, one_thread, family: str, method: str,
                                                      mode: str) -> None:
    torch.manual_seed(0)
    model = FAMILIES[family](**_method(method))
    inputs, target = _token_batch() if family == "transformer" else _image_batch()
    check_per_example_gradients(model, inputs, target, mode)


# --- adapted image models of the zoo ---

def _image_entries() -> list[object]:
    from adapt_zoo import ZOO
    return [pytest.param(name, id=name.split(" ")[0] + f"-{e.source.split(' ')[0]}")
            for name, e in ZOO.items() if isinstance(x := e.example(), torch.Tensor) and x.dim() == 4]


_ADAPTED: dict[str, nn.Module] = {}


def _adapted(name: str) -> nn.Module:
    """The zoo model ``name`` adapted by fixup.adapt (once per session), as a fresh copy."""
    from adapt_zoo import ZOO
    from test_adapt_zoo import _needs
    entry = ZOO[name]
    _needs(entry.needs)
    if name not in _ADAPTED:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FixupWarning)
            _ADAPTED[name] = fixup.adapt(entry.build(), entry.example())[0]
    return copy.deepcopy(_ADAPTED[name])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", _image_entries())
def test_adapted_image_models_give_exact_per_example_gradients(opacus, one_thread, name: str, mode: str) -> None:
    model = _adapted(name)
    inputs, target = _image_batch()
    check_per_example_gradients(model, inputs, target, mode)


# --- the whole of make_private ---

def _private_step(model: nn.Module, inputs: tuple[torch.Tensor, ...], target: torch.Tensor, mode: str) -> None:
    opt = torch.optim.SGD(fixup.param_groups(model, 0.1), lr=0.1, momentum=0.9)
    # Two batches of 4: a sampling rate under 1, which the privacy accountant needs.
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*inputs, target), batch_size=4)
    before = [p.detach().clone() for p in model.parameters()]
    dp_model, dp_opt, dp_loader, engine, report = private.make_private(
        model, opt, loader, noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, poisson_sampling=False)
    assert report.ready and report.checked_inplace
    for *x, y in dp_loader:
        dp_opt.zero_grad()
        _loss(dp_model(*x), y).backward()
        dp_opt.step()
    after = list(model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    assert engine.get_epsilon(delta=1e-5) > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", ("fixup", "skipinit", "rezero"))
def test_make_private_steps_our_model(opacus, one_thread, method: str, mode: str) -> None:
    torch.manual_seed(0)
    _private_step(fixup.create_model("resnet20", **_method(method)), *_image_batch(8), mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["resnet18 (timm ResNet)", "resnet18 (torchvision ResNet)"])
def test_make_private_steps_adapted_resnet(opacus, one_thread, name: str, mode: str) -> None:
    _private_step(_adapted(name), *_image_batch(8), mode)


def test_make_private_refuses_batchnorm_naming_it(opacus) -> None:
    model = fixup.create_model("resnet_cifar", depth=8, norm="batchnorm")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, target = _image_batch()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*inputs, target), batch_size=4)
    with pytest.raises(ValueError, match=r"norm1 \(BatchNorm2d\) mixes the examples.*GroupNorm"):
        private.make_private(model, opt, loader, noise_multiplier=1.0, max_grad_norm=1.0)


# --- prepare without Opacus ---

def test_prepare_keeps_state_dict_and_function_and_is_idempotent(one_thread) -> None:
    model = _adapted("resnet18 (torchvision ResNet)")
    _perturb(model)
    x = _image_batch()[0][0]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    expected = model(x)
    report = private.prepare(model, x)
    assert report.moved and report.fresh and report.ready
    assert any(isinstance(m, private.LayerScalars) for m in model.modules())
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    model.load_state_dict(state)  # strict: the keys of the unprepared model load into the prepared one
    again = private.prepare(model, x)
    assert not (again.moved or again.fresh or again.shared) and again.ready


def test_prepare_calls_a_module_registered_twice_once(one_thread) -> None:
    model = _basic()
    names = [n for n, _ in model.named_parameters()]
    keys = list(model.state_dict())
    report = private.prepare(model)
    assert report.shared and all(".shortcut.0" in n for n in report.shared)
    assert [n for n, _ in model.named_parameters()] == names  # each parameter once, under its first name
    assert list(model.state_dict()) == keys
    assert not report.checked_inplace and "not checked" in report.summary()


def test_prepare_names_what_opacus_cannot_take() -> None:
    report = private.prepare(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.MultiheadAttention(4, 2)))
    assert not report.ready and len(report.problems) == 2
    assert "1 (BatchNorm2d)" in report.problems[0] and "GroupNorm" in report.problems[0]
    assert "DPMultiheadAttention" in report.problems[1]


def test_inplace_relu_is_in_place_without_hooks_and_not_on_a_hooked_output() -> None:
    relu, layer = InplaceReLU(), nn.Linear(3, 3)
    x = layer(torch.randn(2, 3))
    assert relu(x) is x  # the fast path: no copy
    layer.register_full_backward_hook(lambda *a: None)
    y = layer(torch.randn(2, 3))
    out = relu(y)
    assert out is not y and torch.equal(out, y.clamp(min=0))
    out.sum().backward()  # an in-place ReLU here raises "Output 0 of BackwardHookFunction is a view"


def test_adapt_reports_whether_the_model_is_ready_for_private_training(one_thread) -> None:
    from adapt_zoo import ZOO
    entry = ZOO["resnet18 (torchvision ResNet)"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        model, report = fixup.adapt(entry.build(), entry.example())
        assert report.private.startswith("ready for private training (Opacus) after fixup.private.prepare")
        assert report.private in str(report) and report.to_dict()["private"] == report.private
        assert not any(isinstance(m, private.LayerScalars) for m in model.modules())  # a copy was checked
        model, report = fixup.adapt(entry.build(), entry.example(), private=True)
        assert report.private.startswith("ready for private training (Opacus): 17 layers' scalars out of hooks")
        assert any(isinstance(m, private.LayerScalars) for m in model.modules())
        transformer = ZOO["nn.Transformer (pre-norm)"]
        _, report = fixup.adapt(transformer.build(), transformer.example())
    assert report.private.startswith("not ready") and "encoder.layers.0.self_attn (MultiheadAttention)" in \
        report.private


class _Twice(nn.Module):
    """A layer registered twice and called through both names, its output then changed in place."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.second = self.first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.first(x)
        y += 1.0
        z = self.second(y)
        z += 1.0
        return z


def test_a_module_registered_twice_calls_what_its_first_path_holds(one_thread) -> None:
    model = _Twice()
    x = torch.randn(2, 3)
    expected = model(x)
    report = private.prepare(model, x)
    assert report.shared == ["second"] and report.fresh == ["first"] and report.ready
    assert model.second.target is model.first  # the FreshOutput now at "first", not the bare layer
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    model.first.module.register_full_backward_hook(lambda *a: None)  # as Opacus: one hooked layer, called twice
    model(x).sum().backward()


def test_prepare_mends_opacus_own_route_for_timm_resnet(opacus, one_thread) -> None:
    """ModuleValidator.fix (BatchNorm -> GroupNorm) leaves timm's in-place additions, which fail under hooks;
    prepare copies those outputs under hooks, and the per-example gradients are exact."""
    from opacus.validators import ModuleValidator

    from adapt_zoo import timm_model
    from test_adapt_zoo import _needs
    _needs("timm")
    torch.manual_seed(0)
    model = ModuleValidator.fix(timm_model("resnet18"))
    check_per_example_gradients(model, *_image_batch(), "hooks")
