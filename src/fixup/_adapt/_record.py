"""Capture: run the model eagerly on the example input and record what it computes, attributed to modules.

A :class:`torch.overrides.TorchFunctionMode` sees every torch function and tensor method the forward
calls (``F.relu``, ``x + y``, ``x.view(...)``, ``F.scaled_dot_product_attention``), and forward hooks on
every submodule say which module is running. Leaf modules (weight layers, norms, attention, activations,
Fixup's scalars, the user's ``leaf_modules``) are recorded as one ``call_module`` node each and not looked
into; everything else is recorded op by op. The record is a ``torch.fx.Graph`` (used for the analysis only:
it is never run), with the same conventions as a symbolic trace: ``placeholder`` nodes for the inputs,
``get_attr`` nodes for parameters and buffers, ``meta["nn_module_stack"]`` for the enclosing modules.

Because the model really runs, Python control flow on sizes, data-dependent shapes and whatever a
symbolic tracer cannot follow (Hugging Face models, ``torch.rand(x.shape[0], ...)``) just work, and
shape reads are plain integers, so nothing depends on a tensor through its shape. A decision on a
tensor's *values* (``if x.sum() > 0:``, ``.item()``) is recorded: the model would take the same branch
for every input only by chance, and ``adapt(strict=True)`` refuses it.

A subclass of a norm whose forward is its own (timm's ``BatchNormAct2d``: batch norm, then its ``drop``
and ``act`` children) is looked into: its functional norm call is recorded as a ``call_module`` node of
the module, and what follows (its activation) as usual, so the activation is seen and kept.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn
from torch.overrides import TorchFunctionMode

from ..branch import WEIGHT_LAYERS
from . import _vocab as V

__all__ = ["FUSED", "Recording", "is_plain_norm", "record"]

_PLAIN_NORM_FORWARDS = {nn.modules.batchnorm._BatchNorm.forward, nn.GroupNorm.forward, nn.LayerNorm.forward,
                        nn.modules.instancenorm._InstanceNorm.forward}
_FUNCTIONAL_NORMS = {F.batch_norm, F.layer_norm, F.group_norm, F.instance_norm, F.rms_norm, torch.batch_norm,
                     torch.layer_norm, torch.group_norm}
_DUNDER = {"__add__": operator.add, "__radd__": operator.add, "__iadd__": operator.iadd, "__mul__": operator.mul,
           "__rmul__": operator.mul, "__imul__": operator.imul, "__getitem__": operator.getitem,
           "__matmul__": operator.matmul, "__rmatmul__": operator.matmul, "__truediv__": operator.truediv,
           "__sub__": operator.sub, "__rsub__": operator.sub, "__neg__": operator.neg}
# Reads of a tensor's values into Python: control flow or arithmetic on data.
_VALUE_READS = {"__bool__", "item", "tolist", "__int__", "__float__", "__index__", "__len__"}
FUSED = "fixup_fused_norm"  # node.meta key: this norm node is the norm part of a fused norm+activation module


def is_plain_norm(mod: nn.Module) -> bool:
    """One of PyTorch's norm modules (or a subclass that keeps its forward)."""
    return isinstance(mod, V.NORM_LAYERS) and type(mod).forward in _PLAIN_NORM_FORWARDS


def _is_fused_norm(mod: nn.Module) -> bool:
    return isinstance(mod, V.NORM_LAYERS) and type(mod).forward not in _PLAIN_NORM_FORWARDS


def _matrix(mod: nn.Module) -> bool:
    """A childless module of another type with a 2-D ``weight`` (``transformers``' Conv1D, an embedding)."""
    w = mod._parameters.get("weight")
    return isinstance(w, Tensor) and w.dim() == 2 and not mod._modules


@dataclass
class Recording:
    """What one forward computed: the graph, the value reads, and each module's calls."""

    graph: fx.Graph
    value_reads: list[tuple[fx.Node, str]] = field(default_factory=list)  # reads of tensor values into Python
    calls: dict[str, int] = field(default_factory=dict)    # module path -> number of calls
    output: Any = None

    def nonlinearities(self, modules: dict[str, nn.Module]) -> list[str]:
        """Every activation, gate and softmax computed, by node name and where (module scope or target)."""
        out = []
        for n in self.graph.nodes:
            if V.is_activation(n, modules) or V._name(n) in ("softmax", "log_softmax"):
                stack = n.meta.get("nn_module_stack") or {}
                where = str(n.target) if n.op == "call_module" else next(reversed(stack.values()))[0] if stack else ""
                out.append(f"{V._name(n)}@{where}")
        return out


