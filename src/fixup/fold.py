"""Inference folding: fold Fixup's scalars into neighbouring weights, exactly.

Fixup's scalars (Zhang, Dauphin & Ma, ICLR 2019, section 3, rule 3) are cheap to train but are extra
operations at inference. All of them fold into the layers beside them:

- a multiplier after a layer and a bias after that: ``s * layer(x) + b = layer'(x)`` with weight
  ``s * W`` and per-channel bias ``b`` (plus ``s`` times the layer's own bias);
- a bias before a linear layer or a convolution without padding: ``W (x + b) = W x + b * W.sum(1)``;
- a bias before a zero-padded convolution: ``conv(x + b) = conv(x) + b * conv(1)``. Inside the image
  ``conv(1)`` is the constant ``W.sum((1, 2, 3))``, which joins the per-channel bias; only the output
  rows and columns that read the padding differ, and :class:`ShiftedConv2d` adds that correction to them
  alone (a few border slices, not a pass over the tensor).

Each block folds itself (a ``fold_()`` method built from :func:`fold_layer`); a model folds its own stem
and head. :func:`fold_for_inference` asks every module that has ``fold_`` to fold, in module order (a model
before its blocks, so that a model may hand its blocks what crosses block boundaries: the Wide-ResNet's
pre-activation biases ride on the residual stream). Blocks of other libraries can register a rule with
:func:`register_folder`; blocks with scalars and no rule are left as they are and named in the result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .nn import Bias, Scale
from .ops import ones_response, scalar_value

__all__ = ["FOLDERS", "FoldResult", "ShiftedConv2d", "fold_after", "fold_before_linear", "fold_for_inference",
           "fold_layer", "register_folder"]


@dataclass
class FoldResult:
    """The folded model and what was folded."""

    model: nn.Module
    folded: int = 0  # scalar modules folded into weights and replaced by nn.Identity
    kept: int = 0  # scalar modules left in place (blocks with a normalisation layer, or without a rule)
    unsupported: list[str] = field(default_factory=list)  # block types with scalars and no folding rule


# block type -> function folding that block in place and returning the number of scalars it folded
FOLDERS: dict[type[nn.Module], Callable[[nn.Module], int]] = {}


def register_folder(block_type: type[nn.Module]) -> Callable[[Callable[[nn.Module], int]], Callable[[nn.Module], int]]:
    """Decorator: register ``fn(block) -> folded count`` as the folding rule of ``block_type``
    (for blocks that have no ``fold_`` method of their own)."""

    def decorate(fn: Callable[[nn.Module], int]) -> Callable[[nn.Module], int]:
        FOLDERS[block_type] = fn
        return fn

    return decorate


def _border_extent(n: int, k: int, s: int, p: int, d: int) -> tuple[int, int, int]:
    """Output length, and how many leading and trailing outputs read the zero padding, along one axis."""
    out = (n + 2 * p - d * (k - 1) - 1) // s + 1
    reads_pad = [i * s - p < 0 or i * s - p + d * (k - 1) > n - 1 for i in range(out)]
    lead = next((i for i, r in enumerate(reads_pad) if not r), out)
    trail = next((i for i, r in enumerate(reversed(reads_pad)) if not r), out)
    return out, lead, min(trail, out - lead)


class ShiftedConv2d(nn.Conv2d):
    """``conv(x + shift)`` for a zero-padded convolution, computed as ``conv(x)`` plus a border correction.

    The interior part of ``shift * conv(1)``, ``shift * W.sum((1, 2, 3))``, is already in ``bias`` (folded
    by :func:`fold_layer`); ``forward`` adds ``shift * (conv(1) - W.sum((1, 2, 3)))`` to the output rows and
    columns that read the padding, in place. The correction is cached per input size and recomputed when
    the weight, bias or shift change (``_version``). For inference: under autograd the in-place slices are
    correct but copy gradients, so train the unfolded model instead.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register_buffer("shift", torch.zeros(1))
        self._borders: dict[tuple, list[tuple[tuple[slice, slice], Tensor]]] = {}

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, shift: Tensor) -> ShiftedConv2d:
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                  conv.dilation, conv.groups, conv.bias is not None, conv.padding_mode,
                  device=conv.weight.device, dtype=conv.weight.dtype)
        new.weight = conv.weight
        new.bias = conv.bias
        new.shift.copy_(shift.detach().reshape(1))
        return new

    def _pieces(self, size: tuple[int, int]) -> list[tuple[tuple[slice, slice], Tensor]]:
        (ho, t, b), (wo, left, right) = (_border_extent(n, k, s, p, d) for n, k, s, p, d in
                                          zip(size, self.kernel_size, self.stride, self.padding, self.dilation))
        with torch.no_grad():
            full = ones_response(self.weight, size, self.stride, self.padding, self.dilation)[0]
            corr = (full - self.weight.sum((1, 2, 3))[:, None, None]) * self.shift  # zero inside the image
        regions = [(slice(0, t), slice(0, wo)), (slice(ho - b, ho), slice(0, wo)),
                   (slice(t, ho - b), slice(0, left)), (slice(t, ho - b), slice(wo - right, wo))]
        return [(r, corr[:, r[0], r[1]].contiguous()) for r in regions
                if r[0].stop > r[0].start and r[1].stop > r[1].start]

    def forward(self, x: Tensor) -> Tensor:
        out = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        size = (x.shape[-2], x.shape[-1])
        if torch.compiler.is_compiling():
            pieces = self._pieces(size)
        else:
            key = (size, x.device, x.dtype, self.weight._version, self.shift._version,
                   None if self.bias is None else self.bias._version)
            pieces = self._borders.get(key)
            if pieces is None:
                pieces = self._pieces(size)
                self._borders = {key: pieces}
        for (rows, cols), piece in pieces:
            out[:, :, rows, cols] += piece.to(out.dtype)
        return out


