"""Fixup for models written elsewhere: find the residual branches, take out normalisation, apply the rule.

``fixup.adapt(model, example_input)`` traces the model with torch.fx, finds every residual sum
``y = shortcut(x) + F(x)`` (see :mod:`fixup.adapt._graph` for how), and returns a copy in which

* each BatchNorm/GroupNorm/LayerNorm/InstanceNorm is a scalar :class:`fixup.Bias` where it stood
  before an activation or at a branch's end, and is removed where a scalar bias is placed anyway
  (before the next weight layer) or where it sat on the residual stream (the post-norm Transformer);
* every branch has a scalar multiplier (:class:`fixup.Scale`, right after its last weight layer) and
  scalar biases before each of its convolutions, linear layers, attentions and element-wise
  activations (Fixup, section 3, rule 3), plus one before the classifier as in the paper's ResNets;
* the blocks declare their branches (``residual_branches()``) and the model its classifier, so that
  :func:`fixup.fixup_init_` does the counting (L, m per branch, the factors, the zeroed layers).

The returned model is a ``torch.fx.GraphModule`` that keeps the original's weight layers under
their original qualified names (their ``state_dict`` keys do not change) and runs the traced
computation; the input model is left untouched.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..branch import Branch, WeightSlice, find_branches
from ..init import fixup_init_
from ..nn import Bias, Scale
from . import _trace as T
from ._graph import Analysis, Residual, analyse
from ._report import AdaptReport, NormChange, ResidualRecord

__all__ = ["AdaptError", "AdaptReport", "FixupAdapted", "adapt"]


class AdaptError(ValueError):
    """The model has a structure ``adapt`` cannot account for without miscounting."""


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


def _inputs(example_input: Tensor | Sequence[Tensor]) -> tuple[Tensor, ...]:
    return (example_input,) if isinstance(example_input, Tensor) else tuple(example_input)


def _check_trace(model: nn.Module, gm: fx.GraphModule, args: tuple[Tensor, ...]) -> None:
    """The traced graph must compute what the model computes (else tracing specialised something)."""
    modes = {m: m.training for root in (model, gm) for m in root.modules()}
    try:
        model.eval()
        gm.eval()
        with torch.no_grad():
            want, got = model(*args), gm(*args)
    finally:
        for m, mode in modes.items():
            m.train(mode)
    if isinstance(want, Tensor) and not (isinstance(got, Tensor) and _same(want, got)):
        raise AdaptError(f"the torch.fx trace of {type(model).__name__} does not compute what the model computes "
                         "on the example input; its forward probably depends on values fx cannot see")


_DROPOUTS = {F.dropout: nn.Dropout, F.dropout1d: nn.Dropout1d, F.dropout2d: nn.Dropout2d,
             F.dropout3d: nn.Dropout3d, F.alpha_dropout: nn.AlphaDropout}


def _modeful_dropout(gm: fx.GraphModule) -> list[str]:
    """Turn ``F.dropout(x, p, self.training)`` (whose flag tracing fixes) into dropout modules that follow
    ``model.train()``/``eval()``; return warnings for training-mode values tracing had to fix otherwise."""
    notes = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is F.scaled_dot_product_attention:
            p = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
            if not isinstance(p, fx.Node) and p:
                notes.append(f"{node.name}: attention dropout p={p} was fixed when tracing; it also applies in eval()")
            continue
        if node.target not in _DROPOUTS:
            continue
        args = dict(zip(("input", "p", "training", "inplace"), node.args)) | dict(node.kwargs)
        p, training = args.get("p", 0.5), args.get("training", True)
        if isinstance(p, fx.Node) or isinstance(training, fx.Node):
            continue
        stack = node.meta.get("nn_module_stack") or {}
        scope = next(reversed(stack.values()))[0] if stack else ""
        name = f"fx_{node.name}"
        gm.add_submodule(f"{scope}.{name}" if scope else name, _DROPOUTS[node.target](p))
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(f"{scope}.{name}" if scope else name, (args["input"],))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    gm.recompile()
    return notes


def _same(want: Tensor, got: Tensor) -> bool:
    """Equal up to float rounding (relative to the output's scale), with the same inf/NaN pattern."""
    if want.shape != got.shape:
        return False
    finite = torch.isfinite(want)
    if not torch.equal(finite, torch.isfinite(got)):
        return False
    w, g = want[finite].double(), got[finite].double()
    scale = w.abs().max().item() if w.numel() else 0.0
    return bool(((w - g).abs() <= 1e-4 * w.abs() + 1e-5 * (1.0 + scale)).all())


class _Rewriter:
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

    def _add(self, container: str, stem: str, module: nn.Module) -> str:
        parent = self.gm.get_submodule(container) if container else self.gm
        name, k = f"fixup_{stem}", 2
        while hasattr(parent, name):
            name, k = f"fixup_{stem}_{k}", k + 1
        target = f"{container}.{name}" if container else name
        self.gm.add_submodule(target, module)
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
                bias = Bias()
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


def adapt(
    model: nn.Module,
    example_input: Tensor | Sequence[Tensor],
    *,
    strict: bool = True,
    generator: torch.Generator | None = None,
    mode: str = "fan_out",
    leaf_modules: tuple[type[nn.Module], ...] = (),
    **init_options: Any,
) -> tuple[FixupAdapted, AdaptReport]:
    """Return a Fixup-parameterised, Fixup-initialised copy of ``model`` and its accounting report.

    Args:
        model: any ``nn.Module`` whose forward torch.fx can trace (PyTorch's Transformer modules are
            handled; see :mod:`fixup.adapt._trace`). It is not modified.
        example_input: a tensor, or a tuple of the forward's positional tensors; used to check the
            trace and the adapted model. Later forward arguments keep their defaults.
        strict: raise :class:`AdaptError` on anything that cannot be attributed (a residual sum with
            weight layers on both sides, a weight layer shared between branches, a branch that does
            not end in a weight layer). With ``strict=False`` those sums are left out of L and each
            is a warning in the report.
        generator, mode, init_options: passed to :func:`fixup.fixup_init_` (the random draws, the fan
            convention, e.g. ``base="xavier"`` for the base initialisation).
        leaf_modules: module types to keep whole while tracing (never searched for branches).
    """
    args = _inputs(example_input)
    source = copy.deepcopy(model)
    graph, fixed = T.trace(source, args, leaf_modules)
    gm = FixupAdapted(source, graph, class_name=type(model).__name__)
    mode_notes = _modeful_dropout(gm)
    _check_trace(source, gm, args)
    analysis = analyse(gm.graph, dict(gm.named_modules()))
    problems = [str(p) for p in analysis.problems]
    if problems and strict:
        raise AdaptError(f"fixup.adapt cannot account for {type(model).__name__} without miscounting:\n  - "
                         + "\n  - ".join(problems)
                         + "\nChange the model, or pass strict=False to adapt the residual sums it can attribute "
                           "and get the rest as warnings.")
    if not analysis.residuals:
        raise AdaptError(f"fixup.adapt found no residual sum y = x + F(x) with a weight layer on F in "
                         f"{type(model).__name__}; Fixup applies to residual networks only")
    rw = _Rewriter(gm, analysis)
    rw.norms_out()
    inserted = [(r, *rw.branch(r)) for r in analysis.residuals]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    declared: dict[str, list[Branch]] = {}
    pairs: list[tuple[Residual, Branch]] = []
    for r, container, biases, scale in inserted:
        branch = rw.declare(r, biases, scale, order)
        declared.setdefault(container, []).append(branch)
        pairs.append((r, branch))
    gm.add_submodule("fixup_decl", _Declarations())
    gm.fixup_decl.classifier = rw.classifier(analysis.classifier)
    rw.remove_norms()
    types = {path: cls.__name__ for n in gm.graph.nodes
             for path, cls in (n.meta.get("nn_module_stack") or {}).values()}
    names = _declare(gm, declared, types)
    gm.graph.lint()
    gm.recompile()
    report = fixup_init_(gm, generator=generator, mode=mode, **init_options)
    with torch.no_grad():
        gm(*args)  # the adapted model runs on the example input
    residuals = [ResidualRecord(names[id(b)], r.add.name, r.fork.name, r.shortcut_kind,
                                [str(n.target) for n in r.layers], [str(n.target) for n in r.gates])
                 for r, b in pairs]
    data = vars(report).copy()
    data["warnings"] = [*problems, *analysis.notes, *data["warnings"],
                        *(f"the forward branches on a traced value; the adapted model always takes the branch "
                          f"the example input took ({f})" for f in fixed), *mode_notes]
    return gm, AdaptReport(**data, residuals=residuals, norms_replaced=rw.norms, scalars_added=rw.added)


def _declare(gm: FixupAdapted, declared: dict[str, list[Branch]], types: dict[str, str]) -> dict[int, str]:
    """Attach each block's branches to it (an AdaptedBlock in place of the traced container)."""
    for path, branches in declared.items():
        if not path:
            gm.fixup_decl.branches = branches
            continue
        parent, _, leaf = path.rpartition(".")
        block = AdaptedBlock(gm.get_submodule(path), types.get(path, "Module"))
        setattr(gm.get_submodule(parent) if parent else gm, leaf, block)
        block.branches = branches
    return {id(b): name for name, b in find_branches(gm)}
