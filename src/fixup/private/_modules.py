"""The modules :func:`fixup.private.prepare` puts in a model, and where it puts them.

Each is parameter-free, so Opacus hooks what it holds, never the wrapper; each keeps the model's ``state_dict`` keys.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from .._adapt._modules import bias_inputs, bias_output, scale_output
from ..nn import inplace_safe

__all__ = ["FreshOutput", "LayerScalars", "SharedModule", "direct_params", "move_scalars", "replace",
           "repoint_shared", "share_aliases"]

_WRAPPED = "module"  # the child name of the module a wrapper holds; hidden from state_dict keys


class _Wrapper(nn.Module):
    """A parameter-free module around ``module`` whose ``state_dict`` keys are those of ``module`` itself, and
    whose unknown attributes are ``module``'s (third-party code may read e.g. ``conv.out_channels``)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.add_module(_WRAPPED, module)
        self._register_state_dict_hook(_unwrap_keys)
        self._register_load_state_dict_pre_hook(_wrap_keys, with_module=True)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get(_WRAPPED)
            if inner is None:
                raise
            return getattr(inner, name)


def _unwrap_keys(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    inner = prefix + _WRAPPED + "."
    for key in [k for k in state if k.startswith(inner)]:
        state[prefix + key[len(inner):]] = state.pop(key)


def _wrap_keys(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
    own = {prefix + name for name in module._modules if name != _WRAPPED}
    for key in [k for k in state if k.startswith(prefix) and not any(k.startswith(o + ".") for o in own)]:
        if not key.startswith(prefix + _WRAPPED + "."):
            state[prefix + _WRAPPED + "." + key[len(prefix):]] = state.pop(key)


class FreshOutput(_Wrapper):
    """``module``, returning a fresh tensor where its output is a view: the output of a module under a full
    backward hook, which the code after it changes in place. Without hooks the output passes unchanged (no copy)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self._modules[_WRAPPED](*args, **kwargs)
        return out.clone() if isinstance(out, Tensor) and not inplace_safe(out) else out


class LayerScalars(_Wrapper):
    """A weight layer with ``fixup.adapt``'s scalars called around it rather than by hooks on it.

    ``pre`` are the layer's input hooks (``bias_inputs``), ``post`` its output hooks (``scale_output``,
    ``bias_output``), in their order, called with this module, which holds their scalar modules under the same
    names (``fixup_bias``, ``fixup_scale``, ``fixup_out_bias``). The layer itself then sees only its own input and
    output, as a grad sampler assumes.
    """

    def __init__(self, module: nn.Module, pre: list[Callable], post: list[Callable],
                 scalars: dict[str, nn.Module]) -> None:
        super().__init__(module)
        for name, scalar in scalars.items():
            self.add_module(name, scalar)
        self.pre, self.post = list(pre), list(post)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        for hook in self.pre:
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        out = self._modules[_WRAPPED](*args, **kwargs)
        for hook in self.post:
            result = hook(self, args, out)
            if result is not None:
                out = result
        return out


class SharedModule(nn.Module):
    """A second registration of a module the model also holds elsewhere (a block's ``projection`` inside its
    ``shortcut``): it calls that module without registering it again, so that Opacus hooks it once (twice, its
    per-example gradients would count twice, and functorch mode would copy the first hooks). Its ``state_dict``
    entries stay under this path too, and are loaded through the first registration."""

    def __init__(self, target: nn.Module, first: str) -> None:
        super().__init__()
        self.__dict__["target"] = target  # not a submodule
        self.first = first
        self._register_state_dict_hook(_shared_keys)
        self._register_load_state_dict_pre_hook(_drop_shared_keys, with_module=True)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.target(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"the module at {self.first!r}"


def _shared_keys(module: SharedModule, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    state.update({prefix + k: v for k, v in module.target.state_dict().items()})


def _drop_shared_keys(module: SharedModule, state: dict[str, Any], prefix: str, *args: Any) -> None:
    for key in [k for k in state if k.startswith(prefix)]:
        del state[key]


def direct_params(m: nn.Module) -> bool:
    return any(p.requires_grad for p in m.parameters(recurse=False))


# --- modules registered twice ---

def share_aliases(model: nn.Module) -> list[str]:
    first: dict[int, str] = {}
    shared: list[str] = []
    for name, m in list(model.named_modules(remove_duplicate=False)):
        if not name or any(name.startswith(s + ".") for s in shared):
            continue
        if id(m) in first and not isinstance(m, SharedModule) and any(p.requires_grad for p in m.parameters()):
            replace(model, name, SharedModule(m, first[id(m)]))
            shared.append(name)
        else:
            first.setdefault(id(m), name)
    return shared


def repoint_shared(model: nn.Module) -> None:
    """Point every :class:`SharedModule` at what its first registration's path holds now (a wrapper, if one was
    put there), so that both registrations compute the same."""
    for m in model.modules():
        if isinstance(m, SharedModule):
            m.__dict__["target"] = model.get_submodule(m.first)


# --- adapt's hooks into wrappers ---

def _adapt_hook(fn: Callable) -> str | None:
    """Which of ``fixup.adapt``'s hooks ``fn`` is, or None."""
    if isinstance(fn, functools.partial) and fn.func is bias_inputs:
        return "pre"
    if fn is bias_output or fn is scale_output:
        return "post"
    return None


def _scalar_names(fn: Callable) -> list[str]:
    if isinstance(fn, functools.partial):
        return list(dict.fromkeys(fn.args[0].values()))
    return ["fixup_out_bias"] if fn is bias_output else ["fixup_scale"]


def _take_hooks(layer: nn.Module) -> tuple[list[Callable], list[Callable]]:
    """Remove ``fixup.adapt``'s hooks from ``layer``; return them (input hooks, output hooks) in order."""
    pre, post = [], []
    for hooks, out in ((layer._forward_pre_hooks, pre), (layer._forward_hooks, post)):
        for key, fn in list(hooks.items()):
            if _adapt_hook(fn) is not None:
                out.append(fn)
                del hooks[key]
                for extra in ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                              "_forward_hooks_always_called"):
                    getattr(layer, extra, {}).pop(key, None)
    return pre, post


def replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def move_scalars(model: nn.Module) -> list[str]:
    moved = []
    for name, layer in list(model.named_modules()):
        if not name or isinstance(layer, _Wrapper) or not direct_params(layer):
            continue
        if not any(_adapt_hook(fn) for fn in (*layer._forward_pre_hooks.values(), *layer._forward_hooks.values())):
            continue
        pre, post = _take_hooks(layer)
        names = [n for fn in (*pre, *post) for n in _scalar_names(fn)]
        scalars = {n: layer._modules.pop(n) for n in dict.fromkeys(names) if n in layer._modules}
        replace(model, name, LayerScalars(layer, pre, post, scalars))
        moved.append(name)
    return moved
