"""Wide-ResNets WRN-d-k (Zagoruyko & Komodakis 2016), in Fixup and baseline forms.

Depth d = 6n + 4: a 3x3 stem convolution, three stages of n pre-activation basic blocks with 16k, 32k
and 64k channels (the first block of stages 2 and 3 has stride 2), a final normalisation and ReLU,
global average pooling and the classifier. Dropout, when asked for, sits between the two
convolutions of each branch. Where width or stride change the shortcut is a 1x1 projection of the
pre-activated input, as in the original.

The Fixup paper uses WRNs twice: width 1 and depths 10 to 10,000 in its depth study (section 4.1,
figure 3) and WRN-28-10 / WRN-40-10 with Mixup and Cutout (appendix C).

**Fixup form.** The Fixup form is the pre-activation block with each normalisation layer replaced
by a scalar bias where its shift was, plus rule 3's bias before the second convolution and the
scalar multiplier and bias at the end of the branch (the structure of the Fixup authors' WRN)::

    a   = relu(x + b1a)                          # BN1 -> bias
    h   = relu(conv1(a) + b1b)                   # BN2 -> bias
    out = scale * conv2(dropout(h + b2a)) + b2b     # b2b: the stream bias
    y   = shortcut + out,  shortcut = x, or projection(a) where width/stride change

The branch has m = 2 weight layers (conv1 scaled by L^-1/2, conv2 zeroed); the projection is
He-initialised and not depth-scaled. The identity path carries x untouched, so each block with an
identity shortcut is exactly the identity at initialisation. The head is ``fc(pool(relu(x + b)) + b')``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..branch import Branch
from ..init import initialise_
from ..method import METHODS, Method
from ..nn import Bias, Scale, ScaledReLU, ScaledStdConv2d, residual_add
from ..perf.fold import count_scalars, fold_layer
from ..perf.ops import lean_conv2d, lean_residual_, observed, plain_conv, scalar_value
from ._common import branch_multiplier, check_method, make_norm, name_blocks, scalar
from ._drop_path import DropPath, drop_path_rates, make_head_dropout, maybe_drop_path
from ._registry import register_model
from .nf_blocks import NFBasicBlock, assign_betas

__all__ = ["WideBlock", "WideResNet", "check_wrn_depth"]

_NORMS = ("fixup", "batchnorm", "groupnorm", "none")


class WideBlock(nn.Module):
    """A pre-activation basic block: ``y = shortcut + conv2(dropout(relu(norm2(conv1(relu(norm1(x)))))))``.

    The method decides the scalars (``b2b``, after the last layer, is the stream bias) and the output
    scale on ``shortcut + F(x)`` (the 1/sqrt(2) baseline). With ``drop_path`` > 0 each example's ``F(x)`` is
    dropped with that probability in training (:class:`~fixup.models.DropPath`).
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1, method: Method = METHODS["fixup"],
                 dropout: float = 0.0, *, norm_groups: int = 16, drop_path: float = 0.0) -> None:
        super().__init__()
        norm, biases = method.norm, method.fixup and method.biases
        self.block_name = "WideBlock"
        self.output_scale = float(method.output_scale)
        self.norm1 = make_norm(norm, in_ch, norm_groups)
        self.bias1a = scalar(Bias, biases)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.norm2 = make_norm(norm, out_ch, norm_groups)
        self.bias1b = scalar(Bias, biases)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.bias2a = scalar(Bias, biases)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.scale = branch_multiplier(method)
        self.bias2b = scalar(Bias, method.has_stream_bias)
        self.relu = nn.ReLU()  # not in place: x itself is the identity shortcut
        self.drop_path = maybe_drop_path(drop_path)  # stochastic depth on F(x), per example
        self.lean = True  # compute forward by fixup.perf.ops where it applies: same function, less memory
        self.projection = nn.Conv2d(in_ch, out_ch, 1, stride, bias=False) if (stride, in_ch) != (1, out_ch) else None

    def residual_branches(self) -> Sequence[Branch]:
        biases = [m for m in (self.bias1a, self.bias1b, self.bias2a) if isinstance(m, Bias)]
        scale = self.scale if isinstance(self.scale, Scale) else None
        stream = self.bias2b if isinstance(self.bias2b, Bias) else None
        return [Branch([self.conv1, self.conv2], "wide-basic", biases=biases, scale=scale, shortcut=self.projection,
                       stream_bias=stream)]

    def last_norm(self) -> nn.Module:
        """The last normalisation layer on the branch (zeroing its gain zeroes the branch)."""
        return self.norm2

    def _scalar_modules(self) -> tuple[nn.Module, ...]:
        return self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.scale

    def _scalars(self) -> tuple[Tensor | None, ...]:
        """(b1a, b1b, b2a, b2b, scale): the parameters, None where the method has no such scalar."""
        return tuple(scalar_value(m) for m in self._scalar_modules())

    def lean_ready(self) -> bool:
        """Whether :meth:`lean_forward` computes exactly what the block's modules would: no normalisation,
        plain convolutions, and no hooks on the inner modules."""
        if type(self.norm1) is not nn.Identity or type(self.norm2) is not nn.Identity:
            return False
        convs = (self.conv1, self.conv2) + (() if self.projection is None else (self.projection,))
        return (all(plain_conv(c) for c in convs) and type(self.dropout) in (nn.Identity, nn.Dropout)
                and type(self.drop_path) in (nn.Identity, DropPath)
                and not observed(*convs, *self._scalar_modules(), self.relu, self.dropout, self.drop_path))

    def lean_forward(self, x: Tensor) -> Tensor:
        """The forward keeping no tensor for the scalars (:mod:`fixup.perf.ops`); call where :meth:`lean_ready`.

        ``relu(x + b1a)`` costs one addition more than the bare ``relu(x)`` (the shortcut needs ``x`` itself);
        ``b1b`` rides in conv1's bias, ``b2a``, the multiplier and ``b2b`` in conv2. With dropout active
        (training, p > 0) the shift before conv2 is applied to the tensor, as dropout(h + b2a) requires.
        """
        b1a, b1b, b2a, b2b, s = self._scalars()
        # The scalars join in the activation's dtype: under bf16 autocast a float32 scalar would promote the
        # whole stream to float32 (a copy per block, and both dtypes kept for backward).
        a = F.relu(x) if b1a is None else (x + b1a.to(x.dtype)).relu_()
        h = lean_conv2d(a, self.conv1, bias=b1b).relu_()
        p = self.dropout.p if isinstance(self.dropout, nn.Dropout) else 0.0
        if self.training and p > 0:
            h = F.dropout(h if b2a is None else h + b2a.to(h.dtype), p, True)
            b2a = None
        out = lean_conv2d(h, self.conv2, shift=b2a, scale=s, bias=b2b)
        if isinstance(self.drop_path, DropPath):  # stochastic depth: in place on conv2's fresh output
            out = self.drop_path.forward_(out)
        shortcut = x if self.projection is None else self.projection(a)
        return lean_residual_(out, shortcut, self.block_name, self.output_scale)

    def input_shift(self) -> Tensor | None:
        """The bias added to the block's input before its first activation (``b1a``), or None."""
        return scalar_value(self.bias1a)

    @torch.no_grad()
    def fold_(self, *, input_shifted: bool = False, next_shift: Tensor | None = None) -> int:
        """Fold the scalars into conv1 and conv2 (exact; see :mod:`fixup.perf.fold`); returns how many folded.

        ``b1a`` sits on the residual stream before the activation, where no layer can take it. A model can
        carry it on the stream instead: with ``input_shifted`` the block's input arrives as ``x + b1a`` (the
        producer adds it), the block drops ``b1a``, and its output arrives shifted by ``next_shift`` (its
        consumer's ``b1a``; conv2's bias takes the difference). Called alone, ``b1a`` is kept.
        """
        if type(self.norm1) is not nn.Identity or type(self.norm2) is not nn.Identity:
            return 0
        b1a, b1b, b2a, b2b, s = self._scalars()
        n = count_scalars(*self._scalar_modules())
        post = b2b
        shift = None if next_shift is None else next_shift.reshape(1)
        if input_shifted and b1a is not None and self.projection is None:
            shift = -b1a if shift is None else shift - b1a  # the identity shortcut carries x + b1a
        if shift is not None:
            post = shift if post is None else post + shift
        self.conv1 = fold_layer(self.conv1, bias=b1b)
        self.conv2 = fold_layer(self.conv2, shift=b2a, scale=s, bias=post)
        if not input_shifted:
            n -= count_scalars(self.bias1a)
        else:
            self.bias1a = nn.Identity()
        self.bias1b, self.bias2a, self.bias2b, self.scale = (nn.Identity() for _ in range(4))
        return n

    def forward(self, x: Tensor) -> Tensor:
        if self.lean and self.lean_ready():
            return self.lean_forward(x)
        a = self.relu(self.bias1a(self.norm1(x)))
        out = self.relu(self.bias1b(self.norm2(self.conv1(a))))
        out = self.drop_path(self.bias2b(self.scale(self.conv2(self.dropout(self.bias2a(out))))))
        shortcut = x if self.projection is None else self.projection(a)
        out = residual_add(shortcut, out, self.block_name)
        if self.output_scale != 1.0:  # the 1/sqrt(2) baseline: (x + F(x)) / sqrt(2)
            out = out * self.output_scale
        return out