def _padded(layer: nn.Module) -> bool:
    return isinstance(layer, nn.Conv2d) and any(p != 0 for p in layer.padding)


@torch.no_grad()
def fold_layer(layer: nn.Module, *, shift: Tensor | None = None, pre_scale: Tensor | None = None,
               scale: Tensor | None = None, bias: Tensor | None = None) -> nn.Module:
    """One layer computing ``scale * layer(pre_scale * (x + shift)) + bias`` exactly.

    ``layer`` is an ``nn.Linear`` or ``nn.Conv2d`` (one group); the scalars are tensors of shape (1,) or
    None, ``bias`` may be a per-output vector. Returns ``layer`` itself, changed in place (it gains a bias
    parameter if it had none), or, for a shift before a zero-padded convolution, a :class:`ShiftedConv2d`
    sharing its parameters: assign the result back.
    """
    if not isinstance(layer, (nn.Linear, nn.Conv2d)) or getattr(layer, "groups", 1) != 1:
        raise ValueError(f"fold_layer folds into nn.Linear or nn.Conv2d with groups=1, got {layer!r}; "
                         "fold this layer's scalars by hand or leave them unfolded")
    if shift is None and pre_scale is None and scale is None and bias is None:
        return layer
    w = layer.weight
    out_features = w.shape[0]
    new_bias = torch.zeros(out_features, dtype=w.dtype, device=w.device)
    if layer.bias is not None:
        new_bias += layer.bias
    if pre_scale is not None:
        w.mul_(pre_scale)
    if shift is not None:
        new_bias += shift * w.sum(tuple(range(1, w.dim())))  # the interior response to the shift
    if scale is not None:
        w.mul_(scale)
        new_bias.mul_(scale)
    if bias is not None:
        if bias.numel() not in (1, out_features):
            raise ValueError(f"bias after the layer must be a scalar or have {out_features} entries (one per "
                             f"output), got shape {tuple(bias.shape)}")
        new_bias += bias.reshape(-1).expand(out_features)
    layer.bias = nn.Parameter(new_bias)
    if shift is not None and _padded(layer):
        return ShiftedConv2d.from_conv(layer, shift)
    return layer


def fold_after(layer: nn.Module, scale: nn.Module | None = None, bias: nn.Module | None = None) -> int:
    """Fold ``scale`` (a Scale or None) then ``bias`` (a Bias or None), applied after ``layer``, into it.

    ``layer`` is an ``nn.Conv2d`` or ``nn.Linear``, changed in place. Returns the number of scalars
    folded; the caller replaces the folded modules by ``nn.Identity``.
    """
    s = None if scale is None else scalar_value(scale)
    b = None if bias is None else scalar_value(bias)
    fold_layer(layer, scale=s, bias=b)
    return int(s is not None) + int(b is not None)


def fold_before_linear(bias: nn.Module, linear: nn.Linear) -> int:
    """Fold a scalar Bias applied just before ``linear`` into its bias: ``W (x + b) = W x + b W.sum(1)``."""
    b = scalar_value(bias)
    if not isinstance(bias, Bias) or b is None:
        return 0
    fold_layer(linear, shift=b)
    return 1


def count_scalars(*modules: nn.Module) -> int:
    """The number of Bias and Scale modules among ``modules`` (not their children)."""
    return sum(isinstance(m, (Bias, Scale)) for m in modules)


def _count_all(module: nn.Module) -> int:
    return sum(isinstance(m, (Bias, Scale)) for m in module.modules())


def fold_for_inference(model: nn.Module, inplace: bool = False) -> FoldResult:
    """Fold every scalar; returns the folded model (a copy unless ``inplace``) in eval mode.

    The folded model computes the same outputs as ``model`` in eval mode (to float rounding). It is
    for deployment: it no longer has the Fixup parameterisation, so do not train or re-initialise it.
    """
    model = model if inplace else copy.deepcopy(model)
    before = _count_all(model)
    folded, unsupported = 0, set()
    for module in list(model.modules()):
        own = getattr(module, "fold_", None)
        rule = FOLDERS.get(type(module))
        if callable(own):
            folded += own()
        elif rule is not None:
            folded += rule(module)
        elif hasattr(module, "residual_branches") and any(isinstance(m, (Bias, Scale)) for m in module.children()):
            unsupported.add(type(module).__name__)
    return FoldResult(model.eval(), folded, before - folded, sorted(unsupported))
