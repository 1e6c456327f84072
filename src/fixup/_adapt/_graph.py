"""Finding residual branches in a traced graph: which adds are residual sums, and what each branch holds.

A residual sum is an add whose two operands are paths from a common ancestor, the *fork* (the latest
node both depend on). The side that passes through weight layers is the branch F; the other side is
the shortcut: the fork itself (identity), a parameter-free path (subsampling, padding, pooling) or
exactly one weight layer (a projection). When both sides pass through weight layers, the side with
one weight layer is the projection and the other the branch, and so is a side of fewer layers in series with
no nonlinearity (a depthwise + pointwise projection); anything else cannot be attributed, unless the add lies
inside another sum's branch, where it joins two of that branch's paths.

Inside the branch, the *data path* is every node the branch's output depends on, except the gate
input of a product with a sigmoid (squeeze-excite): the weight layers on the data path, in execution
order, are the branch's layers and m is their number (an ``nn.MultiheadAttention`` counts four:
Q, K, V and the output projection); weight layers that only feed a gate are reported as gate layers,
He-initialised and not depth-scaled. After the last weight layer only pass-through operations
(normalisation, dropout, reshapes, a gate) may follow, so that zeroing it zeroes the branch; where the branch
ends in a concatenation or a sum of several weight paths, after the last layer of each path (its *ends*, all
zeroed, :mod:`fixup._adapt._ends`), and m counts the path with the most layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import fx, nn

from ..branch import WEIGHT_LAYERS
from . import _vocab as T
from ._ends import Ends, find_ends, longest_path

__all__ = ["AdaptError", "Analysis", "Problem", "Residual", "analyse"]


class AdaptError(ValueError):
    """The model has a structure ``adapt`` cannot account for without miscounting."""


@dataclass
class Problem:
    """Something the analysis cannot account for: the node and why."""

    node: str
    reason: str

    def __str__(self) -> str:
        return f"node {self.node!r}: {self.reason}"


@dataclass
class Residual:
    """One residual sum ``add = shortcut + F`` found in the graph."""

    add: fx.Node
    block: str                       # module path in whose forward the sum is computed ("" for the root)
    fork: fx.Node
    branch_out: fx.Node              # the add's operand that is F
    layers: list[fx.Node]            # weight units on F's data path, execution order (its ends last, in order)
    data: set[fx.Node]               # F's data path
    gates: list[fx.Node] = field(default_factory=list)
    projection: fx.Node | None = None
    shortcut_kind: str = "identity"  # "identity", "parameter-free" or "projection"
    layer_scale: fx.Node | None = None  # a parameter multiplying the branch after its last layer
    ends: Ends | None = None  # where the branch ends: the last weight layer of each path (_ends.py)
    path: set[fx.Node] = field(default_factory=set)  # the weight layers of its path with the most (m counts them)
    shortcut_layers: list[fx.Node] = field(default_factory=list)  # a projection of several layers in series


@dataclass
class Analysis:
    residuals: list[Residual]
    classifier: list[fx.Node]
    problems: list[Problem]
    notes: list[str]
    trunk: list[fx.Node] = field(default_factory=list)  # weight layers carrying the stream outside the branches
    tokens: list[str] = field(default_factory=list)      # learned tokens concatenated into the stream (parameters)


class _Ancestry:
    """Ancestor sets as bit masks over the graph's nodes in execution order (metadata reads cut)."""

    def __init__(self, graph: fx.Graph) -> None:
        self.nodes = list(graph.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.mask: dict[fx.Node, int] = {}
        for i, n in enumerate(self.nodes):
            m = 1 << i
            for p in T.data_inputs(n):
                m |= self.mask[p]
            self.mask[n] = m

    def has(self, node: fx.Node, ancestor: fx.Node) -> bool:
        """``ancestor`` is ``node`` or one of its ancestors."""
        return bool(self.mask[node] >> self.index[ancestor] & 1)

    def between(self, fork: fx.Node, end: fx.Node) -> set[fx.Node]:
        """Nodes after ``fork`` that depend on it and that ``end`` depends on (``end`` included, ``fork`` not)."""
        lo, hi = self.index[fork], self.index[end]
        return {n for n in self.nodes[lo + 1:hi + 1] if self.has(end, n) and self.has(n, fork)}


def _scope(node: fx.Node) -> str:
    """The innermost module whose forward created ``node`` ("" for the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def _units(nodes: set[fx.Node], modules: dict[str, nn.Module]) -> list[fx.Node]:
    return [n for n in nodes if T.is_weight_unit(n, modules)]


class _Analyser:
    def __init__(self, graph: fx.Graph, modules: dict[str, nn.Module]) -> None:
        self.graph, self.modules = graph, modules
        self.anc = _Ancestry(graph)
        self.problems: list[Problem] = []
        self.two_sided: dict[fx.Node, Problem] = {}  # adds of two weight paths: a problem unless inside a branch
        self.notes: list[str] = []
        self.by_scope: dict[str, list[fx.Node]] = {}  # module path -> nodes created inside its forward
        self.inputs = [n for n in self.anc.nodes if n.op == "placeholder"]
        for n in self.anc.nodes:
            for path, _ in (n.meta.get("nn_module_stack") or {}).values():
                self.by_scope.setdefault(path, []).append(n)

    def _side_inputs(self, block: str, fork: fx.Node, out: fx.Node) -> set[fx.Node]:
        """Nodes computed inside the block from inputs other than the fork (keys and values of
        cross-attention computed from an encoder's memory), which ``out`` depends on."""
        if not block:
            return set()
        hi = self.anc.index[out]
        return {n for n in self.by_scope.get(block, ()) if self.anc.index[n] <= hi and self._from_input(n)
                and n.op in ("call_module", "call_function", "call_method") and self.anc.has(out, n)
                and not self.anc.has(fork, n) and not self.anc.has(n, fork)}

    def _from_input(self, node: fx.Node) -> bool:
        """``node`` depends on one of the model's inputs (not only on parameters and constants)."""
        return any(self.anc.has(node, p) for p in self.inputs)

    def _hidden_weights(self, node: fx.Node) -> bool:
        """A module call holding a weight matrix that is not a weight layer (a leaf kept whole)."""
        mod = T.module_of(node, self.modules)
        return mod is not None and not T.is_weight_unit(node, self.modules) and not T.is_lookup(node) and \
            not T.is_norm(node, self.modules) and any(p.dim() >= 2 for p in mod.parameters())

    def _data_path(self, out: fx.Node, allowed: set[fx.Node]) -> set[fx.Node]:
        seen, stack = set(), [out]
        while stack:
            n = stack.pop()
            if n in seen or n not in allowed:
                continue
            seen.add(n)
            inputs = T.data_inputs(n)
            if n.target in ("mul", "mul_") or getattr(n.target, "__name__", "") == "mul":
                gates = [p for p in inputs if T.gate_operand(p, self.modules)]
                if gates and len(gates) < len(inputs):
                    inputs = [p for p in inputs if p not in gates]
            stack.extend(inputs)
        return seen

    def residual(self, add: fx.Node) -> Residual | None:
        a, b = add.args[0], add.args[1]
        common = self.anc.mask[a] & self.anc.mask[b]
        if not common:
            return None  # two independent inputs (e.g. token + position embeddings): not a residual sum
        fork = self.anc.nodes[common.bit_length() - 1]
        sides = {a: self.anc.between(fork, a) if a is not fork else set(),
                 b: self.anc.between(fork, b) if b is not fork else set()}
        counts = {s: len(_units(nodes, self.modules)) for s, nodes in sides.items()}
        if counts[a] == counts[b] == 0:
            hidden = [n for nodes in sides.values() for n in nodes if self._hidden_weights(n)]
            if hidden:
                self.problems.append(Problem(add.name, (
                    f"this add sums two paths from {fork.name!r}, and {hidden[0].name!r} "
                    f"({_describe(hidden[0], self.modules)}) on one of them holds a weight matrix but is not a "
                    "weight layer fixup_init_ can count (nn.Linear, nn.Conv1d/2d/3d, nn.MultiheadAttention); "
                    "do not keep it whole (leaf_modules), or make its layers such modules")))
            return None  # no weight layer on either side: nothing for Fixup to count
        elif self._shortcut_side(counts[b], counts[a], sides[b]):
            shortcut, out = b, a
        elif self._shortcut_side(counts[a], counts[b], sides[a]):
            shortcut, out = a, b
        else:  # a problem, unless the add joins two paths inside another residual branch (analyse decides)
            self.two_sided[add] = Problem(add.name, (
                f"both operands of this add pass through weight layers ({counts[a]} and {counts[b]}) from their "
                f"common input {fork.name!r}, so neither is an identity or projection shortcut (one weight layer, "
                "or fewer layers than the other side in series with no nonlinearity); the residual branch cannot "
                "be told apart"))
            return None
        block = _scope(add)
        allowed = sides[out] | self._side_inputs(block, fork, out)
        data = self._data_path(out, allowed)
        layers = sorted(_units(data, self.modules), key=self.anc.index.__getitem__)
        gates = sorted(set(_units(allowed, self.modules)) - set(layers), key=self.anc.index.__getitem__)
        if not layers:
            self.problems.append(Problem(add.name, (
                f"the branch operand {out.name!r} passes through no weight layer from the fork {fork.name!r}; "
                "its shortcut operand does, so the add is not a residual sum Fixup can count")))
            return None
        res = Residual(add, block, fork, out, layers, data, gates)
        sc_units = sorted(_units(sides[shortcut], self.modules), key=self.anc.index.__getitem__)
        if len(sc_units) == 1 and isinstance(T.module_of(sc_units[0], self.modules), WEIGHT_LAYERS):
            res.projection, res.shortcut_kind = sc_units[0], "projection"
        elif sc_units and self._linear(sides[shortcut]):
            res.shortcut_kind, res.shortcut_layers = "projection", sc_units  # set as trunk layers (trunk=)
        elif sc_units:
            self.problems.append(Problem(add.name, (
                f"the shortcut operand {shortcut.name!r} passes through {len(sc_units)} weight units "
                f"({', '.join(n.name for n in sc_units)}); a shortcut may hold at most one projection layer")))
            return None
        elif shortcut is not fork and not all(T.is_passthrough(n, self.modules) for n in sides[shortcut]):
            res.shortcut_kind = "parameter-free"
        return res if self._check_tail(res) else None

    def _linear(self, nodes: set[fx.Node]) -> bool:
        """Weight layers (Linear, Conv) and pass-through operations only: a linear map, as a projection is."""
        return all(T.is_passthrough(n, self.modules) or isinstance(T.module_of(n, self.modules), WEIGHT_LAYERS)
                   for n in nodes)

    def _shortcut_side(self, count: int, other: int, nodes: set[fx.Node]) -> bool:
        """A side with ``count`` weight layers (the other side ``other``) is the shortcut: none, one where the other
        has more, or several in series with no nonlinearity where the other has more (a depthwise-separable
        projection, GhostNet's)."""
        return count == 0 or (count < other and (count == 1 or self._linear(nodes)))

    def _check_tail(self, res: Residual) -> bool:
        """Each path of the branch must end in a weight layer followed only by operations that keep a zero zero, so
        that zeroing those layers (one per path: the ends, _ends.py) zeroes F. The layers are put in order, the ends
        last, and the path m counts is found."""
        found = find_ends(res.branch_out, res.data, self.anc.index, self.anc.has, self.modules)
        if not isinstance(found, Ends):
            node, why = found
            last = res.layers[-1]
            self.problems.append(Problem(res.add.name, (
                f"the branch ends in {node.name!r} ({_describe(node, self.modules)}) after its last weight layer "
                f"{last.name!r}{f' ({why})' if why else ''}; zeroing that layer would not make the branch zero. "
                "Fixup needs each path of the branch to end in a weight layer followed only by operations that keep "
                "a zero zero (normalisation, dropout, reshapes, a concatenation or sum of such paths)")))
            return False
        res.ends, res.layer_scale = found, found.layer_scale
        res.layers = [n for n in res.layers if n not in found.layers] + found.layers
        res.path = longest_path(res.branch_out, res.data, self.anc.index, self.modules)
        return True

    def classifier(self, residuals: list[Residual], output: fx.Node) -> list[fx.Node]:
        """The last weight layers feeding the output, outside every branch and after every residual sum."""
        taken = {n for r in residuals for n in (*r.layers, *r.gates, *([r.projection] if r.projection else []))}
        adds = [r.add for r in residuals]
        cands = [n for n in self.anc.nodes
                 if isinstance(T.module_of(n, self.modules), WEIGHT_LAYERS) and n not in taken
                 and self.anc.has(output, n) and not any(self.anc.has(a, n) for a in adds)]
        last = [c for c in cands if not any(d is not c and self.anc.has(d, c) for d in cands)]
        return [c for c in last if self._plainly_reaches(c, output)]

    def trunk(self, residuals: list[Residual], classifier: list[fx.Node]) -> list[fx.Node]:
        """Weight layers outside every branch that carry the stream, in execution order: the stem, projection
        shortcuts, downsampling layers, the layers of blocks without a skip. Branch layers, gate layers and the
        classifier are not trunk layers; a layer called more than once is listed at its first call."""
        inside = {n for r in residuals for n in (*r.layers, *r.gates)} | set(classifier)
        out: list[fx.Node] = []
        seen: set[str] = set()
        memo: dict[fx.Node, bool] = {}
        for n in self.anc.nodes:
            if T.is_weight_unit(n, self.modules) and n not in inside and str(n.target) not in seen \
                    and not self._feeds_only_gates(n, memo):
                seen.add(str(n.target))
                out.append(n)
        return out

    def tokens(self, residuals: list[Residual]) -> list[str]:
        """Parameters concatenated into the stream as positions of their own (a ViT's class token, register
        tokens), outside every branch: at initialisation such a position carries only the parameter."""
        inside = set().union(*(r.data for r in residuals)) if residuals else set()
        found: list[str] = []
        for n in self.anc.nodes:
            if n in inside or T._name(n) not in ("cat", "concat", "concatenate"):
                continue
            for operand in T.data_inputs(n):
                if self._from_input(operand):
                    continue
                stack, seen = [operand], set()
                while stack:
                    a = stack.pop()
                    if a in seen:
                        continue
                    seen.add(a)
                    if a.op == "get_attr" and a.meta.get("param") and str(a.target) not in found:
                        found.append(str(a.target))
                    stack.extend(T.data_inputs(a))
        return found

    def _feeds_only_gates(self, node: fx.Node, memo: dict[fx.Node, bool]) -> bool:
        """Every use of ``node``'s output ends in a sigmoid gate (squeeze-excite's layers), through other layers
        that feed only gates, before it reaches the output or another weight layer's data."""
        if node not in memo:
            memo[node] = False  # a cycle cannot occur in a recording; this guards the recursion anyway
            stack, seen, ok = [u for u in node.users if node in T.data_inputs(u)], set(), True
            while stack and ok:
                u = stack.pop()
                if u in seen or T.is_gate(u, self.modules):
                    continue
                seen.add(u)
                if u.op == "output":
                    ok = False
                elif T.is_weight_unit(u, self.modules):
                    ok = self._feeds_only_gates(u, memo)
                else:
                    stack.extend(v for v in u.users if u in T.data_inputs(v))
            memo[node] = ok and bool(node.users)
        return memo[node]

    def _plainly_reaches(self, node: fx.Node, output: fx.Node) -> bool:
        """``node`` reaches the output through pass-through operations only (a head, not a pooler's dense
        layer followed by tanh)."""
        seen, stack = set(), list(node.users)
        while stack:
            u = stack.pop()
            if u is output:
                return True
            if u in seen:
                continue
            seen.add(u)
            if T.is_passthrough(u, self.modules) or (u.op == "call_method" and u.target in ("float", "to")):
                stack.extend(u.users)
        return False


def _describe(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    mod = T.module_of(node, modules)
    return type(mod).__name__ if mod is not None else f"{node.op} {T._name(node)}"


def analyse(graph: fx.Graph, modules: dict[str, nn.Module]) -> Analysis:
    """Find every residual sum of ``graph``, its branch and shortcut, and the classifier."""
    an = _Analyser(graph, modules)
    found = [r for n in graph.nodes if T.is_add(n) and (r := an.residual(n)) is not None]
    # An add of two weight paths is no residual sum; inside a branch it sums the branch's paths (_ends.py).
    inside = set().union(*(r.data for r in found)) if found else set()
    an.problems += [p for add, p in an.two_sided.items() if add not in inside]
    # A weight layer may belong to one branch only, and must be called once (not shared).
    owner: dict[fx.Node, Residual] = {}
    bad: set[int] = set()
    for i, r in enumerate(found):
        for n in r.layers:
            if n in owner:
                other = owner[n]
                an.problems.append(Problem(r.add.name, (
                    f"weight layer {n.target!r} lies in two residual branches (the sums {other.add.name!r} and "
                    f"{r.add.name!r}: a residual sum nested inside another's branch); its layers cannot be "
                    "counted for both")))
                bad.update({i, found.index(other)})
            owner[n] = r
    calls: dict[str, list[fx.Node]] = {}
    for n in graph.nodes:
        if T.is_weight_unit(n, modules):
            calls.setdefault(str(n.target), []).append(n)
    for target, nodes in calls.items():
        if len(nodes) > 1 and any(n in owner for n in nodes):
            an.problems.append(Problem(nodes[0].name, (
                f"weight layer {target!r} is called {len(nodes)} times ({', '.join(n.name for n in nodes)}); "
                "a layer shared between branches (or used inside and outside one) cannot be counted")))
            bad.update(i for i, r in enumerate(found) if any(n in r.layers for n in nodes))
    for i, r in enumerate(found):
        if not _check_branch_ops(an, graph, modules, r):
            bad.add(i)
    residuals = [r for i, r in enumerate(found) if i not in bad]
    output = next(n for n in graph.nodes if n.op == "output")
    classifier = an.classifier(residuals, output)
    return Analysis(residuals, classifier, an.problems, an.notes, an.trunk(residuals, classifier),
                    an.tokens(residuals))


def _check_branch_ops(an: _Analyser, graph: fx.Graph, modules: dict[str, nn.Module], r: Residual) -> bool:
    """Every weight on the branch's data path must be in a layer that can be counted."""
    ok = True
    for n in sorted(r.data, key=an.anc.index.__getitem__):
        if T.functional_norm(n):
            an.problems.append(Problem(n.name, "a normalisation called as a function on a residual branch "
                                       "cannot be replaced; use the module form (nn.LayerNorm, ...)"))
            ok = False
        mod = T.module_of(n, modules)
        if mod is not None and not T.is_weight_unit(n, modules) and not T.is_norm(n, modules) and \
                not T.is_lookup(n) and any(p.dim() >= 2 for p in mod.parameters()):
            an.problems.append(Problem(n.name, (
                f"{type(mod).__name__} on the branch of {r.add.name!r} holds a weight matrix but is not a "
                "weight layer fixup_init_ can count (nn.Linear, nn.Conv1d/2d/3d, nn.MultiheadAttention)")))
            ok = False
        for p in n.all_input_nodes:
            if p.op != "get_attr" or p in r.data:
                continue
            if p is r.layer_scale:
                continue
            if p.meta.get("param") and p.meta.get("dim", 0) >= 2:
                an.problems.append(Problem(n.name, (
                    f"parameter {p.target!r} is used as a weight directly on the branch of {r.add.name!r}, "
                    "not through a weight layer module, so it cannot be counted in m")))
                ok = False
            elif p.meta.get("param"):
                an.notes.append(f"parameter {p.target!r} on the branch of {r.add.name!r} is not a weight "
                                "layer; it is left as it is")
    return ok
