"""ImageNet ResNet-18/34/50/101/152 (He et al. 2016; torchvision's layout), in Fixup and baseline forms.

A 7x7 stride-2 stem convolution and 3x3 stride-2 max pooling, four stages of basic (ResNet-18/34) or
bottleneck (ResNet-50/101/152) blocks with 64, 128, 256 and 512 planes (stride 2 at the first block
of stages 2-4, on the 3x3 convolution of a bottleneck: "ResNet v1.5"), 1x1 projection shortcuts where
shape changes, global average pooling and the classifier. With BatchNorm the parameter counts are
torchvision's exactly (ResNet-50: 25,557,032).

**Fixup form** (section 3 and the authors' reference ImageNet code): every normalisation layer is
removed; a scalar bias sits before each convolution and each activation, the branch ends in the
scalar multiplier and a bias, and the projection shortcut takes the branch's biased input::

    bottleneck (m = 3, rule 2's factor L^-1/4):
    out = relu(conv1(x + b1a) + b1b)
    out = relu(conv2(out + b2a) + b2b)                 # 3x3, carries the stride
    out = scale * conv3(out + b3a) + b3b               # conv3 zeroed; b3b is the stream bias
    y   = relu(shortcut(x + b1a) + out)      (an identity shortcut carries x itself)

Basic blocks (m = 2, factor L^-1/2) are :class:`fixup.models.resnet_cifar.BasicBlock` with its 1x1
projection shortcut ("B"), which is torchvision's BasicBlock. The stem is ``relu(conv1(x) + b)``, the
head ``fc(pool(x) + b)``. Without normalisation the Fixup ResNet-50 has 25,503,912 weights plus 114
scalars (16 blocks x 7 + 2): 53,120 fewer parameters than with BatchNorm (its gains and shifts).

**NF form** (``nf_resnet``, Brock et al. 2021): the blocks of :mod:`fixup.models.nf_blocks` (pre-activation,
weight-standardised), the stem a weight-standardised convolution and max pooling, the head activating before
pooling, as the authors' NF-ResNets.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..branch import Branch
from ..init import initialise_
from ..method import METHODS, Method
from ..nn import Bias, InplaceReLU, Scale, ScaledReLU, ScaledStdConv2d, residual_add
from ..perf.fold import count_scalars, fold_layer
from ..perf.ops import lean_conv2d, lean_residual_, observed, plain_conv, scalar_value
from ._common import StemHeadFolding, branch_multiplier, check_method, make_norm, name_blocks, scalar
from ._drop_path import DropPath, drop_path_rates, make_head_dropout, maybe_drop_path
from ._registry import register_model
from .nf_blocks import NFBasicBlock, NFBottleneck, assign_betas
from .resnet_cifar import BasicBlock

__all__ = ["LAYERS", "Bottleneck", "ImageNetResNet"]

_NORMS = ("fixup", "batchnorm", "groupnorm", "none")
GN_GROUPS = 32  # Wu & He (2018), GroupNorm's default number of groups
# Blocks per stage and block type, He et al. (2016) table 1.
LAYERS: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (with the stride), 1x1 expand (x4); ``relu(shortcut(x) + F(x))``.

    The method decides the scalars (``b3b``, after the last layer, is the stream bias) and the output
    scale on ``shortcut(x) + F(x)`` (the 1/sqrt(2) baseline). With ``drop_path`` > 0 each example's ``F(x)`` is
    dropped with that probability in training (:class:`~fixup.models.DropPath`).
    """

    expansion = 4

    def __init__(self, in_ch: int, planes: int, stride: int = 1, method: Method = METHODS["fixup"], *,
                 norm_groups: int = GN_GROUPS, drop_path: float = 0.0) -> None:
        super().__init__()
        norm, biases = method.norm, method.fixup and method.biases
        out_ch = planes * self.expansion
        self.block_name = "Bottleneck"
        self.output_scale = float(method.output_scale)
        self.bias1a, self.bias1b = scalar(Bias, biases), scalar(Bias, biases)
        self.bias2a, self.bias2b = scalar(Bias, biases), scalar(Bias, biases)
        self.bias3a, self.bias3b = scalar(Bias, biases), scalar(Bias, method.has_stream_bias)
        self.scale = branch_multiplier(method)
        self.conv1 = nn.Conv2d(in_ch, planes, 1, bias=False)
        self.norm1 = make_norm(norm, planes, norm_groups)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.norm2 = make_norm(norm, planes, norm_groups)
        self.conv3 = nn.Conv2d(planes, out_ch, 1, bias=False)
        self.norm3 = make_norm(norm, out_ch, norm_groups)
        self.relu = InplaceReLU()
        self.drop_path = maybe_drop_path(drop_path)  # stochastic depth on F(x), per example
        self.lean = True  # compute forward by fixup.perf.ops where it applies: same function, less memory
        self.projection: nn.Conv2d | None = None
        self.shortcut: nn.Module = nn.Identity()
        if (stride, in_ch) != (1, out_ch):
            self.projection = nn.Conv2d(in_ch, out_ch, 1, stride, bias=False)
            self.shortcut = nn.Sequential(self.projection, make_norm(norm, out_ch, norm_groups))

    def residual_branches(self) -> Sequence[Branch]:
        biases = [m for m in (self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.bias3a) if isinstance(m, Bias)]
        scale = self.scale if isinstance(self.scale, Scale) else None
        stream = self.bias3b if isinstance(self.bias3b, Bias) else None
        return [Branch([self.conv1, self.conv2, self.conv3], "bottleneck", biases=biases, scale=scale,
                       shortcut=self.projection, stream_bias=stream)]

    def last_norm(self) -> nn.Module:
        """The branch's last normalisation layer (its gain is what zero_init_last_norm zeroes)."""
        return self.norm3

    def _scalars(self) -> tuple[Tensor | None, ...]:
        """(b1a, b1b, b2a, b2b, b3a, b3b, scale): the parameters, None where the method has no such scalar."""
        return tuple(scalar_value(m) for m in (self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.bias3a,
                                               self.bias3b, self.scale))

    def _scalar_modules(self) -> tuple[nn.Module, ...]:
        return self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.bias3a, self.bias3b, self.scale

    def _plain_shortcut(self) -> bool:
        """Identity, or a bias-free 1x1 projection without normalisation: a linear shortcut."""
        if self.projection is None:
            return type(self.shortcut) is nn.Identity
        return (type(self.shortcut) is nn.Sequential and type(self.shortcut[1]) is nn.Identity
                and plain_conv(self.projection) and self.projection.bias is None)

    def lean_ready(self) -> bool:
        """Whether :meth:`lean_forward` computes exactly what the block's modules would: no normalisation,
        plain convolutions, a linear shortcut, and no hooks on the inner modules."""
        if any(type(n) is not nn.Identity for n in (self.norm1, self.norm2, self.norm3)):
            return False
        convs = (self.conv1, self.conv2, self.conv3)
        return (all(plain_conv(c) for c in convs) and self._plain_shortcut()
                and type(self.drop_path) in (nn.Identity, DropPath)
                and not observed(*convs, *self._scalar_modules(), self.relu, self.drop_path, *self.shortcut.modules()))

    def _shortcut_response(self, b1a: Tensor) -> Tensor:
        """``projection(x + b1a) - projection(x)``, per output channel: ``b1a * W.sum((1, 2, 3))`` (1x1, no padding)."""
        return self.projection.weight.sum((1, 2, 3)) * b1a

    def lean_forward(self, x: Tensor) -> Tensor:
        """The forward keeping no tensor for the scalars (:mod:`fixup.perf.ops`); call where :meth:`lean_ready`.

        conv1 and conv3 are 1x1 without padding, so their biases before and after ride in the convolution's
        per-channel bias; only conv2's (3x3, zero-padded) shift adds a map. Under stochastic depth in training the
        projection's response to ``b1a`` joins after the branch is dropped (it belongs to the shortcut).
        """
        b1a, b1b, b2a, b2b, b3a, b3b, s = self._scalars()
        dropping = isinstance(self.drop_path, DropPath) and self.drop_path.active
        out = lean_conv2d(x, self.conv1, shift=b1a, bias=b1b).relu_()
        out = lean_conv2d(out, self.conv2, shift=b2a, bias=b2b).relu_()
        post, response = b3b, None
        if b1a is not None and self.projection is not None:
            response = self._shortcut_response(b1a)
            if not dropping:
                post = response if post is None else response + post
        out = lean_conv2d(out, self.conv3, shift=b3a, scale=s, bias=post)
        if dropping:
            out = self.drop_path.forward_(out)
            if response is not None:
                out = out.add_(response.reshape(1, -1, 1, 1).to(out.dtype))
        shortcut = x if self.projection is None else self.projection(x)
        return lean_residual_(out, shortcut, self.block_name, self.output_scale, relu=True)

    @torch.no_grad()
    def fold_(self) -> int:
        """Fold every scalar into the three convolutions (exact; :mod:`fixup.perf.fold`); returns how many folded."""
        if any(type(n) is not nn.Identity for n in (self.norm1, self.norm2, self.norm3)) or not self._plain_shortcut():
            return 0
        b1a, b1b, b2a, b2b, b3a, b3b, s = self._scalars()
        n = count_scalars(*self._scalar_modules())
        post = b3b
        if b1a is not None and self.projection is not None:
            response = self._shortcut_response(b1a)
            post = response if post is None else response + post
        self.conv1 = fold_layer(self.conv1, shift=b1a, bias=b1b)
        self.conv2 = fold_layer(self.conv2, shift=b2a, bias=b2b)
        self.conv3 = fold_layer(self.conv3, shift=b3a, scale=s, bias=post)
        self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.bias3a, self.bias3b, self.scale = (
            nn.Identity() for _ in range(7))
        return n

    def forward(self, x: Tensor) -> Tensor:
        if self.lean and self.lean_ready():
            return self.lean_forward(x)
        shifted = self.bias1a(x)
        out = self.relu(self.bias1b(self.norm1(self.conv1(shifted))))
        out = self.relu(self.bias2b(self.norm2(self.conv2(self.bias2a(out)))))
        out = self.drop_path(self.bias3b(self.scale(self.norm3(self.conv3(self.bias3a(out))))))
        # An identity shortcut carries x itself; a projection shortcut sees x + b1a (reference code).
        shortcut = x if isinstance(self.shortcut, nn.Identity) else self.shortcut(shifted)
        out = residual_add(shortcut, out, self.block_name)
        if self.output_scale != 1.0:  # the 1/sqrt(2) baseline: (x + F(x)) / sqrt(2)
            out = out * self.output_scale
        return self.relu(out)


