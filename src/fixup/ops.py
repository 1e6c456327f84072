"""Lean Fixup operations: the scalar biases and multiplier without extra saved activations.

A straightforward Fixup block (Zhang, Dauphin & Ma, ICLR 2019, section 3, rule 3) computes
``scale * conv2(relu(conv1(x + b1a) + b1b) + b2a) + b2b``. Each ``x + b`` makes a new full-size
tensor that the next convolution keeps for its backward pass, and ``x * scale`` keeps the
convolution's output too: a ResNet-56 training step then holds about 2.4x the activations of the
bare network (``fixup bench``).

The same function can be computed keeping only what the bare network keeps, by linearity:

- a scalar bias before a convolution: ``conv(x + b, W) = conv(x, W) + b * conv(1, W)``, where
  ``conv(1, W)`` is the convolution of an all-ones image, a per-channel map that is constant inside
  the image and differs only at the zero-padded border. It equals ``conv(1, W.sum(1))`` over a
  single channel, so it costs a convolution of one (1, 1, H, W) image. The big convolution then saves
  ``x`` itself, which the previous ReLU already keeps.
- a multiplier after a convolution: ``s * conv(u, W) = conv(u, s * W)``; autograd then finds
  ``d/ds`` from the weight gradient, and the convolution's output need not be kept.
- a scalar bias after a convolution, and the maps above, are added in place to the convolution's
  fresh output, which no backward needs.

Everything is ordinary autograd (no custom backward), so double backward, ``torch.compile`` and
activation checkpointing work unchanged. The results equal the straightforward ones up to float
rounding (tests/test_speed_ops.py compares outputs and gradients).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

from .nn import Bias, Scale, check_residual_shapes

__all__ = ["basic_block_lean_forward", "can_run_lean", "lean_conv2d", "lean_residual_relu_", "ones_response",
           "set_lean"]


def ones_response(weight: Tensor, size: tuple[int, int], stride: int | tuple[int, int] = 1,
                  padding: int | tuple[int, int] = 0) -> Tensor:
    """``conv2d(ones(1, C_in, H, W), weight)``: the response of a zero-padded convolution to a constant 1.

    Computed as a single-channel convolution with the kernel summed over its input channels
    (needs ``groups=1``). Returns shape (1, C_out, H_out, W_out).
    """
    ones = weight.new_ones((1, 1, *size))
    return F.conv2d(ones, weight.sum(1, keepdim=True), None, stride, padding)


def _shift_response(weight: Tensor, shift: Tensor, size: tuple[int, int], stride, padding) -> Tensor:
    """``shift * ones_response(weight)``, with ``shift`` applied to the small summed kernel, so that
    backward keeps that kernel and a one-channel image of ones rather than a (1, C_out, H, W) map."""
    ones = weight.new_ones((1, 1, *size))
    return F.conv2d(ones, weight.sum(1, keepdim=True) * shift, None, stride, padding)


def lean_conv2d(x: Tensor, conv: nn.Conv2d, *, shift: Tensor | None = None, scale: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
    """``scale * conv(x + shift) + bias`` computed keeping only ``x`` and the weight for backward.

    ``shift`` and ``scale`` are scalars (shape (1,)) or None; ``bias`` is a scalar or a map that
    broadcasts to the output from shape (1, C_out, H_out, W_out). ``conv``'s own bias, if any, is
    added inside the convolution (so it is multiplied by ``scale``). The result is a fresh tensor that
    no backward needs, so callers may change it in place (``relu_``, ``add_``).
    """
    if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise ValueError(f"lean_conv2d supports groups=1 and zero padding given as numbers; got "
                         f"groups={conv.groups}, padding={conv.padding!r}, "
                         f"padding_mode={conv.padding_mode!r}. "
                         "Call the module directly instead.")
    weight = conv.weight if scale is None else conv.weight * scale
    conv_bias = conv.bias
    if conv_bias is not None and scale is not None:
        conv_bias = conv_bias * scale
    maps = []
    if shift is not None:
        maps.append(_shift_response(weight, shift, tuple(x.shape[-2:]), conv.stride, conv.padding))
    if bias is not None and bias.numel() == 1 and not maps:
        # A scalar after the convolution rides in the convolution's own per-channel bias: no extra pass.
        post = bias.expand(weight.shape[0])
        conv_bias = post if conv_bias is None else conv_bias + post
    elif bias is not None:
        maps.append(bias)
    out = F.conv2d(x, weight, conv_bias, conv.stride, conv.padding, conv.dilation)
    if not maps:
        return out
    for m in maps:
        pairs = zip(reversed(m.shape), reversed(out.shape))
        fits = m.dim() <= out.dim() and all(a in (1, b) for a, b in pairs)
        if not fits:
            raise ValueError(f"a bias map of shape {tuple(m.shape)} does not broadcast to the convolution's "
                             f"output shape {tuple(out.shape)}; in a residual block this means the branch "
                             "and the shortcut differ in shape: check the block's widths and strides")
    add = maps[0] if len(maps) == 1 else maps[0] + maps[1]
    return out.add_(add.to(out.dtype))


def lean_residual_relu_(branch: Tensor, shortcut: Tensor, block: str = "residual block",
                        output_scale: float = 1.0) -> Tensor:
    """``relu(output_scale * (branch + shortcut))`` computed in place in ``branch``, a fresh tensor nobody saved.

    Shapes of ``branch`` and ``shortcut`` must match exactly, as in :func:`fixup.nn.residual_add`.
    """
    check_residual_shapes(shortcut, branch, block)
    branch = branch.add_(shortcut)
    if output_scale != 1.0:
        branch = branch.mul_(output_scale)
    return branch.relu_()


def _value(scalar: nn.Module) -> Tensor | None:
    """The parameter of a Bias or Scale module, or None where the module is absent (nn.Identity)."""
    if isinstance(scalar, Bias):
        return scalar.bias
    if isinstance(scalar, Scale):
        return scalar.scale
    return None


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


_ZERO_PAD: list[type] = []  # ZeroPadShortcut, imported on first use (the models import this module)


def _linear_shortcut(shortcut: nn.Module) -> bool:
    """Identity, subsample-and-pad, or a Sequential of bias-free convolutions and identities; no hooks."""
    if not _ZERO_PAD:
        from .models.resnet_cifar import ZeroPadShortcut

        _ZERO_PAD.append(ZeroPadShortcut)
    parts = list(shortcut) if type(shortcut) is nn.Sequential else [shortcut]
    return all(not _hooked(m) and (type(m) in (nn.Identity, _ZERO_PAD[0])
                                   or (type(m) is nn.Conv2d and m.bias is None)) for m in parts)


def _plain_conv(conv: nn.Module) -> bool:
    return (type(conv) is nn.Conv2d and conv.groups == 1 and conv.padding_mode == "zeros"
            and not isinstance(conv.padding, str))


def can_run_lean(block: nn.Module) -> bool:
    """Whether :func:`basic_block_lean_forward` computes exactly what ``block``'s modules would.

    It does where the block has no normalisation layer, its shortcut is linear (identity,
    subsample-and-pad, a bias-free 1x1 projection), its convolutions are plain ``nn.Conv2d`` with zero
    padding and one group, and nothing observes its inner modules: a forward hook (LSUV, the lab's
    probes) must see every module called as written, so with hooks on the block's submodules, or
    global module hooks, the block runs its straightforward path. Checked at every call (cheaply).
    """
    if type(block.norm1) is not nn.Identity or type(block.norm2) is not nn.Identity:
        return False
    if (_module._global_forward_hooks or _module._global_forward_pre_hooks or _module._global_backward_hooks
            or _module._global_backward_pre_hooks):
        return False
    inner = (block.conv1, block.conv2, block.bias1a, block.bias1b, block.bias2a, block.bias2b, block.scale,
             block.relu, block.norm1, block.norm2, block.shortcut)
    if any(_hooked(m) for m in inner):
        return False
    return _plain_conv(block.conv1) and _plain_conv(block.conv2) and _linear_shortcut(block.shortcut)


def basic_block_lean_forward(block: nn.Module, x: Tensor) -> Tensor:
    """A :class:`fixup.models.resnet_cifar.BasicBlock`'s forward, keeping no tensor for its scalars.

    ``relu(c * (shortcut(x + b1a) + scale * conv2(relu(conv1(x + b1a) + b1b) + b2a) + b2b))`` where
    absent scalars are skipped, an identity shortcut carries ``x`` itself and ``c`` is the block's
    ``output_scale``. Call only where :func:`can_run_lean` holds.
    """
    b1a, b1b, b2a, b2b = (_value(m) for m in (block.bias1a, block.bias1b, block.bias2a, block.bias2b))
    out = lean_conv2d(x, block.conv1, shift=b1a, bias=b1b).relu_()
    post = b2b
    if b1a is not None and not isinstance(block.shortcut, nn.Identity):
        # shortcut(x + b1a) = shortcut(x) + shortcut(b1a): the shortcut is linear (can_run_lean), so its
        # response to the scalar is that of a single constant image, added with the branch's last bias.
        response = block.shortcut(b1a.expand(1, *x.shape[1:]))
        post = response if post is None else response + post
    shortcut = block.shortcut(x)
    # Check the residual shapes before the shortcut's response joins conv2's output map.
    check_residual_shapes(shortcut, _conv_output_shape(block.conv2, out.shape), block.block_name)
    out = lean_conv2d(out, block.conv2, shift=b2a, scale=_value(block.scale), bias=post)
    return lean_residual_relu_(out, shortcut, block.block_name, block.output_scale)


def _conv_output_shape(conv: nn.Conv2d, shape: torch.Size) -> torch.Size:
    size = [(n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, p, d, k, s in zip(shape[-2:], conv.padding, conv.dilation, conv.kernel_size, conv.stride)]
    return torch.Size((shape[0], conv.out_channels, *size))


def set_lean(model: nn.Module, on: bool = True) -> nn.Module:
    """Switch every block of ``model`` that has a lean path (a ``lean`` attribute) to it, or back.

    The lean path is the default; the straightforward path is kept as the reference it is tested
    against and for the benchmark's before/after comparison. Returns ``model``.
    """
    for module in model.modules():
        if hasattr(module, "lean"):
            module.lean = bool(on)
    return model
