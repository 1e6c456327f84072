"""Pieces shared by the model builders: the normalisation choice and the initialisation step."""

from __future__ import annotations

from torch import nn

from ..init import fixup_init_
from ..report import FixupReport

__all__ = ["NORMS", "check_norm", "finish", "make_norm", "name_blocks"]

NORMS = ("fixup", "batchnorm", "groupnorm", "layernorm", "none")


def check_norm(norm: str, allowed: tuple[str, ...]) -> str:
    if norm not in allowed:
        raise ValueError(f"norm={norm!r} is not available for this model; choose one of {', '.join(allowed)}")
    return norm


def make_norm(norm: str, channels: int, groups: int = 16) -> nn.Module:
    """The normalisation layer after a convolution: BatchNorm, GroupNorm, or nothing."""
    if norm == "batchnorm":
        return nn.BatchNorm2d(channels)
    if norm == "groupnorm":
        return nn.GroupNorm(min(groups, channels), channels)
    return nn.Identity()


def name_blocks(model: nn.Module) -> None:
    """Tell every block its qualified name, so that shape errors in residual sums can name it."""
    for name, module in model.named_modules():
        if hasattr(module, "block_name"):
            module.block_name = name


def finish(model: nn.Module, norm: str, init: str | None, **init_kwargs) -> nn.Module:
    """Initialise a freshly built model for its method and attach ``model.init_report``.

    ``norm="fixup"`` applies :func:`fixup.fixup_init_`. Other norms get He initialisation of every
    convolution (fan_out, as torchvision's ResNet), normalisation gains 1 and shifts 0, and PyTorch's
    default for linear layers.
    """
    report: FixupReport | None = None
    if norm == "fixup":
        if init not in (None, "fixup"):
            raise ValueError(f"init={init!r} does not combine with norm='fixup'; use init=None")
        report = fixup_init_(model, **init_kwargs)
    else:
        if init not in (None, "he"):
            raise ValueError(f"init={init!r} does not combine with norm={norm!r}; use init='he'")
        for mod in model.modules():
            if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)
            elif isinstance(mod, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(mod.weight)
                nn.init.zeros_(mod.bias)
    model.init_report = report
    return model
