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
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from ..branch import Branch
from ..init import fixup_init_
from . import _trace as T
from ._graph import AdaptError, Residual, analyse
from ._report import AdaptReport, ResidualRecord
from ._rewrite import AdaptedBlock, FixupAdapted, Rewriter, declare

__all__ = ["AdaptError", "AdaptReport", "AdaptedBlock", "FixupAdapted", "adapt"]

AdaptError.__module__ = __name__  # raised and documented as fixup.adapt.AdaptError


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


def _check_zero_branches(gm: nn.Module, args: tuple[Tensor, ...], branches: list[tuple[str, Branch]]) -> None:
    """Run the adapted model on the example input: every branch must output exactly zero (rule 1)."""
    nonzero: list[str] = []
    hooks = [b.scale.register_forward_hook(
        lambda _m, _a, out, name=name: nonzero.extend([name] if torch.count_nonzero(out) else []))
        for name, b in branches if b.scale is not None]
    try:
        with torch.no_grad():
            gm(*args)
    finally:
        for h in hooks:
            h.remove()
    if nonzero:
        raise AdaptError(f"after initialisation the branches {nonzero} do not output zero on the example input; "
                         "their last operation is not the zeroed weight layer. Please report this model.")


def _signature(graph: fx.Graph) -> list[tuple[str, str]]:
    return [(n.op, n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target)))
            for n in graph.nodes]


def _mode_dependence(source: nn.Module, args: tuple[Tensor, ...], leaves: tuple[type[nn.Module], ...],
                     signature: list[tuple[str, str]]) -> list[str]:
    """Trace again in the other mode (train/eval): Python decisions on ``self.training`` are fixed by a
    trace, so a different graph means the adapted model computes as in the traced mode only."""
    modes = {m: m.training for m in source.modules()}
    traced = "train" if source.training else "eval"
    try:
        source.train(not source.training)
        other, _ = T.trace(source, args, leaves)
    finally:
        for m, mode in modes.items():
            m.train(mode)
    if _signature(other) == signature:
        return []
    return [f"the forward computes a different graph in {'eval' if traced == 'train' else 'train'} mode than in "
            f"{traced} mode (a Python branch on self.training other than functional dropout); the adapted model "
            f"always computes as in {traced} mode, the mode the model was in when adapted"]


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
    mode_notes = _mode_dependence(source, args, leaf_modules, _signature(graph))
    gm = FixupAdapted(source, graph, class_name=type(model).__name__)
    mode_notes += _modeful_dropout(gm)
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
    rw = Rewriter(gm, analysis)
    rw.norms_out()
    inserted = [(r, *rw.branch(r)) for r in analysis.residuals]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    declared: dict[str, list[Branch]] = {}
    pairs: list[tuple[Residual, Branch]] = []
    for r, container, biases, scale in inserted:
        branch = rw.declare(r, biases, scale, order)
        declared.setdefault(container, []).append(branch)
        pairs.append((r, branch))
    classifier = rw.classifier(analysis.classifier)
    rw.remove_norms()
    types = {path: cls.__name__ for n in gm.graph.nodes
             for path, cls in (n.meta.get("nn_module_stack") or {}).values()}
    names = declare(gm, declared, types, classifier)
    gm.graph.lint()
    gm.recompile()
    report = fixup_init_(gm, generator=generator, mode=mode, **init_options)
    _check_zero_branches(gm, args, [(names[id(b)], b) for _, b in pairs])
    residuals = [ResidualRecord(names[id(b)], r.add.name, r.fork.name, r.shortcut_kind,
                                [str(n.target) for n in r.layers], [str(n.target) for n in r.gates])
                 for r, b in pairs]
    data = vars(report).copy()
    data["warnings"] = [*problems, *analysis.notes, *data["warnings"],
                        *(f"the forward branches on a traced value; the adapted model always takes the branch "
                          f"the example input took ({f})" for f in fixed), *mode_notes]
    return gm, AdaptReport(**data, residuals=residuals, norms_replaced=rw.norms, scalars_added=rw.added)


