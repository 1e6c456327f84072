"""Tracing a model written elsewhere into a torch.fx graph, and the vocabulary for reading its nodes.

Weight layers, normalisation layers, ``nn.MultiheadAttention`` and Fixup's own scalars stay leaves
(one ``call_module`` node each); everything else is traced through. PyTorch's stock Transformer
modules cannot be traced as written (their forward picks a fused "fast path" by inspecting tensor
values, and ``nn.TransformerEncoder`` may convert to nested tensors), so the tracer runs, in their
place, their documented non-fast-path computation, built from the modules' own ``_sa_block``,
``_mha_block`` and ``_ff_block`` methods. ``nn.MultiheadAttention`` stays one leaf whose Q, K and V
projections are rows of its fused ``in_proj_weight`` (declared with :class:`fixup.WeightSlice`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..branch import WEIGHT_LAYERS
from ..nn import Bias, Scale, residual_add

__all__ = [
    "NORM_LAYERS",
    "WEIGHT_KIND",
    "gate_operand",
    "is_activation",
    "is_add",
    "is_gate",
    "is_join",
    "is_lookup",
    "is_meta",
    "is_mul",
    "is_norm",
    "is_passthrough",
    "is_weight_unit",
    "module_of",
    "slow_path_",
]

NORM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm,
)
_ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.ELU, nn.SELU, nn.CELU, nn.LeakyReLU, nn.Tanh, nn.Hardtanh,
    nn.Hardswish, nn.Mish, nn.Softplus, nn.PReLU, nn.Sigmoid, nn.Hardsigmoid,
)
_ACTIVATION_NAMES = {"relu", "relu_", "relu6", "gelu", "silu", "elu", "selu", "celu", "leaky_relu", "tanh",
                     "hardtanh", "hardswish", "mish", "softplus", "prelu", "sigmoid", "hardsigmoid"}
_GATES: tuple[type[nn.Module], ...] = (nn.Sigmoid, nn.Hardsigmoid)
_GATE_NAMES = {"sigmoid", "hardsigmoid"}
# Operations that move or reshape values without mixing them with anything learnt or nonlinear.
_PASSTHROUGH_NAMES = {"getitem", "dropout", "dropout1d", "dropout2d", "dropout3d", "reshape", "view", "permute",
                      "transpose", "flatten", "unflatten", "contiguous", "squeeze", "unsqueeze", "expand",
                      "expand_as", "clone", "to", "type_as", "float", "half", "bfloat16", "identity"}
_PASSTHROUGH_MODULES: tuple[type[nn.Module], ...] = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Identity, nn.Flatten, nn.Unflatten,
    Bias, Scale,
)
_JOIN_NAMES = {"cat", "concat", "concatenate", "stack"}
_META_NAMES = {"size", "dim", "numel", "ndimension", "shape", "ndim", "device", "dtype", "len"}
# Functions of a tensor's shape and type only (``torch.rand_like(x)`` does not depend on x's values).
_LIKE_NAMES = {"rand_like", "randn_like", "zeros_like", "ones_like", "empty_like", "full_like", "new_zeros",
               "new_ones", "new_empty", "new_full"}
_ADDS = {operator.add, operator.iadd, torch.add, residual_add}


def _name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", str(target)).lstrip("_")


def module_of(node: fx.Node, modules: dict[str, nn.Module]) -> nn.Module | None:
    """The module a ``call_module`` node calls, or ``None``."""
    return modules.get(node.target) if node.op == "call_module" else None  # type: ignore[arg-type]


def is_weight_unit(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """A weight layer (Linear/Conv, or a module whose 2-D weight acts as one: ``transformers``' Conv1D) or a
    multi-head attention, each one call of a leaf module."""
    return isinstance(module_of(node, modules), (*WEIGHT_LAYERS, nn.MultiheadAttention)) or \
        (node.op == "call_module" and node.meta.get(WEIGHT_KIND) in ("linear", "transposed"))


def is_lookup(node: fx.Node) -> bool:
    """A call of an embedding table (ids in, rows out): it holds a matrix but is no weight layer of a branch."""
    return node.op == "call_module" and node.meta.get(WEIGHT_KIND) == "lookup"


# node.meta key set by the recorder on calls of other childless modules with a 2-D ``weight``: "linear" when
# it maps the input's last dim like ``nn.Linear`` (weight out x in), "transposed" when like ``transformers``'
# Conv1D (weight in x out), "lookup" for an embedding table indexed by ids, absent when its shape says neither.
WEIGHT_KIND = "fixup_weight_kind"


def is_norm(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    return isinstance(module_of(node, modules), NORM_LAYERS)


def is_activation(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """An element-wise activation (module, function or tensor method)."""
    if node.op == "call_module":
        return isinstance(module_of(node, modules), _ACTIVATIONS)
    return node.op in ("call_function", "call_method") and _name(node) in _ACTIVATION_NAMES


def is_gate(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """A bounded gate (sigmoid): its output multiplies a signal, as in squeeze-excite."""
    if node.op == "call_module":
        return isinstance(module_of(node, modules), _GATES)
    return node.op in ("call_function", "call_method") and _name(node) in _GATE_NAMES


def is_meta(node: fx.Node) -> bool:
    """Reads a tensor's shape, device or type: a dependency on metadata, not on values."""
    if node.op == "call_method" and _name(node) in _META_NAMES | _LIKE_NAMES:
        return True
    if node.op == "call_function" and _name(node) in _LIKE_NAMES:
        return True
    if node.op == "call_function" and node.target in (getattr, len):
        return node.target is len or (len(node.args) > 1 and node.args[1] in _META_NAMES)
    return False


def is_add(node: fx.Node) -> bool:
    """A sum of two tensors: ``a + b``, ``torch.add``, ``a.add(b)`` or :func:`fixup.residual_add`."""
    if node.op == "call_function" and node.target in _ADDS:
        return len(node.args) >= 2 and all(isinstance(a, fx.Node) for a in node.args[:2])
    if node.op == "call_method" and node.target in ("add", "add_"):
        return len(node.args) >= 2 and all(isinstance(a, fx.Node) for a in node.args[:2])
    return False


def is_mul(node: fx.Node) -> bool:
    """An element-wise product: ``a * b``, ``torch.mul``, ``a.mul(b)``."""
    return node.target in ("mul", "mul_") or getattr(node.target, "__name__", "") == "mul"


def is_join(node: fx.Node) -> bool:
    """Joins paths without mixing them with anything learnt: a concatenation (``torch.cat``, ``torch.stack``) or
    a sum of tensors. A concatenation or sum of zeros is zero."""
    return is_add(node) or (node.op in ("call_function", "call_method") and _name(node) in _JOIN_NAMES)


def gate_operand(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """``node`` is, up to reshapes, the output of a sigmoid gate."""
    while not is_gate(node, modules):
        if not is_passthrough(node, modules) or not node.all_input_nodes or module_of(node, modules) is not None:
            return False
        node = node.all_input_nodes[0]
    return True


def is_passthrough(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Moves, reshapes or drops values; after a branch's last weight layer only these may follow."""
    if node.op == "call_module":
        return isinstance(module_of(node, modules), (*_PASSTHROUGH_MODULES, *NORM_LAYERS))
    if node.op not in ("call_function", "call_method"):
        return False
    if _name(node) in _PASSTHROUGH_NAMES:
        return True
    if node.target in (operator.mul, operator.truediv, torch.mul, "mul", "div"):
        # A product with a constant number keeps a zero zero.
        return sum(isinstance(a, fx.Node) for a in node.args) == 1
    return False


# --- traceable forwards of PyTorch's stock Transformer modules (their non-fast-path computation) ---

def _causal(flag: Any) -> bool:
    return bool(flag) if isinstance(flag, bool) else False


def _encoder_layer(layer: nn.TransformerEncoderLayer, src: Any, src_mask: Any = None,
                   src_key_padding_mask: Any = None, is_causal: bool = False) -> Any:
    x, causal = src, _causal(is_causal)
    if layer.norm_first:
        x = x + layer._sa_block(layer.norm1(x), src_mask, src_key_padding_mask, is_causal=causal)
        return x + layer._ff_block(layer.norm2(x))
    x = layer.norm1(x + layer._sa_block(x, src_mask, src_key_padding_mask, is_causal=causal))
    return layer.norm2(x + layer._ff_block(x))


def _decoder_layer(layer: nn.TransformerDecoderLayer, tgt: Any, memory: Any, tgt_mask: Any = None,
                   memory_mask: Any = None, tgt_key_padding_mask: Any = None,
                   memory_key_padding_mask: Any = None, tgt_is_causal: bool = False,
                   memory_is_causal: bool = False) -> Any:
    x, tc, mc = tgt, _causal(tgt_is_causal), _causal(memory_is_causal)
    if layer.norm_first:
        x = x + layer._sa_block(layer.norm1(x), tgt_mask, tgt_key_padding_mask, tc)
        x = x + layer._mha_block(layer.norm2(x), memory, memory_mask, memory_key_padding_mask, mc)
        return x + layer._ff_block(layer.norm3(x))
    x = layer.norm1(x + layer._sa_block(x, tgt_mask, tgt_key_padding_mask, tc))
    x = layer.norm2(x + layer._mha_block(x, memory, memory_mask, memory_key_padding_mask, mc))
    return layer.norm3(x + layer._ff_block(x))


def _encoder(enc: nn.TransformerEncoder, src: Any, mask: Any = None, src_key_padding_mask: Any = None,
             is_causal: Any = None) -> Any:
    x = src
    for mod in enc.layers:
        x = mod(x, src_mask=mask, is_causal=_causal(is_causal), src_key_padding_mask=src_key_padding_mask)
    return x if enc.norm is None else enc.norm(x)


def _decoder(dec: nn.TransformerDecoder, tgt: Any, memory: Any, tgt_mask: Any = None, memory_mask: Any = None,
             tgt_key_padding_mask: Any = None, memory_key_padding_mask: Any = None, tgt_is_causal: Any = None,
             memory_is_causal: bool = False) -> Any:
    x = tgt
    for mod in dec.layers:
        x = mod(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask, tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=_causal(tgt_is_causal),
                memory_is_causal=memory_is_causal)
    return x if dec.norm is None else dec.norm(x)


def _transformer(t: nn.Transformer, src: Any, tgt: Any, src_mask: Any = None, tgt_mask: Any = None,
                 memory_mask: Any = None, src_key_padding_mask: Any = None, tgt_key_padding_mask: Any = None,
                 memory_key_padding_mask: Any = None, src_is_causal: Any = None, tgt_is_causal: Any = None,
                 memory_is_causal: bool = False) -> Any:
    memory = t.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
    return t.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                     tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                     tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)


class _SlowEncoderLayer(nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` that always runs its documented non-fast-path computation."""

    forward = _encoder_layer


class _SlowDecoderLayer(nn.TransformerDecoderLayer):
    forward = _decoder_layer


class _SlowEncoder(nn.TransformerEncoder):
    forward = _encoder


class _SlowDecoder(nn.TransformerDecoder):
    forward = _decoder


class _SlowTransformer(nn.Transformer):
    forward = _transformer


_SLOW = {nn.TransformerEncoderLayer: _SlowEncoderLayer, nn.TransformerDecoderLayer: _SlowDecoderLayer,
         nn.TransformerEncoder: _SlowEncoder, nn.TransformerDecoder: _SlowDecoder, nn.Transformer: _SlowTransformer}


def slow_path_(model: nn.Module) -> list[str]:
    """Give each stock Transformer module of ``model`` (a private copy) the class of the same name in this
    module, a subclass whose forward is the documented non-fast-path computation; return their names.

    The fused fast path reads the norms' ``eps`` and ``weight`` directly and the encoder may convert to
    nested tensors, so neither would run once the norms are replaced; the subclass keeps every attribute,
    parameter name and method of the original.
    """
    swapped = []
    for name, mod in model.named_modules():
        slow = _SLOW.get(type(mod))
        if slow is not None:
            mod.__class__ = slow
            swapped.append(name or type(model).__name__)
    return swapped


def data_inputs(node: fx.Node) -> list[fx.Node]:
    """The nodes whose values flow into ``node`` (metadata reads such as ``x.size()`` do not count)."""
    return [] if is_meta(node) else list(node.all_input_nodes)


def functional_norm(node: fx.Node) -> bool:
    """A normalisation written as a function call, which cannot be swapped for a module."""
    return node.op == "call_function" and node.target in (F.layer_norm, F.batch_norm, F.group_norm,
                                                          F.instance_norm, torch.layer_norm,
                                                          torch.batch_norm, torch.group_norm)
