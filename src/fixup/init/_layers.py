"""What the initialisers of :mod:`fixup.init` share: finding, drawing and recording weight layers."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..branch import WEIGHT_LAYERS, WeightSlice
from ..method import Method
from ..nn import Bias, DyT, Scale
from ..report import LayerRecord, describe_norm
from .fans import BASE_INITS, base_std, groups_of

__all__ = ["TRUNCATED_STD", "check_layer", "check_output_scale", "default_linear_", "draw_", "draw_standard_",
           "draw_truncated_", "layer_key", "model_base", "named_weight_layers", "record",
           "reset_norms_and_scalars"]


def model_base(model: nn.Module, base: str | None = None) -> str:
    """The standard initialisation ``model``'s weight layers start from: ``base`` if given, else the one the
    model declares as ``init_base`` (the Transformer: ``"xavier"``, as the authors' fairseq code), else He."""
    chosen = base or getattr(model, "init_base", "he")
    if chosen not in BASE_INITS:
        raise ValueError(f"base must be one of {BASE_INITS}, got {chosen!r}")
    return chosen


def named_weight_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every ``nn.Linear`` / ``nn.Conv*`` of ``model`` with its qualified name, in module order."""
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, WEIGHT_LAYERS)]


def record(name: str, layer: nn.Module | WeightSlice, std: float) -> LayerRecord:
    """The report's line for a weight layer drawn with ``std``."""
    kind = f"{type(layer.module).__name__}.{layer.param}" if isinstance(layer, WeightSlice) else type(layer).__name__
    return LayerRecord(name, kind, list(layer.weight.shape), float(std))


def layer_key(layer: nn.Module | WeightSlice) -> object:
    """What makes two declared layers the same layer (a module, or a block of a parameter)."""
    return layer.key if isinstance(layer, WeightSlice) else id(layer)


def draw_(layer: nn.Module | WeightSlice, std: float, generator: torch.Generator | None) -> None:
    """Normal draws of ``std`` (zeros where ``std`` is 0) for the layer's weight, its bias 0."""
    if std == 0.0:
        layer.weight.zero_()
    else:
        layer.weight.normal_(0.0, std, generator=generator)
    if getattr(layer, "bias", None) is not None:
        layer.bias.zero_()


# The std of a standard normal truncated at +-2 std: haiku's TruncatedNormal divides by it so that the truncated
# draw has the std asked for (haiku.initializers.VarianceScaling, distribution "truncated_normal").
TRUNCATED_STD = 0.87962566103423978


def draw_truncated_(layer: nn.Module | WeightSlice, std: float, generator: torch.Generator | None) -> None:
    """Draws from a normal truncated at 2 std of itself and rescaled so that the draws' std is ``std`` (haiku's
    truncated-normal initialiser) for the layer's weight; its bias 0."""
    wide = std / TRUNCATED_STD
    nn.init.trunc_normal_(layer.weight, 0.0, wide, -2.0 * wide, 2.0 * wide, generator=generator)
    if getattr(layer, "bias", None) is not None:
        layer.bias.zero_()


def draw_standard_(layer: nn.Module | WeightSlice, name: str, base: str, mode: str, generator: torch.Generator | None,
                   factor: float = 1.0) -> LayerRecord:
    """Draw ``layer`` by the standard rule ``base`` (He with fan ``mode``, per group, or Xavier) times ``factor``;
    return its report line."""
    std = base_std(_as_drawn(layer), base, mode, groups_of(layer)) * factor
    draw_(layer, std, generator)
    return record(name, layer, std)


def _as_drawn(layer: nn.Module | WeightSlice) -> torch.Tensor:
    """The weight whose fans the standard rule counts: a layer that declares ``fan_out_mult`` k is drawn as one of
    k row blocks of a fused matrix (the Transformer's Q, K and V: fairseq draws them as one (3d, d) matrix)."""
    k = int(getattr(layer, "fan_out_mult", 1))
    w = layer.weight
    return w if k == 1 else w.new_empty((k * w.shape[0], *w.shape[1:]), device="meta")


def default_linear_(layer: nn.Module, generator: torch.Generator | None) -> float:
    """PyTorch's default for ``nn.Linear`` (uniform, bound 1/sqrt(fan_in)), drawn from ``generator``; its std."""
    bound = 1.0 / math.sqrt(layer.weight.shape[1]) if layer.weight.shape[1] else 0.0
    layer.weight.uniform_(-bound, bound, generator=generator)
    if layer.bias is not None:
        layer.bias.uniform_(-bound, bound, generator=generator)
    return bound / math.sqrt(3.0)


def check_layer(layer: object, where: str, names: dict[int, str]) -> str:
    """The qualified name of a declared weight layer, or a ValueError saying why it cannot be one."""
    if not isinstance(getattr(layer, "weight", None), torch.Tensor):
        raise ValueError(
            f"{where}: {type(layer).__name__} has no `weight` tensor; branch layers must be weight layers "
            "(nn.Linear or nn.Conv*). Declare only the weight layers of the branch, in execution order."
        )
    owner = layer.module if isinstance(layer, WeightSlice) else layer
    if id(owner) not in names:
        raise ValueError(f"{where}: a declared layer ({type(owner).__name__}) is not a submodule of the model")
    if isinstance(layer, WeightSlice):
        return f"{names[id(owner)]}.{layer.label()}" if names[id(owner)] else layer.label()
    return names[id(owner)]


def reset_norms_and_scalars(model: nn.Module) -> int:
    """Normalisation layers to gain 1, shift 0, fresh running statistics; scalars to their start (biases 0,
    multipliers 1, gates 0). Returns the number of scalar modules."""
    scalars = 0
    for mod in model.modules():
        if describe_norm("", mod) is not None and hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
        elif isinstance(mod, (Bias, Scale)):
            mod.reset_parameters()
            scalars += 1
        elif isinstance(mod, DyT):  # Dynamic Tanh in a LayerNorm's place: alpha at its alpha0, gamma 1, beta 0
            mod.reset_parameters()
    return scalars


def check_output_scale(model: nn.Module, method: Method) -> None:
    """Every block that has an ``output_scale`` must carry the method's (built for the same method)."""
    scales = [(name, mod.output_scale) for name, mod in model.named_modules() if hasattr(mod, "output_scale")]
    if method.output_scale != 1.0 and not scales:
        raise ValueError(f"init={method.init!r} multiplies each block's output, but {type(model).__name__}'s "
                         "blocks have no `output_scale`; this architecture does not support it")
    for name, scale in scales:
        if scale != method.output_scale:
            raise ValueError(f"block {name!r} has output_scale {scale:g} but init={method.init!r} needs "
                             f"{method.output_scale:g}; build the model with the norm/init you initialise it for")
