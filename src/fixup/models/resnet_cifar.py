"""CIFAR ResNets of depth 6n+2 with basic blocks (He et al. 2016, section 4.2), in Fixup and baseline forms.

Three stages of n blocks with 16, 32 and 64 channels; the paper's CIFAR models (Fixup, section 4.1) use
shortcut option A: strided subsampling plus zero channels, parameter-free. Option B is a 1x1 projection.
For ``nf_resnet`` the blocks are :class:`fixup.models.nf_blocks.NFBasicBlock` (pre-activation, weight-standardised,
option B), the stem a weight-standardised convolution without activation, and the head activates before pooling.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..branch import Branch
from ..init import initialise_
from ..method import METHODS, Method
from ..nn import Bias, InplaceReLU, Scale, ScaledReLU, ScaledStdConv2d, check_residual_shapes, residual_add
from ..perf.fold import count_scalars, fold_layer
from ..perf.ops import conv_output_shape, lean_conv2d, lean_residual_, observed, plain_conv, scalar_value
from ._common import StemHeadFolding, branch_multiplier, check_method, make_norm, name_blocks, scalar
from ._drop_path import DropPath, drop_path_rates, make_head_dropout, maybe_drop_path
from ._registry import register_model
from .nf_blocks import NFBasicBlock, assign_betas

__all__ = ["BasicBlock", "CifarResNet", "check_cifar_depth"]

_NORMS = ("fixup", "batchnorm", "groupnorm", "none")


class ZeroPadShortcut(nn.Module):
    """Shortcut option A: subsample by ``stride`` and append zero channels; no parameters."""

    def __init__(self, stride: int, extra_channels: int) -> None:
        super().__init__()
        self.stride, self.extra = stride, extra_channels

    def forward(self, x: Tensor) -> Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra))  # (B, C + extra, H/s, W/s)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions on the branch; ``relu(shortcut(x) + F(x))``.

    Fixup form: ``F(x) = scale * conv2(relu(conv1(x + b1a) + b1b) + b2a) + b2b``, where ``b2b``, the
    bias after the last layer, is the branch's *stream bias* (it shifts the residual stream; absent when
    the method has none). An identity shortcut carries ``x`` unchanged; a subsampling or projection
    shortcut takes ``x + b1a`` (as the authors' reference code). Normalised forms put the norm after
    each convolution; ``norm="none"`` is the bare network. The method's ``output_scale`` multiplies
    ``shortcut(x) + F(x)`` (the 1/sqrt(2) baseline). With ``drop_path`` > 0 each example's ``F(x)`` is dropped
    with that probability in training (:class:`~fixup.models.DropPath`). The ImageNet ResNet-18/34 use this block
    with shortcut "B" (torchvision's BasicBlock).
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1, method: Method = METHODS["fixup"],
                 shortcut: str = "A", *, norm_groups: int = 16, drop_path: float = 0.0) -> None:
        super().__init__()
        norm, biases = method.norm, method.fixup and method.biases
        self.block_name = "BasicBlock"
        self.output_scale = float(method.output_scale)
        self.bias1a, self.bias1b = scalar(Bias, biases), scalar(Bias, biases)
        self.bias2a, self.bias2b = scalar(Bias, biases), scalar(Bias, method.has_stream_bias)
        self.scale = branch_multiplier(method)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.norm1 = make_norm(norm, out_ch, norm_groups)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.norm2 = make_norm(norm, out_ch, norm_groups)
        self.relu = InplaceReLU()
        self.drop_path = maybe_drop_path(drop_path)  # stochastic depth on F(x), per example
        self.lean = True  # compute forward by fixup.perf.ops where it applies: same function, less memory
        self.projection: nn.Conv2d | None = None
        if stride == 1 and in_ch == out_ch:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "A":
            if out_ch < in_ch:
                raise ValueError(f"shortcut option A cannot shrink channels ({in_ch} -> {out_ch}); use option B")
            self.shortcut = ZeroPadShortcut(stride, out_ch - in_ch)
        elif shortcut == "B":
            self.projection = nn.Conv2d(in_ch, out_ch, 1, stride, bias=False)
            self.shortcut = nn.Sequential(self.projection, make_norm(norm, out_ch, norm_groups))
        else:
            raise ValueError(f"shortcut must be 'A' (subsample and zero-pad) or 'B' (1x1 projection), got {shortcut!r}")

    def residual_branches(self) -> Sequence[Branch]:
        biases = [m for m in (self.bias1a, self.bias1b, self.bias2a) if isinstance(m, Bias)]
        scale = self.scale if isinstance(self.scale, Scale) else None
        stream = self.bias2b if isinstance(self.bias2b, Bias) else None
        return [Branch([self.conv1, self.conv2], "basic", biases=biases, scale=scale, shortcut=self.projection,
                       stream_bias=stream)]

    def last_norm(self) -> nn.Module:
        """The branch's last normalisation layer (its gain is what zero_init_last_norm zeroes)."""
        return self.norm2

    def _scalars(self) -> tuple[Tensor | None, ...]:
        """(b1a, b1b, b2a, b2b, scale): the parameters, None where the method has no such scalar."""
        return tuple(scalar_value(m) for m in (self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.scale))

    def _linear_shortcut(self) -> bool:
        parts = list(self.shortcut) if type(self.shortcut) is nn.Sequential else [self.shortcut]
        return all(type(m) in (nn.Identity, ZeroPadShortcut) or (type(m) is nn.Conv2d and m.bias is None)
                   for m in parts)

    def lean_ready(self) -> bool:
        """Whether :meth:`lean_forward` computes exactly what the block's modules would.

        It does without normalisation layers, with a linear shortcut (identity, subsample-and-pad, a
        bias-free 1x1 projection), plain convolutions, and nothing observing the inner modules (hooks: LSUV,
        the laboratory's probes must see every module called as written). Checked at every call (cheaply).
        """
        if type(self.norm1) is not nn.Identity or type(self.norm2) is not nn.Identity:
            return False
        inner = (self.conv1, self.conv2, self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.scale, self.relu,
                 self.drop_path, self.shortcut, *self.shortcut.modules())
        return (plain_conv(self.conv1) and plain_conv(self.conv2) and self._linear_shortcut()
                and type(self.drop_path) in (nn.Identity, DropPath) and not observed(*inner))

    def _shortcut_response(self, b1a: Tensor) -> Tensor:
        """``shortcut(x + b1a) - shortcut(x)``: the linear shortcut's response to a constant image, (1, C_out, 1, 1)."""
        return self.shortcut(b1a.reshape(1, 1, 1, 1).expand(1, self.conv1.in_channels, 1, 1))

    def lean_forward(self, x: Tensor) -> Tensor:
        """The forward keeping no tensor for the scalars (:mod:`fixup.perf.ops`); call where :meth:`lean_ready`.

        Under stochastic depth in training the shortcut's response to ``b1a`` joins after the branch is dropped
        (it belongs to the shortcut), and the drop multiplies conv2's fresh output in place.
        """
        b1a, b1b, b2a, b2b, s = self._scalars()
        dropping = isinstance(self.drop_path, DropPath) and self.drop_path.active
        out = lean_conv2d(x, self.conv1, shift=b1a, bias=b1b).relu_()
        post, response = b2b, None
        if b1a is not None and not isinstance(self.shortcut, nn.Identity):
            # shortcut(x + b1a) = shortcut(x) + shortcut(b1a): the shortcut is linear, so its response to the
            # scalar is a per-channel constant, added with the branch's last bias.
            response = self._shortcut_response(b1a)
            if not dropping:
                post = response if post is None else response + post
        shortcut = self.shortcut(x)
        # Check the residual shapes before the shortcut's response joins conv2's output.
        check_residual_shapes(shortcut, conv_output_shape(self.conv2, out.shape), self.block_name)
        out = lean_conv2d(out, self.conv2, shift=b2a, scale=s, bias=post)
        if dropping:
            out = self.drop_path.forward_(out)
            if response is not None:
                out = out.add_(response.to(out.dtype))
        return lean_residual_(out, shortcut, self.block_name, self.output_scale, relu=True)

    @torch.no_grad()
    def fold_(self) -> int:
        """Fold every scalar into conv1 and conv2 (exact; see :mod:`fixup.perf.fold`); returns how many folded.

        Needs no normalisation layer and a linear shortcut; otherwise nothing is folded.
        """
        if not (type(self.norm1) is nn.Identity and type(self.norm2) is nn.Identity and self._linear_shortcut()):
            return 0
        b1a, b1b, b2a, b2b, s = self._scalars()
        n = count_scalars(self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.scale)
        post = b2b
        if b1a is not None and not isinstance(self.shortcut, nn.Identity):
            response = self._shortcut_response(b1a).reshape(-1)  # per output channel
            post = response if post is None else response + post
        self.conv1 = fold_layer(self.conv1, shift=b1a, bias=b1b)
        self.conv2 = fold_layer(self.conv2, shift=b2a, scale=s, bias=post)
        self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.scale = (nn.Identity() for _ in range(5))
        return n

    def forward(self, x: Tensor) -> Tensor:
        if self.lean and self.lean_ready():
            return self.lean_forward(x)
        shifted = self.bias1a(x)
        out = self.relu(self.bias1b(self.norm1(self.conv1(shifted))))
        out = self.drop_path(self.bias2b(self.scale(self.norm2(self.conv2(self.bias2a(out))))))
        # An identity shortcut carries x itself; a subsampling or projection shortcut sees x + b1a.
        shortcut = x if isinstance(self.shortcut, nn.Identity) else self.shortcut(shifted)
        out = residual_add(shortcut, out, self.block_name)
        if self.output_scale != 1.0:  # the 1/sqrt(2) baseline: (x + F(x)) / sqrt(2)
            out = out * self.output_scale
        return self.relu(out)


