"""Rewriting the traced graph into Fixup's parameterisation, and the modules that declare the branches.

Norms become scalar biases or go; scalar biases are inserted before each weight layer and activation
of a branch, a multiplier after its last weight layer; each block that computes a residual sum
becomes an :class:`AdaptedBlock` that declares its branches, and the root declares its classifier.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from torch import fx, nn

from ..branch import Branch, WeightSlice, find_branches
from ..nn import Bias, Scale
from . import _trace as T
from ._graph import AdaptError, Analysis, Residual
from ._report import NormChange

__all__ = ["AdaptedBlock", "FixupAdapted", "Rewriter", "declare"]


class _Declarations(nn.Module):
    """Holds (without registering) what the adapted root declares: its own branches and the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.branches: list[Branch] = []
        self.classifier: list[nn.Module] = []


class AdaptedBlock(nn.Module):
    """A block of the adapted model: the original block's children, plus the branches it declares."""

    def __init__(self, original: nn.Module, original_type: str) -> None:
        super().__init__()
        for store in ("_parameters", "_buffers", "_modules"):
            getattr(self, store).update(getattr(original, store))
        self.original_type = original_type
        self.branches: list[Branch] = []

    def residual_branches(self) -> Sequence[Branch]:
        return list(self.branches)

    def extra_repr(self) -> str:
        return f"adapted from {self.original_type}: {len(self.branches)} residual branch(es)"


class FixupAdapted(fx.GraphModule):
    """The adapted model: the traced computation of the original, in Fixup's parameterisation."""

    def residual_branches(self) -> Sequence[Branch]:
        return list(self.fixup_decl.branches)

    def classifier_layers(self) -> Sequence[nn.Module]:
        return list(self.fixup_decl.classifier)

    def __reduce__(self) -> tuple:
        # GraphModule pickles as a plain GraphModule; come back as a FixupAdapted (children, among
        # them the declarations, survive the round trip).
        return _restore, (super().__reduce__(),)


def _restore(reduced: tuple) -> FixupAdapted:
    rebuild, args = reduced
    gm = rebuild(*args)
    gm.__class__ = type(type(gm).__name__, (type(gm), FixupAdapted), {})
    return gm


