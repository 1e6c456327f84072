"""Adaptive gradient clipping (AGC) for any training loop: the authors' rule for NF-ResNets, ours for Fixup.

AGC (Brock, De, Smith & Simonyan 2021, "High-Performance Large-Scale Image Recognition Without
Normalization", section 4.1) clips each *unit* of a weight, not the whole gradient: with ``W_i`` and
``G_i`` the weights and gradient of unit ``i`` (one output row of a linear layer, one output filter of a
convolution; the whole tensor for a vector or a scalar, and a weight-standardised layer's per-channel gain is a
vector), ``G_i`` is multiplied by ``clipping * max(||W_i||, eps) / ||G_i||`` whenever the ratio
``||G_i|| / max(||W_i||, eps)`` exceeds ``clipping`` (the paper's lambda), and left as it is otherwise. The
floor ``eps = 1e-3`` is the paper's.

Which tensors it leaves out is the model's method's rule (``Method.agc_exempt``, :func:`agc_rule`):

- ``"classifier"`` (the NF-ResNets: the authors' released NFNet code): every tensor is clipped except the
  classifier's weight, which is left unclipped (their classifier's bias is clipped, with the gains and biases).
- ``"zero_started"`` (Fixup forms and any model without a method: ours). AGC bounds each step relative to the
  weight's own norm, so a tensor that starts at zero may move by at most ``clipping * eps`` per unit and step
  (1e-5 at lambda 0.01), and afterwards grows by a factor of about ``1 + lr * clipping`` per step: in practice
  it barely leaves zero. Fixup starts the last layer of every residual branch and the classifier at zero (rule
  1) and its scalar biases at zero (rule 3); under plain AGC its branches would stay switched off. So the
  tensors of :func:`agc_exempt` (the last layer of each declared branch, the declared classifier and every
  Fixup scalar) are taken out of AGC and their gradients clipped *together* to the global norm
  ``exempt_max_norm`` (the rule of ``torch.nn.utils.clip_grad_norm_``), so they learn and stay bounded.

The NF-ResNet's skip gain starts at zero too and is clipped by AGC, as in the authors' code: at a small learning
rate it opens slowly (measured in docs/methods.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .branch import WeightSlice, find_branches, find_classifier
from .groups import unwrap
from .method import model_method
from .nn import Bias, Scale, ScaledStdConv2d
from .report import FixupWarning

__all__ = ["AGC_CLIPPING", "AGC_EPS", "AGCStats", "adaptive_clip_grad_", "agc_exempt", "agc_rule", "unit_norms",
           "whole_units"]

AGC_CLIPPING = 0.01  # lambda: the ratio ||G_i|| / ||W_i|| a unit may reach (Brock et al. 2021, section 4.1)
AGC_EPS = 1e-3  # the floor of a unit's weight norm (Brock et al. 2021, section 4.1)


class AGCStats(NamedTuple):
    """What one call did (0-d tensors, so a loop on an accelerator need not wait for them)."""

    clipped_fraction: Tensor  # fraction of the clipped tensors' units whose gradient was scaled down
    exempt_norm: Tensor  # global gradient norm of the exempt tensors before clipping (0 when there are none)


def unit_norms(x: Tensor, whole: bool = False) -> Tensor:
    """The Euclidean norm of each unit of ``x``, shaped to broadcast against it (float32).

    A unit is a slice along dim 0 (an output row of ``nn.Linear``, an output filter of ``nn.Conv*``) for
    tensors of 2 or more dimensions, and the whole tensor for vectors and scalars, as in Brock et al.
    (2021); ``whole=True`` makes the whole tensor one unit whatever its shape (a weight-standardised layer's
    gain, stored as ``(C, 1, 1, 1)`` to broadcast, is a vector: :func:`whole_units`). ``nn.ConvTranspose*``
    stores its input channels along dim 0, so there a unit is an input channel.
    """
    if x.ndim <= 1 or whole:
        return torch.linalg.vector_norm(x, dtype=torch.float32)
    return torch.linalg.vector_norm(x, dim=tuple(range(1, x.ndim)), keepdim=True, dtype=torch.float32)


def whole_units(model: nn.Module) -> list[Tensor]:
    """The parameters AGC clips as one unit although they have more than one dimension: the per-channel gains of
    the weight-standardised convolutions (vectors in the authors' code; ours are ``(C, 1, 1, 1)``)."""
    return [m.gain for m in unwrap(model).modules() if isinstance(m, ScaledStdConv2d)]


def agc_rule(model: nn.Module) -> str:
    """Which tensors AGC leaves out of ``model`` (one of :data:`fixup.method.AGC_RULES`): its method's
    ``agc_exempt`` (the method it was built for, or adapted to: :func:`fixup.method.model_method`), or
    ``"zero_started"`` for a model without a method of :data:`fixup.METHODS`."""
    method = model_method(unwrap(model))
    return method.agc_exempt if method is not None else "zero_started"


def _layer_params(layer: nn.Module | WeightSlice) -> list[Tensor]:
    if isinstance(layer, WeightSlice):  # a fused parameter: the whole of it goes, not only the declared rows
        params = [getattr(layer.module, layer.param)]
        if layer.bias_param is not None and getattr(layer.module, layer.bias_param, None) is not None:
            params.append(getattr(layer.module, layer.bias_param))
        return params
    return list(layer.parameters(recurse=False))


def agc_exempt(model: nn.Module) -> list[Tensor]:
    """The parameters :func:`adaptive_clip_grad_` leaves out of AGC, found from the model's declarations.

    Under the ``"classifier"`` rule (:func:`agc_rule`; the NF-ResNets) they are the declared classifier's
    weights, as in the authors' code. Under ``"zero_started"`` (every other model) they are the tensors Fixup
    starts at zero or that are single numbers: the weight and bias of the last layer (of each path) of every declared
    residual branch (every layer of the branch under ``fixup_zero_branch``), every parameter of the declared classifier,
    and every :class:`~fixup.nn.Bias` and :class:`~fixup.nn.Scale` (gates included). That rule is the same
    whatever the model's normalisation, so the BatchNorm and He baselines are clipped alike. A model that
    declares no branches and no classifier has none. Each parameter appears once, in module order.
    """
    target = unwrap(model)
    if agc_rule(target) == "classifier":
        return [layer.weight for layer in find_classifier(target)]
    method = model_method(target)
    every_layer = method is not None and method.zero_branch
    found: dict[int, Tensor] = {}
    for _, branch in find_branches(target):
        for layer in (branch.layers if every_layer else branch.zeroed):
            found.update((id(p), p) for p in _layer_params(layer))
    for layer in find_classifier(target):
        found.update((id(p), p) for p in layer.parameters())
    for module in target.modules():
        if isinstance(module, (Bias, Scale)):
            found.update((id(p), p) for p in module.parameters(recurse=False))
    return list(found.values())


def _as_params(parameters: Iterable[Tensor] | Tensor, what: str) -> list[Tensor]:
    if isinstance(parameters, Tensor):
        return [parameters]
    if isinstance(parameters, tuple) and parameters and isinstance(parameters[0], nn.Module):
        raise TypeError(f"{what} got a tuple ({', '.join(type(v).__name__ for v in parameters)}): fixup.adapt "
                        "returns the model and its report; unpack them with `model, report = fixup.adapt(...)` "
                        "and pass `model`")
    try:
        params = list(parameters)
    except TypeError:
        raise TypeError(f"{what} takes a model, a tensor or an iterable of tensors, got "
                        f"{type(parameters).__name__}") from None
    bad = [type(p).__name__ for p in params if not isinstance(p, Tensor)]
    if bad:
        raise TypeError(f"{what} takes a model, a tensor or an iterable of tensors; the iterable held {bad[0]}")
    return params


@torch.no_grad()
def adaptive_clip_grad_(parameters_or_model: nn.Module | Iterable[Tensor] | Tensor, clipping: float = AGC_CLIPPING,
                        eps: float = AGC_EPS, *, exempt: Iterable[Tensor] | None = None,
                        exempt_max_norm: float | str | None = "auto") -> AGCStats:
    """Clip gradients in place by AGC, unit by unit; call it between ``loss.backward()`` and ``optimizer.step()``.

    ``fixup.adaptive_clip_grad_(model)`` is used like ``torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)``.
    Pass the *model* (a DistributedDataParallel wrapper is looked through): its method's rule (:func:`agc_rule`)
    and declarations say what :func:`agc_exempt` leaves out: an NF-ResNet's classifier weight, left unclipped
    (the authors' rule), or a Fixup model's tensors that start at zero, which plain AGC would freeze (see the
    module docstring), clipped together to the global norm ``exempt_max_norm``. Given tensors rather than a
    model, every tensor is clipped by AGC; a tensor that is all zero then draws a :class:`~fixup.FixupWarning`,
    because it will barely move.

    Args:
        parameters_or_model: a module, or the tensors to clip (those without a gradient are skipped).
        clipping: lambda, the largest ratio of a unit's gradient norm to its weight norm (> 0). Brock et al.
            use 0.01-0.16, smaller for larger batches.
        eps: the floor of a unit's weight norm (> 0).
        exempt: tensors to leave out of AGC, replacing :func:`agc_exempt` (``()``: AGC on everything).
        exempt_max_norm: the global norm the exempt tensors' gradients are clipped to together;
            ``None`` or 0 leaves them unclipped; ``"auto"``: the rule's own (unclipped under ``"classifier"``,
            1 under ``"zero_started"``; 1 for tensors given without a model).

    Returns:
        :class:`AGCStats`: the fraction of units clipped and the exempt tensors' gradient norm.
    """
    for name, value in (("clipping", clipping), ("eps", eps)):
        if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if exempt_max_norm == "auto":
        rule = agc_rule(parameters_or_model) if isinstance(parameters_or_model, nn.Module) else "zero_started"
        exempt_max_norm = None if rule == "classifier" else 1.0
    if exempt_max_norm is not None and not (isinstance(exempt_max_norm, (int, float)) and
                                            0 <= exempt_max_norm < float("inf")):
        raise ValueError(f"exempt_max_norm must be a finite number >= 0 or None (unclipped), got {exempt_max_norm!r}")
    what = "adaptive_clip_grad_"
    if isinstance(parameters_or_model, nn.Module):
        params = list(unwrap(parameters_or_model).parameters())
        skip = agc_exempt(parameters_or_model) if exempt is None else _as_params(exempt, f"{what}(exempt=...)")
        whole = {id(p) for p in whole_units(parameters_or_model)}
        warn_zero = False
    else:
        params = _as_params(parameters_or_model, what)
        skip = [] if exempt is None else _as_params(exempt, f"{what}(exempt=...)")
        whole, warn_zero = set(), exempt is None
    skip_ids = {id(p) for p in skip}
    clipped, zero_tensors = [], []
    units = 0
    for p in params:
        if p.grad is None or id(p) in skip_ids:
            continue
        if p.grad.is_sparse:
            raise ValueError(f"{what} needs dense gradients; a parameter of shape {tuple(p.shape)} has a sparse one")
        w_norm = unit_norms(p, id(p) in whole)
        if warn_zero:
            zero_tensors.append(w_norm.max() == 0)
        max_norm = clipping * w_norm.clamp_min(eps)
        g_norm = unit_norms(p.grad, id(p) in whole)
        over = g_norm > max_norm
        p.grad.mul_(torch.where(over, max_norm / g_norm.clamp_min(torch.finfo(torch.float32).tiny), 1.0)
                    .to(p.grad.dtype))
        clipped.append(over.sum())
        units += over.numel()
    fraction = torch.stack(clipped).sum() / units if clipped else torch.zeros(())
    if zero_tensors and bool(torch.stack(zero_tensors).any()):
        warnings.warn(f"{what}: a tensor with a gradient is all zero, so AGC lets it move by at most "
                      f"clipping * eps = {clipping * eps:.3g} per unit and step and it will barely learn. For a "
                      "Fixup model pass the model itself (fixup.adaptive_clip_grad_(model)), which clips the "
                      "tensors that start at zero by the global norm instead", FixupWarning, stacklevel=3)
    grads = [p for p in params if p.grad is not None and id(p) in skip_ids]
    if not grads:
        return AGCStats(fraction, torch.zeros(()))
    if exempt_max_norm:
        norm = nn.utils.clip_grad_norm_(grads, exempt_max_norm)
    else:
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad, dtype=torch.float32)
                                                     for p in grads]))
    return AGCStats(fraction, norm)