def check_wrn_depth(depth: int) -> int:
    """Blocks per stage n for a Wide-ResNet of ``depth`` = 6n + 4 layers."""
    if not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
        near = ""
        if isinstance(depth, int) and depth >= 4:
            low = max(10, (depth - 4) // 6 * 6 + 4)
            near = f"; the nearest valid depths are {low} and {low + 6}"
        raise ValueError(f"Wide-ResNet depth must be 6n+4 with n >= 1 (10, 16, 22, 28, 40, ..., 10000), "
                         f"got {depth!r}{near}")
    return (depth - 4) // 6


class WideResNet(nn.Module):
    """WRN-depth-width for 32x32 images (any size works: the head pools globally).

    ``dropout``: between each branch's convolutions (the WRN paper's); ``drop_path``: stochastic depth, block i of
    the 3n dropping its branch with ``drop_path * i / (3n)`` (:func:`~fixup.models.drop_path_rates`);
    ``head_dropout``: dropout on the pooled features before the classifier. All 0 (off) by default; none changes
    the parameters or their initialisation.
    """

    def __init__(self, depth: int = 16, width: int = 1, num_classes: int = 10, in_channels: int = 3,
                 dropout: float = 0.0, method: Method | str = "fixup", norm_groups: int = 16,
                 generator: torch.Generator | None = None, drop_path: float = 0.0, head_dropout: float = 0.0) -> None:
        super().__init__()
        n = check_wrn_depth(depth)
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"width (the widening factor k) must be a positive whole number, got {width!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
        self.method = method = check_method(method, _NORMS, "the Wide-ResNet", "resnet")
        rates = iter(drop_path_rates(drop_path, 3 * n))
        self.depth, self.width, self.norm = depth, width, method.norm
        norm, fixup_biases, nf = method.norm, method.fixup and method.biases, method.nf
        self.conv1 = (ScaledStdConv2d if nf else nn.Conv2d)(in_channels, 16, 3, 1, 1, bias=False)
        stages, in_ch = [], 16
        for i, out_ch in enumerate((16 * width, 32 * width, 64 * width)):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(*[
                NFBasicBlock(in_ch if j == 0 else out_ch, out_ch, stride if j == 0 else 1, method, dropout,
                             drop_path=next(rates)) if nf
                else WideBlock(in_ch if j == 0 else out_ch, out_ch, stride if j == 0 else 1, method, dropout,
                               norm_groups=norm_groups, drop_path=next(rates))
                for j in range(n)]))
            in_ch = out_ch
        self.layer1, self.layer2, self.layer3 = stages
        if nf:  # NF-ResNet blocks (Brock et al. 2021): each knows the analytic std of its input
            assign_betas([block for stage in stages for block in stage])
        self.norm_final = make_norm(norm, in_ch, norm_groups)
        self.bias_final = scalar(Bias, fixup_biases)
        # Not in place: the last block's output stays as it returned it. NF: the variance-preserving ReLU.
        self.relu = ScaledReLU() if nf else nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.bias_fc = scalar(Bias, fixup_biases)
        self.head_dropout = make_head_dropout(head_dropout)
        self.fc = nn.Linear(in_ch, num_classes)
        name_blocks(self)
        self.init_report = initialise_(self, method, generator=generator)

    def classifier_layers(self) -> Sequence[nn.Module]:
        return [self.fc]

    @torch.no_grad()
    def fold_(self) -> int:
        """Fold every scalar: the head's into fc, and each block's pre-activation bias onto the residual stream.

        The stream carries ``x + b1a`` of the next block (the stem's convolution adds the first block's, each
        block's conv2 the difference to the next one's, the last block the head's ``bias_final``), so that
        ``relu(x + b1a)`` becomes a bare ``relu``. Returns the number of scalars folded.
        """
        if type(self.norm_final) is not nn.Identity:
            return 0  # normalised baselines: no scalars
        blocks = [block for stage in (self.layer1, self.layer2, self.layer3) for block in stage]
        shifts = [block.input_shift() for block in blocks] + [scalar_value(self.bias_final)]
        shifts = [None if t is None else t.detach().clone() for t in shifts]
        n = count_scalars(self.bias_final, self.bias_fc)
        self.conv1 = fold_layer(self.conv1, bias=shifts[0])
        for block, next_shift in zip(blocks, shifts[1:]):
            n += block.fold_(input_shifted=True, next_shift=next_shift)
        self.fc = fold_layer(self.fc, shift=scalar_value(self.bias_fc))
        self.bias_final, self.bias_fc = nn.Identity(), nn.Identity()
        return n

    def forward_features(self, x: Tensor) -> Tensor:
        """The last stage's output, before the final normalisation and activation: (B, 64k, H/4, W/4)."""
        return self.layer3(self.layer2(self.layer1(self.conv1(x))))

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bias_final(self.norm_final(self.forward_features(x))))
        return self.fc(self.head_dropout(self.bias_fc(torch.flatten(self.pool(x), 1))))


@register_model
def wide_resnet(depth: int = 16, width: int = 1, **kwargs) -> WideResNet:
    """WRN-depth-width, any depth 6n+4; width 1 is the paper's depth-study network (section 4.1)."""
    return WideResNet(depth, width, **kwargs)


@register_model
def wrn28_10(**kwargs) -> WideResNet:
    """WRN-28-10 (36.5 M parameters with BatchNorm), of the paper's Mixup/Cutout experiments (appendix C)."""
    return WideResNet(28, 10, **kwargs)


@register_model
def wrn40_10(**kwargs) -> WideResNet:
    """WRN-40-10, of the paper's Mixup/Cutout experiments (appendix C)."""
    return WideResNet(40, 10, **kwargs)
