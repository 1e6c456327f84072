"""The layers a converted model holds where a trained model had normalisation.

* :class:`ChannelAffine`: ``x * weight + bias`` per channel, a learnable affine with no statistics. An eval-mode
  BatchNorm *is* one (``weight = gamma / sqrt(var + eps)``, ``bias = beta - mean * weight``); where no layer
  before it can absorb it, it stays one. It is also the "affine" option for LayerNorm/GroupNorm, fitted to the
  layer's input and output on calibration data.
* :class:`DynamicTanh`: ``weight * tanh(alpha * x) + bias`` (Zhu, Chen, He, LeCun & Liu, "Transformers without
  Normalization", CVPR 2025, eq. 1), the "dyt" option for LayerNorm/GroupNorm: ``alpha`` is one learnable
  scalar fitted to the layer's inputs, ``weight`` and ``bias`` the norm's own affine.
* :class:`FusedAffineTail`: timm's ``BatchNormAct2d`` with its BatchNorm as a :class:`ChannelAffine`, then the
  module's own children that followed it (dropout, activation), in order.

Each computes one example at a time: nothing couples the examples of a batch, and each is a plain module with
its own parameters, for Opacus' per-example gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._adapt._modules import keep_tail, run_tail
from ..nn import DyT

__all__ = ["ChannelAffine", "DynamicTanh", "FusedAffineTail"]


def _along(v: Tensor, x: Tensor, dim: int) -> Tensor:
    """``v`` (one value per channel) shaped to broadcast along ``x``'s dimension ``dim``."""
    shape = [1] * x.dim()
    shape[dim] = -1
    return v.to(x.dtype).view(shape)


class ChannelAffine(nn.Module):
    """``x * weight + bias`` with one weight and one bias per channel, channels along ``dim`` (1: NCHW, -1: tokens)."""

    def __init__(self, num_channels: int, dim: int = 1) -> None:
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: Tensor) -> Tensor:
        return x * _along(self.weight, x, self.dim) + _along(self.bias, x, self.dim)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, dim={self.dim}"


DynamicTanh = DyT  # the one Dynamic Tanh layer (fixup.nn.DyT), under the name convert has always given it


class FusedAffineTail(ChannelAffine):
    """A fused norm+activation module (timm's ``BatchNormAct2d``) whose BatchNorm could not be folded into a
    layer: its eval-mode affine, then the module's own children that followed the normalisation, in order."""

    def __init__(self, num_channels: int, tail: Sequence[tuple[str, nn.Module]], original_type: str) -> None:
        super().__init__(num_channels, 1)
        keep_tail(self, tail, original_type)

    def forward(self, x: Tensor) -> Tensor:
        return run_tail(self, super().forward(x))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}; from {self.original_type}: affine, then {', '.join(self.order) or 'nothing'}"