def check_cifar_depth(depth: int) -> int:
    """Blocks per stage n for a CIFAR ResNet of ``depth`` = 6n + 2 layers."""
    if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2 with n >= 1 (8, 14, 20, 32, 56, 110, 1202, ...), "
                         f"got {depth!r}; the nearest valid depths are {_nearest(depth, 6, 2, 8)}")
    return (depth - 2) // 6


def _check_shortcut(shortcut: str | None, method: Method) -> str:
    """The shortcut option: "A" by default, "B" (a 1x1 projection) for NF-ResNets, whose transition blocks project
    their normalised input (Brock et al. 2021, section 4)."""
    if shortcut is None:
        return "B" if method.nf else "A"
    if method.nf and shortcut != "B":
        raise ValueError(f"{method.name}'s transition blocks project their normalised input (a 1x1 convolution), so "
                         f"shortcut={shortcut!r} has no NF form; use shortcut='B' (the default for {method.name})")
    return shortcut


def _nearest(depth: object, step: int, offset: int, minimum: int) -> str:
    try:
        d = int(depth)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return f"{minimum} and up"
    low = max(minimum, (d - offset) // step * step + offset)
    return f"{low} and {low + step}" if low != d else str(low + step)


class CifarResNet(StemHeadFolding, nn.Module):
    """ResNet-(6n+2) for 32x32 images (any input size works: the head pools globally).

    ``drop_path``: stochastic depth, block i of the 3n dropping its branch with ``drop_path * i / (3n)``
    (:func:`~fixup.models.drop_path_rates`); ``head_dropout``: dropout on the pooled features before the classifier.
    Both 0 (off) by default; neither changes the parameters or their initialisation.
    """

    def __init__(self, depth: int = 20, num_classes: int = 10, in_channels: int = 3, width: int = 16,
                 shortcut: str | None = None, method: Method | str = "fixup",
                 generator: torch.Generator | None = None, drop_path: float = 0.0, head_dropout: float = 0.0) -> None:
        super().__init__()
        n = check_cifar_depth(depth)
        rates = iter(drop_path_rates(drop_path, 3 * n))
        self.method = method = check_method(method, _NORMS, "the CIFAR ResNet", "resnet")
        self.depth, self.norm = depth, method.norm
        norm, nf = method.norm, method.nf
        shortcut = _check_shortcut(shortcut, method)
        fixup_biases = method.fixup and method.biases
        self.conv1 = (ScaledStdConv2d if nf else nn.Conv2d)(in_channels, width, 3, 1, 1, bias=False)
        self.norm1 = make_norm(norm, width)
        self.bias1 = scalar(Bias, fixup_biases)
        # NF-ResNets are pre-activation networks: the stem ends at its convolution, the head activates.
        self.relu = nn.Identity() if nf else InplaceReLU()
        stages, in_ch = [], width
        for i, out_ch in enumerate((width, 2 * width, 4 * width)):
            blocks = [NFBasicBlock(in_ch if j == 0 else out_ch, out_ch, 2 if (i > 0 and j == 0) else 1, method,
                                   drop_path=next(rates)) if nf
                      else BasicBlock(in_ch if j == 0 else out_ch, out_ch, 2 if (i > 0 and j == 0) else 1, method,
                                      shortcut, drop_path=next(rates))
                      for j in range(n)]
            stages.append(nn.Sequential(*blocks))
            in_ch = out_ch
        self.layer1, self.layer2, self.layer3 = stages
        if nf:
            assign_betas([block for stage in stages for block in stage])
        self.head_act = ScaledReLU() if nf else nn.Identity()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.bias2 = scalar(Bias, fixup_biases)
        self.head_dropout = make_head_dropout(head_dropout)
        self.fc = nn.Linear(in_ch, num_classes)
        name_blocks(self)
        self.init_report = initialise_(self, method, generator=generator)

    def classifier_layers(self) -> Sequence[nn.Module]:
        return [self.fc]

    def forward_features(self, x: Tensor) -> Tensor:
        x = self.relu(self.bias1(self.norm1(self.conv1(x))))
        return self.layer3(self.layer2(self.layer1(x)))

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(self.pool(self.head_act(self.forward_features(x))), 1)
        return self.fc(self.head_dropout(self.bias2(x)))


@register_model
def resnet_cifar(depth: int = 20, **kwargs) -> CifarResNet:
    """CIFAR ResNet of any depth 6n+2."""
    return CifarResNet(depth, **kwargs)


@register_model
def resnet20(**kwargs) -> CifarResNet:
    return CifarResNet(20, **kwargs)


@register_model
def resnet32(**kwargs) -> CifarResNet:
    return CifarResNet(32, **kwargs)


@register_model
def resnet44(**kwargs) -> CifarResNet:
    return CifarResNet(44, **kwargs)


@register_model
def resnet56(**kwargs) -> CifarResNet:
    return CifarResNet(56, **kwargs)


@register_model
def resnet110(**kwargs) -> CifarResNet:
    return CifarResNet(110, **kwargs)


@register_model
def resnet1202(**kwargs) -> CifarResNet:
    return CifarResNet(1202, **kwargs)
