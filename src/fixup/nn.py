"""Scalar parameters of the Fixup parameterisation and of the gated methods, the layers of NF-ResNets, and the
checked residual sum.

Fixup's rule 3 (Zhang, Dauphin & Ma, ICLR 2019, section 3) adds to every residual branch one
scalar multiplier, initially 1, and scalar biases, initially 0, before each convolution, linear
layer and element-wise activation. These are single numbers shared by the whole tensor, not
per-channel parameters as in a normalisation layer's affine transform. SkipInit (De & Smith 2020)
and ReZero (Bachlechner et al. 2020) multiply each branch by a :class:`Gate`: the same scalar
multiplier, starting at 0. NF-ResNets (Brock, De & Smith, ICLR 2021) replace normalisation by
:class:`ScaledStdConv2d` and :class:`ScaledReLU`. Dynamic Tanh (Zhu, Chen, He, LeCun & Liu, CVPR 2025) replaces each
LayerNorm by :class:`DyT`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .method import DYT_ALPHA

__all__ = ["DYT_ALPHA", "RELU_GAMMA", "Bias", "DyT", "Gate", "InplaceReLU", "Scale", "ScaledReLU", "ScaledStdConv2d",
           "check_residual_shapes", "fit_dyt_alpha", "inplace_safe", "residual_add"]

# Brock, De & Smith (2021), section 4: the gain that gives ReLU's output unit variance on a unit Gaussian input,
# 1 / sqrt(Var(relu(z))) = 1 / sqrt((1 - 1/pi) / 2).
RELU_GAMMA = math.sqrt(2.0 / (1.0 - 1.0 / math.pi))


class Bias(nn.Module):
    """A learnable scalar shift ``x + b``; ``b`` starts at 0."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return x + self.bias.to(x.dtype)  # in x's dtype: under bf16 autocast, no promotion of x to float32


class Scale(nn.Module):
    """A learnable scalar multiplier ``s * x``; ``s`` starts at 1."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.scale.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale.to(x.dtype)  # in x's dtype, as Bias


class Gate(Scale):
    """A learnable scalar gate ``alpha * x`` on a residual branch; ``alpha`` starts at 0, so the block starts as
    its shortcut (SkipInit's gain, ReZero's alpha). A :class:`Scale` in every other respect (lean forward,
    folding), with its own optimiser group (:func:`fixup.param_groups`)."""

    def __init__(self) -> None:
        super().__init__()
        with torch.no_grad():
            self.scale.zero_()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.scale.zero_()


def check_residual_shapes(shortcut: Tensor, branch: Tensor | torch.Size, block: str = "residual block") -> None:
    """Raise unless ``shortcut`` and ``branch`` (a tensor or its shape) have the same full shape."""
    branch_shape = branch.shape if isinstance(branch, Tensor) else torch.Size(branch)
    if shortcut.shape != branch_shape:
        raise ValueError(
            f"{block}: residual branch output has shape {tuple(branch_shape)} but the shortcut has "
            f"shape {tuple(shortcut.shape)}; they must match exactly. Give the shortcut a projection "
            "(or subsampling) to the branch's shape, or correct the branch's width and stride."
        )


def residual_add(shortcut: Tensor, branch: Tensor, block: str = "residual block") -> Tensor:
    """Return ``shortcut + branch`` after checking that both have the same full shape.

    A plain ``+`` would broadcast a branch of the wrong width or size into a result that looks
    valid; this names the block and both shapes instead.
    """
    check_residual_shapes(shortcut, branch, block)
    return shortcut + branch


# torch.compiler.is_compiling exists from torch 2.3; before it a compiled graph breaks here, correct but slower.
_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def inplace_safe(x: Tensor) -> bool:
    """Whether ``x`` may be changed in place: it is not a view.

    A module under a full backward hook (Opacus's per-sample gradients, ``register_full_backward_hook``) returns
    its output as a view made by a custom autograd function, and autograd refuses any in-place change of it
    ("Output 0 of BackwardHookFunction is a view and is being modified inplace"). Without hooks a layer's output
    is a fresh tensor, and the in-place fast path stays. Under ``torch.compile`` (no module hooks fire in a
    compiled graph's body, and ``_is_view`` would break the graph) it is always safe: the compiler decides.
    """
    return _compiling() or not x._is_view()


class InplaceReLU(nn.ReLU):
    """``nn.ReLU(inplace=True)`` that computes out of place where its input is a view (:func:`inplace_safe`): the
    output of a module under a backward hook. An ``nn.ReLU`` in every other respect."""

    def __init__(self) -> None:
        super().__init__(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x, inplace=self.inplace and inplace_safe(x))


class ScaledReLU(nn.Module):
    """``gamma * relu(x)`` with ``gamma`` = :data:`RELU_GAMMA`: a unit Gaussian input gives a unit-variance output
    (Brock, De & Smith 2021, section 4)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x) * RELU_GAMMA


class ScaledStdConv2d(nn.Conv2d):
    """A convolution with scaled weight standardisation (Brock, De & Smith 2021, section 4, eq. 4).

    The weight used is ``gain * (W - mean) / (std * sqrt(N))``, with the mean and the (biased) std of each output
    unit's row of ``N`` = fan-in weights and ``gain`` a learnable per-output-channel affine gain that starts at 1.
    Every row then has zero mean and unit norm, so a unit-variance input with independent entries gives a
    unit-variance output whatever the raw weights' scale. ``eps`` floors ``N * var`` (a row of equal weights).
    """

    def __init__(self, *args, eps: float = 1e-4, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gain = nn.Parameter(torch.ones(self.out_channels, 1, 1, 1))
        self.eps = eps

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "gain"):
            with torch.no_grad():
                self.gain.fill_(1.0)

    def standardized_weight(self) -> Tensor:
        """The weight the convolution applies: each row standardised, scaled by 1/sqrt(fan-in) and the gain."""
        w = self.weight
        fan_in = w[0].numel()  # in_channels / groups x kernel size
        var, mean = torch.var_mean(w, dim=tuple(range(1, w.ndim)), correction=0, keepdim=True)
        return self.gain * (w - mean) * torch.rsqrt(torch.clamp(var * fan_in, min=self.eps))

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.standardized_weight(), self.bias)


