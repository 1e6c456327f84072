"""The residual blocks of NF-ResNets (Brock, De & Smith, "Characterizing signal propagation to close the
performance gap in unnormalized ResNets", ICLR 2021), for the library's CIFAR, Wide and ImageNet ResNets.

An NF block is a pre-activation block without normalisation, every convolution weight-standardised
(:class:`fixup.nn.ScaledStdConv2d`) and every ReLU scaled to keep unit variance (:class:`fixup.nn.ScaledReLU`)::

    a = gamma * relu(h / beta)                      # beta: the analytic std of h (section 4)
    y = shortcut + alpha * F(a),  shortcut = h, or a 1x1 projection of a at a transition

``F`` is ``conv2(gamma * relu(conv1(a)))`` (basic) or ``conv3(gamma * relu(conv2(gamma * relu(conv1(a)))))``
(bottleneck). Each branch then adds variance alpha^2, so beta_{i+1}^2 = beta_i^2 + alpha^2; a transition's
shortcut projects the unit-variance ``a``, which resets the stream's variance to 1 + alpha^2
(:func:`assign_betas`). alpha = 0.2, the paper's choice. With ``method.gate`` (``nf_resnet``) the branch is also
multiplied by a learnable skip gain that starts at 0, as in the authors' released models (their ``skip_gain``);
``nf_resnet_nozero`` leaves it out, the block as the paper analyses it. With ``drop_path`` > 0 the branch is dropped
per example in training before the gain (stochastic depth, as their ``StochDepth``: :mod:`fixup.models._drop_path`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from torch import Tensor, nn

from ..branch import Branch
from ..method import METHODS, Method
from ..nn import Gate, ScaledReLU, ScaledStdConv2d, residual_add
from ._common import branch_multiplier
from ._drop_path import maybe_drop_path

__all__ = ["NF_ALPHA", "NFBasicBlock", "NFBottleneck", "assign_betas", "expected_stds"]

NF_ALPHA = 0.2  # the rate at which each branch adds variance to the stream (Brock et al. 2021, section 4)


class _NFBlock(nn.Module):
    """What the two NF blocks share: the input's scaling and activation, the shortcut, alpha and the gain."""

    kind = "nf"

    def __init__(self, in_ch: int, out_ch: int, stride: int, method: Method, drop_path: float = 0.0) -> None:
        super().__init__()
        self.block_name = type(self).__name__
        self.alpha = NF_ALPHA
        self.beta = 1.0  # the expected std of the block's input; the model sets it (assign_betas)
        self.act = ScaledReLU()
        self.scale = branch_multiplier(method)  # the zero-started skip gain (nf_resnet), or an identity
        self.drop_path = maybe_drop_path(drop_path)  # stochastic depth on the branch, per example (the authors')
        self.projection: ScaledStdConv2d | None = None
        if (stride, in_ch) != (1, out_ch):
            self.projection = ScaledStdConv2d(in_ch, out_ch, 1, stride)

    @property
    def transition(self) -> bool:
        """Whether the shortcut projects the normalised input (and so resets the stream's variance)."""
        return self.projection is not None

    def _layers(self) -> list[ScaledStdConv2d]:
        raise NotImplementedError

    def _branch(self, a: Tensor) -> Tensor:
        raise NotImplementedError

    def residual_branches(self) -> Sequence[Branch]:
        gate = self.scale if isinstance(self.scale, Gate) else None
        return [Branch(self._layers(), self.kind, scale=gate, shortcut=self.projection)]

    def forward(self, h: Tensor) -> Tensor:
        a = self.act(h / self.beta)
        shortcut = h if self.projection is None else self.projection(a)
        out = self.scale(self.drop_path(self._branch(a))) * self.alpha
        return residual_add(shortcut, out, self.block_name)


class NFBasicBlock(_NFBlock):
    """Two 3x3 weight-standardised convolutions on the branch (CIFAR, Wide and ImageNet-18/34 ResNets)."""

    kind = "nf-basic"

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1, method: Method = METHODS["nf_resnet"],
                 dropout: float = 0.0, *, drop_path: float = 0.0) -> None:
        super().__init__(in_ch, out_ch, stride, method, drop_path)
        self.conv1 = ScaledStdConv2d(in_ch, out_ch, 3, stride, 1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()  # the Wide-ResNet's, between the two
        self.conv2 = ScaledStdConv2d(out_ch, out_ch, 3, 1, 1)

    def _layers(self) -> list[ScaledStdConv2d]:
        return [self.conv1, self.conv2]

    def _branch(self, a: Tensor) -> Tensor:
        return self.conv2(self.dropout(self.act(self.conv1(a))))


class NFBottleneck(_NFBlock):
    """1x1 reduce, 3x3 (with the stride), 1x1 expand (x4), weight-standardised (ImageNet ResNet-50/101/152)."""

    kind = "nf-bottleneck"
    expansion = 4

    def __init__(self, in_ch: int, planes: int, stride: int = 1, method: Method = METHODS["nf_resnet"], *,
                 drop_path: float = 0.0) -> None:
        super().__init__(in_ch, planes * self.expansion, stride, method, drop_path)
        self.conv1 = ScaledStdConv2d(in_ch, planes, 1)
        self.conv2 = ScaledStdConv2d(planes, planes, 3, stride, 1)
        self.conv3 = ScaledStdConv2d(planes, planes * self.expansion, 1)

    def _layers(self) -> list[ScaledStdConv2d]:
        return [self.conv1, self.conv2, self.conv3]

    def _branch(self, a: Tensor) -> Tensor:
        return self.conv3(self.act(self.conv2(self.act(self.conv1(a)))))


def expected_stds(transitions: Iterable[bool], alpha: float = NF_ALPHA) -> list[float]:
    """The analytic std of each block's input, and last of the network's output, for blocks in forward order.

    The stem gives the first block unit variance; each block adds alpha^2 to its input's variance, and a
    transition (a shortcut that projects the normalised input) first resets it to 1 (section 4).
    """
    var, stds = 1.0, []
    for transition in transitions:
        stds.append(math.sqrt(var))
        var = (1.0 if transition else var) + alpha**2
    return [*stds, math.sqrt(var)]


def assign_betas(blocks: Sequence[_NFBlock]) -> float:
    """Give each block (in forward order) its beta, the analytic std of its input; returns the output's std."""
    stds = expected_stds((b.transition for b in blocks), NF_ALPHA)
    for block, std in zip(blocks, stds):
        block.beta = std
    return stds[-1]
