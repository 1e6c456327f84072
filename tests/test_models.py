"""Every registered model in every method: runs, is the identity at init in its Fixup forms, counts right."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import fixup
from fixup.branch import find_branches
from fixup.init import data_init_
from fixup.method import METHODS
from fixup.nn import residual_add
from fixup.perf.ops import set_lean

# (builder, keyword arguments, input size): small members of each architecture family, for the method grid.
TINY = [
    ("resnet_cifar", {"depth": 8}, 8),
    ("resnet_cifar", {"depth": 8, "shortcut": "B"}, 8),
    ("wide_resnet", {"depth": 16, "width": 2, "dropout": 0.3}, 8),
    ("resnet_imagenet_tiny", {}, 32),
    ("resnet_imagenet_bottleneck_tiny", {}, 32),
]
COMBOS = [(m.norm, m.init) for m in METHODS.values() if m.norm != "layernorm" and m.family != "transformer"]


@pytest.mark.parametrize(("norm", "init"), COMBOS)
@pytest.mark.parametrize(("name", "kwargs", "size"), TINY)
def test_every_method_runs_forward_and_backward_without_nan(name, kwargs, size, norm, init) -> None:
    model = fixup.create_model(name, norm=norm, init=init, num_classes=5, generator=torch.Generator().manual_seed(0),
                               **kwargs)
    x = torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(1))
    data_init_(model, x)
    out = model(x)
    assert out.shape == (4, 5) and torch.isfinite(out).all()
    torch.nn.functional.cross_entropy(out, torch.arange(4) % 5).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    assert model.init_report is not None and model.init_report.num_branches == len(find_branches(model))


FIXUP_INITS = [m.init for m in METHODS.values() if m.fixup]


@pytest.mark.parametrize("init", FIXUP_INITS)
@pytest.mark.parametrize(("name", "kwargs", "size"), TINY)
def test_fixup_forms_are_the_identity_at_init(name, kwargs, size, init, monkeypatch) -> None:
    """Every branch adds exactly zero, so each residual sum returns its shortcut, blocks whose input and
    output shapes agree return their input, and the logits are exactly 0."""
    model = fixup.create_model(name, init=init, **kwargs).eval()
    blocks = {n: model.get_submodule(n) for n, _ in find_branches(model)}
    sums: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def checked_add(shortcut: torch.Tensor, branch: torch.Tensor, block: str = "") -> torch.Tensor:
        out = residual_add(shortcut, branch, block)
        sums.append((block, shortcut.clone(), branch.clone(), out.clone()))  # before any in-place ReLU
        return out

    io: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(name: str, x: torch.Tensor, y: torch.Tensor) -> None:
        io[name] = (x.clone(), y.clone())

    x = torch.randn(3, 3, size, size)
    hooks = [b.register_forward_hook(lambda m, a, y, n=n: record(n, a[0], y)) for n, b in blocks.items()]
    with torch.no_grad():
        logits = model(x)  # the default forward (the lean path where a block has one)
    for h in hooks:
        h.remove()
    assert torch.equal(logits, torch.zeros_like(logits))
    same_shape = [n for n, (a, y) in io.items() if a.shape == y.shape]
    assert same_shape  # each tiny variant has identity-shortcut blocks
    for n in same_shape:
        assert torch.equal(io[n][0], io[n][1]), n
    # The straightforward forward, through fixup.nn.residual_add: every sum returns its shortcut exactly.
    for module in {type(b).__module__ for b in blocks.values()}:
        monkeypatch.setattr(sys.modules[module], "residual_add", checked_add)
    with torch.no_grad():
        assert torch.equal(set_lean(model, False)(x), logits)
    assert sorted(b for b, *_ in sums) == sorted(blocks)  # every block summed once
    for block, shortcut, branch, out in sums:
        assert not branch.any() and torch.equal(out, shortcut), block


@pytest.mark.parametrize(("name", "params"), [("resnet20", 0.27e6), ("resnet56", 0.85e6), ("resnet110", 1.7e6)])
def test_cifar_parameter_counts(name: str, params: float) -> None:
    with torch.device("meta"):  # counted without allocating or initialising anything
        model = fixup.models.resnet_cifar.CifarResNet(int(name[6:]), method="batchnorm")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.03)


def test_residual_shape_mismatch_names_the_block() -> None:
    model = fixup.create_model("resnet_cifar", depth=8, norm="none")
    model.layer2[0].shortcut = nn.Identity()  # drops the subsampling: 16 channels at 8x8 against 32 at 4x4
    with pytest.raises(ValueError, match=r"layer2\.0: residual branch output has shape \(1, 32, 4, 4\) but the "
                                         r"shortcut has shape \(1, 16, 8, 8\)"):
        model(torch.randn(1, 3, 8, 8))


@pytest.mark.slow
def test_ten_thousand_layer_cifar_resnet_builds_and_runs() -> None:
    model = fixup.create_model("resnet_cifar", depth=9998, num_classes=10)
    assert model.init_report.num_branches == 4998
    with torch.no_grad():
        out = model(torch.randn(2, 3, 8, 8))
    assert torch.equal(out, torch.zeros(2, 10))
