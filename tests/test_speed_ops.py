"""The lean Fixup path computes what the straightforward one does, keeping less for backward."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
from _perturb import perturbed as _perturbed
from fixup.method import METHODS
from fixup.models import create_model
from fixup.models.resnet_cifar import BasicBlock, CifarResNet
from fixup.perf.ops import _AddBorder, _ScaledMatmul, lean_conv2d, lean_linear, ones_response, set_lean


def _reference_block(block: BasicBlock, x: torch.Tensor) -> torch.Tensor:
    """Fixup's basic block written out with plain operations on full tensors (section 3, rule 3)."""
    xa = x + block.bias1a.bias
    out = F.relu(F.conv2d(xa, block.conv1.weight, None, block.conv1.stride, 1) + block.bias1b.bias)
    out = F.conv2d(out + block.bias2a.bias, block.conv2.weight, None, 1, 1)
    out = out * block.scale.scale + block.bias2b.bias
    shortcut = x if isinstance(block.shortcut, torch.nn.Identity) else block.shortcut(xa)  # identity carries x
    return F.relu(shortcut + out)


def _reference(model: CifarResNet, x: torch.Tensor) -> torch.Tensor:
    x = F.relu(model.conv1(x) + model.bias1.bias)
    for stage in (model.layer1, model.layer2, model.layer3):
        for block in stage:
            x = _reference_block(block, x)
    return model.fc(torch.flatten(model.pool(x), 1) + model.bias2.bias)


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("shortcut", ["A", "B"])
def test_lean_model_matches_plain_reference_in_outputs_and_gradients(shortcut):
    # float64: the two paths sum in different orders, and in float32 that rounding flips a ReLU whose input is near
    # zero on some CPUs (a 1% gradient change, machine-dependent); in float64 they agree to 1e-14.
    torch.manual_seed(0)
    model = _perturbed(create_model("resnet_cifar", depth=14, shortcut=shortcut)).double()
    assert all(block.lean for block in model.modules() if isinstance(block, BasicBlock))
    reference = copy.deepcopy(model)
    x = torch.randn(3, 3, 12, 12, dtype=torch.float64)
    out, ref = model(x), _reference(reference, x)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10 * ref.abs().max().item())
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out.backward(g)
    ref.backward(g)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        tol = 1e-10 * max(1.0, q.grad.abs().max().item())  # relative to the gradient's own size
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=tol, msg=lambda m, n=name: f"{n}: {m}")


def test_plain_path_is_the_reference_too():
    model = _perturbed(create_model("resnet_cifar", depth=8))
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(set_lean(model, False)(x), _reference(model, x), rtol=1e-5, atol=1e-5)
    assert not any(getattr(m, "lean", False) for m in model.modules())


_NO_NORM = [(m.norm, m.init) for m in METHODS.values()
            if m.norm in ("fixup", "none") and m.init != "lsuv" and m.family != "transformer"]


@pytest.mark.parametrize(("norm", "init"), _NO_NORM)
def test_lean_equals_plain_for_every_method_without_normalisation(norm, init):
    """Ablations drop scalars and the 1/sqrt(2) baseline scales block outputs: the lean path follows.

    Both paths compute the same function in real arithmetic, so they are compared in float64, where only the order
    of the sums differs: a few thousand terms per entry at eps64 ~ 2e-16 each stay far below 1e-10 of the largest
    entry (in float32 a scalar's gradient, a sum over the whole map that mostly cancels, differed by 6e-4 of itself
    for one draw, with the random-order suite's global seed).
    """
    torch.manual_seed(0)
    model = _perturbed(create_model("resnet_cifar", depth=8, norm=norm, init=init, shortcut="B")).double()
    plain = set_lean(copy.deepcopy(model), False)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    out, ref = model(x), plain(x)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10 * ref.abs().max().item())
    out.sum().backward()
    ref.sum().backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        tol = 1e-10 * max(1.0, q.grad.abs().max().item())
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=tol, msg=lambda m, n=name: f"{n}: {m}")


