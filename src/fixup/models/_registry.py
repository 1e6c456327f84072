"""The model registry: ``@register_model`` builders, ``create_model`` and ``list_models``."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

__all__ = ["create_model", "list_models", "register_model"]

Builder = TypeVar("Builder", bound=Callable[..., nn.Module])
_MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(fn: Builder) -> Builder:
    """Register a builder under its function name; a name registered twice is an error."""
    name = fn.__name__
    if name in _MODELS:
        raise ValueError(f"a model named {name!r} is already registered ({_MODELS[name].__module__}); "
                         "pick another builder name")
    _MODELS[name] = fn
    return fn


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style ``pattern``, sorted."""
    return sorted(n for n in _MODELS if fnmatch.fnmatchcase(n, pattern))


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """Build a registered model; ``kwargs`` (``norm=``, ``init=``, ``num_classes=``, ...) go to its builder."""
    if name not in _MODELS:
        close = difflib.get_close_matches(name, _MODELS, n=5, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}.{hint} fixup.list_models() lists all {len(_MODELS)}.")
    return _MODELS[name](**kwargs)
