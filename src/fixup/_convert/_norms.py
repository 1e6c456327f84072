"""LayerNorm and GroupNorm: normalisation by each example's own statistics, which no fixed layer computes.

They cannot be folded; ``fixup.convert(..., per_example_norms=...)`` offers two replacements, each fitted on the
inputs the layer sees on calibration data, and reports the change each causes (before any fine-tuning):

* ``"affine"``: a :class:`ChannelAffine` ``a x + c``, per channel, the least-squares fit of the norm's output on
  its input over the calibration data (``a = cov(x, y) / var(x)``, ``c = mean(y) - a mean(x)``, per channel);
* ``"dyt"``: :class:`DynamicTanh` ``gamma * tanh(alpha x) + beta`` with the norm's own ``gamma`` and ``beta`` and
  the scalar ``alpha`` that minimises the squared error on the calibration data (Zhu et al., CVPR 2025; they
  train ``alpha`` from 0.5, we start it where it fits the trained layer).

A norm is refused, with the reason, where neither applies: a LayerNorm over more than one dimension, a subclass
whose own forward does more than permute its input before the normalisation (and back after it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, fx, nn

from .._adapt import _vocab as V
from .._adapt._record import is_plain_norm
from ..nn import fit_dyt_alpha
from ._layers import ChannelAffine, DynamicTanh

__all__ = ["PER_EXAMPLE_OPTIONS", "fit", "layout", "unfitted"]

PER_EXAMPLE_OPTIONS = ("refuse", "affine", "dyt")


def _permuted_dim(node: fx.Node, path: str) -> int | None:
    """For the functional norm call recorded for fused module ``path``: the dimension of the module's input that the
    call normalises last, when the module hands it its input as is (-1) or through one ``permute``; else None."""
    arg = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if arg is None:
        return None
    if path not in (arg.meta.get("nn_module_stack") or {}):
        return -1
    src = arg.args[0] if arg.args and isinstance(arg.args[0], fx.Node) else None
    if V._name(arg) != "permute" or src is None or path in (src.meta.get("nn_module_stack") or {}):
        return None
    dims = arg.args[1] if len(arg.args) == 2 and isinstance(arg.args[1], (list, tuple)) else arg.args[1:]
    return int(dims[-1]) if dims and all(isinstance(d, int) for d in dims) else None


def layout(mod: nn.Module, node: fx.Node, path: str, tail: list[Any] | None) -> tuple[int, int] | str:
    """(channels, the dimension of the module's input that holds them) of per-example norm ``mod`` called at
    ``node``, or why neither replacement applies. A LayerNorm normalises its last dimension: a subclass with a
    forward of its own (timm's LayerNorm2d, transformers' ConvNextLayerNorm) is understood where it permutes its
    input once before the normalisation and applies nothing after it but the inverse permute."""
    if isinstance(mod, nn.LayerNorm) and len(mod.normalized_shape) != 1:
        return (f"it normalises over {len(mod.normalized_shape)} dimensions {list(mod.normalized_shape)}; the "
                "replacements act per channel of one dimension")
    if is_plain_norm(mod):
        if isinstance(mod, nn.LayerNorm):
            return int(mod.normalized_shape[0]), -1
        return int(mod.num_channels if isinstance(mod, nn.GroupNorm) else mod.num_features), 1
    dim = _permuted_dim(node, path) if isinstance(mod, nn.LayerNorm) and not tail else None
    if dim is None:
        return (f"{type(mod).__name__} has a forward of its own that convert cannot read (which dimension holds its "
                "channels, what follows the normalisation); write it as a plain nn.LayerNorm/nn.GroupNorm")
    return int(mod.normalized_shape[0]), dim


def _rows(t: Tensor, dim: int) -> Tensor:
    """``t`` as (samples, channels), channels taken from ``dim``; float64."""
    return t.double().movedim(dim, -1).reshape(-1, t.shape[dim])


def _fit_affine(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Least squares per channel: y ~ a x + c (rows of x, y are samples)."""
    mx, my = x.mean(0), y.mean(0)
    var = (x - mx).pow(2).mean(0)
    cov = ((x - mx) * (y - my)).mean(0)
    a = torch.where(var > 0, cov / var.clamp_min(1e-300), torch.zeros_like(var))
    return a, my - a * mx


@torch.no_grad()
def fit(mod: nn.Module, option: str, inputs: list[Tensor], channels: int, dim: int,
        targets: list[Tensor] | None = None) -> tuple[nn.Module, float]:
    """The replacement of per-example norm ``mod`` (``channels`` along ``dim`` of its input) by ``option`` fitted
    on ``inputs`` to ``targets`` (default: ``mod``'s outputs on them), call by call, and its change:
    RMS(new - target) / RMS(target)."""
    ref = next((p for p in mod.parameters()), None)
    placement = {"device": inputs[0].device, "dtype": ref.dtype if ref is not None else inputs[0].dtype}
    x = torch.cat([_rows(t, dim) for t in inputs])
    y = torch.cat([_rows(t, dim) for t in (targets if targets is not None else [mod(t) for t in inputs])])
    new: nn.Module
    if option == "affine":
        a, c = _fit_affine(x, y)
        new = ChannelAffine(channels, dim)
        new.weight.copy_(a)
        new.bias.copy_(c)
    elif option == "dyt":
        gamma = mod.weight.double() if getattr(mod, "weight", None) is not None else torch.ones(channels).double()
        beta = mod.bias.double() if getattr(mod, "bias", None) is not None else torch.zeros(channels).double()
        new = DynamicTanh(channels, dim, fit_dyt_alpha(x, y, gamma, beta))
        new.weight.copy_(gamma)
        new.bias.copy_(beta)
    else:
        raise ValueError(f"per_example_norms must be one of {PER_EXAMPLE_OPTIONS}, got {option!r}")
    new = new.to(**placement)
    out = torch.cat([_rows(new(t), dim) for t in inputs])
    change = float((out - y).pow(2).mean().sqrt() / y.pow(2).mean().sqrt().clamp_min(1e-300))
    return new, change


def unfitted(mod: nn.Module, option: str, channels: int, dim: int) -> nn.Module:
    """The replacement's structure without a fit (its values come from a saved state_dict)."""
    ref = next((p for p in mod.parameters()), None)
    new = ChannelAffine(channels, dim) if option == "affine" else DynamicTanh(channels, dim)
    return new if ref is None else new.to(device=ref.device, dtype=ref.dtype)