def test_forward_hooks_on_inner_modules_see_the_straightforward_path():
    """LSUV and the lab's probes hook convolutions and scalars: they must see them called as written."""
    model = _perturbed(create_model("resnet_cifar", depth=8))
    block = model.layer1[0]
    seen = {}
    handle = block.conv1.register_forward_hook(lambda _m, inp, _out: seen.setdefault("input", inp[0]))
    x = torch.randn(2, 3, 8, 8)
    model(x)
    handle.remove()
    stem = F.relu(model.conv1(x) + model.bias1.bias)
    torch.testing.assert_close(seen["input"], stem + block.bias1a.bias)  # conv1 received x + b1a


@pytest.mark.parametrize("stride", [1, 2])
def test_lean_conv2d_equals_shift_conv_scale_bias(stride):
    conv = nn.Conv2d(4, 6, 3, stride, 1, bias=True)
    x = torch.randn(2, 4, 7, 9, requires_grad=True)
    shift, scale, bias = (torch.randn(1, requires_grad=True) for _ in range(3))
    out = lean_conv2d(x, conv, shift=shift, scale=scale, bias=bias)
    ref = scale * conv(x + shift) + bias
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    lean_grads = torch.autograd.grad(out, (x, shift, scale, bias, conv.weight, conv.bias), g)
    ref_grads = torch.autograd.grad(ref, (x, shift, scale, bias, conv.weight, conv.bias), g)
    for a, b in zip(lean_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_ones_response_differs_only_at_the_padded_border():
    w = torch.randn(5, 3, 3, 3)
    resp = ones_response(w, (6, 6), 1, 1)[0]
    torch.testing.assert_close(resp, F.conv2d(torch.ones(1, 3, 6, 6), w, None, 1, 1)[0])
    interior = w.sum((1, 2, 3))
    torch.testing.assert_close(resp[:, 1:-1, 1:-1], interior[:, None, None].expand(5, 4, 4))
    assert not torch.allclose(resp[:, 0, 0], interior)


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of distinct storages that autograd keeps for the backward pass of one forward."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return sum(storages.values())


def test_lean_fixup_keeps_no_more_for_backward_than_the_bare_network():
    # Activations dominate at this size, as in training; the lean path also keeps a scaled copy of each
    # conv2 weight (the multiplier folded in), which is parameter-sized.
    x = torch.randn(16, 3, 32, 32)
    lean = create_model("resnet_cifar", depth=14)
    plain = set_lean(copy.deepcopy(lean), False)
    bare = create_model("resnet_cifar", depth=14, norm="none")
    lean_b, plain_b, bare_b = (_saved_bytes(m, x) for m in (lean, plain, bare))
    assert lean_b <= 1.05 * bare_b, (lean_b, bare_b)
    assert plain_b >= 2 * bare_b, (plain_b, bare_b)  # the straightforward path keeps a tensor per scalar


def test_lean_path_still_rejects_mismatched_residual_shapes():
    block = BasicBlock(4, 4, method=fixup.METHODS["fixup"])
    block.conv2 = nn.Conv2d(4, 5, 3, 1, 1, bias=False)
    with pytest.raises(ValueError, match=r"shape \(1, 4, 6, 6\)"):
        block(torch.randn(1, 4, 6, 6))
    bare = BasicBlock(4, 4, method=fixup.METHODS["he"])
    bare.conv2 = nn.Conv2d(4, 5, 3, 1, 1, bias=False)
    with pytest.raises(ValueError, match="must match exactly"):
        bare(torch.randn(1, 4, 6, 6))


@pytest.mark.parametrize("stride,padding,dilation,size", [(1, 1, 1, (7, 9)), (2, 1, 1, (8, 7)), (1, 2, 2, (6, 6)),
                                                          (2, 3, 1, (5, 4))])
def test_add_border_adds_the_shift_response_beyond_its_interior_with_exact_gradients(stride, padding, dilation, size):
    """The compiled path's border function: ``out + conv(1, W) - W.sum()`` (zero inside the image), with a
    backward that reads only the border, checked numerically in float64, double backward included."""
    conv = nn.Conv2d(3, 4, 3, stride, padding, dilation, bias=False).double()
    summed = torch.randn(4, 3, 3, dtype=torch.float64, requires_grad=True)
    out_shape = (2, 4, *[(n + 2 * padding - dilation * 2 - 1) // stride + 1 for n in size])
    base = torch.randn(out_shape, dtype=torch.float64, requires_grad=True)

    def add_border(out, kernel):
        return _AddBorder.apply(out.clone(), kernel, size, conv)

    expected = base + (F.conv2d(torch.ones(1, 3, *size, dtype=torch.float64), summed[:, None].expand(4, 3, 3, 3) / 3,
                                None, stride, padding, dilation) - summed.sum((1, 2))[:, None, None])
    torch.testing.assert_close(add_border(base, summed), expected)
    assert torch.autograd.gradcheck(add_border, (base, summed))
    assert torch.autograd.gradgradcheck(add_border, (base, summed))


@pytest.mark.parametrize("bias_shape", [(1,), (5,), (1, 5, 1, 1)])
@pytest.mark.parametrize("padding", [0, 1])
def test_lean_conv2d_takes_every_documented_bias_form_with_a_shift_and_a_multiplier(bias_shape, padding):
    """A scalar, a (C_out,) vector or a (1, C_out, 1, 1) bias, after a shifted, scaled convolution, padded
    (the eager path's map) or not (the convolution's bias): values and gradients against the formula."""
    conv = nn.Conv2d(3, 5, 3 if padding else 1, padding=padding, bias=False).double()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    shift, scale = (torch.randn(1, dtype=torch.float64, requires_grad=True) for _ in range(2))
    bias = torch.randn(bias_shape, dtype=torch.float64, requires_grad=True)
    lean = lean_conv2d(x, conv, shift=shift, scale=scale, bias=bias)
    per_channel = bias.reshape(1, -1, 1, 1) if bias.numel() > 1 else bias
    written = F.conv2d(x + shift, conv.weight, None, 1, padding) * scale + per_channel
    torch.testing.assert_close(lean, written)
    grads = torch.autograd.grad(lean.square().sum(), (shift, scale, bias, conv.weight))
    expected = torch.autograd.grad(written.square().sum(), (shift, scale, bias, conv.weight))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


def test_scaled_matmul_keeps_no_scaled_weight_and_has_exact_gradients():
    """The eager multiplier inside a linear layer: ``x @ (s W).t()`` with gradients (double backward included)
    checked numerically, and autograd keeping ``x`` and ``W`` for backward, never a scaled copy of ``W``."""
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(1, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(_ScaledMatmul.apply(x, weight, scale), x @ (scale * weight).t())
    assert torch.autograd.gradcheck(_ScaledMatmul.apply, (x, weight, scale))
    assert torch.autograd.gradgradcheck(_ScaledMatmul.apply, (x, weight, scale))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        lean_linear(x, nn.Linear(5, 4, dtype=torch.float64), shift=scale, scale=scale, bias=scale).sum().backward()
    assert sum(t.numel() for t in saved if t.shape == (4, 5)) == weight.numel()  # the weight itself, once


def test_scaled_linear_under_bfloat16_autocast_matches_autograd_of_the_written_form():
    linear = nn.Linear(8, 6)
    x = torch.randn(4, 7, 8)
    shift, scale = torch.tensor([0.3], requires_grad=True), torch.tensor([0.7], requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lean = lean_linear(x, linear, shift=shift, scale=scale)
        written = F.linear(x + shift, linear.weight * scale, linear.bias * scale)
    assert lean.dtype == written.dtype == torch.bfloat16
    torch.testing.assert_close(lean, written, rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(lean.float().square().sum(), (shift, scale, linear.weight, linear.bias))
    expected = torch.autograd.grad(written.float().square().sum(), (shift, scale, linear.weight, linear.bias))
    for got, want in zip(grads, expected):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2 * want.abs().max().item())
