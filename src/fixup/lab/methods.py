"""Build a registered model under a named initialisation method, reproducibly, for the laboratory.

A method is a (norm, init) pair of :func:`fixup.create_model`, named as in :mod:`fixup.baselines`:
``fixup`` (the rule) and its ablations (``fixup_no_depth_scale``, the paper's "essential" one, ...),
``none`` or ``he`` (He initialisation, no normalisation), ``xavier``, ``lsuv``, ``sqrt2`` (1/sqrt(2)
residual rescaling), and the normalised baselines by their norm (``batchnorm``, ``groupnorm``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..baselines import METHODS as BASELINE_METHODS
from ..baselines import data_init_
from ..models import create_model

__all__ = ["METHODS", "build_model", "model_factory", "sample_batch"]


def _methods() -> dict[str, tuple[str, str | None]]:
    """method name -> (norm, init) of create_model, from the methods :mod:`fixup.baselines` defines."""
    table: dict[str, tuple[str, str | None]] = {}
    for norm, inits in BASELINE_METHODS.items():
        for init in inits:
            table[init if norm in ("fixup", "none") else norm] = (norm, init)
    table["none"] = ("none", "he")
    return table


# method -> (norm, init): fixup and its ablations by init name (fixup_no_depth_scale, ...), the
# unnormalised baselines by init name (he = none, xavier, lsuv, sqrt2), the normalised ones by norm.
METHODS: dict[str, tuple[str, str | None]] = _methods()
ALIASES = {"resnet": "resnet_cifar", "bn": "batchnorm", "gn": "groupnorm"}


def build_model(name: str, method: str = "fixup", *, seed: int = 0, data: torch.Tensor | None = None,
                **kwargs: Any) -> nn.Module:
    """``create_model(name, norm=..., init=..., **kwargs)`` for ``method``, drawn from ``seed``.

    A data-dependent method (``lsuv``) is finished on ``data`` with :func:`fixup.baselines.data_init_`;
    without data it raises. The global random state is left as it was.
    """
    name = ALIASES.get(name, name)
    method = ALIASES.get(method, method)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose among {', '.join(METHODS)}")
    norm, init = METHODS[method]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create_model(name, norm=norm, init=init, generator=torch.Generator().manual_seed(seed), **kwargs)
        if getattr(model, "pending_data_init", None):
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