def _along(v: Tensor, x: Tensor, dim: int) -> Tensor:
    """``v`` (one value per channel) shaped to broadcast along ``x``'s dimension ``dim``, in ``x``'s dtype."""
    shape = [1] * x.dim()
    shape[dim] = -1
    return v.to(x.dtype).view(shape)


class DyT(nn.Module):
    """Dynamic Tanh, ``weight * tanh(alpha * x) + bias`` element-wise (Zhu, Chen, He, LeCun & Liu, "Transformers
    without Normalization", CVPR 2025, eq. 1), in place of a LayerNorm.

    ``alpha`` is one learnable scalar that starts at ``alpha`` (:data:`DYT_ALPHA`, the paper's 0.5); ``weight`` and
    ``bias`` are per channel, ones and zeros, the LayerNorm's affine. Channels lie along ``dim``: -1 for tokens
    (B, T, C), 1 for images (N, C, H, W). Each example is computed alone: nothing couples the examples of a batch.
    """

    def __init__(self, num_channels: int, dim: int = -1, alpha: float = DYT_ALPHA) -> None:
        super().__init__()
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"DyT's alpha must be a positive finite number, got {alpha!r}")
        self.dim, self.alpha0 = dim, float(alpha)
        self.alpha = nn.Parameter(torch.full((1,), self.alpha0))
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.alpha.fill_(self.alpha0)
            self.weight.fill_(1.0)
            self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.alpha.to(x.dtype) * x)
        return y * _along(self.weight, x, self.dim) + _along(self.bias, x, self.dim)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, dim={self.dim}, alpha0={self.alpha0:g}"


_DYT_ALPHAS = torch.logspace(-4, 2, 121, dtype=torch.float64)  # fit_dyt_alpha's search grid, then refined


@torch.no_grad()
def fit_dyt_alpha(x: Tensor, y: Tensor, gamma: Tensor, beta: Tensor) -> float:
    """The alpha minimising the mean of ``(gamma * tanh(alpha * x) + beta - y) ** 2``: the :class:`DyT` closest to a
    norm whose output on inputs ``x`` is ``y`` (rows are samples, columns channels; ``gamma``, ``beta`` per channel).
    A log grid over [1e-4, 100], then golden-section search between the best point's neighbours."""
    def loss(alpha: float) -> float:
        return float((torch.tanh(alpha * x) * gamma + beta - y).pow(2).mean())

    losses = [loss(float(a)) for a in _DYT_ALPHAS]
    i = min(range(len(losses)), key=losses.__getitem__)
    last = len(_DYT_ALPHAS) - 1
    lo, hi = math.log(float(_DYT_ALPHAS[max(i - 1, 0)])), math.log(float(_DYT_ALPHAS[min(i + 1, last)]))
    g = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if loss(math.exp(a)) < loss(math.exp(b)):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)
