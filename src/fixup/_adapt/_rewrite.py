"""Rewriting the user's model, in place, into Fixup's parameterisation, from the analysis of its recording.

Norms become scalar biases (where they stood before an activation or inside a branch) or go (on the
residual stream, on shortcuts); a fused norm+activation module keeps its activation. Each branch gets
a scalar bias before each weight layer and activation that has none yet, and a multiplier after its
last weight layer (after each path's, where the branch ends in several: _ends.py), unless it already has one
(a layer scale). The blocks then declare their branches.
Nothing is matched by name: every decision comes from the recorded computation.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import fx, nn

from ..branch import Branch, WeightSlice
from ..nn import Bias, Gate, Scale
from . import _vocab as T
from ._graph import AdaptError, Analysis, Residual
from ._modules import (
    DeclaredBranches,
    DeclaredClassifier,
    FusedNormBias,
    FusedNormTail,
    LayerScaleHandle,
    TransposedWeight,
    bias_inputs,
    bias_output,
    scale_output,
)
from ._record import FUSED
from ._report import NormChange

__all__ = ["Rewriter"]


def _scope(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


class Rewriter:
    """Applies the analysis of a recording to the recorded model itself."""

    def __init__(self, model: nn.Module, graph: fx.Graph, analysis: Analysis, calls: dict[str, int]) -> None:
        self.model, self.graph, self.an, self.calls = model, graph, analysis, calls
        self.modules: dict[str, nn.Module] = dict(model.named_modules())
        # every place the model registers each module (owner, attribute), aliases included; kept as modules change
        self.holders: dict[nn.Module, list[tuple[nn.Module, str]]] = {}
        for owner in model.modules():
            for name, child in owner._modules.items():
                if child is not None:
                    self.holders.setdefault(child, []).append((owner, name))
        self.order = {n: i for i, n in enumerate(graph.nodes)}
        self.bias_of: dict[fx.Node, Bias] = {}     # node whose output now carries this scalar bias
        self.shared: dict[fx.Node, Bias] = {}      # bias created for a source node (Q, K and V share it)
        self.names: dict[int, str] = {}            # id(module) -> qualified name, for new modules too
        self.norms: list[NormChange] = []
        self.added: list[str] = []
        self.notes: list[str] = []
        self.layer_scales: list[str] = []
        self.gated_layer_scales: list[LayerScaleHandle] = []  # gated methods: layer scales kept as weights (set to 1)
        self.fused_qkv: list[str] = []
        weight = next((p for p in model.parameters() if p.is_floating_point()), None)
        self.placement = {} if weight is None else {"device": weight.device, "dtype": weight.dtype}

    # --- helpers ---
    def _set(self, path: str, new: nn.Module) -> None:
        """Put ``new`` at ``path``, and wherever else the model holds the module that was there: a block that
        registers one layer under two names (a ``projection`` that is also ``shortcut[0]``) calls it by either."""
        parent, _, leaf = path.rpartition(".")
        old = self.modules.get(path)
        holders = self.holders.pop(old, []) if old is not None else []
        here = (self.modules[parent] if parent else self.model, leaf)
        if not any(o is here[0] and n == leaf for o, n in holders):
            holders.append(here)
        for owner, name in holders:
            setattr(owner, name, new)
        self.holders.setdefault(new, []).extend(holders)
        self.modules[path] = new

    def _attach(self, module: nn.Module, path: str, stem: str, new: nn.Module) -> str:
        """Register ``new`` as a child of ``module`` named ``stem`` (``stem_2``, ... if taken); return the name."""
        for name, child in module.named_children():
            if child is new:
                return name
        name, k = stem, 2
        while hasattr(module, name):
            name, k = f"{stem}_{k}", k + 1
        module.add_module(name, new.to(**self.placement))
        self.added.append(f"{path}.{name}" if path else name)
        return name

    def _biased(self, node: fx.Node) -> Bias | None:
        """The scalar bias ``node``'s output already carries (through dropout and identities), if any."""
        while True:
            if node in self.bias_of:
                return self.bias_of[node]
            mod = T.module_of(node, self.modules)
            if isinstance(mod, Bias):
                return mod
            if mod is not None and T.is_passthrough(node, self.modules) and not T.is_norm(node, self.modules) \
                    and len(node.all_input_nodes) == 1:
                node = node.all_input_nodes[0]
                continue
            return None

    def _effective_users(self, node: fx.Node) -> list[fx.Node]:
        out, stack = [], list(node.users)
        while stack:
            u = stack.pop()
            if T.is_passthrough(u, self.modules) and not T.is_norm(u, self.modules) and \
                    not isinstance(T.module_of(u, self.modules), (Bias, Scale)) and len(u.all_input_nodes) == 1:
                stack.extend(u.users)
            else:
                out.append(u)
        return out

    # --- normalisation ---
    def norms_out(self, biases: bool = True,
                  removed_why: str = "a gated method adds no bias (gate_biases=False)") -> None:
        """Take every normalisation out: a scalar bias in its place where Fixup keeps one (``biases``), else none
        (the report saying ``removed_why``)."""
        owner = {n: r for r in self.an.residuals for n in r.data}
        done: set[str] = set()
        for node in list(self.graph.nodes):
            if not T.is_norm(node, self.modules) or str(node.target) in done:
                continue
            path = str(node.target)
            done.add(path)
            users, r = self._effective_users(node), owner.get(node)
            if r is not None and users and all(u in r.layers for u in users):
                action, why = "bias", "the scalar bias before the branch's next weight layer"
            elif r is not None:
                action, why = "bias", "on a residual branch"
            elif any(T.is_activation(u, self.modules) for u in users):
                action, why = "bias", "before an activation outside the residual branches"
            else:
                action, why = "removed", "on the residual stream or a shortcut (Fixup keeps no bias there)"
            if not biases:
                action, why = "removed", removed_why
            mod = self.modules[path]
            if node.meta.get(FUSED):
                tail = self._fused_tail(node, path, mod)
                new: nn.Module = FusedNormBias(tail, type(mod).__name__) if action == "bias" else \
                    FusedNormTail(tail, type(mod).__name__)
                if tail:
                    why += f"; keeps its {', '.join(n for n, _ in tail)}"
            else:
                new = Bias() if action == "bias" else nn.Identity()
            self.norms.append(NormChange(path, type(mod).__name__, action, why))
            self._set(path, new.to(**self.placement))
            if action == "bias":
                self.bias_of[node] = new  # type: ignore[assignment]

    def _fused_tail(self, norm: fx.Node, path: str, mod: nn.Module) -> list[tuple[str, nn.Module]]:
        """The children a fused norm module applies after its normalisation, in order; anything else it
        computes there must be a reshape (a scalar bias commutes with it)."""
        tail: list[tuple[str, nn.Module]] = []
        for n in self.graph.nodes:
            if path not in (n.meta.get("nn_module_stack") or {}) or n is norm or n.op == "get_attr":
                continue
            child = str(n.target)[len(path) + 1:] if n.op == "call_module" else ""
            if child and "." not in child and child in mod._modules:
                if self.order[n] < self.order[norm]:
                    raise AdaptError(f"{path} ({type(mod).__name__}) calls its child {child!r} before its "
                                     "normalisation; fixup.adapt cannot tell what to keep. Replace it with separate "
                                     "norm and activation modules")
                if child not in (c for c, _ in tail):
                    tail.append((child, mod._modules[child]))
            elif not T.is_passthrough(n, self.modules):
                raise AdaptError(f"{path} ({type(mod).__name__}) computes {T._name(n)!r} itself besides its "
                                 "normalisation; fixup.adapt would lose it when replacing the norm. Write that "
                                 "operation as a child module (e.g. self.act = nn.ReLU()) or outside the norm")
        return tail

    # --- scalars ---
    def _hook_bias(self, module: nn.Module, path: str, positions: dict[int, Bias]) -> None:
        names = {i: self._attach(module, path, "fixup_bias", b) for i, b in positions.items()}
        module.register_forward_pre_hook(functools.partial(bias_inputs, names))

    def _bias_layer(self, n: fx.Node, allowed: set[fx.Node]) -> list[Bias]:
        """Scalar biases before the weight layer called at ``n`` (one per distinct input)."""
        path = str(n.target)
        module = self.modules[path]
        count = 3 if isinstance(module, nn.MultiheadAttention) else 1
        made, positions = [], {}
        for i, a in enumerate(n.args[:count]):
            if not isinstance(a, fx.Node) or a not in allowed:
                continue
            b = self._biased(a)
            if b is None:
                b = self.shared.setdefault(a, Bias())
                positions[i] = b
            made.append(b)
        if positions:
            self._hook_bias(module, path, positions)
        return made

    def _bias_activation(self, n: fx.Node) -> list[Bias]:
        wrapper = _scope(n)
        outer = self._activation_module(wrapper) if wrapper else None
        src = outer or next((a for a in n.args if isinstance(a, fx.Node)), None)
        if src is None:
            return []
        b = self._biased(src)
        if b is not None:
            return [b]
        b = self.shared.setdefault(src, Bias())
        if n.op == "call_module" and self.calls.get(str(n.target)) == 1:
            self._hook_bias(self.modules[str(n.target)], str(n.target), {0: b})
            return [b]
        if outer is not None:  # an activation written as a module (transformers' GELUActivation)
            self._hook_bias(self.modules[wrapper], wrapper, {0: b})
            self.bias_of[outer] = b
            return [b]
        if src.op == "call_module" and self.calls.get(str(src.target)) == 1 and len(src.users) == 1:
            module = self.modules[str(src.target)]
            self._attach(module, str(src.target), "fixup_out_bias", b)
            module.register_forward_hook(bias_output)
            self.bias_of[src] = b
            return [b]
        self.shared.pop(src)
        self.notes.append(f"no scalar bias before the activation {n.name!r} in {wrapper or 'the root'}: its input "
                          "is computed by a function, not by a module a bias can be attached to")
        return []

    def _activation_module(self, path: str) -> fx.Node | None:
        """The input of ``path`` if it is an activation written as a module: no parameters, called once, an
        element-wise computation of one input with no weight layer or other module inside."""
        mod = self.modules[path]
        if self.calls.get(path) != 1 or any(True for _ in mod.parameters()):
            return None
        inside = [m for m in self.graph.nodes if path in (m.meta.get("nn_module_stack") or {})]
        if not all(m.op in ("call_function", "call_method", "get_attr") for m in inside):
            return None
        outside = {p for m in inside for p in T.data_inputs(m) if p not in inside and p.op != "get_attr"}
        return outside.pop() if len(outside) == 1 else None

    def branch(self, r: Residual, gated: bool = False) -> tuple[str, Branch]:
        """Put in the branch's scalars and return the block that declares it and its declaration.

        ``gated`` (SkipInit, ReZero): the branch's multiplier is a :class:`fixup.Gate` that starts at 0, and no
        scalar bias is added before its layers and activations (the norms' shifts are biases only under
        ``adapt(..., gate_biases=True)``); a layer scale the branch already has is kept as a weight, set to 1 by
        the initialiser."""
        assert r.ends is not None  # every residual the analysis returns has its ends
        data = r.data | {r.fork}
        biases: list[Bias] = []
        stream: Bias | None = None
        for n in sorted(r.data, key=self.order.__getitem__):
            b = self.bias_of.get(n) or (T.module_of(n, self.modules) if isinstance(
                T.module_of(n, self.modules), Bias) else None)
            if b is None:
                continue
            if n in r.ends.joined:  # after the ends, on every path: the bias shifts the stream
                stream = stream or b  # type: ignore[assignment]
            else:
                biases.append(b)  # type: ignore[arg-type]
        for n in sorted(r.data, key=self.order.__getitem__) if not gated else ():
            if n in r.layers:
                biases += self._bias_layer(n, data)
            elif T.is_activation(n, self.modules) and n not in r.ends.tail:
                biases += self._bias_activation(n)
        scale: Scale
        if gated:
            if r.layer_scale is not None:
                owner_path, _, pname = str(r.layer_scale.target).rpartition(".")
                self.layer_scales.append(str(r.layer_scale.target))
                self.gated_layer_scales.append(LayerScaleHandle(self.modules[owner_path] if owner_path else self.model,
                                                                pname, str(r.layer_scale.target)))
            scale = Gate()
            self._scale_ends(r, scale)  # a Gate in the multiplier's place
        elif r.layer_scale is not None:
            owner_path, _, pname = str(r.layer_scale.target).rpartition(".")
            scale = LayerScaleHandle(self.modules[owner_path] if owner_path else self.model, pname,
                                     str(r.layer_scale.target))
            self.layer_scales.append(str(r.layer_scale.target))
        else:
            scale = Scale()
            self._scale_ends(r, scale)
        unique = list({id(b): b for b in biases if b is not stream}.values())
        projection = T.module_of(r.projection, self.modules) if r.projection is not None else None
        layers, m = self._layers(r)
        return self._container(r), Branch(layers=layers, kind=self._kind(r), m=m, biases=unique, scale=scale,
                                          shortcut=projection, stream_bias=stream, ends=len(r.ends.layers))

    def _scale_ends(self, r: Residual, scale: Scale) -> None:
        """The branch's multiplier on the output of each end that reads no other end: every path of the branch
        goes through one of them (one scalar, shared where the branch ends in several parallel layers)."""
        assert r.ends is not None
        for end in r.ends.first:
            module = self.modules[str(end.target)]
            self._attach(module, str(end.target), "fixup_scale", scale)
            module.register_forward_hook(scale_output)

    def _container(self, r: Residual) -> str:
        paths = [str(n.target) for n in r.layers]
        block = r.block
        while block and not all(p.startswith(block + ".") for p in paths):
            block = block.rpartition(".")[0]
        return block

    def _layers(self, r: Residual) -> tuple[list[nn.Module | WeightSlice], int]:
        """The branch's declared layers (the ends last: rule 1 zeroes them) and m, the declared layers on its path
        with the most (_ends.py)."""
        assert r.ends is not None
        declared: dict[fx.Node, list[nn.Module | WeightSlice]] = {}
        attention = self._kind(r) == "attention"
        last = r.layers[-1]
        last_width = _width(self.modules[str(last.target)], last)
        for i, n in enumerate(r.layers):
            mod = self.modules[str(n.target)]
            if isinstance(mod, nn.MultiheadAttention):
                declared[n] = _mha_layers(mod)
                continue
            transposed = n.meta.get(T.WEIGHT_KIND) == "transposed"
            width = _width(mod, n)
            bias = "bias" if isinstance(getattr(mod, "bias", None), nn.Parameter) else None
            if attention and i == 0 and n is not last and last_width and width == 3 * last_width:
                # Q, K and V fused in one layer (timm's ViT qkv, GPT-2's c_attn): three layers, as if separate.
                cls = TransposedWeight if transposed else WeightSlice
                declared[n] = [cls(mod, "weight", (k * last_width, (k + 1) * last_width), bias) for k in range(3)]
                self.fused_qkv.append(str(n.target))
            elif transposed:
                declared[n] = [TransposedWeight(mod, "weight", None, bias)]
            else:
                declared[n] = [mod]
        ends = r.ends.layers  # an attention's Q, K and V come before the ends; its output projection is one
        inner = [d for n in r.layers for d in (declared[n] if n not in ends else declared[n][:-1])]
        m = sum(len(declared[n]) for n in r.path)
        return inner + [declared[n][-1] for n in ends], m

    def _kind(self, r: Residual) -> str:
        mods = [T.module_of(n, self.modules) for n in r.layers]
        if any(isinstance(m, nn.MultiheadAttention) for m in mods) or \
                any(T._name(n) in ("scaled_dot_product_attention", "softmax") for n in r.data):
            return "attention"
        if all(not isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) for m in mods):
            return "mlp" if len(mods) > 1 else "linear"
        return "conv" if all(isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) for m in mods) else "mixed"

    def classifier(self, nodes: list[fx.Node], bias: bool = True) -> list[nn.Module]:
        """The classifier's layers, with rule 3's scalar bias before each unless ``bias`` is False."""
        out = []
        everything = set(self.graph.nodes)
        for n in nodes:
            if bias:
                self._bias_layer(n, everything)
            out.append(self.modules[str(n.target)])
        return out

    def declare(self, declared: dict[str, list[Branch]], classifier: list[nn.Module]) -> None:
        """Each block declares its branches (``residual_branches()``), the root its classifier."""
        for path, branches in declared.items():
            block = self.modules[path] if path else self.model
            block.residual_branches = DeclaredBranches(branches)
        self.model.classifier_layers = DeclaredClassifier(classifier)


def _width(mod: nn.Module, node: fx.Node) -> int:
    """Output features of a weight layer."""
    weight: Any = getattr(mod, "weight", None)
    if weight is None or weight.dim() < 2:
        return 0
    return int(weight.shape[1] if node.meta.get(T.WEIGHT_KIND) == "transposed" else weight.shape[0])


def _mha_layers(mod: nn.MultiheadAttention) -> list[nn.Module | WeightSlice]:
    e = mod.embed_dim
    rows = [(i * e, (i + 1) * e) for i in range(3)]
    if mod._qkv_same_embed_dim:
        qkv = [WeightSlice(mod, "in_proj_weight", r, "in_proj_bias") for r in rows]
    else:
        qkv = [WeightSlice(mod, p, None, "in_proj_bias", r)
               for p, r in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), rows)]
    return [*qkv, mod.out_proj]
