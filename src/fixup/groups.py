"""Optimiser parameter groups for a Fixup network: the one public place learning rates per parameter come from.

Fixup's scalars (rule 3: :class:`~fixup.nn.Bias`, :class:`~fixup.nn.Scale`) are single numbers that
steer whole tensors. They are found by module type, never by parameter name, and learn at
``scalar_lr_mult`` times the weights' rate: 0.1 by default, as the authors' released CIFAR and ImageNet
code does for every scalar.

The *stream biases* (each branch's bias after its last layer, declared by its block as
``Branch.stream_bias``) get a fixed budget on top: in a stage every one of them receives the same
gradient, so their sum, the offset of the residual stream, moves (blocks per stage) times faster than
any one scalar: the aligned-updates failure that rule 2 prevents for the weights. Following the paper's
own assumption that the L branches' updates add up in step (appendix B), the ``S`` stream biases of a
model share one scalar's rate: each learns at ``lr * scalar_lr_mult / S``. Measured on a Wide-ResNet-1000
in docs/training.md; ``stream_budget=False`` gives the authors' parameterisation.

The *gates* of SkipInit and ReZero (:class:`~fixup.nn.Gate`, one per branch, starting at 0) are their own
group at ``lr * gate_lr_mult``, 1 by default: both papers train the gate as an ordinary parameter, at the
weights' rate (ReZero's authors' Transformer layers hold it as a plain ``nn.Parameter``); the group makes the
rate visible and tunable (docs/methods.md).

*Gains and biases* go undecayed where the model's method says so (``Method.decay_gains`` False: the NF-ResNets
and SkipInit, whose authors' code exempts every gain and bias from weight decay): the weight-standardised layers'
gains and every weight layer's bias form the ``gains_biases`` group at the weights' rate and no decay, and the
gates (their skip gains) lose their decay too.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .branch import WEIGHT_LAYERS, find_branches
from .method import model_method
from .nn import Bias, Gate, Scale, ScaledStdConv2d

__all__ = ["GATE_LR_MULT", "SCALAR_LR_MULT", "param_groups", "stream_biases", "unwrap"]

SCALAR_LR_MULT = 0.1  # the scalars' rate relative to the weights' (the authors' released code)
GATE_LR_MULT = 1.0  # the gates' rate relative to the weights' (SkipInit, ReZero: trained like any weight)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DataParallel / DistributedDataParallel wrappers."""
    _check_module(model)
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return model


def _check_module(model: object) -> None:
    """Refuse anything but a module, saying what to pass (``fixup.adapt`` returns a ``(model, report)`` pair)."""
    if isinstance(model, nn.Module):
        return
    if isinstance(model, tuple) and model and isinstance(model[0], nn.Module):
        raise TypeError(f"expected an nn.Module, got a tuple ({', '.join(type(v).__name__ for v in model)}): "
                        "fixup.adapt returns the model and its report; unpack them with "
                        "`model, report = fixup.adapt(...)` and pass `model`")
    raise TypeError(f"expected an nn.Module (the model whose parameters to group), got {type(model).__name__}: "
                    f"{model!r:.80}")


def stream_biases(model: nn.Module) -> list[Bias]:
    """The stream biases ``model``'s blocks declare, in module order (each once)."""
    seen: dict[int, Bias] = {}
    for _, branch in find_branches(unwrap(model)):
        if branch.stream_bias is not None:
            seen.setdefault(id(branch.stream_bias), branch.stream_bias)
    return list(seen.values())


