"""Stochastic depth and the dropout before the classifier (fixup.models._drop_path): a dropped branch leaves the block
its shortcut, a kept one keeps the branch's expectation, evaluation is the model without them, the rate grows with
the block's index as in SkipInit's authors' code, the lean paths compute the same, the defaults change nothing, and
the options reach the model from the training config."""

from __future__ import annotations

import argparse
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
from _perturb import perturbed
from fixup.models import DropPath, drop_path_rates
from fixup.models.nf_blocks import _NFBlock
from fixup.models.resnet_cifar import BasicBlock
from fixup.models.resnet_imagenet import Bottleneck
from fixup.models.wide_resnet import WideBlock
from fixup.perf.ops import set_lean
from fixup.train import TrainConfig, fit
from fixup.train.cli import add_config_options, config_from_args
from fixup.train.image_task import ImageClassification
from fixup.train.recipe import apply_recipe
from test_private import _image_batch, check_per_example_gradients

# Each ResNet class in a small size, and its number of residual blocks.
MODELS = {"cifar": (lambda **kw: fixup.create_model("resnet_cifar", depth=14, **kw), 6),
          "cifar_B": (lambda **kw: fixup.create_model("resnet_cifar", depth=14, shortcut="B", **kw), 6),
          "basic": (lambda **kw: fixup.create_model("resnet_imagenet_tiny", num_classes=10, **kw), 5),
          "bottleneck": (lambda **kw: fixup.create_model("resnet_imagenet_bottleneck_tiny", num_classes=10, **kw), 5),
          "wide": (lambda **kw: fixup.create_model("wide_resnet", depth=16, **kw), 6)}
# Every kind of block the ResNets build: Fixup's, the gated ones, the normalised and bare baselines, the NF blocks.
METHODS = ("fixup", "skipinit", "rezero", "batchnorm", "groupnorm", "he", "sqrt2", "nf_resnet", "nf_resnet_nozero")


def _model(family: str, method: str, **kw) -> nn.Module:
    if family == "cifar_B" and fixup.METHODS[method].nf:
        pytest.skip("NF-ResNets always project (shortcut B): the same as 'cifar'")
    return MODELS[family][0](method=method, generator=torch.Generator().manual_seed(0), **kw)


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "residual_branches")]


