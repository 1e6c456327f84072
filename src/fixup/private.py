"""Private training (DP-SGD) with Opacus: what a fixup-lab model needs to give per-example gradients.

Without normalisation nothing couples the examples of a batch, which is what DP-SGD (Abadi et al. 2016) needs:
each example's gradient is clipped and noised on its own. Opacus computes those gradients from hooks on every
module that holds parameters: a forward hook keeps the module's input, a full backward hook receives the
gradient of its output, and a grad sampler (or ``torch.func``, its "functorch" mode) turns both into one
gradient per example. Three things break that, and this module mends them:

- an in-place change of a hooked module's output (timm's ``x += shortcut``, ``ReLU(inplace=True)``): the full
  backward hook returns the output as a view that autograd refuses to change in place. Our own models compute
  out of place where the input is such a view (:class:`fixup.nn.InplaceReLU`, the lean forwards step aside
  under hooks); for a model written elsewhere :func:`prepare` finds, by one forward pass with the hooks Opacus
  would add, every module whose output is changed in place, and wraps it (:class:`FreshOutput`) so that it
  returns a copy under hooks only;
- ``fixup.adapt``'s scalars applied by hooks on a weight layer: a multiplier applied by a forward hook is
  inside the layer's output as the backward hook sees it, so the layer's per-example gradients would miss the
  factor, and in functorch mode the input's scalar bias would be added twice. :func:`prepare` moves them into a
  wrapper around the layer (:class:`LayerScalars`) that calls the same scalar modules around it;
- a parameter module Opacus has no grad sampler for: :func:`register_grad_samplers` gives Fixup's scalars
  (:class:`~fixup.nn.Bias`, :class:`~fixup.nn.Scale`, :class:`~fixup.nn.Gate`) exact per-example formulas;
  everything else with parameters (NF-ResNets' ``ScaledStdConv2d``, a fused norm's bias with its activation)
  goes to Opacus's functorch fallback, which is exact for them.

Wrappers keep the model's ``state_dict`` keys (the wrapped module's entries appear under its own path), so a
checkpoint loads into the model before and after :func:`prepare`. Opacus is imported only by
:func:`register_grad_samplers` and :func:`make_private` (the ``dp`` extra); the rest needs torch alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ._adapt._modules import bias_inputs, bias_output, scale_output
from .nn import Bias, Gate, Scale, inplace_safe

__all__ = ["FreshOutput", "LayerScalars", "PrivateReport", "SharedModule", "make_private", "prepare",
           "register_grad_samplers"]

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


@dataclass
class PrivateReport:
    """What :func:`prepare` changed, and what still stands in the way of private training."""

    shared: list[str] = field(default_factory=list)     # second registrations of a module: SharedModule
    moved: list[str] = field(default_factory=list)      # layers whose adapt scalars now sit in a LayerScalars
    fresh: list[str] = field(default_factory=list)      # modules whose output is changed in place: FreshOutput
    problems: list[str] = field(default_factory=list)   # what Opacus cannot take, with the fix
    checked_inplace: bool = False                       # whether a forward pass looked for in-place changes

    @property
    def ready(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "shared": list(self.shared), "moved": list(self.moved), "fresh": list(self.fresh),
                "problems": list(self.problems), "checked_inplace": self.checked_inplace}

    def summary(self) -> str:
        """One line: ready for private training (Opacus), or why not."""
        if self.problems:
            return "not ready for private training (Opacus): " + "; ".join(self.problems)
        done = [f"{len(self.shared)} modules registered twice now called once by reference" if self.shared else "",
                f"{len(self.moved)} layers' scalars out of hooks" if self.moved else "",
                f"{len(self.fresh)} outputs changed in place copied under hooks" if self.fresh else ""]
        done = [d for d in done if d]
        how = "" if self.checked_inplace else " (in-place changes not checked: no example input)"
        return "ready for private training (Opacus)" + (f": {', '.join(done)}" if done else "") + how

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  registered twice: {name}" for name in self.shared]
        lines += [f"  scalars out of hooks: {name}" for name in self.moved]
        lines += [f"  copied under hooks: {name}" for name in self.fresh]
        return "\n".join(lines)


# --- what Opacus cannot take ---

def _static_problems(model: nn.Module) -> list[str]:
    problems = []
    for name, m in model.named_modules():
        label = f"{name or 'the model'} ({type(m).__name__})"
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)) and \
                (m.track_running_stats or isinstance(m, nn.modules.batchnorm._BatchNorm)):
            problems.append(f"{label} mixes the examples of a batch; remove normalisation (fixup.adapt) or use "
                            "GroupNorm")
        elif isinstance(m, nn.MultiheadAttention):
            problems.append(f"{label} has no per-example gradients in Opacus; replace it with "
                            "opacus.layers.DPMultiheadAttention (opacus.validators.ModuleValidator.fix)")
        elif _direct_params(m) and any(True for _ in m.buffers(recurse=False)) and type(m) not in _SAMPLED:
            problems.append(f"{label} holds buffers ({', '.join(n for n, _ in m.named_buffers(recurse=False))}), "
                            "which Opacus's functorch fallback refuses; a folded model is for inference only: "
                            "train the unfolded one")
    return problems


# Parameter modules with buffers that Opacus samples by its own formulas (functorch is not asked).
_SAMPLED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding, nn.LayerNorm, nn.GroupNorm,
            nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


def _direct_params(m: nn.Module) -> bool:
    return any(p.requires_grad for p in m.parameters(recurse=False))


# --- modules registered twice ---

def _share_aliases(model: nn.Module) -> list[str]:
    first: dict[int, str] = {}
    shared: list[str] = []
    for name, m in list(model.named_modules(remove_duplicate=False)):
        if not name or any(name.startswith(s + ".") for s in shared):
            continue
        if id(m) in first and not isinstance(m, SharedModule) and any(p.requires_grad for p in m.parameters()):
            _replace(model, name, SharedModule(m, first[id(m)]))
            shared.append(name)
        else:
            first.setdefault(id(m), name)
    return shared


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


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _move_scalars(model: nn.Module) -> list[str]:
    moved = []
    for name, layer in list(model.named_modules()):
        if not name or isinstance(layer, _Wrapper) or not _direct_params(layer):
            continue
        if not any(_adapt_hook(fn) for fn in (*layer._forward_pre_hooks.values(), *layer._forward_hooks.values())):
            continue
        pre, post = _take_hooks(layer)
        names = [n for fn in (*pre, *post) for n in _scalar_names(fn)]
        scalars = {n: layer._modules.pop(n) for n in dict.fromkeys(names) if n in layer._modules}
        _replace(model, name, LayerScalars(layer, pre, post, scalars))
        moved.append(name)
    return moved


# --- in-place changes of hooked outputs ---

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


def _inplace_producers(model: nn.Module, example: tuple[Any, ...]) -> list[str]:
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
        params = _direct_params(m)
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


def _as_inputs(example: Any) -> tuple[Any, ...]:
    return example if isinstance(example, tuple) else (example,)


def prepare(model: nn.Module, example: Any = None) -> PrivateReport:
    """Make ``model`` ready for Opacus, in place (its parameters stay the same objects); return what changed.

    Calls a module registered twice through one registration (:class:`SharedModule`), moves ``fixup.adapt``'s
    scalars off the weight layers' hooks (:class:`LayerScalars`), and, given an ``example`` input (a tensor or a
    tuple of positional inputs, a small batch), runs it once with the hooks Opacus adds and wraps every module
    whose output the code after it changes in place (:class:`FreshOutput`).
    What Opacus still cannot take (normalisation that mixes examples, ``nn.MultiheadAttention``, a parameter
    module with buffers) is listed in the report's ``problems``; nothing is changed for those. Calling it again
    changes nothing more. The model's ``state_dict`` keys are kept.
    """
    shared = _share_aliases(model)
    report = PrivateReport(shared=shared, moved=_move_scalars(model), problems=_static_problems(model))
    if example is not None:
        report.checked_inplace = True
        for name in _inplace_producers(model, _as_inputs(example)):
            module = model.get_submodule(name)
            if isinstance(module, FreshOutput):
                continue
            _replace(model, name, FreshOutput(module))
            report.fresh.append(name)
        left = _inplace_producers(model, _as_inputs(example)) if report.fresh else []
        report.problems += [f"{name}: its output is still changed in place under hooks; compute the code after "
                            "it out of place" for name in left]
    return report


# --- Opacus ---

def _bias_grad_sample(layer: Bias, activations: list[Tensor], backprops: Tensor) -> dict[nn.Parameter, Tensor]:
    """``x + b``: each example's gradient of ``b`` is the sum of its output gradient, shape (B, 1)."""
    if not layer.bias.requires_grad:
        return {}
    per_example = backprops.reshape(backprops.shape[0], -1).sum(1, keepdim=True)
    return {layer.bias: per_example.to(layer.bias.dtype)}


