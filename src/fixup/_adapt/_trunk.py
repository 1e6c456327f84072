"""The trunk rule of ``fixup.adapt``: the weight layers outside the residual branches keep the stream's scale.

Fixup's rule sets the residual branches; at initialisation every branch is zero and the stream is whatever
the layers outside them make it. In a normalised model a norm after each of those layers (the stem,
projection shortcuts, downsampling layers, the blocks without a skip) reset the scale; once adapt takes the
norms out, each such layer, non-ReLU activation and gate multiplies the stream by a constant factor, and
the factors compound (EfficientNet-B0 with He draws: RMS 0.54 after the first stage, 8e-5 after the
seventh). The *trunk layers* are found in the recording (:meth:`fixup._adapt._graph._Analyser.trunk`) and
declared by the adapted model as ``model.trunk_layers()``.

Rules (:data:`TRUNK_RULES`):

* ``"lsuv"`` (the default): in execution order, each trunk layer's weight is divided by its output's RMS
  on the example input, so that its output has unit second moment, as the norm after it had made it. This
  is LSUV (Mishkin & Matas, ICLR 2016) restricted to the trunk and taken on second moments; the layers
  after it see the corrected output within the same forward pass. It absorbs every factor between two
  trunk layers whatever causes it (activation gains, gate means, pooling), which an analytic rule has to
  know in advance.
* ``"fan_in"``: He's forward-preserving draw, ``sqrt(2 / fan_in)`` per group, with no data.
* ``"none"``: the draws of :func:`fixup.fixup_init_` (projection shortcuts from ``mode``, other layers
  from ``stem_mode``).

Learned tokens concatenated into the stream as positions of their own (a ViT's class token: timm draws it
with std 1e-6, and the position embedding adds 0.02) are declared as ``model.trunk_tokens()``: at
initialisation their positions carry only the parameter, and once the final norm is gone the classifier
reads the class token at that scale. Under ``"lsuv"`` each is rescaled to unit RMS, the scale of every
other position after the trunk layers (a token that is exactly zero is drawn from N(0, 1)).

docs/adapt.md ("The trunk") has the measurements that chose the default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..branch import WEIGHT_LAYERS
from ..init import groups_of, he_std
from ..signal import output_rms

__all__ = ["TRUNK_RULES", "TrunkRecord", "trunk_init_"]

TRUNK_RULES = ("lsuv", "fan_in", "none")


@dataclass
class TrunkRecord:
    """One trunk layer: the rule applied, its output RMS on the example input before and after, its weight std."""

    name: str
    type: str
    rule: str
    rms_before: float
    rms_after: float
    std: float
    note: str = ""


def _rms(out: Any) -> float:
    rms = output_rms(out)
    return math.nan if rms is None else rms


def _declared_layers(model: nn.Module, rule: str) -> list[nn.Module]:
    if rule not in TRUNK_RULES:
        raise ValueError(f"trunk rule must be one of {TRUNK_RULES}, got {rule!r}")
    declared = getattr(model, "trunk_layers", None)
    if not callable(declared):
        raise ValueError(f"{type(model).__name__} declares no trunk_layers(); run fixup.adapt(model, example_input), "
                         "which finds and declares them")
    return list(declared())


def _lsuv(module: nn.Module, inputs: tuple, output: Any, tol: float, max_iter: int) -> tuple[float, float, Any]:
    """Rescale ``module``'s weight until its output's RMS is 1 within ``tol``; (RMS before, after, new output)."""
    before = after = _rms(output)
    steps = 0
    while math.isfinite(after) and after > 0 and abs(after - 1.0) >= tol and steps < max_iter:
        module.weight.div_(after)
        output = module.forward(*inputs)  # forward() bypasses the hooks; inputs carry the pre-hooks' biases
        after = _rms(output)
        steps += 1
    return before, after, output


def _run_hooked(model: nn.Module, layers: list[nn.Module], args: tuple[Tensor, ...], hook: Callable) -> None:
    """One eval-mode forward of ``model`` with ``hook`` on every layer; the model's modes are restored."""
    handles = [layer.register_forward_hook(hook) for layer in layers]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        model(*args)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.train(mode)


def _token_records(model: nn.Module, rule: str) -> list[TrunkRecord]:
    """The model's declared token parameters (``trunk_tokens()``), rescaled to RMS 1 by ``"lsuv"``."""
    out = []
    tokens = getattr(model, "trunk_tokens", None)
    for name in (tokens() if callable(tokens) else []):
        param = model.get_parameter(name)
        before = float(param.detach().float().pow(2).mean().sqrt())
        if rule == "lsuv":
            if before > 0 and math.isfinite(before):
                param.div_(before)
            else:
                param.normal_(0.0, 1.0)
        after = float(param.detach().float().pow(2).mean().sqrt())
        out.append(TrunkRecord(name, "token", rule, before, after, float(param.float().std()) if param.numel() > 1
                               else after))
    return out


@torch.no_grad()
def trunk_init_(model: nn.Module, example_input: Tensor | Sequence[Tensor], rule: str = "lsuv", *,
                tol: float = 0.01, max_iter: int = 5) -> list[TrunkRecord]:
    """Apply the trunk ``rule`` to ``model.trunk_layers()`` in place; return one record per layer, in execution order.

    Args:
        model: a model returned by :func:`fixup.adapt` (it declares ``trunk_layers()``), or any model that
            declares them.
        example_input: the batch the layers are measured (and, for ``"lsuv"``, calibrated) on; the model runs
            once, in eval mode, and is returned to its mode.
        rule: one of :data:`TRUNK_RULES`.
        tol, max_iter: ``"lsuv"`` stops once ``|RMS - 1| < tol`` or after ``max_iter`` rescalings (one suffices
            when the layer has no bias).

    A layer whose output is zero or not finite cannot be calibrated: its record says so in ``note``, and so
    does one that ran no forward on the example input.
    """
    layers = _declared_layers(model, rule)
    names = {id(m): n for n, m in model.named_modules()}
    args = (example_input,) if isinstance(example_input, Tensor) else tuple(example_input)
    records: dict[int, TrunkRecord] = {}  # by id(layer), in execution order
    if rule == "fan_in":
        for layer in layers:
            if isinstance(layer, WEIGHT_LAYERS):
                layer.weight.normal_(0.0, he_std(layer.weight, "fan_in", groups_of(layer)))

    def visit(module: nn.Module, inputs: tuple, output: Any) -> Any:
        key = id(module)
        if key in records:
            return None
        note = ""
        if rule == "lsuv":
            before, after, output = _lsuv(module, inputs, output, tol, max_iter)
            if not (math.isfinite(after) and after > 0):
                note = "output zero or not finite on the example input: not calibrated"
        else:
            before = after = _rms(output)
            if rule == "fan_in" and not isinstance(module, WEIGHT_LAYERS):
                note = f"{type(module).__name__} is not nn.Linear/nn.Conv*: left as drawn"
        records[key] = TrunkRecord(names.get(key, "?"), type(module).__name__, rule, before, after,
                                   float(module.weight.float().std()), note)
        return output if rule == "lsuv" else None

    _run_hooked(model, layers, args, visit)
    tokens = _token_records(model, rule)
    unrun = [TrunkRecord(names.get(id(layer), "?"), type(layer).__name__, rule, math.nan, math.nan,
                         float(layer.weight.float().std()), "not run on the example input: left as drawn")
             for layer in layers if id(layer) not in records]
    return [*records.values(), *tokens, *unrun]
