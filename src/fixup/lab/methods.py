"""Build a registered model under a named initialisation method, reproducibly, for the laboratory.

A method is a (norm, init) pair of :func:`fixup.create_model`: ``fixup`` (the rule), ``fixup_no_depth_scale``
(the rule without rule 2's factor, the paper's "essential" ablation), ``none`` (He initialisation, no
normalisation), ``batchnorm``, ``groupnorm`` and the baselines ``sqrt2`` (1/sqrt(2) residual rescaling)
and ``lsuv`` where the models provide them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..init import fixup_init_
from ..models import create_model

__all__ = ["METHODS", "build_model", "model_factory", "sample_batch"]

# method -> (norm, init) for create_model
METHODS: dict[str, tuple[str, str | None]] = {
    "fixup": ("fixup", None),
    "fixup_no_depth_scale": ("fixup", "fixup_no_depth_scale"),
    "none": ("none", None),
    "batchnorm": ("batchnorm", None),
    "groupnorm": ("groupnorm", None),
    "sqrt2": ("none", "sqrt2"),
    "lsuv": ("none", "lsuv"),
}
ALIASES = {"resnet": "resnet_cifar", "he": "none", "bn": "batchnorm", "gn": "groupnorm"}


def build_model(name: str, method: str = "fixup", *, seed: int = 0, **kwargs: Any) -> nn.Module:
    """``create_model(name, norm=..., init=..., **kwargs)`` for ``method``, drawn from ``seed``.

    The global random state is left as it was (the draw happens inside ``torch.random.fork_rng``).
    """
    name = ALIASES.get(name, name)
    method = ALIASES.get(method, method)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose among {', '.join(METHODS)}")
    norm, init = METHODS[method]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        opts = {"norm": norm, **kwargs}
        if norm == "fixup":
            opts["generator"] = gen
        if init is None:
            return create_model(name, **opts)
        try:
            return create_model(name, init=init, **opts)
        except ValueError:
            if method != "fixup_no_depth_scale":
                raise
        # Models that do not yet know the init name: apply the ablation directly.
        model = create_model(name, **opts)
        model.init_report = fixup_init_(model, depth_scaling=False, generator=gen)
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