class _Recorder(TorchFunctionMode):
    def __init__(self, root: nn.Module, leaves: tuple[type[nn.Module], ...]) -> None:
        super().__init__()
        self.root, self.leaves = root, leaves
        self.graph = fx.Graph()
        self.rec = Recording(self.graph)
        self.nodes: dict[int, fx.Node] = {}
        self.alive: list[Any] = []                 # keeps recorded tensors alive, so their ids stay unique
        self.names = {id(m): n for n, m in root.named_modules()}
        self.attrs = {id(t): n for n, t in [*root.named_parameters(), *root.named_buffers()]}
        self.stack: list[tuple[str, type]] = []
        self.inside_leaf = 0                       # > 0 while a leaf module runs: its ops are not recorded
        self.fused: list[str] = []                 # fused norm modules running
        self.handles: list[Any] = []

    # --- modules ---
    def is_leaf(self, mod: nn.Module) -> bool:
        if mod is self.root:
            return False
        if isinstance(mod, (*WEIGHT_LAYERS, nn.MultiheadAttention, *self.leaves)) or is_plain_norm(mod):
            return True
        if isinstance(mod, V._ACTIVATIONS + V._PASSTHROUGH_MODULES) and not mod._modules:  # Bias, Scale among them
            return True
        return _matrix(mod)

    def attach(self) -> None:
        for mod in self.root.modules():
            self.handles.append(mod.register_forward_pre_hook(self._enter, with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._leave, with_kwargs=True, always_call=True))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()

    def _meta(self) -> dict[str, Any]:
        return {"nn_module_stack": {p: (p, t) for p, t in self.stack}}

    def _enter(self, mod: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.inside_leaf:
            self.inside_leaf += 1
            return
        path = self.names.get(id(mod), "")
        if mod is not self.root:
            self.rec.calls[path] = self.rec.calls.get(path, 0) + 1
        if self.is_leaf(mod):
            self.inside_leaf = 1
            return
        if mod is not self.root:
            self.stack.append((path, type(mod)))
        if _is_fused_norm(mod):
            self.fused.append(path)

    def _leave(self, mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        if self.inside_leaf > 1:
            self.inside_leaf -= 1
            return
        path = self.names.get(id(mod), "")
        if self.inside_leaf == 1:
            self.inside_leaf = 0
            node = self.graph.create_node("call_module", path, self._arg(args), self._arg(kwargs))
            node.meta.update(self._meta())
            if (_matrix(mod) and not isinstance(mod, WEIGHT_LAYERS)) or isinstance(mod, nn.Embedding):
                kind = _matrix_kind(mod, args, out)
                if kind:
                    node.meta[V.WEIGHT_KIND] = kind
            self._bind(out, node)
            return
        if self.fused and self.fused[-1] == path:
            self.fused.pop()
        if self.stack and self.stack[-1][0] == path and mod is not self.root:
            self.stack.pop()

    # --- values ---
    def _node_for(self, t: Tensor) -> fx.Node:
        node = self.nodes.get(id(t))
        if node is None:
            name = self.attrs.get(id(t), f"constant_{len(self.nodes)}")
            node = self.graph.create_node("get_attr", name)
            node.meta.update(self._meta())
            node.meta["param"] = isinstance(t, nn.Parameter)
            node.meta["dim"] = t.dim()
            self.nodes[id(t)] = node
            self.alive.append(t)
        return node

    def _arg(self, value: Any) -> Any:
        if isinstance(value, Tensor):
            return self._node_for(value)
        if isinstance(value, list):
            return [self._arg(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._arg(v) for v in value)
        if isinstance(value, dict):
            return {k: self._arg(v) for k, v in value.items()}
        if value is None or isinstance(value, (int, float, bool, str, slice, torch.dtype, torch.device)) \
                or value is Ellipsis:
            return value
        return type(value).__name__

    def _bind(self, out: Any, node: fx.Node) -> None:
        if isinstance(out, Tensor):
            self.nodes[id(out)] = node
            self.alive.append(out)
            return
        for i, t in _tensors_in(out):
            item = self.graph.create_node("call_function", operator.getitem, (node, i))
            item.meta.update(self._meta())
            self.nodes[id(t)] = item
            self.alive.append(t)

    def placeholder(self, i: int, t: Tensor) -> None:
        node = self.graph.create_node("placeholder", f"input_{i}")
        self.nodes[id(t)] = node
        self.alive.append(t)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.inside_leaf:
            return out
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a property such as x.shape or x.T
            name = getattr(getattr(func, "__self__", None), "__name__", name)
        if name in _VALUE_READS:
            if args and isinstance(args[0], Tensor) and id(args[0]) in self.nodes:
                stack = [p for p, _ in self.stack]
                node = self.nodes[id(args[0])]
                self.rec.value_reads.append((node, f"{name} of {node.name} in {stack[-1] if stack else 'the root'}"))
            return out
        if not any(True for _ in _tensors_in(out)):
            return out  # a shape, a dtype, a Python number: no dependency worth tracking
        if self.fused and func in _FUNCTIONAL_NORMS:
            node = self.graph.create_node("call_module", self.fused[-1], (self._arg(args[0]),))
            node.meta.update(self._meta())
            node.meta[FUSED] = True
        elif name in _DUNDER or _is_method(func):
            if name in _DUNDER:
                node = self.graph.create_node("call_function", _DUNDER[name], self._arg(args), self._arg(kwargs))
            else:
                node = self.graph.create_node("call_method", name, self._arg(args), self._arg(kwargs))
            node.meta.update(self._meta())
        else:
            node = self.graph.create_node("call_function", func, self._arg(args), self._arg(kwargs))
            node.meta.update(self._meta())
        self._bind(out, node)
        return out


def _is_method(func: Any) -> bool:
    """A tensor method (``x.view``, ``x.split``), as opposed to a function of the torch namespace."""
    return getattr(func, "__objclass__", None) is torch._C.TensorBase or \
        getattr(func, "__qualname__", "").startswith(("Tensor.", "TensorBase."))


def _matrix_kind(mod: nn.Module, args: tuple, out: Any) -> str | None:
    w = mod._parameters["weight"]
    if isinstance(mod, nn.Embedding) or (args and isinstance(args[0], Tensor) and not args[0].is_floating_point()):
        return "lookup"  # an embedding table indexed by ids: not a linear map of the signal
    if not (args and isinstance(args[0], Tensor) and isinstance(out, Tensor)):
        return None
    if args[0].shape[-1] == w.shape[0] and out.shape[-1] == w.shape[1]:
        return "transposed"
    if args[0].shape[-1] == w.shape[1] and out.shape[-1] == w.shape[0]:
        return "linear"
    return None


def _tensors_in(value: Any) -> Iterator[tuple[Any, Tensor]]:
    """(index, tensor) for the tensors directly inside ``value`` (a tensor, a tuple/list, a dict or a
    ``ModelOutput``); a bare tensor is index ``None``."""
    if isinstance(value, Tensor):
        yield None, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if isinstance(v, Tensor):
                yield i, v
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, Tensor):
                yield k, v


def flatten_tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten_tensors(v)]
    return []


def record(model: nn.Module, example: tuple[Tensor, ...],
           leaf_modules: tuple[type[nn.Module], ...] = ()) -> Recording:
    """Run ``model(*example)`` once, without gradients, and return what it computed.

    Raises ``ValueError`` naming the error when the forward itself fails on the example input.
    """
    rec = _Recorder(model, leaf_modules)
    for i, t in enumerate(example):
        rec.placeholder(i, t)
    rec.attach()
    try:
        with torch.no_grad(), rec:
            out = model(*example)
    except Exception as err:  # the user's forward can raise anything
        raise ValueError(f"{type(model).__name__} failed on the example input: {type(err).__name__}: {err}. "
                         "Pass the positional inputs its forward expects (a tensor, or a tuple of tensors)") from err
    finally:
        rec.detach()
    rec.graph.output(tuple(rec._node_for(t) for t in flatten_tensors(out) if id(t) in rec.nodes))
    rec.rec.output = out
    return rec.rec
