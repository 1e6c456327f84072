"""Let torchvision's pure-Python part import beside the CPU build of torch, so that timm's model code can run.

Why this exists: timm imports torchvision (``timm/layers/_fx.py`` imports its feature extraction,
``timm/layers/create_norm.py`` its ``FrozenBatchNorm2d``). The torchvision release for torch 2.13 (0.28) is
served here only as a CUDA build, installed with ``pip install --no-deps`` so that pip keeps the CPU torch.
Its compiled operators (``torchvision::nms``, ``roi_align``, ...) then fail to load, which torchvision
tolerates everywhere but in one place: ``torchvision/_meta_registrations.py`` registers fake kernels for
``torchvision::nms`` and ``torchvision::qnms`` unconditionally, and ``torch.library.register_fake`` raises
"operator torchvision::nms does not exist". ``install()`` makes that registration a no-op for
``torchvision::`` operators that do not exist, and for nothing else. The model code of timm and torchvision
(convolutions, norms, pooling) never calls those operators; detection ops (``torchvision.ops.nms``) stay
unusable, as they would be without the shim.

Remove this file once a CPU build of torchvision is installable beside the CPU torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.library

_NAMESPACE = "torchvision::"


def _operator_exists(qualname: str) -> bool:
    name, _, overload = qualname.partition(".")
    try:
        torch._C._dispatch_find_schema_or_throw(name, overload)
    except RuntimeError:
        return False
    return True


def install() -> None:
    """Make ``torch.library.register_fake`` skip missing ``torchvision::`` operators; idempotent."""
    register_fake = getattr(torch.library, "register_fake", None)  # torch < 2.4: torchvision does not call it
    if register_fake is None or getattr(register_fake, "_skips_missing_torchvision_ops", False):
        return

    @functools.wraps(register_fake)
    def skip_missing(op: object, func: Callable | None = None, /, **kwargs: object) -> object:
        if isinstance(op, str) and op.startswith(_NAMESPACE) and not _operator_exists(op):
            return func if func is not None else (lambda fn: fn)
        return register_fake(op, func, **kwargs)

    skip_missing._skips_missing_torchvision_ops = True  # type: ignore[attr-defined]
    torch.library.register_fake = skip_missing
