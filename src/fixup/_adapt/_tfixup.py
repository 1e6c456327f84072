"""``fixup.adapt(model, x, method="t_fixup")``: T-Fixup for a Transformer written elsewhere.

Huang, Perez, Ba & Volkovs ("Improving Transformer Optimization Through Better Initialization", ICML 2020,
section 3.3) train the encoder-decoder Transformer without LayerNorm and without warm-up: every LayerNorm removed;
Xavier for every weight layer; the input embeddings N(0, d^-1/2); then, in each stack of N layers, the value and
output projections of every attention block and both feed-forward weights times the stack's factor, the input
embeddings times (9N)^(-1/4). This module applies that rule to the residual sums the recording finds
(:mod:`fixup._adapt._graph`), with no name matched:

* a **sub-block** is a residual sum whose branch is attention (its Q, K, V and output projections: an
  ``nn.MultiheadAttention``, a fused Q/K/V layer, or three layers) or a feed-forward of two weight layers; the
  attention is *cross*-attention where a projection reads something that does not descend from the block's input;
* a **stack** is a chain of sub-blocks on one residual stream: each sub-block's input is the previous one's sum
  (through dropout, reshapes or the norm removed); its N is its number of feed-forward sub-blocks, and its layers
  are (self-attention, feed-forward) or (self-attention, cross-attention, feed-forward);
* the **value** projection is the one whose output does not reach the attention's softmax (or is the value of
  ``scaled_dot_product_attention``); in a fused parameter (``in_proj_weight``, GPT-2's ``c_attn``) the third
  block of rows, in the order Q, K, V in which PyTorch and those models split it;
* the stack's **input embeddings** are the tables and learned tensors its first sub-block's input is computed
  from (token, position and token-type tables; a ViT's class token and position tensor), and a weight layer there
  (a ViT's patch projection) is its input projection: Xavier, times the embedding factor.

The factor follows the paper's derivation (its appendix): each sub-block contributes ``a^4 + 2 a^2 e^2`` to the
update's bound (a the weights' factor, e the embeddings'), and the sum over the stack's sub-blocks is held at
Theta(1) with e = (9N)^(-1/4). With three sub-blocks per layer (the decoder) that gives a = (9N)^(-1/4); with two
(the encoder: self-attention and feed-forward) 2N (a^4 + 2 a^2 / (3 sqrt(N))) = 1, a = 0.67 N^(-1/4). A
decoder-only stack (GPT-2: causal self-attention and feed-forward, no cross-attention) has the encoder's two
sub-blocks per layer, so it takes the encoder's factor: the causal mask changes nothing the derivation counts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, fx, nn

from ..branch import WEIGHT_LAYERS, WeightSlice
from ..init.fans import xavier_std
from ..init.t_fixup import decoder_factor, encoder_factor
from ..report.records import LayerRecord
from . import _vocab as V
from ._graph import AdaptError, Residual
from ._record import record
from ._report import NormChange
from ._rewrite import Rewriter
from ._tfixup_report import TFixupAdaptReport, TFixupStack

__all__ = ["adapt_t_fixup", "refuse_other_norms", "remove_norms_"]

Layer = nn.Module | WeightSlice
_OTHER_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)
_RULES = {2: ("encoder", encoder_factor), 3: ("decoder", decoder_factor)}  # sub-blocks per layer -> formula
_REMOVED = "T-Fixup removes every LayerNorm (Huang et al. 2020, section 3.3)"
_INSTEAD = "use method='fixup' (Fixup's rule for any residual network), 'rezero' or 'dyt'"


def refuse_other_norms(model: nn.Module) -> None:
    """A model with BatchNorm, GroupNorm or InstanceNorm is no Transformer T-Fixup is defined for: refused before
    it runs, pointing to Fixup."""
    found = [f"{n} ({type(m).__name__})" for n, m in model.named_modules() if isinstance(m, _OTHER_NORMS)]
    if found:
        raise AdaptError(f"adapt(method='t_fixup') applies T-Fixup (Huang et al. 2020), defined for Transformers: "
                         f"attention and feed-forward sub-blocks with LayerNorm. {type(model).__name__} has "
                         f"{', '.join(found[:3])}{', ...' if len(found) > 3 else ''}, a convolutional network's "
                         "normalisation. Use method='fixup' (Fixup's rule for residual networks, which removes it), "
                         "or 'nf_resnet'")


def _ancestors(node: fx.Node, stop: set[fx.Node] | frozenset[fx.Node] = frozenset()) -> set[fx.Node]:
    """``node`` and every node its value depends on (not through shape reads, not past ``stop``)."""
    seen, todo = {node}, [node]
    while todo:
        for p in V.data_inputs(todo.pop()):
            if p not in seen:
                seen.add(p)
                if p not in stop:
                    todo.append(p)
    return seen


class _Plan:
    """The recorded model's sub-blocks (each one's kind and scaled layers) and its stacks (chains of sub-blocks)."""

    def __init__(self, rw: Rewriter, residuals: list[Residual], name: str) -> None:
        self.rw, self.name, self.modules = rw, name, rw.modules
        self.kind: dict[fx.Node, str] = {}  # residual add -> "self", "cross" or "ffn"
        self.scaled: dict[fx.Node, list[Layer]] = {}
        self.qkv: list[Layer] = []  # the attention's Q, K and V as declared (slices of a fused parameter)
        for r in residuals:
            self._sub_block(r)
        self.stacks = self._chain(residuals)

    def _refuse(self, r: Residual, why: str) -> AdaptError:
        return AdaptError(f"adapt(method='t_fixup') cannot apply T-Fixup to {self.name}: the residual sum in "
                          f"{r.block or 'the root'} ({r.add.name}) {why}. T-Fixup scales Transformer sub-blocks "
                          f"(attention: Q, K, V and an output projection; feed-forward: two weight layers); {_INSTEAD}")

    def _sub_block(self, r: Residual) -> None:
        layers, _ = self.rw._layers(r)
        kind = self.rw._kind(r)
        if kind == "attention":
            if len(layers) != 4:
                raise self._refuse(r, f"is attention with {len(layers)} weight layers, not Q, K, V and an output "
                                      "projection")
            self.kind[r.add] = "cross" if self._cross(r) else "self"
            self.scaled[r.add] = [self._value(r, layers), layers[-1]]
            self.qkv += layers[:3]
        elif kind == "mlp" and len(layers) == 2:
            self.kind[r.add] = "ffn"
            self.scaled[r.add] = list(layers)
        else:
            mods = ", ".join(str(n.target) for n in r.layers)
            raise self._refuse(r, f"has a {kind} branch of {len(layers)} weight layers ({mods}): a convolutional or "
                                  "other branch is not a Transformer sub-block")

    def _cross(self, r: Residual) -> bool:
        """A projection of the attention reads a tensor that does not descend from the block's input."""
        for n in r.layers:
            mha = isinstance(V.module_of(n, self.modules), nn.MultiheadAttention)
            if n is r.layers[-1] and not mha:
                continue  # the output projection reads the attention's output
            for a in [a for a in n.args[:3 if mha else 1] if isinstance(a, fx.Node)]:
                if r.fork not in _ancestors(a):
                    return True
        return False

    def _value(self, r: Residual, layers: list[Layer]) -> Layer:
        """The value projection among ``layers[:3]`` (see the module's docstring)."""
        if all(isinstance(x, WeightSlice) and x.module is layers[0].module for x in layers[:3]):  # type: ignore
            return layers[2]  # one fused parameter, split Q, K, V
        nodes = r.layers[:3]
        for core in sorted(r.data, key=lambda n: self.rw.order[n]):
            name = V._name(core)
            if name == "scaled_dot_product_attention":
                args = [*core.args, *[core.kwargs.get(k) for k in ("query", "key", "value")]]
                q, k, v = [a for a in args if isinstance(a, fx.Node)][:3]
                reach = _ancestors(q) | _ancestors(k)
                found = [i for i, n in enumerate(nodes) if n in _ancestors(v) and n not in reach]
            elif name == "softmax":
                reach = _ancestors(core)
                found = [i for i, n in enumerate(nodes) if n not in reach]
            else:
                continue
            if len(found) == 1:
                return layers[found[0]]
        raise self._refuse(r, "is attention whose value projection could not be told from its queries and keys (no "
                              "softmax or scaled_dot_product_attention that the queries and keys reach and the "
                              "values do not)")

    def _chain(self, residuals: list[Residual]) -> list[tuple[list[Residual], fx.Node]]:
        """Residual sums chained along their streams: [(sums, the stack's input node), ...]."""
        adds = {r.add: r for r in residuals}
        stacks: list[tuple[list[Residual], fx.Node]] = []
        where: dict[fx.Node, int] = {}
        for r in residuals:
            node = r.fork
            while node not in adds:
                ins = V.data_inputs(node)
                if len(ins) != 1 or not V.is_passthrough(node, self.modules):
                    break
                node = ins[0]
            if node in adds:
                i = where[node]
                if stacks[i][0][-1].add is not node:
                    raise self._refuse(r, f"reads the stream of {node.name}, which another sub-block already "
                                          "continues: the stream forks into two stacks")
                stacks[i][0].append(r)
            else:
                i = len(stacks)
                stacks.append(([r], node))
            where[r.add] = i
        return stacks

    def layers_of(self, sums: list[Residual]) -> tuple[int, int]:
        """(N, sub-blocks per layer) of a stack: every layer (self-attention, [cross-attention,] feed-forward)."""
        kinds = [self.kind[r.add] for r in sums]
        layers, current = [], []
        for k in kinds:
            current.append(k)
            if k == "ffn":
                layers.append(tuple(current))
                current = []
        shapes = set(layers)
        if current or len(shapes) != 1 or shapes.pop() not in (("self", "ffn"), ("self", "cross", "ffn")):
            raise self._refuse(sums[0], f"starts a stack whose sub-blocks run {' -> '.join(kinds)}; T-Fixup's stacks "
                                        "repeat self-attention, [cross-attention,] feed-forward, each layer alike")
        return len(layers), len(kinds) // len(layers)


