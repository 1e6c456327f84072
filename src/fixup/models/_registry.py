"""The model registry: ``@register_model`` builders, ``create_model`` and ``list_models``."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from ..method import Method, as_method, resolve_method

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


def create_model(name: str, *, norm: str | None = None, init: str | None = None, method: Method | str | None = None,
                 zero_init_last_norm: bool = False, **kwargs: Any) -> nn.Module:
    """Build a registered model, initialised for its method; ``kwargs`` (``num_classes=``, ``depth=``,
    ``generator=``, ...) go to its builder.

    The method is resolved here, once: from ``norm`` (default ``"fixup"``) and ``init`` (the ablation or
    baseline; default: the norm's own; ``init`` alone may name any method, ``init="rezero"``), or given whole
    as ``method`` (a :class:`fixup.Method` or a name of :data:`fixup.METHODS`). The model's constructor builds
    its scalars from it and initialises itself;
    ``model.init_report`` says what it did.
    """
    if name not in _MODELS:
        close = difflib.get_close_matches(name, _MODELS, n=5, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}.{hint} fixup.list_models() lists all {len(_MODELS)}.")
    if method is None:
        resolved = resolve_method(norm, init, zero_init_last_norm=zero_init_last_norm)
    elif norm is not None or init:
        raise ValueError(f"give either method= or norm=/init=, not both (got method={method!r}, norm={norm!r}, "
                         f"init={init!r})")
    else:
        resolved = as_method(method)
    return _MODELS[name](method=resolved, **kwargs)
