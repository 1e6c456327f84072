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

import inspect
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..branch import WEIGHT_LAYERS
from ..nn import Bias, Scale, residual_add

__all__ = [
    "NORM_LAYERS",
    "AdaptTracer",
    "is_activation",
    "is_add",
    "is_gate",
    "is_meta",
    "is_norm",
    "is_passthrough",
    "is_weight_unit",
    "module_of",
    "trace",
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
    """A weight layer (Linear/Conv) or a multi-head attention, each one call of a leaf module."""
    return isinstance(module_of(node, modules), (*WEIGHT_LAYERS, nn.MultiheadAttention))


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


# Module types whose structure is known and traced through with these forwards.
STRUCTURES: dict[type[nn.Module], Callable[..., Any]] = {
    nn.TransformerEncoderLayer: _encoder_layer,
    nn.TransformerDecoderLayer: _decoder_layer,
    nn.TransformerEncoder: _encoder,
    nn.TransformerDecoder: _decoder,
    nn.Transformer: _transformer,
}


def _raw_attr(root: nn.Module, target: str) -> Any:
    """``root.<target>`` read from the modules' own dictionaries (fx patches ``getattr`` while tracing)."""
    obj: Any = root
    *path, last = target.split(".")
    for part in path:
        obj = obj.__dict__["_modules"][part] if part in obj.__dict__.get("_modules", {}) else \
            object.__getattribute__(obj, part)
    for store in ("_parameters", "_buffers", "_modules"):
        if last in obj.__dict__.get(store, {}):
            return obj.__dict__[store][last]
    return object.__getattribute__(obj, last)


_UNKNOWN = object()
_VALUE = "fixup_value"  # node.meta key: the node's value on the example input, while tracing


class AdaptTracer(fx.Tracer):
    """torch.fx tracer that keeps weight layers, norms, attention and scalars as leaves.

    Given example inputs it also computes every node's value on them as it goes, so that Python
    control flow on traced values (``if x.shape[1] > n:``, a loop over a tensor) takes the branch the
    example takes instead of failing; each such decision is recorded in ``fixed``.
    """

    def __init__(self, leaf_modules: tuple[type[nn.Module], ...] = (),
                 example: tuple[Any, ...] | None = None) -> None:
        super().__init__(autowrap_functions=(residual_add,))
        self.proxy_buffer_attributes = True  # buffers (position tables, masks) are graph inputs, not constants
        self.extra_leaves = leaf_modules
        self.example, self._next_input = example, 0
        self.fixed: list[str] = []
        self._evaluating = False

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if type(m) in STRUCTURES:
            return False
        if isinstance(m, (*WEIGHT_LAYERS, *NORM_LAYERS, nn.MultiheadAttention, Bias, Scale, *self.extra_leaves)):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        if self._evaluating:  # computing an example value: run the module, record nothing
            return forward(*args, **kwargs)
        structure = STRUCTURES.get(type(m))
        if structure is not None:
            def forward(*a: Any, **k: Any) -> Any:
                return structure(m, *a, **k)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._evaluating:  # computing an example value: the real parameter, not a proxy
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def create_proxy(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     name: str | None = None, type_expr: Any = None, proxy_factory_fn: Any = None) -> fx.Proxy:
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if self.example is not None:
            proxy.node.meta[_VALUE] = self._evaluate(proxy.node)
        return proxy

    def _evaluate(self, node: fx.Node) -> Any:
        if node.op == "placeholder":
            if self._next_input < len(self.example):
                self._next_input += 1
                return self.example[self._next_input - 1]
            return node.args[0] if node.args else _UNKNOWN
        if node.op == "get_attr":
            return _raw_attr(self.root, str(node.target))
        unknown = False

        def value(n: fx.Node) -> Any:
            nonlocal unknown
            v = n.meta.get(_VALUE, _UNKNOWN)
            unknown = unknown or v is _UNKNOWN
            return v

        args, kwargs = fx.node.map_arg(node.args, value), fx.node.map_arg(node.kwargs, value)
        if unknown:
            return _UNKNOWN
        self._evaluating = True
        try:
            if node.op == "call_module":
                return self.root.get_submodule(str(node.target))(*args, **kwargs)
            if node.op == "call_function":
                return node.target(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], str(node.target))(*args[1:], **kwargs)
        except Exception:  # a value we cannot compute only matters if control flow needs it
            return _UNKNOWN
        finally:
            self._evaluating = False
        return _UNKNOWN

    def to_bool(self, obj: fx.Proxy) -> bool:
        value = obj.node.meta.get(_VALUE, _UNKNOWN)
        if value is _UNKNOWN:
            return super().to_bool(obj)
        self.fixed.append(f"{obj.node.name} = {bool(value)}")
        return bool(value)

    def iter(self, obj: fx.Proxy) -> Any:
        value = obj.node.meta.get(_VALUE, _UNKNOWN)
        if value is _UNKNOWN or not hasattr(value, "__len__"):
            return super().iter(obj)
        self.fixed.append(f"iteration over {obj.node.name} ({len(value)} items)")
        return iter([obj[i] for i in range(len(value))])


def trace(model: nn.Module, example: tuple[Any, ...],
          leaf_modules: tuple[type[nn.Module], ...] = ()) -> tuple[fx.Graph, list[str]]:
    """Trace ``model.forward`` called with the positional ``example`` inputs; later arguments keep their
    defaults. Returns the graph and the control-flow decisions the example fixed.

    ``model`` must be a private copy: if it is itself a stock Transformer module its class is swapped
    for a subclass whose forward is the traceable one. Raises ``ValueError`` naming the failure and
    what to do when torch.fx cannot trace the model.
    """
    structure = STRUCTURES.get(type(model))
    if structure is not None:  # the root itself is a stock Transformer module: trace its known structure
        model.__class__ = type(type(model).__name__, (type(model),), {"forward": structure})
    params = list(inspect.signature(model.forward).parameters.values())
    concrete = {p.name: p.default for p in params[len(example):]
                if p.default is not inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD}
    tracer = AdaptTracer(leaf_modules, example)
    try:
        with torch.no_grad():
            graph = tracer.trace(model, concrete_args=concrete or None)
    except Exception as err:  # fx raises many types (TraceError, TypeError, RuntimeError) on untraceable code
        raise ValueError(
            f"torch.fx could not trace {type(model).__name__}: {type(err).__name__}: {err}. Pass the submodule "
            "types that fx cannot trace through as leaf_modules=(...) (they are then kept whole and not searched "
            "for residual branches), or adapt a submodule that fx can read."
        ) from err
    for node in graph.nodes:
        node.meta.pop(_VALUE, None)
        if isinstance(node.type, str):  # a postponed annotation ("torch.Tensor") would not pickle
            node.type = None
    return graph, tracer.fixed


def data_inputs(node: fx.Node) -> list[fx.Node]:
    """The nodes whose values flow into ``node`` (metadata reads such as ``x.size()`` do not count)."""
    return [] if is_meta(node) else list(node.all_input_nodes)


def functional_norm(node: fx.Node) -> bool:
    """A normalisation written as a function call, which cannot be swapped for a module."""
    return node.op == "call_function" and node.target in (F.layer_norm, F.batch_norm, F.group_norm,
                                                          F.instance_norm, torch.layer_norm,
                                                          torch.batch_norm, torch.group_norm)
