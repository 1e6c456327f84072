"""What each claim row states about its setting: the model run, steps, per-example rate and scalars.

Helpers the image studies share to build a :class:`fixup.studies.claims.Protocol`, and the labels of
the models as the report names them.
"""

from __future__ import annotations

import math

from ..groups import SCALAR_LR_MULT
from ._common import TRAIN_SIZE
from .claims import Protocol
from .grid import Grid

__all__ = ["image_protocol", "model_label", "scalars_text", "steps"]

_NAMES = {"resnet_cifar": "ResNet", "wide_resnet": "Wide-ResNet", "resnet_imagenet": "ResNet"}


def model_label(model: str, depth: int | str, width: int | None = None) -> str:
    """``ResNet-32``, ``Wide-ResNet-1000 width 1`` (the registered builder in brackets)."""
    name = _NAMES.get(model, model)
    w = f" width {width}" if width else ""
    return f"{name}-{depth}{w} ({model})"


def steps(grid: Grid, batch: int, epochs: float, *, data: str | None = None) -> int:
    """Optimiser steps of an image cell: epochs x ceil(training examples / batch) (``data``: default the grid's)."""
    return int(epochs * math.ceil(TRAIN_SIZE.get(data or grid.data, 50_000) / batch))


def scalars_text(mult: float) -> str:
    """How Fixup's scalar biases and multipliers were trained, from their lr multiplier."""
    if mult == 0:
        return "held fixed (not trained)"
    if mult == 1:
        return "trained at the full rate"
    return f"trained at {mult:g}x the rate (stream biases sharing one scalar's rate)"


def image_protocol(grid: Grid, *, model: str, paper_model: str, batch: int, epochs: float, lr: float,
                   scalar_lr_mult: float | None = SCALAR_LR_MULT, n: int | None = None) -> Protocol:
    return Protocol(model=model, paper_model=paper_model, data=grid.describe_data(),
                    steps=steps(grid, batch, epochs), n=grid.seeds if n is None else n, lr=lr, batch=batch,
                    scalars="" if scalar_lr_mult is None else scalars_text(scalar_lr_mult))
