"""The ResNets' two regularisers of SkipInit's reference recipe: stochastic depth and dropout before the classifier.

Stochastic depth (Huang et al. 2016, "Deep Networks with Stochastic Depth"; "drop path" in timm) drops each
example's residual branch in training: a block ``y = shortcut(x) + F(x)`` computes ``shortcut(x) + m F(x) / (1 - p)``
with ``m`` ~ Bernoulli(1 - p) drawn per example, so a dropped branch leaves the block its shortcut and a kept one is
scaled to keep the branch's expectation; in evaluation the block is unchanged. Each block's ``p`` follows the linear
rule of De & Smith's released SkipInit ResNet (deepmind-research ``nfnets/skipinit_resnet.py``, also their
NF-ResNet's): block ``i`` of ``N`` (counted from 0 over the whole network) drops with ``rate * i / N``, so the first
block never drops and the last drops with ``rate * (N - 1) / N`` (:func:`drop_path_rates`).

Their ``StochDepth`` does not rescale a kept branch (``scale_by_keep=False``): in training a branch is then
``1 - p`` of its evaluation value in expectation. We rescale (as dropout does), so that training and evaluation
agree in expectation; docs/methods.md lists it among the differences from their code.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["DropPath", "check_rate", "drop_path_rates", "make_head_dropout", "maybe_drop_path"]


def check_rate(name: str, rate: float) -> float:
    """``rate`` as a float after checking that it is a probability in [0, 1); the error names the option and range."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0.0 <= rate < 1.0 and math.isfinite(rate)):
        raise ValueError(f"{name} must be a probability in [0, 1) (0 = off), got {rate!r}")
    return float(rate)


def drop_path_rates(rate: float, blocks: int) -> list[float]:
    """Each block's drop probability under the authors' linear rule: ``rate * i / blocks`` for block ``i`` = 0, 1, ...,
    ``blocks - 1`` in forward order (deepmind-research ``nfnets/skipinit_resnet.py``: ``stochdepth_rate * index /
    num_blocks``)."""
    rate = check_rate("drop_path", rate)
    if not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"blocks must be a positive whole number of residual blocks, got {blocks!r}")
    return [rate * i / blocks for i in range(blocks)]


class DropPath(nn.Module):
    """Drop each example's residual branch with probability ``p`` in training, scale a kept one by ``1 / (1 - p)``;
    the identity in evaluation (and at ``p = 0``).

    A block applies it to its branch's output ``F(x)``, before the sum with the shortcut. The mask has one entry
    per example (shape (B, 1, ..., 1)), drawn from torch's default generator as ``nn.Dropout`` draws (the engine
    seeds it; activation checkpointing replays it). Each example's mask multiplies only its own activations, so
    per-example gradients (Opacus) stay exact for the mask drawn.
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = check_rate("drop_path", p)

    def extra_repr(self) -> str:
        return f"p={self.p:g}"

    @property
    def active(self) -> bool:
        """Whether a forward now may drop: in training, at ``p > 0``."""
        return self.training and self.p > 0.0

    def mask(self, x: Tensor) -> Tensor:
        """Which examples of a batch ``x`` (B, ...) keep their branch: 1 (kept, probability ``1 - p``) or 0, shape
        (B, 1, ..., 1), in ``x``'s dtype, not requiring gradients."""
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        return torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(1.0 - self.p)

    def forward(self, x: Tensor) -> Tensor:
        # The mask (0 or 1) is exact in any dtype; dividing by the Python float 1 - p rounds each entry once, where a
        # factor 1 / (1 - p) held in bfloat16 would be off by up to 2^-9 for every example alike.
        return x * self.mask(x) / (1.0 - self.p) if self.active else x

    def forward_(self, x: Tensor) -> Tensor:
        """:meth:`forward` in place on ``x``, a fresh tensor that no backward keeps (a lean block's branch output);
        its backward keeps the (B, 1, ..., 1) mask only."""
        return x.mul_(self.mask(x)).div_(1.0 - self.p) if self.active else x


def maybe_drop_path(p: float) -> nn.Module:
    """A :class:`DropPath` of probability ``p`` for a block's branch, or an identity placeholder at ``p = 0`` (no
    parameters either way: the model's parameters, initialisation and forward are as without the option)."""
    return DropPath(p) if check_rate("drop_path", p) > 0 else nn.Identity()


def make_head_dropout(p: float) -> nn.Module:
    """Dropout on the pooled features before the classifier (the authors' ``drop_rate``), or an identity at
    ``p = 0``."""
    return nn.Dropout(p) if check_rate("head_dropout", p) > 0 else nn.Identity()
