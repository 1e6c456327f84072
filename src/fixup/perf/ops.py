"""Lean Fixup operations: the scalar biases and multiplier without extra saved activations.

A straightforward Fixup branch (Zhang, Dauphin & Ma, ICLR 2019, section 3, rule 3) computes, e.g. for a
basic block, ``scale * conv2(relu(conv1(x + b1a) + b1b) + b2a) + b2b``. Each ``x + b`` makes a new
full-size tensor that the next layer keeps for its backward pass, and ``x * scale`` keeps the layer's
output too: a ResNet-56 training step then holds about 2.4x the activations of the bare network
(``fixup bench``).

The same function can be computed keeping only what the bare network keeps, by linearity:

- a scalar bias before a linear layer: ``W (x + b) = W x + b * W.sum(1)``, a per-feature bias;
- a scalar bias before a convolution without padding (a 1x1 convolution): likewise
  ``conv(x + b, W) = conv(x, W) + b * W.sum((1, 2, 3))``, a per-channel bias inside the convolution;
- a scalar bias before a zero-padded convolution: ``conv(x + b, W) = conv(x, W) + b * conv(1, W)``, where
  ``conv(1, W)`` is the convolution of an all-ones image, a per-channel map that is constant inside the
  image and differs only at the zero-padded border. Eager, it is computed as a convolution of one
  (1, 1, H, W) image with the kernel summed over its input channels, and added to the output in place.
  Compiled, ``b * W.sum()`` rides in the convolution's per-channel bias and the border's difference is
  added by :class:`_AddBorder`: which kernel taps read inside the image factorises into rows and columns,
  ``conv(1, W)[o, i, j] = sum_ab W.sum(1)[o, a, b] R[a, i] C[b, j]`` with 0/1 matrices ``R`` and ``C``,
  and the kernel's gradient needs the batch's gradient summed over the border rectangles only. Under
  inductor this replaces a one-channel convolution whose weight gradient runs on a slow reference
  kernel and a strided batch reduction of a (C, H, W) map (``fixup bench``'s profile: compiled ResNet-20
  from 1.23x to 1.07x the bare network). The big convolution then saves ``x`` itself, which the
  previous ReLU already keeps;
- a multiplier after a layer: ``s * layer(u, W) = layer(u, s * W)``; autograd then finds ``d/ds`` from
  the weight gradient, and the layer's output need not be kept;
- a scalar bias after a layer, and the maps above, ride in the layer's bias or are added in place to
  its fresh output, which no backward needs.

These are generic helpers: each residual block owns its lean forward (``lean_forward``) and decides,
by ``lean_ready()``, whether it applies; nothing here reads a block's attributes. Everything but
:class:`_AddBorder` (compiled) and :class:`_ScaledMatmul` (an eager linear layer's multiplier, which keeps ``W``
rather than ``s * W``) is ordinary autograd, and their backward is written in differentiable operations, so
double backward, ``torch.compile`` and activation checkpointing work unchanged. tests/test_speed_ops.py
and tests/test_lean_families.py compare outputs and gradients with the straightforward forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

from ..nn import Bias, Scale, check_residual_shapes

__all__ = ["ShiftedConv2d", "conv_output_shape", "lean_conv2d", "lean_linear", "lean_residual_",
           "observed", "ones_response", "plain_conv", "plain_linear", "scalar_value", "set_lean"]


def scalar_value(scalar: nn.Module) -> Tensor | None:
    """The parameter of a :class:`~fixup.nn.Bias` or :class:`~fixup.nn.Scale`, or None where the module is
    absent (``nn.Identity``: the method has no such scalar)."""
    if isinstance(scalar, Bias):
        return scalar.bias
    if isinstance(scalar, Scale):
        return scalar.scale
    return None


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def observed(*modules: nn.Module) -> bool:
    """Whether a hook watches any of ``modules`` (or every module: global hooks).

    A block whose inner modules are observed (LSUV, the laboratory's probes) runs its straightforward
    forward, so that the hooks see every module called as written.
    """
    if (_module._global_forward_hooks or _module._global_forward_pre_hooks or _module._global_backward_hooks
            or _module._global_backward_pre_hooks):
        return True
    return any(_hooked(m) for m in modules)


def plain_conv(conv: nn.Module) -> bool:
    """An ``nn.Conv2d`` (or a folded :class:`ShiftedConv2d`) with one group and zero padding given as numbers."""
    return (type(conv) in (nn.Conv2d, ShiftedConv2d) and conv.groups == 1 and conv.padding_mode == "zeros"
            and not isinstance(conv.padding, str))


def plain_linear(linear: nn.Module) -> bool:
    """An ``nn.Linear`` (not a subclass)."""
    return type(linear) is nn.Linear


def ones_response(weight: Tensor, size: tuple[int, int], stride: int | tuple[int, int] = 1,
                  padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1) -> Tensor:
    """``conv2d(ones(1, C_in, H, W), weight)``: the response of a zero-padded convolution to a constant 1.

    Computed as a single-channel convolution with the kernel summed over its input channels
    (needs ``groups=1``). Returns shape (1, C_out, H_out, W_out).
    """
    return _summed_ones_response(weight.sum(1, keepdim=True), size, stride, padding, dilation)


def _summed_ones_response(summed: Tensor, size: tuple[int, int], stride, padding, dilation) -> Tensor:
    """:func:`ones_response` from the kernel summed over its input channels, shape (C_out, 1, kh, kw)."""
    return F.conv2d(summed.new_ones((1, 1, *size)), summed, None, stride, padding, dilation)


def _taps_inside(n: int, k: int, s: int, p: int, d: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(k, n_out) 0/1 matrix along one axis: whether kernel tap ``a`` of output ``i`` reads inside the image
    (rather than the zero padding)."""
    out = (n + 2 * p - d * (k - 1) - 1) // s + 1
    pos = torch.arange(out, device=device)[None, :] * s - p + torch.arange(k, device=device)[:, None] * d
    return ((pos >= 0) & (pos < n)).to(dtype)


def _tap_matrices(like: Tensor, size: tuple[int, int], geometry: tuple) -> tuple[Tensor, Tensor]:
    """Per axis, which taps of a kernel ``like`` (..., kh, kw) read inside an image of ``size``: (kh, H_out) and
    (kw, W_out) 0/1 matrices on its device, in its dtype; ``geometry`` is (stride, padding, dilation)."""
    (sh, sw), (ph, pw), (dh, dw) = (torch.nn.modules.utils._pair(v) for v in geometry)
    kh, kw = like.shape[-2:]
    return (_taps_inside(int(size[0]), kh, sh, ph, dh, like.device, like.dtype),
            _taps_inside(int(size[1]), kw, sw, pw, dw, like.device, like.dtype))


def _border_extent(n: int, k: int, s: int, p: int, d: int) -> tuple[int, int, int]:
    """Output length, and how many leading and trailing outputs read the zero padding, along one axis."""
    out = (n + 2 * p - d * (k - 1) - 1) // s + 1
    reads_pad = [i * s - p < 0 or i * s - p + d * (k - 1) > n - 1 for i in range(out)]
    lead = next((i for i, r in enumerate(reads_pad) if not r), out)
    trail = next((i for i, r in enumerate(reversed(reads_pad)) if not r), out)
    return out, lead, min(trail, out - lead)


def _border_regions(size: tuple[int, int], conv: nn.Conv2d) -> list[tuple[slice, slice]]:
    """The output rows and columns of ``conv`` on an input of ``size`` that read its zero padding, as at most
    four disjoint rectangles (top and bottom rows, then the left and right columns between them)."""
    (ho, t, b), (wo, left, right) = (_border_extent(n, k, s, p, d) for n, k, s, p, d in
                                      zip(size, conv.kernel_size, conv.stride, conv.padding, conv.dilation))
    regions = [(slice(0, t), slice(0, wo)), (slice(ho - b, ho), slice(0, wo)),
               (slice(t, ho - b), slice(0, left)), (slice(t, ho - b), slice(wo - right, wo))]
    return [r for r in regions if r[0].stop > r[0].start and r[1].stop > r[1].start]


def _border_map(summed: Tensor, size: tuple[int, int], geometry: tuple) -> Tensor:
    """``conv(1, W) - W.sum()`` per output channel, (C_out, H_out, W_out), zero inside the image, from the
    kernel summed over its input channels (C_out, kh, kw); ``geometry`` is (stride, padding, dilation).

    ``conv(1, W)[o, i, j] = sum_ab summed[o, a, b] rows[a, i] cols[b, j]``: two small matrix products (a
    one-channel convolution's weight gradient runs on a slow reference kernel under inductor), laid out
    channels-last, as inductor lays out a CPU convolution's output, so that adding the map to it is one
    vectorised pass that inductor fuses with the next operation.
    """
    rows, cols = _tap_matrices(summed, size, geometry)
    per_row = torch.matmul(cols.t(), summed.permute(1, 2, 0))  # (kh, W_out, C_out)
    hwc = torch.matmul(rows.t(), per_row.flatten(1)).view(rows.shape[1], cols.shape[1], -1)
    return hwc.permute(2, 0, 1) - summed.sum((1, 2))[:, None, None]


class _AddBorder(torch.autograd.Function):
    """``out + (conv(1, W) - W.sum())`` in place (:func:`_border_map`), given the kernel summed over its input
    channels: the border part of a shift's response, for the compiled lean path.

    Autograd alone would reduce the gradient of a (C, H, W) map over the whole batch; the kernel's gradient
    needs only the batch's gradient summed over the border rectangles, which ``backward`` takes. The
    output's gradient passes through unchanged. ``backward`` is written in differentiable operations, so
    double backward works.
    """

    @staticmethod
    def forward(ctx, out: Tensor, summed: Tensor, size: tuple[int, int], conv: nn.Conv2d) -> Tensor:
        geometry = (conv.stride, conv.padding, conv.dilation)
        ctx.regions, ctx.geometry, ctx.size = _border_regions(size, conv), geometry, size
        ctx.save_for_backward(summed)  # for its shape, device and dtype
        out.add_(_border_map(summed, size, geometry).to(out.dtype))
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:
        (kernel,) = ctx.saved_tensors
        border = grad.new_zeros(grad.shape[1:], dtype=kernel.dtype)  # the batch's gradient summed, on the border
        for rows, cols in ctx.regions:
            border[:, rows, cols] = grad[:, :, rows, cols].sum(0).to(kernel.dtype)
        rows, cols = _tap_matrices(kernel, ctx.size, ctx.geometry)
        channels, height, width = border.shape
        # rows @ border @ cols.t() per channel, as two plain matrix products: a (C, kh, H) x (C, H, W) batched
        # product runs as a loop over channels on CPU (compiled: thousands of select and clone calls a step)
        per_col = torch.mm(border.reshape(channels * height, width), cols.t())  # (C * H, kw)
        by_row = per_col.view(channels, height, -1).transpose(0, 1).reshape(height, -1)  # (H, C * kw)
        taps = torch.mm(rows, by_row).view(rows.shape[0], channels, -1).transpose(0, 1)  # (C, kh, kw)
        summed = taps - border.sum((1, 2))[:, None, None]
        return grad, summed, None, None


#: Eager :class:`ShiftedConv2d` outputs of at most this many elements take the border correction as one
#: whole-map addition rather than one addition per border rectangle (up to four): on a CPU a rectangle's
#: addition costs its dispatch and strided access whatever its size, a whole-map addition about 0.1 ms per
#: million elements, so the one addition wins at CIFAR and small-bottleneck sizes (folded bottleneck forward
#: 1.07x -> 1.01x the bare network, ``fixup bench --variants none fixup-folded``) and the rectangles at
#: ImageNet sizes.
WHOLE_MAP_NUMEL = 1 << 20


class ShiftedConv2d(nn.Conv2d):
    """``conv(x + shift)`` for a zero-padded convolution, computed as ``conv(x)`` plus a border correction.

    The interior part of ``shift * conv(1)``, ``shift * W.sum((1, 2, 3))``, is already in ``bias`` (folded
    by :func:`fold_layer`); ``forward`` adds ``shift * (conv(1) - W.sum((1, 2, 3)))``, zero inside the image,
    to the output in place. The correction is cached per input size and recomputed when the weight, bias or
    shift change (``_version``). Eager, a small output takes it as one whole-map addition and a large one
    as in-place additions on the rows and columns that read the padding (:data:`WHOLE_MAP_NUMEL`); compiled,
    it is one whole-map addition (:func:`_border_map`) that inductor fuses with the next operation. For
    inference: under autograd the in-place additions are correct but copy gradients, so train the unfolded
    model instead.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register_buffer("shift", torch.zeros(1))
        self._borders: dict[tuple, tuple[Tensor, list[tuple[tuple[slice, slice], Tensor]]]] = {}

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, shift: Tensor) -> ShiftedConv2d:
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                  conv.dilation, conv.groups, conv.bias is not None, conv.padding_mode,
                  device=conv.weight.device, dtype=conv.weight.dtype)
        new.weight = conv.weight
        new.bias = conv.bias
        new.shift.copy_(shift.detach().reshape(1))
        return new

    def _correction(self, size: tuple[int, int]) -> tuple[Tensor, list[tuple[tuple[slice, slice], Tensor]]]:
        """The whole (C_out, H_out, W_out) correction map, and its border rectangles with their pieces."""
        with torch.no_grad():
            full = ones_response(self.weight, size, self.stride, self.padding, self.dilation)[0]
            corr = (full - self.weight.sum((1, 2, 3))[:, None, None]) * self.shift  # zero inside the image
        return corr, [((rows, cols), corr[:, rows, cols].contiguous()) for rows, cols in _border_regions(size, self)]

    def forward(self, x: Tensor) -> Tensor:
        out = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        size = (x.shape[-2], x.shape[-1])
        if torch.compiler.is_compiling():  # one fused whole-map addition rather than four slice updates
            summed = self.weight.sum(1) * self.shift
            return out.add_(_border_map(summed, size, (self.stride, self.padding, self.dilation)).to(out.dtype))
        key = (size, x.device, x.dtype, self.weight._version, self.shift._version,
               None if self.bias is None else self.bias._version)
        cached = self._borders.get(key)
        if cached is None:
            cached = self._correction(size)
            self._borders = {key: cached}
        whole, pieces = cached
        if out.numel() <= WHOLE_MAP_NUMEL:
            return out.add_(whole.to(out.dtype))
        for (rows, cols), piece in pieces:
            out[:, :, rows, cols].add_(piece.to(out.dtype))  # on the view: no copy back into ``out``
        return out


def _padded(conv: nn.Conv2d) -> bool:
    return any(p != 0 for p in conv.padding)


def _channel_vector(t: Tensor, channels: int) -> Tensor | None:
    """``t`` as a tensor that broadcasts as a (channels,) vector where it is constant over everything but the
    channel axis (a scalar, shape (1,) as it is; a (C,) vector; shape (1, C, 1, 1)); None where it varies over
    positions. A scalar is not expanded: adding it to a vector broadcasts, with one autograd node fewer."""
    if t.numel() == 1:
        return t if t.shape == (1,) else t.reshape(1)
    if t.numel() == channels and (t.dim() == 1 or (t.dim() >= 2 and t.shape[1] == channels)):
        return t if t.dim() == 1 else t.reshape(channels)
    return None


def lean_conv2d(x: Tensor, conv: nn.Conv2d, *, shift: Tensor | None = None, scale: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
    """``scale * conv(x + shift) + bias`` computed keeping only ``x`` and the weight for backward.

    ``shift`` and ``scale`` are scalars (shape (1,)) or None; ``bias`` is a scalar, a per-channel vector
    (shape (C_out,) or (1, C_out, 1, 1)) or a map that broadcasts to the output from shape
    (1, C_out, H_out, W_out). ``conv``'s own bias, if any, is added inside the convolution (so it is
    multiplied by ``scale``). Where nothing varies over positions (no shift, or a convolution without
    padding) everything rides in the convolution's per-channel bias; otherwise one map is added in place.
    The result is a fresh tensor that no backward needs, so callers may change it in place.
    """
    if type(conv) is ShiftedConv2d:  # a folded layer: its shift is inside; nothing more may be folded in
        if shift is not None or scale is not None or bias is not None:
            raise ValueError("lean_conv2d got scalars for a folded ShiftedConv2d, whose shift is already inside; "
                             "fold every scalar of the block (fixup.fold_for_inference) or none")
        return conv(x)
    if not plain_conv(conv):
        raise ValueError(f"lean_conv2d supports nn.Conv2d with groups=1 and zero padding given as numbers; got "
                         f"{type(conv).__name__} with groups={conv.groups}, padding={conv.padding!r}, "
                         f"padding_mode={conv.padding_mode!r}. Call the module directly instead.")
    # Eager, every autograd node of the scalars' parameter-sized arithmetic costs more than its work: a (1,)
    # term broadcasts (no expand) until it meets a per-channel one, and a shift's term joins by one addcmul.
    channels = conv.out_channels
    weight = conv.weight if scale is None else conv.weight * scale
    vector = conv.bias  # what rides in the convolution's per-channel bias
    if vector is not None and scale is not None:
        vector = vector * scale
    add = None  # a map varying over positions, added to the output in place
    border = None  # compiled: the shift on the kernel summed over its input channels, for _AddBorder
    eager_map = shift is not None and _padded(conv) and not torch.compiler.is_compiling()
    per_channel = None if bias is None else _channel_vector(bias, channels)
    if per_channel is not None and not eager_map:
        vector = per_channel if vector is None else vector + per_channel
        bias = None
    if shift is not None and not _padded(conv):  # shift * W.sum() per channel
        total = weight.sum((1, 2, 3))
        vector = total * shift if vector is None else torch.addcmul(vector, total, shift)
    elif eager_map:
        # Eager, one map shift * conv(1, W) added in place, whose gradient autograd reduces over the batch,
        # beats a custom function touching the border only (``fixup bench``, CIFAR and bottleneck ResNets),
        # and the one-channel convolution beats _AddBorder's matrix products by ~0.1 ms a layer. The shift
        # multiplies the small summed kernel, not a (1, C_out, H, W) map.
        add = _summed_ones_response(weight.sum(1, keepdim=True) * shift, x.shape[-2:], conv.stride, conv.padding,
                                    conv.dilation)
    elif shift is not None:
        # compiled: shift * W.sum() per channel in the convolution's bias, the border's difference added after
        # it, its gradient reduced over the border only (_AddBorder)
        border = weight.sum(1) * shift
        response = border.sum((1, 2))
        vector = response if vector is None else vector + response
    if bias is not None:  # varying over positions, or joining the eager shift's map: one in-place addition
        term = per_channel[:, None, None] if per_channel is not None and bias.dim() == 1 and bias.numel() > 1 else bias
        add = term if add is None else add + term
    if vector is not None and vector.shape != (channels,):  # scalar terms only: the convolution wants (C_out,)
        vector = vector.expand(channels)
    out = F.conv2d(x, weight, vector, conv.stride, conv.padding, conv.dilation)
    if border is not None:
        out = _AddBorder.apply(out, border, tuple(x.shape[-2:]), conv)
    if add is None:
        return out
    pairs = zip(reversed(add.shape), reversed(out.shape))
    if add.dim() > out.dim() or not all(a in (1, b) for a, b in pairs):
        raise ValueError(f"a bias map of shape {tuple(add.shape)} does not broadcast to the convolution's output "
                         f"shape {tuple(out.shape)}; in a residual block this means the branch and the shortcut "
                         "differ in shape: check the block's widths and strides")
    return out.add_(add.to(out.dtype))


class _ScaledMatmul(torch.autograd.Function):
    """``x @ (scale * weight).t()`` keeping ``x``, ``weight`` and ``scale`` for backward, not the scaled weight.

    Autograd would keep ``scale * weight``, a parameter-sized tensor per scaled layer: in a 512-wide
    Transformer at 1,024 tokens a step, 1.11x the bare network's peak memory (``fixup bench --families
    transformer --width 512``). Backward recomputes the product; it is written in differentiable operations,
    so double backward works. Under autocast the product runs in the autocast dtype, as ``F.linear`` would.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight, scale)
        return torch.matmul(x, (weight * scale).t())

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, weight, scale = ctx.saved_tensors
        grad_x = torch.matmul(grad, (weight * scale).to(grad.dtype)).to(x.dtype)
        raw = torch.mm(grad.reshape(-1, grad.shape[-1]).t(), x.reshape(-1, x.shape[-1]).to(grad.dtype))
        raw = raw.to(weight.dtype)  # the gradient of the scaled weight, (out, in)
        return grad_x, raw * scale, (raw * weight).sum().reshape(scale.shape)