def _shortcut(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the block computes with its residual branch gone, written out per block type."""
    if isinstance(block, (BasicBlock, Bottleneck)):  # relu(output_scale * shortcut(x + b1a)), post-activation
        s = x if isinstance(block.shortcut, nn.Identity) else block.shortcut(block.bias1a(x))
        return F.relu(s * block.output_scale if block.output_scale != 1.0 else s)
    if isinstance(block, WideBlock):  # pre-activation: the projection takes relu(norm1(x) + b1a)
        s = x if block.projection is None else block.projection(block.relu(block.bias1a(block.norm1(x))))
        return s * block.output_scale if block.output_scale != 1.0 else s
    assert isinstance(block, _NFBlock)
    return x if block.projection is None else block.projection(block.act(x / block.beta))


def _input(block: nn.Module, batch: int = 6, size: int = 8) -> torch.Tensor:
    return torch.randn(batch, block.conv1.in_channels, size, size, generator=torch.Generator().manual_seed(3),
                       dtype=torch.float64)


def test_the_rate_grows_linearly_with_the_block_index_as_the_authors_rule() -> None:
    # deepmind-research nfnets/skipinit_resnet.py: stochdepth_rate * index / num_blocks, index 0, 1, ..., N - 1
    assert drop_path_rates(0.1, 4) == pytest.approx([0.0, 0.025, 0.05, 0.075], abs=1e-15)
    for family, (build, n) in MODELS.items():
        for method in ("fixup", "nf_resnet"):
            if family == "cifar_B" and method == "nf_resnet":
                continue
            blocks = _blocks(build(method=method, drop_path=0.3))
            assert len(blocks) == n
            rates = [b.drop_path.p if isinstance(b.drop_path, DropPath) else 0.0 for b in blocks]
            assert rates == pytest.approx([0.3 * i / n for i in range(n)], abs=1e-15), (family, method)
            assert isinstance(blocks[0].drop_path, nn.Identity)  # the first block never drops


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, math.nan, True])
def test_a_rate_outside_zero_to_one_is_refused_naming_it(bad: float) -> None:
    with pytest.raises(ValueError, match="drop_path must be a probability in"):
        fixup.create_model("resnet20", drop_path=bad)
    with pytest.raises(ValueError, match="head_dropout must be a probability in"):
        fixup.create_model("resnet20", head_dropout=bad)


@pytest.mark.parametrize("lean", [False, True])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", list(MODELS))
def test_a_dropped_branch_leaves_the_block_its_shortcut(monkeypatch, one_thread, family: str, method: str,
                                                         lean: bool) -> None:
    model = set_lean(perturbed(_model(family, method, drop_path=0.5)).double().train(), lean)
    monkeypatch.setattr(DropPath, "mask", lambda self, x: x.new_zeros((x.shape[0],) + (1,) * (x.dim() - 1)))
    dropping = [b for b in _blocks(model) if isinstance(b.drop_path, DropPath)]
    assert dropping
    for block in dropping:
        x = _input(block)
        with torch.no_grad():
            out, expected = block(x), _shortcut(block, x)
        if lean and getattr(block, "lean_ready", lambda: False)():
            # The lean path adds the shortcut's response to b1a apart (shortcut(x) + shortcut(b1a)): to rounding.
            torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
        else:
            assert torch.equal(out, expected), f"{family}/{method}: {block.block_name}"


def test_drop_path_preserves_the_expectation() -> None:
    # Each example's factor is 0 with probability p and 1/(1-p) otherwise: mean 1, variance p/(1-p). Over n examples
    # the mean is within 5 standard deviations, 5 sqrt(p / ((1-p) n)), of 1 (odds of a miss below 1e-6).
    p, n = 0.3, 200_000
    torch.manual_seed(0)
    factor = DropPath(p).train()(torch.ones(n, 1))
    assert factor.unique().tolist() == pytest.approx([0.0, 1 / (1 - p)])
    assert abs(float(factor.mean()) - 1) < 5 * math.sqrt(p / ((1 - p) * n))


@pytest.mark.parametrize("family,method", [("wide", "fixup"), ("wide", "skipinit"), ("wide", "batchnorm"),
                                           ("cifar", "nf_resnet"), ("bottleneck", "nf_resnet")])
def test_the_mean_over_many_masks_is_the_undropped_block(one_thread, family: str, method: str) -> None:
    # Pre-activation and NF blocks are y = shortcut + m F / (1 - p), linear in the mask: over k draws per example,
    # mean(y) - y_eval = F (M / (k (1 - p)) - 1), M ~ Binomial(k, 1 - p): within 5 sigma, 5 |F| sqrt(p / ((1 - p) k)).
    k = 2000
    model = perturbed(_model(family, method, drop_path=0.9)).double()
    block = _blocks(model)[2]  # p = 0.9 * 2 / N, 0.3 to 0.36: a small block, often dropped
    p = block.drop_path.p
    x = _input(block, batch=2, size=4)
    with torch.no_grad():
        block.eval()
        undropped = block(x)
        branch = undropped - _shortcut(block, x)
        block.train()
        torch.manual_seed(1)
        if any(isinstance(m, nn.BatchNorm2d) for m in block.modules()):
            block.apply(lambda m: m.eval() if isinstance(m, nn.BatchNorm2d) else None)  # the eval statistics
        mean = block(x.repeat(k, 1, 1, 1)).view(k, *undropped.shape).mean(0)
    bound = 5 * branch.abs() * math.sqrt(p / ((1 - p) * k)) + 1e-12
    assert (mean - undropped).abs().le(bound).all()
    assert branch.abs().max() > 1e-3  # the branch is there to drop


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", list(MODELS))
def test_evaluation_is_deterministic_and_the_model_without_them(one_thread, family: str, method: str) -> None:
    plain = perturbed(_model(family, method)).eval()
    regular = perturbed(_model(family, method, drop_path=0.5, head_dropout=0.5)).eval()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first, second, reference = regular(x), regular(x), plain(x)
        regular.train()
        torch.manual_seed(0)
        trained = regular(x)
    assert torch.equal(first, second) and torch.equal(first, reference)
    assert not torch.allclose(trained, first)  # ... while training draws


@pytest.mark.parametrize("method", ["fixup", "skipinit", "he"])
@pytest.mark.parametrize("family", list(MODELS))
def test_the_lean_path_drops_as_the_straightforward_one(one_thread, family: str, method: str) -> None:
    lean = perturbed(_model(family, method, drop_path=0.9, head_dropout=0.5)).double().train()
    plain = set_lean(copy.deepcopy(lean), False)
    assert any(b.lean_ready() for b in _blocks(lean))
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    outs = []
    for model in (lean, plain):
        torch.manual_seed(0)  # the same masks: each block draws once, in the same order, on either path
        out = model(x)
        out.square().sum().backward()
        outs.append(out)
    # Float64; the lean path sums the scalars' terms in another order (fixup.perf.ops): 1e-8 of each tensor's largest
    # entry is millions of eps, while a mask applied wrongly (the shortcut's response dropped, a factor missed)
    # changes entries by tens of percent.
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-8 * float(outs[1].detach().abs().max()))
    for (name, a), b in zip(lean.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-8 * float(b.grad.abs().max()) + 1e-300,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", list(MODELS))
def test_the_defaults_leave_every_model_as_it_was(one_thread, family: str, method: str) -> None:
    plain = _model(family, method)
    assert not any(isinstance(m, (DropPath, nn.Dropout)) for m in plain.modules())
    regular = _model(family, method, drop_path=0.3, head_dropout=0.3)
    a, b = plain.state_dict(), regular.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the same draws, the same tensors
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(plain.train()(x), regular.eval()(x)) or plain.method.norm == "batchnorm"


def test_the_options_reach_the_model_through_the_training_config(one_thread) -> None:
    parser = argparse.ArgumentParser()
    add_config_options(parser)
    args = parser.parse_args(["--model", "resnet_cifar", "--depth", "14", "--drop-path", "0.3", "--head-dropout",
                              "0.2"])
    config, recipe = apply_recipe(config_from_args(args))
    assert (recipe.drop_path, recipe.drop_path_from) == (0.3, "explicit")
    model = ImageClassification(config).build_model(config)
    rates = [b.drop_path.p if isinstance(b.drop_path, DropPath) else 0.0 for b in _blocks(model)]
    assert rates == pytest.approx(drop_path_rates(0.3, 6)) and model.head_dropout.p == 0.2
    # the default: neither
    config = apply_recipe(TrainConfig(model="resnet_cifar", depth=14))[0]
    model = ImageClassification(config).build_model(config)
    assert not any(isinstance(m, (DropPath, nn.Dropout)) for m in model.modules())


def test_minus_one_takes_the_method_rate_and_the_engine_trains_with_it(one_thread) -> None:
    config, recipe = apply_recipe(TrainConfig(init="skipinit", drop_path=-1))
    assert config.drop_path == 0.1 and recipe.drop_path_from == "method" and "authors' rate" in recipe.notes[-1]
    assert apply_recipe(TrainConfig(drop_path=-1))[0].drop_path == 0.0  # fixup's recipe has none
    assert apply_recipe(TrainConfig())[1].drop_path_from == "default"
    result = fit(TrainConfig(model="resnet_cifar", depth=8, init="skipinit", drop_path=-1, head_dropout=0.1,
                             batch_size=64, max_updates=1, checkpoint=False), progress=False)
    assert result.recipe["drop_path"] == 0.1 and result.config["images"]["drop_path"] == 0.1
    assert [b.drop_path.p for b in _blocks(result.model)[1:]] == pytest.approx(drop_path_rates(0.1, 3)[1:])


@pytest.mark.parametrize("bad", [{"drop_path": 1.0}, {"drop_path": -0.5}, {"head_dropout": 1.0},
                                 {"adapt": "m:f", "drop_path": 0.1}])
def test_the_config_refuses_what_it_cannot_train(bad: dict) -> None:
    with pytest.raises(ValueError, match=r"drop_path|head_dropout"):
        TrainConfig(**bad).validate()


@pytest.mark.parametrize("method", ["fixup", "skipinit", "nf_resnet"])
def test_per_example_gradients_stay_exact_under_opacus(one_thread, monkeypatch, method: str) -> None:
    # Each example's mask multiplies its own activations only, so Opacus's per-example gradient is the example's
    # own for the mask it drew. To compare with single-example runs the masks must be the same in both: here an
    # example's branch is kept where its output's first entry exceeds its second, a function of the example alone
    # (and not of a bias that every example shares).
    pytest.importorskip("opacus", reason="opacus is not installed (the dp extra brings it)")
    kept: list[float] = []  # the fraction of examples each call kept

    def mask(self: DropPath, x: torch.Tensor) -> torch.Tensor:
        flat = x.detach().flatten(1)
        keep = (flat[:, 0] > flat[:, 1]).to(x.dtype)
        kept.append(float(keep.mean()))
        return keep.view(-1, *([1] * (x.dim() - 1)))

    monkeypatch.setattr(DropPath, "mask", mask)
    torch.manual_seed(0)
    method_kw = {"norm": "fixup"} if method == "fixup" else {"init": method}
    model = fixup.create_model("resnet_cifar", depth=14, drop_path=0.9, **method_kw)
    check_per_example_gradients(model, *_image_batch(8), "hooks")
    assert any(0 < k < 1 for k in kept)  # a batch with branches both dropped and kept


def test_activation_checkpointing_replays_the_masks(one_thread) -> None:
    # The recompute during backward must draw the masks the forward drew (torch.utils.checkpoint restores the RNG).
    from fixup.perf.checkpointing import enable_checkpointing

    model = perturbed(_model("cifar", "skipinit", drop_path=0.9)).double().train()
    checkpointed = enable_checkpointing(copy.deepcopy(model), 2)
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for m in (model, checkpointed):
        torch.manual_seed(0)
        m(x).square().sum().backward()
    for (name, a), b in zip(model.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-8 * float(a.grad.abs().max()) + 1e-300,
                                   msg=lambda m, name=name: f"{name}: {m}")
