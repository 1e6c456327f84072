"""SkipInit and ReZero on every family: each block starts as its shortcut, every gate is exactly 0, the first steps
move every gate, and the report names the method and accounts for each branch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fixup
from fixup.branch import WeightSlice, find_branches
from fixup.nn import Gate
from fixup.report import GateReport

GATED = ("skipinit", "skipinit_he", "rezero")
# (builder, kwargs, input maker): the smallest model of each family.
FAMILIES = {
    "resnet_cifar": ({"depth": 14}, lambda: torch.randn(4, 3, 16, 16)),
    "wide_resnet": ({"depth": 16, "width": 2}, lambda: torch.randn(4, 3, 16, 16)),
    "resnet_imagenet_tiny": ({}, lambda: torch.randn(4, 3, 32, 32)),
    "resnet_imagenet_bottleneck_tiny": ({}, lambda: torch.randn(4, 3, 32, 32)),
    "transformer_tiny": ({"src_vocab": 50, "tgt_vocab": 50},
                         lambda: (torch.randint(1, 50, (3, 7)), torch.randint(1, 50, (3, 5)))),
}


def _build(name: str, method: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    kwargs, make = FAMILIES[name]
    torch.manual_seed(seed)
    model = fixup.create_model(name, init=method, generator=torch.Generator().manual_seed(seed), **kwargs)
    x = make()
    return model, x if isinstance(x, tuple) else (x,)


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if callable(getattr(m, "residual_branches", None))]


def _block_inputs(model: nn.Module, args: tuple[torch.Tensor, ...]) -> dict[nn.Module, tuple]:
    """Each block's positional and keyword inputs on one forward pass (eval mode)."""
    seen: dict[nn.Module, tuple] = {}
    hooks = [b.register_forward_pre_hook(lambda m, a, kw: seen.setdefault(m, (a, kw)), with_kwargs=True)
             for b in _blocks(model)]
    with torch.no_grad():
        model(*args)
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("method", GATED)
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_block_starts_as_its_shortcut_and_every_gate_is_zero(name: str, method: str) -> None:
    model, args = _build(name, method)
    model.eval()
    gates = [m for m in model.modules() if isinstance(m, Gate)]
    branches = find_branches(model)
    assert len(gates) == len(branches) > 0
    assert all(float(g.scale.detach()) == 0.0 for g in gates)
    assert not [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm))]
    inputs = _block_inputs(model, args)
    for block in _blocks(model):
        a, kw = inputs[block]
        with torch.no_grad():
            gated = block(*a, **kw)
            # The same block with its branch removed instead (gate 1, last layer zero): only the shortcut is left.
            [branch] = block.residual_branches()
            last = branch.layers[-1]
            last = last.module if isinstance(last, WeightSlice) else last
            saved = [t.detach().clone() for t in (last.weight, branch.gate.scale)]
            last.weight.zero_()
            if last.bias is not None:
                last.bias.zero_()
            branch.gate.scale.fill_(1.0)
            shortcut_only = block(*a, **kw)
        assert torch.equal(gated, shortcut_only), type(block).__name__
        if branch.shortcut is None and gated.shape == a[0].shape and bool((a[0] >= 0).all()):
            assert torch.equal(gated, a[0])  # an identity shortcut: the block is exactly the identity
        with torch.no_grad():
            last.weight.copy_(saved[0])
            branch.gate.scale.copy_(saved[1])


@pytest.mark.parametrize("method", GATED)
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_first_steps_move_every_gate_at_the_weights_rate(name: str, method: str) -> None:
    model, args = _build(name, method)
    groups = fixup.param_groups(model, lr=0.1, weight_decay=0.0)
    gate_group = next(g for g in groups if g["name"] == "gates")
    assert gate_group["lr"] == 0.1 and len(gate_group["params"]) == len(find_branches(model))
    undecayed = not fixup.METHODS[method].decay_gains  # skipinit: its biases in their own group
    assert {g["name"] for g in groups} - {"gains_biases"} == {"weights", "gates"}
    assert ("gains_biases" in {g["name"] for g in groups}) == (undecayed and any(
        getattr(m, "bias", None) is not None for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))))
    opt = torch.optim.SGD(groups, lr=0.1)
    names = gate_group["param_names"]
    # skipinit's classifier starts at 0 (the authors' code): no gradient reaches the gates until it has moved.
    late = int(fixup.METHODS[method].draw == "truncated_fan_in")
    for step in range(2 + late):
        opt.zero_grad()
        out = model(*args)
        target = torch.zeros(out.shape[:-1], dtype=torch.long)
        nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1)).backward()
        opt.step()
        moved = {n: float(p.detach()) != 0.0 for n, p in zip(names, gate_group["params"])}
        if step < late:
            assert not any(moved.values()), moved
        elif step == late and name.startswith("transformer"):
            # The encoder reaches the loss only through the decoder's cross-attention, whose gates are 0: its
            # gates get no gradient on the first step, and move from the second on.
            assert moved == {n: not n.startswith("encoder") for n in names}, moved
        else:
            assert all(moved.values()), moved


@pytest.mark.parametrize("method", GATED)
def test_the_report_names_the_method_and_each_branch_s_gate(method: str) -> None:
    model, _ = _build("wide_resnet", method)
    report = model.init_report
    assert isinstance(report, GateReport) and report.method == method
    text = str(report)
    assert text.startswith(f"Accounting report: method {method}") and "alpha = 0" in text
    assert report.num_branches == len(report.branches) == 6
    params = dict(model.named_parameters())
    for rec in report.branches:
        assert isinstance(model.get_submodule(rec.gate.rsplit(".", 1)[0]), Gate)
        assert float(params[rec.gate].detach()) == 0.0
        for layer in rec.layers:  # drawn, none zeroed, none scaled by depth
            assert layer.std > 0 and float(params[layer.name + ".weight"].std()) > 0
    assert GateReport.from_dict(report.to_dict()) == report


def test_skipinit_he_and_rezero_build_the_same_network_from_the_same_draws() -> None:
    """On these models the two papers' definitions coincide (docs/methods.md): one gate at 0 per branch; only
    ``skipinit``'s draw (the authors' truncated normal, classifier at 0) tells SkipInit from ReZero."""
    a, _ = _build("resnet_cifar", "skipinit_he")
    b, _ = _build("resnet_cifar", "rezero")
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_model_built_for_another_method_is_refused_with_what_to_do() -> None:
    model = fixup.create_model("resnet20")
    with pytest.raises(ValueError, match=r"have no gate; build the model for the method .*method='rezero'"):
        fixup.init.initialise_(model, "rezero")


@pytest.mark.parametrize("name", ["resnet_cifar", "wide_resnet", "resnet_imagenet_bottleneck_tiny"])
def test_a_trained_gate_folds_into_its_layer_for_inference(name: str) -> None:
    model, args = _build(name, "rezero")
    with torch.no_grad():
        for i, gate in enumerate(m for m in model.modules() if isinstance(m, Gate)):
            gate.scale.fill_(0.1 * (i + 1))  # as after training
    model.eval()
    expected = model(*args)
    folded = fixup.fold_for_inference(model).model
    assert not [m for m in folded.modules() if isinstance(m, Gate)]
    torch.testing.assert_close(folded(*args), expected, rtol=1e-5, atol=1e-5)