def _label(layer: Layer, names: dict[int, str]) -> str:
    return f"{names[id(layer.module)]}.{layer.label()}" if isinstance(layer, WeightSlice) else names[id(layer)]


def _xavier_(layer: Layer, generator: torch.Generator | None, factor: float = 1.0) -> float:
    """Xavier uniform (the library's T-Fixup draw) times ``factor`` for the layer's weight, its bias 0; the std."""
    std = xavier_std(layer.weight) * factor
    bound = math.sqrt(3.0) * std
    layer.weight.uniform_(-bound, bound, generator=generator)
    if isinstance(getattr(layer, "bias", None), Tensor):
        layer.bias.zero_()
    return std


def _embedding_inputs(model: nn.Module, modules: dict[str, nn.Module], start: fx.Node,
                      adds: set[fx.Node]) -> tuple[list[tuple[str, Tensor]], list[nn.Module]]:
    """The stack's input embeddings (tables and learned tensors, by name) and input projections (weight layers)."""
    tables: list[tuple[str, Tensor]] = []
    projections: list[nn.Module] = []
    for n in _ancestors(start, adds):
        if n in adds:
            continue
        if V.is_lookup(n):
            tables.append((f"{n.target}.weight", modules[str(n.target)].weight))
        elif V.is_weight_unit(n, modules):
            projections.append(modules[str(n.target)])
        elif n.op == "get_attr" and n.meta.get("param"):
            tables.append((str(n.target), model.get_parameter(str(n.target))))
    return sorted(tables, key=lambda t: t[0]), projections


