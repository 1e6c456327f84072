"""Private training (DP-SGD) with Opacus: what a fixup-lab model needs to give per-example gradients.

Without normalisation nothing couples the examples of a batch, which is what DP-SGD (Abadi et al. 2016) needs:
each example's gradient is clipped and noised on its own. Opacus computes those gradients from hooks on every
module that holds parameters: a forward hook keeps the module's input, a full backward hook receives the
gradient of its output, and a grad sampler (or ``torch.func``, its "functorch" mode) turns both into one
gradient per example. Four things break that, and this package mends them:

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
- a module registered twice (a block's ``projection``, also ``shortcut[0]``): Opacus hooks it twice, counting its
  per-example gradients twice; :func:`prepare` calls the second registration by reference (:class:`SharedModule`);
- a parameter module Opacus has no grad sampler for: :func:`register_grad_samplers` gives Fixup's scalars
  (:class:`~fixup.nn.Bias`, :class:`~fixup.nn.Scale`, :class:`~fixup.nn.Gate`), NF-ResNets'
  :class:`~fixup.nn.ScaledStdConv2d` and Dynamic Tanh's :class:`~fixup.nn.DyT` exact per-example formulas;
  everything else with parameters (a fused norm's bias with its activation) goes to Opacus's functorch fallback,
  which is exact for them.

Wrappers keep the model's ``state_dict`` keys (the wrapped module's entries appear under its own path), so a
checkpoint loads into the model before and after :func:`prepare`. Opacus is imported only by
:func:`register_grad_samplers` and :func:`make_private` (the ``dp`` extra); the rest needs torch alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import Bias, DyT, Gate, Scale, ScaledStdConv2d
from ._inplace import inplace_producers
from ._modules import (
    FreshOutput,
    LayerScalars,
    SharedModule,
    direct_params,
    move_scalars,
    replace,
    repoint_shared,
    share_aliases,
)

__all__ = ["FreshOutput", "LayerScalars", "PrivateReport", "SharedModule", "make_private", "prepare",
           "register_grad_samplers"]


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
        elif direct_params(m) and type(m) not in _SAMPLED and any(True for _ in m.buffers()):
            # Opacus's functorch fallback takes the module whole (its children too) and refuses any buffer in it.
            problems.append(f"{label} holds buffers ({', '.join(n for n, _ in m.named_buffers())}), "
                            "which Opacus's functorch fallback (this module's per-example gradients computed whole) "
                            "refuses; move them out of it, or, for a folded model (ShiftedConv2d: inference only), "
                            "train the unfolded one")
    return problems


# Parameter modules with buffers that Opacus samples by its own formulas (functorch is not asked).
_SAMPLED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding, nn.LayerNorm, nn.GroupNorm,
            nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


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
    shared = share_aliases(model)
    problems = _static_problems(model)  # named by their paths before any wrapper
    report = PrivateReport(shared=shared, moved=move_scalars(model), problems=problems)
    repoint_shared(model)
    if example is not None:
        report.checked_inplace = True
        for name in inplace_producers(model, _as_inputs(example)):
            module = model.get_submodule(name)
            if isinstance(module, SharedModule):  # wrap the first registration, which both paths then call
                name, module = module.first, model.get_submodule(module.first)
            if isinstance(module, FreshOutput):
                continue
            replace(model, name, FreshOutput(module))
            report.fresh.append(name)
        repoint_shared(model)
        left = inplace_producers(model, _as_inputs(example)) if report.fresh else []
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


def _dyt_grad_sample(layer: DyT, activations: list[Tensor], backprops: Tensor) -> dict[nn.Parameter, Tensor]:
    """``w * tanh(a x) + b``, channels along ``layer.dim``: each example's gradient of ``b`` is its output gradient g
    summed over every other dimension, of ``w`` the same sum of g * tanh(a x), of ``a`` the sum over everything of
    g * w * x * (1 - tanh(a x)^2)."""
    x = activations[0].to(backprops.dtype)
    n, dim = x.shape[0], layer.dim % x.dim()
    if dim == 0:
        raise ValueError("a DyT over the batch dimension (dim 0) has no per-example gradients; put its channels on "
                         "another dimension")
    t = torch.tanh(layer.alpha.detach().to(x.dtype) * x)

    def per_channel(v: Tensor) -> Tensor:  # (n, ..., C, ...) -> (n, C)
        return v.movedim(dim, -1).reshape(n, -1, v.shape[dim]).sum(1)

    out: dict[nn.Parameter, Tensor] = {}
    if layer.bias.requires_grad:
        out[layer.bias] = per_channel(backprops).to(layer.bias.dtype)
    if layer.weight.requires_grad:
        out[layer.weight] = per_channel(backprops * t).to(layer.weight.dtype)
    if layer.alpha.requires_grad:
        shape = [1] * x.dim()
        shape[dim] = -1
        w = layer.weight.detach().to(x.dtype).view(shape)
        out[layer.alpha] = (backprops * w * x * (1 - t * t)).reshape(n, -1).sum(1, keepdim=True).to(layer.alpha.dtype)
    return out


def _std_conv_grad_sample(layer: ScaledStdConv2d, activations: list[Tensor],
                          backprops: Tensor) -> dict[nn.Parameter, Tensor]:
    """A weight-standardised convolution: each example's gradient of the weight it applies (an unfolded
    product, as for any convolution), carried back through the standardisation to the raw weight and the gain in
    closed form. Exact, and several times cheaper than Opacus's functorch fallback."""
    x = activations[0].to(backprops.dtype)
    n, groups = x.shape[0], layer.groups
    padding = layer.padding
    if layer.padding_mode != "zeros":  # reflect, replicate, circular: pad first, as the module does
        x, padding = F.pad(x, layer._reversed_padding_repeated_twice, mode=layer.padding_mode), 0
    elif padding == "valid":
        padding = 0
    elif isinstance(padding, str):
        raise ValueError(f"{type(layer).__name__} with padding={padding!r} has no per-example gradient formula here; "
                         "give its padding in pixels")
    cols = F.unfold(x, layer.kernel_size, dilation=layer.dilation, padding=padding, stride=layer.stride)
    cols = cols.reshape(n, groups, -1, cols.shape[-1])                          # (n, g, C/g * k * k, L)
    grads = backprops.reshape(n, groups, layer.out_channels // groups, -1)      # (n, g, O/g, L)
    applied = torch.einsum("ngol,ngpl->ngop", grads, cols).reshape(n, *layer.weight.shape)
    # W_applied = gain * u with u = (w - mean) * r, r = 1 / sqrt(max(N var, eps)) per row of N fan-in weights. With
    # G an example's gradient of W_applied: d gain = sum_row G u, and d w = gain r (G - mean_row G - u sum_row u G),
    # the last term absent where the floor eps holds (r is then a constant). Computed on (n, out, N) views, in place.
    w = layer.weight.detach().to(applied.dtype).flatten(1)                     # (out, N)
    var, mean = torch.var_mean(w, dim=1, correction=0, keepdim=True)
    spread = var * w.shape[1]
    r = torch.rsqrt(torch.clamp(spread, min=layer.eps))
    u = (w - mean) * r
    g = applied.flatten(2)                                                     # (n, out, N)
    along_u = torch.einsum("nop,op->no", g, u)                                 # sum_row u G, per example
    out: dict[nn.Parameter, Tensor] = {}
    if layer.gain.requires_grad:
        out[layer.gain] = along_u.reshape(n, *layer.gain.shape).to(layer.gain.dtype)
    if layer.weight.requires_grad:
        kept = torch.where(spread > layer.eps, u, 0.0)
        g.sub_(g.mean(dim=2, keepdim=True)).sub_(along_u.unsqueeze(2) * kept)
        g.mul_(layer.gain.detach().to(g.dtype).reshape(1, -1, 1) * r.reshape(1, -1, 1))
        out[layer.weight] = g.reshape(n, *layer.weight.shape).to(layer.weight.dtype)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = backprops.reshape(n, layer.out_channels, -1).sum(-1).to(layer.bias.dtype)
    return out


def register_grad_samplers() -> None:
    """Register the per-example gradients of Fixup's scalars with Opacus (needs the ``dp`` extra). Idempotent.

    Opacus matches a module's exact type, so each of :class:`Bias`, :class:`Scale`, :class:`Gate`,
    :class:`ScaledStdConv2d` and :class:`DyT` is named;
    subclasses with more inside (adapt's fused norm bias with its activation) go to Opacus's functorch fallback.
    """
    try:
        from opacus.grad_sample import register_grad_sampler
    except ImportError as err:
        raise ImportError("private training needs Opacus: pip install 'fixup-lab[dp]' (or pip install opacus)") \
            from err
    register_grad_sampler(Bias)(_bias_grad_sample)
    register_grad_sampler([Scale, Gate])(_scale_grad_sample)
    register_grad_sampler(ScaledStdConv2d)(_std_conv_grad_sample)
    register_grad_sampler(DyT)(_dyt_grad_sample)


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