class ImageNetResNet(StemHeadFolding, nn.Module):
    """ResNet with ``block`` ("basic" or "bottleneck") and ``layers`` blocks per stage; ``width`` planes first.

    ``drop_path``: stochastic depth, block i of all N dropping its branch with ``drop_path * i / N``
    (:func:`~fixup.models.drop_path_rates`); ``head_dropout``: dropout on the pooled features before the classifier.
    Both 0 (off) by default; neither changes the parameters or their initialisation.
    """

    def __init__(self, block: str = "bottleneck", layers: Sequence[int] = (3, 4, 6, 3), num_classes: int = 1000,
                 in_channels: int = 3, width: int = 64, method: Method | str = "fixup", norm_groups: int = GN_GROUPS,
                 generator: torch.Generator | None = None, drop_path: float = 0.0, head_dropout: float = 0.0) -> None:
        super().__init__()
        if block not in ("basic", "bottleneck"):
            raise ValueError(f"block must be 'basic' (ResNet-18/34) or 'bottleneck' (ResNet-50/101/152), got {block!r}")
        if len(layers) != 4 or any(not isinstance(n, int) or n < 1 for n in layers):
            raise ValueError(f"layers must be four positive block counts, one per stage, got {layers!r}")
        self.method = method = check_method(method, _NORMS, "the ImageNet ResNet", "resnet")
        rates = iter(drop_path_rates(drop_path, sum(layers)))
        self.block, self.layers, self.norm = block, tuple(layers), method.norm
        norm, fixup_biases, nf = method.norm, method.fixup and method.biases, method.nf
        expansion = Bottleneck.expansion if block == "bottleneck" else 1
        self.conv1 = (ScaledStdConv2d if nf else nn.Conv2d)(in_channels, width, 7, 2, 3, bias=False)
        self.norm1 = make_norm(norm, width, norm_groups)
        self.bias1 = scalar(Bias, fixup_biases)
        # NF-ResNets are pre-activation networks: the stem ends at its convolution (and pooling), the head activates.
        self.relu = nn.Identity() if nf else InplaceReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, in_ch = [], width
        for i, n in enumerate(layers):
            planes, stride = width * 2**i, 1 if i == 0 else 2
            blocks: list[nn.Module] = []
            for j in range(n):
                s = stride if j == 0 else 1
                p = next(rates)
                if block == "bottleneck":
                    blocks.append(NFBottleneck(in_ch, planes, s, method, drop_path=p) if nf
                                  else Bottleneck(in_ch, planes, s, method, norm_groups=norm_groups, drop_path=p))
                else:
                    blocks.append(NFBasicBlock(in_ch, planes, s, method, drop_path=p) if nf
                                  else BasicBlock(in_ch, planes, s, method, "B", norm_groups=norm_groups, drop_path=p))
                in_ch = planes * expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        if nf:
            assign_betas([b for stage in stages for b in stage])
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
        x = self.maxpool(self.relu(self.bias1(self.norm1(self.conv1(x)))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x: Tensor) -> Tensor:
        pooled = torch.flatten(self.pool(self.head_act(self.forward_features(x))), 1)
        return self.fc(self.head_dropout(self.bias2(pooled)))


@register_model
def resnet_imagenet(depth: int = 50, **kwargs) -> ImageNetResNet:
    """ImageNet ResNet of depth 18, 34, 50, 101 or 152 (``width`` sets the first stage's planes, 64)."""
    if depth not in LAYERS:
        raise ValueError(f"ImageNet ResNet depth must be one of {sorted(LAYERS)}, got {depth!r}")
    return ImageNetResNet(*LAYERS[depth], **kwargs)


@register_model
def resnet18(**kwargs) -> ImageNetResNet:
    return ImageNetResNet(*LAYERS[18], **kwargs)


@register_model
def resnet34(**kwargs) -> ImageNetResNet:
    return ImageNetResNet(*LAYERS[34], **kwargs)


@register_model
def resnet50(**kwargs) -> ImageNetResNet:
    return ImageNetResNet(*LAYERS[50], **kwargs)


@register_model
def resnet101(**kwargs) -> ImageNetResNet:
    return ImageNetResNet(*LAYERS[101], **kwargs)


@register_model
def resnet152(**kwargs) -> ImageNetResNet:
    return ImageNetResNet(*LAYERS[152], **kwargs)


@register_model
def resnet_imagenet_tiny(**kwargs) -> ImageNetResNet:
    """Basic blocks (1, 2, 1, 1) per stage, 8 planes first: for tests (32x32 inputs work)."""
    return ImageNetResNet("basic", (1, 2, 1, 1), **{"width": 8, **kwargs})


@register_model
def resnet_imagenet_bottleneck_tiny(**kwargs) -> ImageNetResNet:
    """Bottleneck blocks (1, 2, 1, 1) per stage, 8 planes first: for tests (32x32 inputs work)."""
    return ImageNetResNet("bottleneck", (1, 2, 1, 1), **{"width": 8, **kwargs})
