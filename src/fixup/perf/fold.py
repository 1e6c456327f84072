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
pre-activation biases ride on the residual stream). A block of your own folds by defining ``fold_``; residual
blocks with scalars and no ``fold_`` are left as they are and named in the result.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..nn import Bias, Scale
from .ops import ShiftedConv2d, scalar_value

__all__ = ["FoldResult", "ShiftedConv2d", "fold_after", "fold_for_inference", "fold_layer"]


@dataclass
class FoldResult:
    """The folded model and what was folded."""

    model: nn.Module
    folded: int = 0  # scalar modules folded into weights and replaced by nn.Identity
    kept: int = 0  # scalar modules left in place (blocks with a normalisation layer, or without fold_)
    unsupported: list[str] = field(default_factory=list)  # residual block types with scalars and no fold_


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
        if callable(own):
            folded += own()
        elif hasattr(module, "residual_branches") and any(isinstance(m, (Bias, Scale)) for m in module.children()):
            unsupported.add(type(module).__name__)
    return FoldResult(model.eval(), folded, before - folded, sorted(unsupported))