@torch.no_grad()
def adapt_t_fixup(source: nn.Module, rw: Rewriter, residuals: list[Residual], generator: torch.Generator | None,
                  report: TFixupAdaptReport) -> None:
    """Apply T-Fixup's draws and factors, in place, to the recorded copy ``source`` (see the module's docstring),
    its LayerNorms already removed (:func:`remove_norms_`); fill ``report``."""
    name = next(c.__name__ for c in type(source).__mro__ if not c.__name__.startswith("_Slow"))  # V.slow_path_
    plan = _Plan(rw, residuals, name)  # refuses a branch that is neither attention nor a feed-forward
    if "self" not in plan.kind.values():
        raise AdaptError(f"adapt(method='t_fixup') found no attention sub-block in {name}: T-Fixup is defined for "
                         f"Transformers (attention and feed-forward sub-blocks); {_INSTEAD}")
    names = {id(m): n for n, m in source.named_modules()}
    adds = {r.add for r in residuals}
    stacks = []
    for sums, start in plan.stacks:
        n_layers, per = plan.layers_of(sums)
        rule, formula = _RULES[per]
        prefix = _common_prefix([rw._container(r) for r in sums])
        stacks.append((TFixupStack(prefix, n_layers, per, rule, formula(n_layers), decoder_factor(n_layers)), sums,
                       _embedding_inputs(source, rw.modules, start, adds)))
    tables = {id(t): t for _, _, (ts, _) in stacks for _, t in ts}
    drawn = _draw_xavier(source, plan, names, tables, generator, report)
    done: set[int] = set()
    for stack, sums, (ts, projections) in stacks:
        _draw_stack(stack, sums, ts, projections, plan, drawn, done, generator)
    scaled = {r.name for s, _, _ in stacks for r in [*s.scaled, *s.embeddings]}
    report.xavier = [r for r in drawn.values() if r.name not in scaled]
    report.stacks = [s for s, _, _ in stacks]
    owners = {key if isinstance(key, int) else key[0] for key in drawn}  # type: ignore[index]
    covered = set(tables) | {id(p) for m in source.modules() if id(m) in owners or isinstance(m, (
        nn.MultiheadAttention, *WEIGHT_LAYERS)) for p in m.parameters(recurse=False)}  # drawn, or tied to a table
    report.untouched = [f"{n} ({'x'.join(map(str, p.shape))}): not a weight layer or input embedding T-Fixup draws"
                        for n, p in source.named_parameters() if id(p) not in covered]