def lean_linear(x: Tensor, linear: nn.Linear, *, shift: Tensor | None = None, scale: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
    """``scale * linear(x + shift) + bias`` as one ``F.linear``: ``W' = s W``, ``c' = s (c + shift W.sum(1)) + bias``.

    ``shift``, ``scale`` and ``bias`` are scalars (shape (1,)) or None (``bias`` may also be a vector of
    ``out_features``). Backward keeps ``x`` and the weight only (eager, :class:`_ScaledMatmul` recomputes
    ``W'``; compiled, inductor decides); the output is fresh (not a view), so callers may change it in place.
    """
    recompute = (scale is not None and torch.is_grad_enabled() and not torch.compiler.is_compiling()
                 and (x.requires_grad or linear.weight.requires_grad or scale.requires_grad))
    weight = linear.weight if scale is None or recompute else linear.weight * scale
    vector = linear.bias
    if vector is not None and scale is not None:
        vector = vector * scale
    if bias is not None:  # a scalar broadcasts onto a vector already there (one autograd node fewer)
        b = bias.expand(linear.out_features) if bias.numel() == 1 and vector is None else bias
        vector = b if vector is None else vector + b
    if shift is not None:  # one addcmul where a vector is there: eager, each node costs more than its work
        total = weight.sum(1) * scale if recompute else weight.sum(1)
        vector = total * shift if vector is None else torch.addcmul(vector, total, shift)
    if recompute:
        out = _ScaledMatmul.apply(x, weight, scale)
        return out if vector is None else out.add_(vector.to(out.dtype))
    if vector is None or x.dim() <= 2:
        return F.linear(x, weight, vector)
    # F.linear with a bias on (B, T, D) returns a view of a 2-D addmm, and the caller's in-place residual
    # addition or ReLU on that view costs backward a zero-filled copy of the whole output (AsStridedBackward0)
    # per layer. matmul, as the bias-free linear of the bare network, returns a fresh tensor; the bias then
    # joins in place (the pass addmm makes to copy it in).
    return torch.matmul(x, weight.t()).add_(vector)


def lean_residual_(branch: Tensor, shortcut: Tensor, block: str = "residual block", output_scale: float = 1.0,
                   relu: bool = False) -> Tensor:
    """``output_scale * (branch + shortcut)``, then ReLU if ``relu``, in place in ``branch``.

    ``branch`` must be a fresh tensor that no backward keeps (the output of a lean layer). Shapes must match
    exactly, as in :func:`fixup.nn.residual_add`.
    """
    check_residual_shapes(shortcut, branch, block)
    branch = branch.add_(shortcut)
    if output_scale != 1.0:
        branch = branch.mul_(output_scale)
    return branch.relu_() if relu else branch


def conv_output_shape(conv: nn.Conv2d, shape: torch.Size) -> torch.Size:
    """The output shape of ``conv`` for an input of ``shape`` (N, C, H, W)."""
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
