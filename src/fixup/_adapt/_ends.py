"""The end of a residual branch: which weight layers rule 1 zeroes, so that the branch starts at exactly zero, and m.

Most branches end in one weight layer, followed only by operations that keep a zero zero (normalisation,
dropout, reshapes, a sigmoid gate, a layer scale, a stochastic-depth mask). Some end in a concatenation or a
sum of several weight paths: GhostNet's ghost module concatenates a primary convolution's output with a cheap
depthwise convolution of that output; a hand-written branch may split its last layer in two, or sum two
parallel layers. Walking back from the branch's output through the operations that keep a zero zero (a
concatenation or a sum of branch tensors among them) reaches, on every path, the path's last weight layer: the
branch's *ends*. Rule 1 zeroes every end.

Why the last layer of each path, and not the one layer that feeds every path: zeroing the feeder makes the branch
zero only if nothing between it and the output turns a zero into something else, and where an activation follows
it (the ReLU between an MLP's first layer and its split second layer) the zeroed layer's output sits where
ReLU'(0) = 0: no gradient reaches the feeder or anything after it, and the branch never moves. Each end, like
rule 1's single last layer, is followed only by operations that keep a zero zero, so it receives the gradient of
the branch's output from the first step. (In GhostNet both ends are zeroed: the primary convolution and the cheap
one on its output; the cheap one learns from the second step, once its input, the primary's output, has moved.)

m is the most weight layers on one path from the branch's input to its output: where paths are concatenated or
summed, the path with the most layers counts (a sum does not multiply), while a product of two branch tensors
(attention's Q K^T, a gated linear unit) counts the layers of both factors, as Fixup counts attention's Q, K, V
and output projection as m = 4. For a branch that does not join paths, that is all its layers, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import fx, nn

from . import _vocab as T

__all__ = ["Ends", "find_ends", "longest_path"]


@dataclass
class Ends:
    """Where a branch ends: what ``find_ends`` read between its last weight layers and its output."""

    layers: list[fx.Node]  # the last weight layer of each path, in execution order: rule 1 zeroes each
    first: list[fx.Node]  # the ends that read no other end's output: the branch's multiplier follows each of them
    tail: set[fx.Node] = field(default_factory=set)  # the operations after the ends, each keeping a zero zero
    joined: set[fx.Node] = field(default_factory=set)  # those every path goes through (a stream bias may sit there)
    layer_scale: fx.Node | None = None  # a parameter multiplying the whole branch after its ends


def find_ends(out: fx.Node, data: set[fx.Node], index: dict[fx.Node, int], has: Callable[[fx.Node, fx.Node], bool],
              modules: dict[str, nn.Module]) -> Ends | tuple[fx.Node, str]:
    """The ends of the branch whose output is ``out`` and data path ``data``; or the node where a path does not
    keep a zero zero, with why (``index``: execution order; ``has(node, ancestor)``)."""
    frontier, ends = {out}, Ends([], [])
    while frontier:  # back from the output, latest node first: each is seen after every node that reads it
        n = max(frontier, key=index.__getitem__)
        frontier.discard(n)
        alone = not frontier and not ends.layers  # every path from an end to the output goes through n
        if T.is_weight_unit(n, modules):
            ends.layers.append(n)
            continue
        inputs = [p for p in T.data_inputs(n) if p in data]
        if not inputs:
            return n, "on a path from the branch's input that passes through no weight layer"
        if T.is_join(n) and len(inputs) < len(T.data_inputs(n)):
            other = next(p for p in T.data_inputs(n) if p not in data)
            return n, f"it joins the branch with {other.name!r}, which no layer of the branch computes"
        if not (T.is_passthrough(n, modules) or T.is_join(n) or (T.is_mul(n) and _keeps_zero_mul(n, data, modules))):
            return n, ""
        if alone and T.is_mul(n) and not any(T.gate_operand(p, modules) for p in T.data_inputs(n)):
            ends.layer_scale = _parameter_factor(n, data, modules) or ends.layer_scale  # the earliest one wins
        ends.tail.add(n)
        if alone:
            ends.joined.add(n)
        frontier.update(inputs)
    ends.layers.sort(key=index.__getitem__)
    ends.first = [e for e in ends.layers if not any(o is not e and has(e, o) for o in ends.layers)]
    return ends


def _keeps_zero_mul(node: fx.Node, data: set[fx.Node], modules: dict[str, nn.Module]) -> bool:
    """A product that is zero where the branch is: by a sigmoid gate (squeeze-excite), or by a factor that does
    not depend on the branch (a stochastic-depth mask, a layer scale)."""
    inputs = T.data_inputs(node)
    return any(T.gate_operand(p, modules) for p in inputs) or sum(p in data for p in inputs) == 1


def _parameter_factor(node: fx.Node, data: set[fx.Node], modules: dict[str, nn.Module]) -> fx.Node | None:
    """The parameter (``get_attr``), up to reshapes, that multiplies the branch at ``node``: a layer scale."""
    factor = next((p for p in T.data_inputs(node) if p not in data), None)
    while factor is not None and factor.op != "get_attr":
        if not T.is_passthrough(factor, modules) or len(factor.all_input_nodes) != 1:
            return None
        factor = factor.all_input_nodes[0]
    return factor if factor is not None and factor.meta.get("param") else None


def longest_path(out: fx.Node, data: set[fx.Node], index: dict[fx.Node, int],
                 modules: dict[str, nn.Module]) -> set[fx.Node]:
    """The weight layers of the branch's path with the most layers (m counts them): at a concatenation or a sum the
    operand with the most, at any other operation every operand's (a product multiplies its factors' layers).
    An ``nn.MultiheadAttention`` weighs four (Q, K, V and the output projection)."""
    layers: dict[fx.Node, frozenset[fx.Node]] = {}
    for n in sorted(data, key=index.__getitem__):
        ins = [layers[p] for p in T.data_inputs(n) if p in layers]
        if T.is_join(n) and ins:
            own = max(ins, key=lambda s: _weight(s, modules))
        else:
            own = frozenset().union(*ins)
        layers[n] = own | {n} if T.is_weight_unit(n, modules) else own
    return set(layers.get(out, frozenset()))


def _weight(nodes: frozenset[fx.Node], modules: dict[str, nn.Module]) -> int:
    return sum(4 if isinstance(T.module_of(n, modules), nn.MultiheadAttention) else 1 for n in nodes)