def _draw_stack(stack: TFixupStack, sums: list[Residual], tables: list[tuple[str, Tensor]],
                projections: list[nn.Module], plan: _Plan, drawn: dict[object, LayerRecord],
                done: set[int], generator: torch.Generator | None) -> None:
    """Scale the stack's sub-blocks and draw its input embeddings (a table another stack drew keeps its draw)."""
    for r in sums:
        for layer in plan.scaled[r.add]:
            layer.weight.mul_(stack.factor)
            rec = drawn[_key(layer)] if _key(layer) in drawn else drawn[id(layer.module)]  # type: ignore[union-attr]
            stack.scaled.append(LayerRecord(rec.name, rec.type, rec.shape, rec.std * stack.factor))
    for label, table in tables:
        if id(table) in done:
            continue
        done.add(id(table))
        std = table.shape[-1] ** -0.5 * stack.embedding_factor
        table.normal_(0.0, std, generator=generator)
        owner = next((m for m in plan.modules.values() if getattr(m, "weight", None) is table), None)
        padding = getattr(owner, "padding_idx", None)
        if padding is not None:
            table[padding].zero_()
        stack.embeddings.append(LayerRecord(label, type(owner).__name__ if owner is not None else "Parameter",
                                            list(table.shape), std))
    for proj in projections:
        if id(proj) in done:
            continue
        done.add(id(proj))
        proj.weight.mul_(stack.embedding_factor)
        rec = drawn[id(proj)]
        stack.embeddings.append(LayerRecord(rec.name, rec.type, rec.shape, rec.std * stack.embedding_factor))


def _key(layer: Layer) -> object:
    return layer.key if isinstance(layer, WeightSlice) else id(layer)