def param_groups(model: nn.Module, lr: float, weight_decay: float = 0.0, *, scalar_lr_mult: float = SCALAR_LR_MULT,
                 scalar_weight_decay: float | None = None, stream_budget: bool | None = None,
                 gate_lr_mult: float = GATE_LR_MULT) -> list[dict[str, Any]]:
    """Parameter groups for any ``torch.optim`` optimiser: ``torch.optim.SGD(param_groups(model, 0.1), momentum=0.9)``.

    Returns up to five groups, each a dict with ``name``, ``params``, ``param_names``, ``lr`` and
    ``weight_decay``: ``weights`` (every parameter that is not a scalar, at ``lr``), ``scalars``
    (biases and multipliers, at ``lr * scalar_lr_mult``), ``stream_biases`` (at
    ``lr * scalar_lr_mult / S`` for the model's ``S`` stream biases), ``gates`` (SkipInit's and ReZero's,
    at ``lr * gate_lr_mult``) and, for a method whose gains and biases are not decayed (``Method.decay_gains``
    False), ``gains_biases`` (at ``lr``, weight decay 0; the gates then have no decay either). Empty groups are
    left out; frozen parameters (``requires_grad=False``) too.

    Args:
        model: any module (a DistributedDataParallel wrapper is looked through); anything else, such as the
            ``(model, report)`` pair :func:`fixup.adapt` returns, is a ``TypeError`` saying what to pass.
        lr: the weights' learning rate (the peak of the schedule).
        weight_decay: the weights' decay.
        scalar_lr_mult: the scalars' rate relative to ``lr``.
        scalar_weight_decay: the scalars' decay; ``None`` means ``weight_decay``.
        stream_budget: give the stream biases one scalar's rate between them. ``None``: as the model's own
            method says where it was built with one (``fixup_paper`` has no budget), else on.
        gate_lr_mult: the gates' rate relative to ``lr`` (their decay is the scalars', or none where the method
            leaves gains undecayed).
    """
    _check_module(model)
    for name, value in (("lr", lr), ("weight_decay", weight_decay), ("scalar_lr_mult", scalar_lr_mult),
                        ("gate_lr_mult", gate_lr_mult)):
        if not (isinstance(value, (int, float)) and value >= 0 and value == value and value != float("inf")):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    target = unwrap(model)
    own = model_method(target)  # built for, or adapted to (fixup.adapt's NF-ResNet form)
    if stream_budget is None:
        stream_budget = own.stream_budget if own is not None else True
    undecayed = own is not None and not own.decay_gains
    gains_biases = set()
    if undecayed:
        gains_biases = {id(m.bias) for m in target.modules() if isinstance(m, WEIGHT_LAYERS)
                        and isinstance(getattr(m, "bias", None), nn.Parameter)}
        gains_biases |= {id(m.gain) for m in target.modules() if isinstance(m, ScaledStdConv2d)}
    gates = {id(p) for m in target.modules() if isinstance(m, Gate) for p in m.parameters(recurse=False)}
    scalars = {id(p) for m in target.modules() if isinstance(m, (Bias, Scale)) for p in m.parameters(recurse=False)}
    stream = {id(p) for b in stream_biases(target) for p in b.parameters()} if stream_budget else set()
    scalar_lr = lr * scalar_lr_mult
    scalar_wd = weight_decay if scalar_weight_decay is None else scalar_weight_decay
    groups = {
        "weights": {"name": "weights", "params": [], "param_names": [], "lr": lr, "weight_decay": weight_decay},
        "scalars": {"name": "scalars", "params": [], "param_names": [], "lr": scalar_lr, "weight_decay": scalar_wd},
        "stream_biases": {"name": "stream_biases", "params": [], "param_names": [],
                          "lr": scalar_lr / max(1, len(stream)), "weight_decay": scalar_wd},
        "gates": {"name": "gates", "params": [], "param_names": [], "lr": lr * gate_lr_mult,
                  "weight_decay": 0.0 if undecayed else scalar_wd},
        "gains_biases": {"name": "gains_biases", "params": [], "param_names": [], "lr": lr, "weight_decay": 0.0},
    }
    for name, p in target.named_parameters():
        if not p.requires_grad:
            continue
        key = ("gates" if id(p) in gates else "stream_biases" if id(p) in stream else "scalars" if id(p) in scalars
               else "gains_biases" if id(p) in gains_biases else "weights")
        groups[key]["params"].append(p)
        groups[key]["param_names"].append(name)
    return [g for g in groups.values() if g["params"]]