def _scale_grad_sample(layer: Scale, activations: list[Tensor], backprops: Tensor) -> dict[nn.Parameter, Tensor]:
    """``s * x``: each example's gradient of ``s`` is the sum of its output gradient times its input, (B, 1)."""
    if not layer.scale.requires_grad:
        return {}
    x = activations[0].to(backprops.dtype)
    per_example = (x * backprops).reshape(backprops.shape[0], -1).sum(1, keepdim=True)
    return {layer.scale: per_example.to(layer.scale.dtype)}


def register_grad_samplers() -> None:
    """Register the per-example gradients of Fixup's scalars with Opacus (needs the ``dp`` extra). Idempotent.

    Opacus matches a module's exact type, so each of :class:`Bias`, :class:`Scale` and :class:`Gate` is named;
    subclasses with more inside (adapt's fused norm bias with its activation) go to Opacus's functorch fallback.
    """
    try:
        from opacus.grad_sample import register_grad_sampler
    except ImportError as err:
        raise ImportError("private training needs Opacus: pip install 'fixup-lab[dp]' (or pip install opacus)") \
            from err
    register_grad_sampler(Bias)(_bias_grad_sample)
    register_grad_sampler([Scale, Gate])(_scale_grad_sample)


def make_private(model: nn.Module, optimizer: torch.optim.Optimizer, data_loader: Iterable, *,
                 noise_multiplier: float, max_grad_norm: float, example: Any = None, engine: Any = None,
                 **opacus_kwargs: Any) -> tuple[nn.Module, Any, Any, Any, PrivateReport]:
    """:func:`prepare` ``model`` and hand it to Opacus's ``PrivacyEngine.make_private``.

    ``example``: an input for the in-place check (default: the inputs of the loader's first batch, the first
    element of a (inputs, targets) batch). ``engine``: a ``PrivacyEngine`` (default: a new one). Other keyword
    arguments go to ``make_private`` (``grad_sample_mode``, ``poisson_sampling``, ...). Returns
    ``(model, optimizer, data_loader, engine, report)``; raises ValueError naming every problem where the model
    is not ready.
    """
    register_grad_samplers()
    from opacus import PrivacyEngine

    if example is None:
        batch = next(iter(data_loader))
        example = batch[0] if isinstance(batch, (tuple, list)) else batch
    report = prepare(model, example)
    if not report.ready:
        raise ValueError("the model is not ready for private training: " + "; ".join(report.problems))
    engine = engine if engine is not None else PrivacyEngine()
    model, optimizer, data_loader = engine.make_private(module=model, optimizer=optimizer, data_loader=data_loader,
                                                        noise_multiplier=noise_multiplier,
                                                        max_grad_norm=max_grad_norm, **opacus_kwargs)
    return model, optimizer, data_loader, engine, report