def _draw_xavier(source: nn.Module, plan: _Plan, names: dict[int, str], tables: dict[int, Tensor],
                 generator: torch.Generator | None, report: TFixupAdaptReport) -> dict[object, LayerRecord]:
    """Xavier for every weight layer (Q, K and V of a fused parameter each as its own layer, as the library's
    T-Fixup draws them), biases 0; a layer whose weight is an embedding's table is left to the embedding's draw."""
    drawn: dict[object, LayerRecord] = {}
    fused = {id(x.module) for x in plan.qkv if isinstance(x, WeightSlice)}
    for x in plan.qkv:
        std = _xavier_(x, generator)
        drawn[_key(x)] = LayerRecord(_label(x, names), type(x.module).__name__ if isinstance(x, WeightSlice) else
                                     type(x).__name__, list(x.weight.shape), std)
    kinds = {str(n.target) for n in plan.rw.graph.nodes if V.is_weight_unit(n, plan.modules)}
    for path, mod in source.named_modules():
        if id(mod) in fused and not isinstance(mod, nn.MultiheadAttention):
            if isinstance(getattr(mod, "bias", None), Tensor):
                mod.bias.zero_()
            continue
        if isinstance(mod, nn.MultiheadAttention):
            if id(mod) not in fused and mod.in_proj_weight is not None:
                drawn[id(mod)] = LayerRecord(f"{path}.in_proj_weight", "MultiheadAttention",
                                             list(mod.in_proj_weight.shape),
                                             _xavier_(WeightSlice(mod, "in_proj_weight"), generator))
            if mod.in_proj_bias is not None:
                mod.in_proj_bias.zero_()
            continue
        weight = getattr(mod, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() < 2 or id(mod) in drawn:
            continue
        if not (isinstance(mod, WEIGHT_LAYERS) or path in kinds):
            continue  # an embedding table or a module that is no weight layer: drawn or left below
        if id(weight) in tables:
            report.tied.append(f"{path} shares its weight with an input embedding, and has the embedding's draw")
            continue
        drawn[id(mod)] = LayerRecord(path, type(mod).__name__, list(weight.shape), _xavier_(mod, generator))
    return drawn


def _common_prefix(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths]
    out = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return ".".join(out)


def remove_norms_(rw: Rewriter, source: nn.Module, args: tuple[Tensor, ...],
                  leaf_modules: tuple[type[nn.Module], ...], report: TFixupAdaptReport) -> None:
    """Every LayerNorm out (``nn.Identity`` in its place, also one the example input does not reach); refused where
    the forward computes a norm by a function, which no module swap removes."""
    rw.norms_out(biases=False, removed_why=_REMOVED)
    report.norms_removed = list(rw.norms)
    for path, parent in list(source.named_modules()):
        for attr, child in list(parent.named_children()):
            if isinstance(child, nn.LayerNorm):
                setattr(parent, attr, nn.Identity())
                report.norms_removed.append(NormChange(f"{path}.{attr}" if path else attr, type(child).__name__,
                                                       "removed", f"{_REMOVED}; not called on the example input"))
    was = source.training
    source.eval()
    try:
        after = record(source, args, leaf_modules)
    except Exception as err:  # the forward itself fails without its norms
        raise AdaptError(f"adapt(method='t_fixup'): {type(source).__name__}'s forward fails once its LayerNorms are "
                         f"removed ({type(err).__name__}: {err}); it is not returned. T-Fixup needs a model that "
                         f"runs without them; {_INSTEAD}") from err
    finally:
        source.train(was)
    modules = dict(source.named_modules())
    left = [n.name for n in after.graph.nodes if V.functional_norm(n) or V.is_norm(n, modules)]
    if left:
        raise AdaptError(f"adapt(method='t_fixup') cannot remove every LayerNorm of {type(source).__name__}: its "
                         f"forward computes {', '.join(left[:3])} by a function or a norm module of another kind. "
                         f"Write the norm as a module (nn.LayerNorm), or {_INSTEAD}")