class Rewriter:
    """Rewrites the traced graph in place: norms out, scalars in, declarations attached."""

    def __init__(self, gm: FixupAdapted, analysis: Analysis) -> None:
        self.gm, self.an = gm, analysis
        self.modules = dict(gm.named_modules())
        self.added: list[str] = []
        self.norms: list[NormChange] = []
        self.bias_nodes: set[fx.Node] = set()
        self.removed: list[fx.Node] = []
        self.bias_after: dict[fx.Node, fx.Node] = {}
        self.index = {n: i for i, n in enumerate(gm.graph.nodes)}  # execution order of the traced nodes
        # New scalars live where the model's weights do (device and floating dtype).
        weight = next((p for p in gm.parameters() if p.is_floating_point()), None)
        self.placement = {} if weight is None else {"device": weight.device, "dtype": weight.dtype}

    def _add(self, container: str, stem: str, module: nn.Module) -> str:
        parent = self.gm.get_submodule(container) if container else self.gm
        name, k = f"fixup_{stem}", 2
        while hasattr(parent, name):
            name, k = f"fixup_{stem}_{k}", k + 1
        target = f"{container}.{name}" if container else name
        self.gm.add_submodule(target, module.to(**self.placement))
        self.modules[target] = module
        self.added.append(target)
        return target

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

    def _biased(self, node: fx.Node) -> fx.Node | None:
        """The Bias node that ``node`` is (or follows through identities and dropout), if any."""
        while True:
            if node in self.bias_nodes or isinstance(T.module_of(node, self.modules), Bias):
                return node
            if T.is_passthrough(node, self.modules) and not T.is_norm(node, self.modules) and \
                    len(node.all_input_nodes) == 1 and node.op == "call_module":
                node = node.all_input_nodes[0]
                continue
            return None

    def norms_out(self) -> None:
        owner = {n: r for r in self.an.residuals for n in r.data}
        for node in list(self.gm.graph.nodes):
            if not T.is_norm(node, self.modules):
                continue
            users, r = self._effective_users(node), owner.get(node)
            mod = T.module_of(node, self.modules)
            if r is not None and users and all(u in r.layers for u in users):
                action, why = "removed", "a scalar bias is placed before the next weight layer of the branch"
            elif r is not None:
                action, why = "bias", "on a residual branch"
            elif any(T.is_activation(u, self.modules) for u in users):
                action, why = "bias", "before an activation outside the residual branches"
            else:
                action, why = "removed", "on the residual stream or a shortcut (Fixup keeps no bias there)"
            self.norms.append(NormChange(str(node.target), type(mod).__name__, action, why))
            if action == "bias":
                bias = Bias().to(**self.placement)
                parent, _, leaf = str(node.target).rpartition(".")
                setattr(self.gm.get_submodule(parent) if parent else self.gm, leaf, bias)
                self.modules[str(node.target)] = bias
                self.bias_nodes.add(node)
            else:
                self.removed.append(node)

    def remove_norms(self) -> None:
        """Take out the norms marked "removed" (after the branches are rewritten: the analysis refers to them)."""
        for node in self.removed:
            node.replace_all_uses_with(node.args[0])
            self.gm.graph.erase_node(node)
            if not any(n.target == node.target for n in self.gm.graph.nodes if n.op == "call_module"):
                self.gm.delete_submodule(str(node.target))

    def _bias_before(self, node: fx.Node, sources: list[fx.Node], container: str, stem: str) -> list[fx.Node]:
        made = []
        for src in dict.fromkeys(sources):
            existing = self._biased(src)
            if existing is not None:
                made.append(existing)
                continue
            b = self.bias_after.get(src)
            if b is None:  # one bias per source: Q, K and V of one input share it
                target = self._add(container, f"bias_{stem}", Bias())
                with self.gm.graph.inserting_after(src):
                    b = self.gm.graph.call_module(target, (src,))
                self.bias_nodes.add(b)
                self.bias_after[src] = b
            node.replace_input_with(src, b)
            made.append(b)
        return made

    def branch(self, r: Residual) -> tuple[str, list[fx.Node], str]:
        """Insert the branch's scalar biases and its multiplier; return its container, biases, multiplier."""
        g, container = self.gm.graph, self._container(r)
        data = r.data | {r.fork}
        biases: list[fx.Node] = [n for n in r.data if n in self.bias_nodes or
                                 isinstance(T.module_of(n, self.modules), Bias)]
        for n in sorted(r.data, key=self.index.__getitem__):
            if n in r.layers or T.is_activation(n, self.modules):
                sources = [a for a in n.args[:3] if isinstance(a, fx.Node) and a in data]
                stem = str(n.target).rpartition(".")[2] if n.op == "call_module" else n.name
                biases += self._bias_before(n, sources, container, stem)
        after = last = r.layers[-1]
        if isinstance(T.module_of(last, self.modules), nn.MultiheadAttention):
            outs = [u for u in last.users if u.target is operator.getitem and u.args[1] == 0]
            if len(outs) != 1:
                raise AdaptError(f"{last.target!r}: the attention output is used other than as `[0]`")
            after = outs[0]
        target = self._add(container, "scale", Scale())
        with g.inserting_after(after):
            s = g.call_module(target, (after,))
        after.replace_all_uses_with(s, delete_user_cb=lambda u: u is not s)
        return container, biases, target

    def declare(self, r: Residual, biases: list[fx.Node], scale: str, order: dict[fx.Node, int]) -> Branch:
        return Branch(
            layers=[layer for n in r.layers for layer in self._layers(n)],
            kind=self._kind(r), biases=[self.modules[str(b.target)] for b in sorted(set(biases), key=order.get)],
            scale=self.modules[scale],
            shortcut=T.module_of(r.projection, self.modules) if r.projection is not None else None)

    def _container(self, r: Residual) -> str:
        names = [str(n.target) for n in r.layers]
        if r.block and all(name.startswith(r.block + ".") for name in names):
            return r.block
        return ""

    def _layers(self, node: fx.Node) -> list[nn.Module | WeightSlice]:
        mod = T.module_of(node, self.modules)
        if not isinstance(mod, nn.MultiheadAttention):
            return [mod]
        e = mod.embed_dim
        rows = [(i * e, (i + 1) * e) for i in range(3)]
        if mod._qkv_same_embed_dim:
            qkv = [WeightSlice(mod, "in_proj_weight", r, "in_proj_bias") for r in rows]
        else:
            qkv = [WeightSlice(mod, p, None, "in_proj_bias", r)
                   for p, r in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), rows)]
        return [*qkv, mod.out_proj]

    def _kind(self, r: Residual) -> str:
        mods = [T.module_of(n, self.modules) for n in r.layers]
        if any(isinstance(m, nn.MultiheadAttention) for m in mods) or \
                any(T._name(n) in ("scaled_dot_product_attention", "softmax") for n in r.data):
            return "attention"
        if all(isinstance(m, nn.Linear) for m in mods):
            return "mlp" if len(mods) > 1 else "linear"
        return "conv" if all(not isinstance(m, nn.Linear) for m in mods) else "mixed"

    def classifier(self, nodes: list[fx.Node]) -> list[nn.Module]:
        out = []
        for n in nodes:
            src = n.args[0]
            if isinstance(src, fx.Node):
                self._bias_before(n, [src], str(n.target).rpartition(".")[0], n.name)
            out.append(T.module_of(n, self.modules))
        return out


def declare(gm: FixupAdapted, declared: dict[str, list[Branch]], types: dict[str, str],
            classifier: list[nn.Module]) -> dict[int, str]:
    """Attach each block's branches to it (an AdaptedBlock in place of the traced container) and the
    classifier to the root; return each branch's name as ``find_branches`` reports it."""
    gm.add_submodule("fixup_decl", _Declarations())
    gm.fixup_decl.classifier = classifier
    for path, branches in declared.items():
        if not path:
            gm.fixup_decl.branches = branches
            continue
        parent, _, leaf = path.rpartition(".")
        block = AdaptedBlock(gm.get_submodule(path), types.get(path, "Module"))
        setattr(gm.get_submodule(parent) if parent else gm, leaf, block)
        block.branches = branches
    return {id(b): name for name, b in find_branches(gm)}
