"""The plain baselines: every weight layer drawn the same way (He, Xavier), the 1/sqrt(2) rescaling, the normalised
networks.

Fixup's depth study (section 4.1) compares against He without normalisation, the 1/sqrt(2) residual rescaling
and LSUV (:mod:`fixup.init.lsuv`); its tables against BatchNorm, GroupNorm and, for the Transformer, LayerNorm.
The 1/sqrt(2) factor itself sits in the blocks (``output_scale``, from the method); this module draws the
weights and resets the normalisation layers, and zeroes each block's last norm gain where the method asks
(Goyal et al. 2017).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..method import Method
from ..nn import Bias, Scale
from ..report import InitReport, describe_norm
from ._layers import default_linear_, named_weight_layers, record, reset_norms_and_scalars
from ._skeleton import plain_report
from .fans import groups_of, he_std, xavier_std

__all__ = ["describe_init", "he_init_", "initialise_", "xavier_init_", "zero_last_norm_gains_"]


def describe_init(model: nn.Module, method: str, scheme: str, stds: dict[str, float]) -> InitReport:
    """The report of a model its own constructor initialised by ``scheme``, with the std each weight layer was
    drawn with (``stds``, by qualified name)."""
    records = [record(name, mod, stds[name]) for name, mod in named_weight_layers(model)]
    scalars = sum(isinstance(m, (Bias, Scale)) for m in model.modules())
    return plain_report(model, method, scheme, records, scalars)


@torch.no_grad()
def he_init_(model: nn.Module, *, generator: torch.Generator | None = None, mode: str = "fan_out",
             method: str = "he") -> InitReport:
    """He normal for every convolution (``mode`` fan, as torchvision's ResNet), PyTorch's default for linear
    layers, normalisation gain 1 and shift 0. Returns the accounting report."""
    records = []
    for name, mod in named_weight_layers(model):
        if isinstance(mod, nn.Linear):
            std = default_linear_(mod, generator)
        else:
            std = he_std(mod.weight, mode, groups_of(mod))
            mod.weight.normal_(0.0, std, generator=generator)
            if mod.bias is not None:
                mod.bias.zero_()
        records.append(record(name, mod, std))
    scalars = reset_norms_and_scalars(model)
    scheme = f"He normal ({mode}) for convolutions, PyTorch's default uniform for linear layers"
    report = plain_report(model, method, scheme, records, scalars)
    report.fan_mode = mode
    return report


@torch.no_grad()
def xavier_init_(model: nn.Module, *, generator: torch.Generator | None = None) -> InitReport:
    """Xavier (Glorot & Bengio 2010) uniform for every weight layer, biases 0."""
    records = []
    for name, mod in named_weight_layers(model):
        std = xavier_std(mod.weight, groups_of(mod))
        mod.weight.uniform_(-math.sqrt(3.0) * std, math.sqrt(3.0) * std, generator=generator)  # uniform of that std
        if mod.bias is not None:
            mod.bias.zero_()
        records.append(record(name, mod, std))
    scalars = reset_norms_and_scalars(model)
    return plain_report(model, "xavier", "Xavier uniform, gain 1, biases 0", records, scalars)


@torch.no_grad()
def zero_last_norm_gains_(model: nn.Module) -> list[str]:
    """Zero the gain of each residual block's last normalisation layer (Goyal et al. 2017), so that every
    block starts as its shortcut. Blocks name that layer with ``last_norm()``; returns the zeroed names."""
    names = {id(mod): name for name, mod in model.named_modules()}
    zeroed = []
    for mod in model.modules():
        norm = mod.last_norm() if callable(getattr(mod, "last_norm", None)) else None
        if norm is None or describe_norm("", norm) is None:
            continue
        if getattr(norm, "weight", None) is None:
            raise ValueError(f"{names[id(norm)]}: the last normalisation layer of a block has no gain to zero "
                             "(affine=False); build it with an affine transform or leave zero_init_last_norm off")
        norm.weight.zero_()
        zeroed.append(f"{names[id(norm)]}.weight")
    if not zeroed:
        raise ValueError(f"{type(model).__name__} has no block whose last normalisation layer could be zeroed; "
                         "zero_init_last_norm needs norm='batchnorm' or 'groupnorm'")
    return zeroed


@torch.no_grad()
def initialise_(model: nn.Module, method: Method, *, generator: torch.Generator | None = None,
                base: str | None = None) -> InitReport:
    """The initialiser of the plain and normalised rows of :data:`fixup.METHODS` (``he``, ``xavier``, ``sqrt2``,
    ``batchnorm``, ``groupnorm``, ``layernorm``); ``base`` is unused (each draws its own)."""
    if method.init == "xavier":
        report = xavier_init_(model, generator=generator)
        report.method = method.name
    else:
        report = he_init_(model, generator=generator, method=method.name)
    if method.zero_init_last_norm:
        report.zeroed.extend(zero_last_norm_gains_(model))
    return report
