"""Gradient clipping (adaptive, Brock et al. 2021) and the errors of ``fixup.param_groups``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fixup
from test_adapt import BasicBlock, ResNet


def test_param_groups_given_adapts_pair_says_to_unpack_it() -> None:
    pair = fixup.adapt(ResNet(BasicBlock, [1, 1], width=8, in_channels=1, small_input=True),
                       torch.randn(2, 1, 8, 8))
    with pytest.raises(TypeError, match=r"model, report = fixup\.adapt"):
        fixup.param_groups(pair, lr=0.1)
    model, _ = pair
    assert fixup.param_groups(model, lr=0.1)  # the fix the message names works


@pytest.mark.parametrize("bad", [[nn.Linear(2, 2)], "resnet20", None, iter(nn.Linear(2, 2).parameters())])
def test_param_groups_refuse_anything_but_a_module_naming_its_type(bad: object) -> None:
    with pytest.raises(TypeError, match=f"expected an nn.Module.*got {type(bad).__name__}"):
        fixup.param_groups(bad, lr=0.1)  # type: ignore[arg-type]


# -- adaptive gradient clipping: the rule ---------------------------------------------------------------------------

def _with_grad(weight: torch.Tensor, grad: torch.Tensor) -> nn.Parameter:
    p = nn.Parameter(weight.clone())
    p.grad = grad.clone()
    return p


def test_a_unit_above_lambda_is_scaled_exactly_to_lambda_and_one_below_is_untouched() -> None:
    weight = torch.tensor([[3.0, 4.0], [0.6, 0.8], [0.0, 0.0]])  # unit norms 5, 1, 0 (floored at eps)
    grad = torch.tensor([[0.3, 0.4], [0.003, 0.004], [1.0, 0.0]])  # ratios 0.1, 0.005, 1 / eps
    p = _with_grad(weight, grad)
    stats = fixup.adaptive_clip_grad_([p], clipping=0.01, eps=1e-3)
    norms = p.grad.norm(dim=1)
    assert norms[0].item() == pytest.approx(0.01 * 5.0, rel=1e-6)  # scaled to lambda * ||W_i||
    assert torch.allclose(p.grad[0] / norms[0], grad[0] / grad[0].norm())  # direction kept
    assert torch.equal(p.grad[1], grad[1])  # below lambda: not touched at all
    assert norms[2].item() == pytest.approx(0.01 * 1e-3, rel=1e-6)  # a zero unit: lambda * eps
    assert stats.clipped_fraction.item() == pytest.approx(2 / 3)


def test_units_are_output_filters_and_vectors_are_one_unit() -> None:
    torch.manual_seed(0)
    conv = _with_grad(torch.randn(4, 3, 3, 3), 10 * torch.randn(4, 3, 3, 3))
    bias = _with_grad(torch.randn(4), 10 * torch.randn(4))
    w_norms = conv.detach().flatten(1).norm(dim=1)
    fixup.adaptive_clip_grad_([conv, bias], clipping=0.05)
    assert torch.allclose(conv.grad.flatten(1).norm(dim=1), 0.05 * w_norms)  # per output filter
    assert bias.grad.norm().item() == pytest.approx(0.05 * bias.detach().norm().item(), rel=1e-5)  # whole vector


@pytest.mark.parametrize(("kw", "match"), [({"clipping": 0.0}, "clipping"), ({"eps": -1.0}, "eps"),
                                           ({"clipping": float("nan")}, "clipping"),
                                           ({"exempt_max_norm": -1.0}, "exempt_max_norm")])
def test_bad_thresholds_are_named(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fixup.adaptive_clip_grad_(nn.Linear(2, 2), **kw)


def test_adaptive_clip_grad_refuses_adapts_pair_and_non_tensors() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"model, report = fixup\.adapt"):
        fixup.adaptive_clip_grad_((model, object()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="iterable of tensors"):
        fixup.adaptive_clip_grad_([model])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="got int"):
        fixup.adaptive_clip_grad_(3)  # type: ignore[arg-type]


# -- Fixup's zero-started tensors ---------------------------------------------------------------------------------

def test_the_exempt_tensors_are_the_zero_started_layers_the_classifier_and_the_scalars() -> None:
    from fixup.branch import find_branches, find_classifier
    from fixup.clip import agc_exempt
    from fixup.nn import Bias, Scale

    model = fixup.create_model("resnet20", norm="fixup")
    exempt = {id(p) for p in agc_exempt(model)}
    zero = {id(p) for p in model.parameters() if not p.detach().any()}
    assert zero <= exempt  # every tensor Fixup starts at zero is exempt ...
    branches = [b for _, b in find_branches(model)]
    assert all(id(b.layers[-1].weight) in exempt for b in branches)
    assert not any(id(b.layers[0].weight) in exempt for b in branches)  # ... the branches' first layers are not,
    assert id(model.conv1.weight) not in exempt  # nor the stem
    scalars = {id(p) for m in model.modules() if isinstance(m, (Bias, Scale)) for p in m.parameters()}
    classifier = {id(p) for m in find_classifier(model) for p in m.parameters()}
    last = {id(p) for b in branches for p in b.layers[-1].parameters()}
    assert exempt == scalars | classifier | last  # and nothing else
    assert len(agc_exempt(nn.Sequential(nn.Linear(2, 2)))) == 0  # nothing declared: nothing exempt


def _steps(model: nn.Module, steps: int, clip, seed: int = 0) -> None:
    torch.manual_seed(seed)
    opt = torch.optim.SGD(fixup.param_groups(model, lr=0.1), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 3, 8, 8), torch.randint(0, 10, (32,))
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        clip(model)
        opt.step()


def test_a_zero_initialised_layer_still_learns_under_agc_but_not_under_plain_agc() -> None:
    torch.manual_seed(0)
    model = fixup.create_model("resnet_cifar", depth=8, norm="fixup")
    plain = fixup.create_model("resnet_cifar", depth=8, norm="fixup")
    plain.load_state_dict(model.state_dict())
    steps = 20
    _steps(model, steps, lambda m: fixup.adaptive_clip_grad_(m, 0.01))
    _steps(plain, steps, lambda m: fixup.adaptive_clip_grad_(m, 0.01, exempt=()))  # the paper's AGC on everything
    last = lambda m: torch.stack([b.layers[-1].weight.norm() for _, b in fixup.branch.find_branches(m)])  # noqa: E731
    # Plain AGC: each step moves a unit by at most lr * lambda * max(||W_i||, eps) (momentum adds up to 10 such
    # steps), so a zero-started layer stays tiny; with the exemption it learns like under global clipping.
    assert last(plain).max().item() < 1e-2
    assert last(model).min().item() > 10 * last(plain).max().item()
    assert plain.fc.weight.norm().item() < 1e-2 < model.fc.weight.norm().item()


def test_exempt_tensors_are_clipped_together_to_the_global_norm() -> None:
    from fixup.clip import agc_exempt

    model = fixup.create_model("resnet_cifar", depth=8, norm="fixup")
    torch.manual_seed(1)
    for p in model.parameters():
        p.grad = 100 * torch.randn_like(p)
    exempt = agc_exempt(model)
    stats = fixup.adaptive_clip_grad_(model, 0.01, exempt_max_norm=0.5)
    assert torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in exempt])).item() == \
        pytest.approx(0.5, rel=1e-4)
    assert stats.exempt_norm.item() > 100  # reported before clipping
    for p in model.parameters():
        p.grad = 100 * torch.ones_like(p)
    fixup.adaptive_clip_grad_(model, 0.01, exempt_max_norm=None)
    assert all(torch.equal(p.grad, torch.full_like(p, 100.0)) for p in exempt)  # None: left as they are


def test_tensors_without_the_model_are_all_clipped_and_an_all_zero_one_warns() -> None:
    model = fixup.create_model("resnet_cifar", depth=8, norm="fixup")
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.warns(fixup.FixupWarning, match="pass the model itself"):
        fixup.adaptive_clip_grad_(model.parameters(), 0.01)
    assert model.fc.weight.grad.norm(dim=1).max().item() == pytest.approx(0.01 * 1e-3, rel=1e-5)


# -- the engine: --clip {norm,agc,none} ------------------------------------------------------------------------------

_BASE = dict(depth=8, batch_size=64, max_updates=2, momentum=0.0, weight_decay=0.0, scalar_lr_mult=1.0,
             schedule="constant", checkpoint=False)


def _stem_moves(**kw) -> tuple[torch.Tensor, torch.Tensor]:
    from fixup.train import TrainConfig, fit

    start = fit(TrainConfig(**_BASE, lr=0.0), progress=False).model.conv1.weight.detach().clone()
    end = fit(TrainConfig(**_BASE, lr=1.0, **kw), progress=False).model.conv1.weight.detach()
    return start.flatten(1).norm(dim=1), (end - start).flatten(1).norm(dim=1)


def test_the_engine_clips_each_unit_to_lambda_times_its_weight_norm_under_clip_agc() -> None:
    # Two plain SGD steps at lr 1: the first moves only the zero-started classifier (nothing else has a gradient),
    # the second moves the stem by its clipped gradient, so each stem filter moves by at most lambda * its norm.
    norms, moved = _stem_moves(clip="agc", agc_clipping=0.001)
    assert (moved <= 0.001 * norms * (1 + 1e-4)).all()
    assert torch.isclose(moved, 0.001 * norms, rtol=1e-4).any()  # clipping had work to do
    _, unclipped = _stem_moves(clip="none")
    assert (unclipped > moved).any()


def test_clip_none_is_grad_clip_zero_and_the_default_stays_the_global_norm_at_1() -> None:
    from fixup.train import TrainConfig
    from fixup.train.recipe import apply_recipe

    cfg = TrainConfig()
    assert (cfg.clip, cfg.grad_clip) == ("auto", 1.0)  # auto: Fixup's recipe prescribes none, so the engine's norm
    assert apply_recipe(cfg.validate())[0].clip == "norm"
    assert torch.equal(_stem_moves(clip="none")[1], _stem_moves(grad_clip=0.0)[1])


@pytest.mark.parametrize(("kw", "match"), [({"clip": "adaptive"}, "clip='adaptive'.*norm, agc, none"),
                                           ({"agc_clipping": 0.0}, "agc_clipping must be > 0")])
def test_bad_clip_options_are_named(kw: dict, match: str) -> None:
    from fixup.train import TrainConfig

    with pytest.raises(ValueError, match=match):
        TrainConfig(**kw).validate()


def test_a_checkpoint_written_before_the_clip_options_resumes(tmp_path) -> None:
    from fixup.train import TrainConfig
    from fixup.train.checkpoint import CheckpointError, check_compatible
    from fixup.train.recipe import apply_recipe

    current = apply_recipe(TrainConfig().validate())[0].to_dict()  # the config the engine saves and compares
    older = {section: {k: v for k, v in fields.items() if k not in ("clip", "agc_clipping")}
             for section, fields in current.items()}
    check_compatible(older, current, tmp_path)  # absent options are their defaults: the same run
    with pytest.raises(CheckpointError, match="clip: checkpoint 'norm', now 'agc'"):
        check_compatible(older, TrainConfig(clip="agc").to_dict(), tmp_path)
