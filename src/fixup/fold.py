"""Inference folding: fold Fixup's scalars into neighbouring weights where that is exact.

Fixup's scalars (Zhang, Dauphin & Ma, ICLR 2019, section 3, rule 3) are cheap to train but are extra
operations at inference. Some fold exactly into the layer beside them:

- a multiplier after a layer and a bias after that: ``s * conv(x) + b = conv'(x)`` with weight
  ``s * W`` and per-channel bias ``b`` (plus ``s`` times the layer's own bias);
- a bias after a layer: it becomes the layer's bias;
- a bias before a linear layer: ``W (x + b) + c = W x + (c + b * W.sum(1))``.

A scalar bias before a zero-padded convolution does not fold into a per-channel bias (the padding
is not shifted, so border outputs differ) and is kept; :mod:`fixup.ops` already computes it
cheaply. Folding works per block type through :data:`FOLDERS`; a block without a folder is left as
it is and named in the result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .nn import Bias, Scale

__all__ = ["FOLDERS", "FoldResult", "fold_for_inference", "register_folder"]


@dataclass
class FoldResult:
    """The folded model and what was folded."""

    model: nn.Module
    folded: int = 0  # scalar modules folded into weights and replaced by nn.Identity
    kept: int = 0  # scalar modules that cannot fold exactly (biases before padded convolutions)
    unsupported: list[str] = field(default_factory=list)  # block types with scalars and no folder


# block type -> function folding that block in place and returning the number of scalars it folded
FOLDERS: dict[type[nn.Module], Callable[[nn.Module], int]] = {}


def register_folder(block_type: type[nn.Module]) -> Callable[[Callable[[nn.Module], int]], Callable[[nn.Module], int]]:
    """Decorator: register ``fn(block) -> folded count`` as the folding rule of ``block_type``."""

    def decorate(fn: Callable[[nn.Module], int]) -> Callable[[nn.Module], int]:
        FOLDERS[block_type] = fn
        return fn

    return decorate


@torch.no_grad()
def fold_after(layer: nn.Module, scale: nn.Module | None = None, bias: nn.Module | None = None) -> int:
    """Fold ``scale`` (a Scale or None) then ``bias`` (a Bias or None), applied after ``layer``, into it.

    ``layer`` is an ``nn.Conv*`` or ``nn.Linear``; it gains a bias parameter if it had none.
    Returns the number of scalars folded; the caller replaces the folded modules by ``nn.Identity``.
    """
    s = scale.scale if isinstance(scale, Scale) else None
    b = bias.bias if isinstance(bias, Bias) else None
    if s is None and b is None:
        return 0
    out_features = layer.weight.shape[0]
    new_bias = torch.zeros(out_features, dtype=layer.weight.dtype, device=layer.weight.device)
    if layer.bias is not None:
        new_bias += layer.bias
    if s is not None:
        layer.weight.mul_(s)
        new_bias.mul_(s)
    if b is not None:
        new_bias += b
    layer.bias = nn.Parameter(new_bias)
    return int(s is not None) + int(b is not None)


@torch.no_grad()
def fold_before_linear(bias: nn.Module, linear: nn.Linear) -> int:
    """Fold a scalar Bias applied just before ``linear`` into its bias: ``W (x + b) = W x + b W.sum(1)``."""
    if not isinstance(bias, Bias):
        return 0
    extra = bias.bias * linear.weight.sum(1)
    linear.bias = nn.Parameter(extra if linear.bias is None else linear.bias + extra)
    return 1


def _count_scalars(module: nn.Module) -> int:
    return sum(isinstance(m, (Bias, Scale)) for m in module.modules())


def fold_for_inference(model: nn.Module, inplace: bool = False) -> FoldResult:
    """Fold every scalar that folds exactly; returns the folded model (a copy unless ``inplace``) in eval mode.

    The folded model computes the same outputs as ``model`` in eval mode (to float rounding). It is
    for deployment: it no longer has the Fixup parameterisation, so do not train or re-initialise it.
    """
    model = model if inplace else copy.deepcopy(model)
    before = _count_scalars(model)
    folded, unsupported = 0, set()
    for module in list(model.modules()):
        rule = FOLDERS.get(type(module))
        if rule is not None:
            folded += rule(module)
        elif hasattr(module, "residual_branches") and any(isinstance(m, (Bias, Scale)) for m in module.children()):
            unsupported.add(type(module).__name__)
    return FoldResult(model.eval(), folded, before - folded, sorted(unsupported))


def _register_builtin() -> None:
    from .models.resnet_cifar import BasicBlock, CifarResNet

    @register_folder(BasicBlock)
    def _basic(block: nn.Module) -> int:
        # relu(conv1(x + b1a) + b1b): b1b folds into conv1; scale * conv2(. + b2a) + b2b: both fold into conv2.
        if not (isinstance(block.norm1, nn.Identity) and isinstance(block.norm2, nn.Identity)):
            return 0  # a normalisation layer sits between the convolution and the scalars
        n = fold_after(block.conv1, None, block.bias1b)
        n += fold_after(block.conv2, block.scale, block.bias2b)
        for name in ("bias1b", "scale", "bias2b"):
            if isinstance(getattr(block, name), (Bias, Scale)):
                setattr(block, name, nn.Identity())
        return n

    @register_folder(CifarResNet)
    def _cifar(model: nn.Module) -> int:
        # stem: relu(conv1(x) + bias1); head: fc(pool(.) + bias2)
        n = 0
        if isinstance(model.norm1, nn.Identity):
            n += fold_after(model.conv1, None, model.bias1)
            if isinstance(model.bias1, Bias):
                model.bias1 = nn.Identity()
        n += fold_before_linear(model.bias2, model.fc)
        if isinstance(model.bias2, Bias):
            model.bias2 = nn.Identity()
        return n


_register_builtin()
