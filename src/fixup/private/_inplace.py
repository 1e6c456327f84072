"""Which modules' outputs a model changes in place, found by one forward pass with the hooks Opacus adds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ._modules import direct_params

__all__ = ["inplace_producers"]

_INPLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
                    "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__setitem__"}


def _inplace(func: Callable, kwargs: dict[str, Any]) -> bool:
    name = getattr(func, "__name__", "")
    return name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__")) or \
        kwargs.get("inplace") is True


class _InplaceWatch(TorchFunctionMode):
    """Records which hooked outputs are changed in place, and changes a copy instead so that the pass goes on."""

    def __init__(self, hooked: dict[int, Tensor]) -> None:
        super().__init__()
        self.hooked, self.hits = hooked, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and isinstance(args[0], Tensor) and _inplace(func, kwargs) and args[0]._is_view():
            base = args[0]._base
            if base is not None and self.hooked.get(id(base)) is base:
                self.hits.append(args[0])
                args = (args[0].clone(), *args[1:])
        return func(*args, **kwargs)


def inplace_producers(model: nn.Module, example: tuple[Any, ...]) -> list[str]:
    """The modules whose output, under Opacus's hooks, the code after them changes in place: for each such
    output the outermost module that returned it."""
    hooked: dict[int, Tensor] = {}   # a hooked module's output, by id (kept alive: ids are not reused)
    returned: dict[int, list[str]] = {}  # a tensor's id -> the modules that returned it, innermost first
    keep: list[Tensor] = []
    handles = []

    def record(name: str, param_module: bool) -> Callable:
        def hook(module: nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, Tensor):
                keep.append(out)
                returned.setdefault(id(out), []).append(name)
                if param_module:
                    hooked[id(out)] = out
        return hook

    for name, m in model.named_modules():
        if not name:
            continue
        params = direct_params(m)
        handles.append(m.register_forward_hook(record(name, params)))
        if params:  # as Opacus: a full backward hook makes the output a view
            handles.append(m.register_full_backward_hook(lambda *a: None))
    watch = _InplaceWatch(hooked)
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), watch:
            model(*example)
    finally:
        for h in handles:
            h.remove()
    producers = []
    for t in watch.hits:
        names = returned.get(id(t), []) or returned.get(id(t._base), [])
        # The outermost module returning the view itself, else the hooked module that made it.
        outer = names[-1] if names else None
        if outer is not None and outer not in producers:
            producers.append(outer)
    return producers
