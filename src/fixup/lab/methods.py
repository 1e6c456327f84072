"""Build a registered model under a named initialisation method, reproducibly, for the laboratory.

Methods are named as in :data:`fixup.METHODS` (``fixup`` and its variants, ``he`` or ``none``, ``xavier``,
``lsuv``, ``sqrt2``, ``batchnorm``, ``groupnorm``; short forms ``bn``, ``gn``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..init import data_init_
from ..method import METHODS, as_method
from ..models import create_model

__all__ = ["METHODS", "build_model", "model_factory", "sample_batch"]
ALIASES = {"resnet": "resnet_cifar"}


def build_model(name: str, method: str = "fixup", *, seed: int = 0, data: torch.Tensor | None = None,
                **kwargs: Any) -> nn.Module:
    """``create_model(name, method=method, **kwargs)``, drawn from ``seed``.

    A data-dependent method (``lsuv``) is finished on ``data`` with :func:`fixup.init.data_init_`;
    without data it raises. The global random state is left as it was.
    """
    name = ALIASES.get(name, name)
    resolved = as_method(method)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create_model(name, method=resolved, generator=torch.Generator().manual_seed(seed), **kwargs)
        if resolved.needs_data:
            if data is None:
                raise ValueError(f"method {method!r} initialises from data; pass data=<an input batch>")
            data_init_(model, data)
    return model


def model_factory(name: str, method: str = "fixup", *, seed: int = 0, **kwargs: Any) -> Callable[[int], nn.Module]:
    """``depth -> build_model(name, method, depth=depth, ...)``, for :func:`fixup.lab.update.depth_sweep`."""
    return lambda depth: build_model(name, method, seed=seed, depth=depth, **kwargs)


def sample_batch(batch: int = 8, size: int = 8, channels: int = 3, num_classes: int = 10,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed Gaussian image batch (batch, channels, size, size) and labels ``arange(batch) % num_classes``.

    The labels cycle through the classes so that, with ``batch >= num_classes``, every class is present
    (a class absent from the batch gives its classifier row the same first gradient as every other
    absent class).
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, size, size, generator=gen)
    return x, torch.arange(batch) % num_classes
