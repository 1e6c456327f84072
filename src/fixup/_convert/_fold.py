"""BatchNorm in eval mode, folded exactly: into the weight layer before it, or into a per-channel affine.

An eval-mode BatchNorm computes ``y = (x - mean) / sqrt(var + eps) * gamma + beta`` per channel with fixed
statistics: a per-channel affine ``y = a x + c``. After a convolution or a linear layer whose output nothing else
reads, ``a`` scales that layer's output rows and ``c`` joins its bias (PyTorch's
``torch.nn.utils.fusion.fuse_conv_bn_weights``/``fuse_linear_bn_weights``, run in float64 and cast back, so the
folded weights are the exact ones rounded once). Anywhere else (after an addition: pre-activation blocks, a norm
on the stream; after a layer whose output is read twice, or which is called twice; a norm module called twice) it
becomes a :class:`ChannelAffine` holding ``a`` and ``c``: still exact, and a learnable affine, not a
normalisation. It is not folded forward into the next layer: a zero-padded convolution reads the padding
unshifted, so that fold is exact only inside the image (``fixup.fold_for_inference`` does that at inference).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, fx, nn
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

from .._adapt import _vocab as V
from ._layers import ChannelAffine, FusedAffineTail

__all__ = ["FOLDABLE_FORWARDS", "BNPlan", "affine_of", "fold_into", "frozen_affine", "is_frozen_batchnorm",
           "plan_batchnorm"]

# Layers a BatchNorm folds into: PyTorch's own, with their own forward (a weight-standardised convolution, whose
# forward rescales its weight, would undo the fold).
FOLDABLE_FORWARDS = {nn.Conv1d.forward: "conv", nn.Conv2d.forward: "conv", nn.Conv3d.forward: "conv",
                     nn.Linear.forward: "linear"}


@dataclass
class BNPlan:
    """What becomes of one eval-mode BatchNorm: folded into ``into`` (a module path), or an affine (``into=""``)."""

    path: str
    into: str
    why: str


def _describe(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    mod = V.module_of(node, modules)
    return f"{node.target} ({type(mod).__name__})" if mod is not None else f"{V._name(node)!r}"


def plan_batchnorm(node: fx.Node, modules: dict[str, nn.Module], calls: dict[str, int], aliases: list[str],
                   in_dims: int, tied: set[str]) -> BNPlan:
    """Where the BatchNorm called at ``node`` goes. ``aliases``: every name of the norm module; ``in_dims``: the
    number of dimensions of its input; ``tied``: paths of modules whose parameters another module shares."""
    path = str(node.target)
    shared = len(aliases) > 1 or calls.get(path, 0) > 1
    if shared:
        return BNPlan(path, "", "called more than once or under several names: one affine serves every call")
    producer = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if producer is None or producer.op != "call_module":
        what = _describe(producer, modules) if producer is not None else "no tensor"
        return BNPlan(path, "", f"no weight layer before it (its input is {what})")
    layer = modules[str(producer.target)]
    kind = FOLDABLE_FORWARDS.get(type(layer).forward)
    if kind is None:
        return BNPlan(path, "", f"its input comes from {_describe(producer, modules)}, not a plain Conv/Linear")
    lpath = str(producer.target)
    if calls.get(lpath, 0) != 1:
        return BNPlan(path, "", f"the layer before it, {lpath}, is called {calls.get(lpath, 0)} times")
    readers = [u for u in producer.users if producer in V.data_inputs(u)]
    if readers != [node]:
        others = ", ".join(u.name for u in readers if u is not node)
        return BNPlan(path, "", f"the output of {lpath} is also read by {others}")
    if lpath in tied:
        return BNPlan(path, "", f"the parameters of {lpath} are shared with another module")
    out = layer.out_channels if kind == "conv" else layer.out_features
    if out != modules[path].num_features:
        return BNPlan(path, "", f"{lpath} has {out} outputs, the norm {modules[path].num_features} channels")
    if kind == "linear" and in_dims != 2:
        return BNPlan(path, "", f"after {lpath} on a {in_dims}-D input the norm's channels (dim 1) are not the "
                                "Linear's features (the last dim)")
    return BNPlan(path, lpath, "directly after it")


def is_frozen_batchnorm(mod: nn.Module) -> bool:
    """A frozen BatchNorm (torchvision's ``FrozenBatchNorm2d``, in detection backbones): weight, bias and running
    statistics held as buffers, a fixed affine, no children."""
    return type(mod).__name__.startswith("FrozenBatchNorm") and not mod._modules and isinstance(
        getattr(mod, "eps", None), float) and all(k in mod._buffers for k in ("weight", "bias", "running_mean",
                                                                               "running_var"))


@torch.no_grad()
def frozen_affine(mod: nn.Module) -> ChannelAffine:
    """The fixed affine of a frozen BatchNorm as a :class:`ChannelAffine`, still frozen (``requires_grad=False``)."""
    new = affine_of(mod)
    new.requires_grad_(False)
    return new


def _statistics(bn: nn.Module) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(mean, var, gamma, beta) in float64; gamma 1 and beta 0 without an affine."""
    mean, var = bn.running_mean.double(), bn.running_var.double()
    gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(mean)
    beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(mean)
    return mean, var, gamma, beta


@torch.no_grad()
def fold_into(layer: nn.Module, bn: nn.Module) -> None:
    """Fold eval-mode ``bn`` into ``layer`` (a plain Conv or Linear) in place: computed in float64, cast once."""
    mean, var, gamma, beta = _statistics(bn)
    w = layer.weight
    b = layer.bias.double() if layer.bias is not None else None
    if isinstance(layer, nn.Linear):
        fw, fb = fuse_linear_bn_weights(w.double(), b, mean, var, bn.eps, gamma, beta)
    else:
        fw, fb = fuse_conv_bn_weights(w.double(), b, mean, var, bn.eps, gamma, beta)
    w.copy_(fw.to(w.dtype))
    if layer.bias is None:
        layer.bias = nn.Parameter(fb.detach().to(device=w.device, dtype=w.dtype), requires_grad=w.requires_grad)
    else:
        layer.bias.copy_(fb.to(layer.bias.dtype))


@torch.no_grad()
def affine_of(bn: nn.Module, tail: list[tuple[str, nn.Module]] | None = None) -> ChannelAffine:
    """The per-channel affine eval-mode ``bn`` computes (with a fused module's tail after it, when given)."""
    mean, var, gamma, beta = _statistics(bn)
    a = gamma * torch.rsqrt(var + bn.eps)
    c = beta - mean * a
    ref = bn.weight if bn.weight is not None else bn.running_mean
    new = ChannelAffine(len(a), 1) if tail is None else FusedAffineTail(len(a), tail, type(bn).__name__)
    new.weight.copy_(a)
    new.bias.copy_(c)
    return new.to(device=ref.device, dtype=ref.dtype)
