"""Fixup for models written elsewhere: find the residual branches, take out normalisation, apply the rule.

``fixup.adapt(model, example_input)`` runs the model once on the example input and records what it
computes, module by module (:mod:`fixup._adapt._record`); finds every residual sum
``y = shortcut(x) + F(x)`` in the record (:mod:`fixup._adapt._graph`); and returns a copy of the model,
of the same class, in which (:mod:`fixup._adapt._rewrite`)

* each BatchNorm/GroupNorm/LayerNorm/InstanceNorm is a scalar :class:`fixup.Bias` where it stood before
  an activation or inside a branch, and is removed on the residual stream and on shortcuts; a fused
  norm+activation module keeps its activation;
* every branch has a scalar multiplier after its last weight layer (or its own layer scale) and scalar
  biases before its weight layers and activations (Fixup, section 3, rule 3), and the classifier a bias;
* the blocks declare their branches and the model its classifier, so that :func:`fixup.fixup_init_`
  does the counting (L, m per branch, the factors, the zeroed layers);
* the weight layers that carry the stream outside the branches (the *trunk*: stem, projection shortcuts,
  downsampling layers, blocks without a skip) are declared as ``model.trunk_layers()`` and set by the trunk
  rule (:mod:`fixup._adapt._trunk`) so that the stream keeps its scale at initialisation; the report lists
  each with its measured output RMS, and the stream's RMS stage by stage (:mod:`fixup.lab.signal`).

Its methods, attributes and the ``state_dict`` keys of every weight layer stay as they were.

``method="dyt"`` is another kind of change: every LayerNorm becomes a :class:`fixup.nn.DyT` where it stood, and
nothing else changes (:mod:`fixup._adapt._dyt`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx, nn

from ..branch import Branch, WeightSlice, find_branches
from ..init import fixup_init_
from ..init.gates import gate_init_
from ..method import ADAPT_METHODS, Method
from ..report import InitReport, warn_report
from ..signal import SIGNAL_BAND, StreamSignal, residual_blocks, stream_signal
from . import _vocab as V
from ._dyt import DyTAdaptReport, DyTRecord, adapt_dyt
from ._graph import AdaptError, Analysis, Residual, analyse
from ._modules import DeclaredTokens, DeclaredTrunk
from ._nf import adapt_nf
from ._nf_report import NFActivation, NFAdaptReport, NFResidual
from ._options import Chosen, check_options
from ._record import Recording, record
from ._report import AdaptReport, GateAdaptReport, NormChange, ResidualRecord
from ._rewrite import Rewriter
from ._tfixup import adapt_t_fixup, refuse_other_norms, remove_norms_
from ._tfixup_report import TFixupAdaptReport, TFixupStack
from ._trunk import TRUNK_RULES, TrunkRecord, trunk_init_
from ._weights import WeightsLoaded, load_original, untie_

__all__ = ["ADAPT_METHODS", "TRUNK_RULES", "AdaptError", "AdaptReport", "DyTAdaptReport", "DyTRecord",
           "GateAdaptReport", "NFActivation", "NFAdaptReport", "NFResidual", "NormChange", "ResidualRecord",
           "TFixupAdaptReport", "TFixupStack", "TrunkRecord", "WeightsLoaded", "adapt", "load_original", "trunk_init_"]


AnyReport = AdaptReport | GateAdaptReport | DyTAdaptReport | NFAdaptReport | TFixupAdaptReport  # adapt's, by method


def as_inputs(example_input: Tensor | Sequence[Tensor]) -> tuple[Tensor, ...]:
    return (example_input,) if isinstance(example_input, Tensor) else tuple(example_input)


def in_mode(model: nn.Module, training: bool, fn: Any) -> Any:
    modes = {m: m.training for m in model.modules()}
    try:
        model.train(training)
        return fn()
    finally:
        for m, mode in modes.items():
            m.train(mode)


def _signature(rec: Recording) -> list[tuple[str, str]]:
    return [(n.op, V._name(n)) for n in rec.graph.nodes]


def _data_reads(rec: Recording) -> list[str]:
    """Reads of tensor values into Python (``if x.sum() > 0``) of values that depend on an input or a parameter."""
    depends: dict[fx.Node, bool] = {}
    for n in rec.graph.nodes:
        depends[n] = n.op == "placeholder" or (n.op == "get_attr" and bool(n.meta.get("param"))) or \
            any(depends.get(p, False) for p in V.data_inputs(n))
    return [where for node, where in rec.value_reads if depends.get(node, False)]


def _check_zero_branches(model: nn.Module, args: tuple[Tensor, ...], branches: list[tuple[str, Branch]]) -> None:
    """Run the adapted model on the example input: every branch's last layer (of each path) must output exactly zero
    (rule 1)."""
    nonzero: list[str] = []

    def check(name: str) -> Any:
        def hook(_m: nn.Module, _a: Any, out: Any) -> None:
            out = out[0] if isinstance(out, tuple) else out
            if torch.count_nonzero(out):
                nonzero.append(name)
        return hook

    hooks = [(last.module if isinstance(last, WeightSlice) else last).register_forward_hook(check(name))
             for name, b in branches for last in b.zeroed]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in hooks:
            h.remove()
    if nonzero:
        raise AdaptError(f"after initialisation the branches {nonzero} do not output zero on the example input; "
                         "their last operation is not the zeroed weight layer. Please report this model.")


def _private_readiness(model: nn.Module, args: tuple[Tensor, ...], apply: bool) -> str:
    """:func:`fixup.private.prepare` on ``model`` (``apply``) or on a copy of it: the report's line about Opacus."""
    from ..private import prepare

    target = model if apply else copy.deepcopy(model)
    was_training = target.training
    target.eval()  # the in-place check's forward, with no dropout draws
    try:
        summary = prepare(target, args).summary()
    finally:
        target.train(was_training)
    if apply or summary.startswith("not ready"):
        return summary
    return summary.replace("ready for private training (Opacus)", "ready for private training (Opacus) after "
                           "fixup.private.prepare(model, example) or adapt(..., private=True)", 1)


def adapt(model: nn.Module, example_input: Tensor | Sequence[Tensor], *, strict: bool = True,
          untie_weights: bool = True, state_dict: Mapping[str, Tensor] | None = None,
          generator: torch.Generator | None = None, mode: str | None = None, trunk: str = "lsuv", method: str = "fixup",
          gate_biases: bool = False, leaf_modules: tuple[type[nn.Module], ...] = (), private: bool = False,
          **init_options: Any) -> tuple[nn.Module, AnyReport]:
    """Return a Fixup-parameterised, Fixup-initialised copy of ``model`` (same class) and its report.

    With ``method="skipinit"`` or ``"rezero"`` the copy is that method's instead: each branch ends in a
    :class:`fixup.Gate` that starts at 0, its weights are drawn by the method (SkipInit: its authors' truncated
    normal from the fan-in, the classifier at 0; ReZero: He) unscaled, no branch layer is zeroed, and every
    normalisation is removed without a bias in its place (``gate_biases=True`` puts Fixup's scalar biases there;
    see docs/methods.md); the report is a :class:`GateAdaptReport`.

    With ``method="dyt"`` (Dynamic Tanh, Zhu et al. 2025) the copy has a :class:`fixup.nn.DyT` in place of every
    LayerNorm (and ``nn.RMSNorm``), gamma and beta the norm's own affine, and nothing else changed; a model with
    BatchNorm and no LayerNorm is refused (measured, docs/methods.md). It takes ``strict``, ``state_dict``,
    ``private`` and ``alpha0``: 0.5 (default), another number, or ``"fitted"`` to each LayerNorm's output on the
    example input (for norms that see small inputs, as GPT-2's); the report is a :class:`DyTAdaptReport`.

    Args:
        model: any ``nn.Module`` whose forward runs on ``example_input``. It is not modified.
        example_input: a tensor, or a tuple of the forward's positional tensors (token ids for a language
            model); the model runs on it once per mode to record its computation, and once adapted to check
            that every branch starts at zero and no activation was lost.
        strict: raise :class:`AdaptError` on anything that cannot be attributed (a residual sum with weight
            layers on both sides, a weight layer shared between branches, a branch that does not end in a
            weight layer) and on decisions taken on tensor values (``if x.sum() > 0:``), which the adapted
            model could not be trusted to take alike. With ``strict=False`` those sums are left out of L and
            each problem is a warning in the report.
        untie_weights: give a layer Fixup zeroes or rescales its own weight where it is tied to another
            module's (GPT-2's ``lm_head`` and ``wte``), with a :class:`fixup.FixupWarning`; ``False`` makes a
            tied weight an error instead. Never is an embedding zeroed through its tied classifier.
        state_dict: the original model's weights to load after the initialisation: every entry that still
            exists with the same name and shape; the report lists what was loaded and dropped (see
            :func:`load_original`, which does the same on an adapted model later).
        generator: the random draws.
        mode, init_options: the initialiser's options: ``mode`` (the He fan of the branch layers
            and shortcuts, ``"fan_out"`` when not given), ``base`` (e.g. ``"xavier"``), ``stem_mode`` (the fan of the
            layers outside the branches, drawn from their fan-in by default) and, for Fixup only, ``depth_scaling``,
            ``rescale``, ``expect_biases``, ``expect_scale`` (see :func:`fixup.fixup_init_`). Each applies under
            the method or is a ValueError, before the model runs, naming the option and what would work: the
            gated ``rezero`` takes ``mode``, ``base`` and ``stem_mode``; ``skipinit`` (its authors' own draw)
            none of them. An unknown option is a ValueError too.
        trunk: the rule for the weight layers outside the branches that carry the stream (stem, projection
            shortcuts, downsampling layers, blocks without a skip), one of ``TRUNK_RULES``: ``"lsuv"`` (default)
            scales each, in execution order, to unit output RMS on the example input; ``"fan_in"`` draws it from
            He's fan-in; ``"none"`` keeps :func:`fixup.fixup_init_`'s draw. See :func:`trunk_init_`.
        method: ``"fixup"`` (default), a gated method of ``fixup.METHODS``, ``"dyt"`` or ``"t_fixup"`` (T-Fixup on
            a Transformer's stacks without LayerNorm, :mod:`fixup._adapt._tfixup`; ``ADAPT_METHODS``).
        gate_biases: under a gated method, put a scalar bias where a removed normalisation stood before an
            activation or inside a branch, as Fixup does (``True``), or none (``False``, the default: neither
            paper adds one, and the biases did not train better, docs/methods.md). Fixup keeps its biases (rule
            3): ``False`` with ``method="fixup"`` is an error.
        leaf_modules: module types to record whole (never searched for branches).
        private: make the copy ready for private training with Opacus (:func:`fixup.private.prepare`: the scalars
            called around their layers rather than by hooks, an output changed in place copied under hooks only).
            Without it the report still says whether the model would be ready, and what ``prepare`` would change.

    The report lists every trunk layer with its rule and measured output RMS (``report.trunk``) and the
    stream's RMS at each stage's output relative to the input's (``report.stream``), with a warning for a
    stage outside ``SIGNAL_BAND`` (0.5x to 2x) or a trunk layer no rule could set.
    """
    chosen = check_options(method, trunk, gate_biases, mode, init_options)  # before the model runs
    if chosen.method.adapt in ("dyt", "t_fixup"):  # the Transformer methods
        return _transformer_form(model, as_inputs(example_input), chosen, strict, leaf_modules, generator,
                                 state_dict, private)
    seen = _record_model(model, as_inputs(example_input), strict, leaf_modules)
    if chosen.method.adapt == "nf":
        return _adapt_nf(seen, chosen, generator, state_dict, private)
    gated = chosen.method.adapt == "gate"
    rw, pairs, untied = _rewrite(seen, gated=gated, gate_biases=gate_biases, untie_weights=untie_weights)
    report = _initialise(seen.source, chosen, rw, generator)
    trunk_records = trunk_init_(seen.source, seen.args, trunk)
    result, new_warnings = _measure_and_report(seen, rw, pairs, untied, report, trunk, trunk_records,
                                               state_dict=state_dict, private=private, gated=gated)
    _declare_recipe(seen.source, chosen.method, gated and not gate_biases)
    warn_report(AdaptReport(warnings=new_warnings), stacklevel=2)
    return seen.source, result


def _declare_recipe(source: nn.Module, method: Method, own_form: bool) -> None:
    """A gated method's own form (no Fixup biases added) whose recipe differs from the scalars' defaults (SkipInit:
    gates and biases undecayed) declares its method, which fixup.param_groups reads (fixup.method.model_method)."""
    if own_form and not method.decay_gains:
        source.adapted_method = method


def _adapt_nf(seen: _Seen, chosen: Chosen, generator: torch.Generator | None,
              state_dict: Mapping[str, Tensor] | None, private: bool) -> tuple[nn.Module, NFAdaptReport]:
    """The NF-ResNet form of the recorded copy (:mod:`fixup._adapt._nf`), with the weights loaded, the readiness for
    Opacus and the warnings issued."""
    source, args = seen.source, seen.args
    report = adapt_nf(source, args, seen.rec, seen.analysis, chosen.method, nonlinear_before=seen.nonlinear_before,
                      leaf_modules=seen.leaf_modules, generator=generator)
    loaded = load_original(source, state_dict) if state_dict is not None else WeightsLoaded()
    report.weights_loaded, report.weights_dropped = loaded.loaded, loaded.dropped
    report.warnings = [*seen.problems, *_notes(seen, []),
                       *report.warnings]
    report.private = _private_readiness(source, args, private)
    warn_report(AdaptReport(warnings=report.warnings), stacklevel=3)
    return source, report


_T_FIXUP_APPLIES = ("T-Fixup scales a Transformer's residual sub-blocks (attention, feed-forward): a model without "
                    "them is not one. Use method='fixup' for another residual network")


def _transformer_form(model: nn.Module, args: tuple[Tensor, ...], chosen: Chosen, strict: bool,
                      leaf_modules: tuple[type[nn.Module], ...], generator: torch.Generator | None,
                      state_dict: Mapping[str, Tensor] | None,
                      private: bool) -> tuple[nn.Module, DyTAdaptReport | TFixupAdaptReport]:
    """The Transformer methods: DyT in each LayerNorm's place, or T-Fixup (:mod:`fixup._adapt._tfixup`) on the
    recorded copy, drawn, scaled and without LayerNorm, which declares its method (``model.adapted_method``: its
    recipe has no warm-up, ``Method.warmup``) for the engine and fixup.param_groups."""
    if chosen.method.adapt == "dyt":
        copied, dyt_report = adapt_dyt(model, args, chosen.method, strict=strict, state_dict=state_dict,
                                       fitted="alpha0" in chosen.init_kwargs)
        dyt_report.private = _private_readiness(copied, args, private)
        return copied, dyt_report
    refuse_other_norms(model)  # a convolutional network: before it runs
    seen = _record_model(model, args, strict, leaf_modules, _T_FIXUP_APPLIES)
    source = seen.source
    rw = Rewriter(source, seen.rec.graph, seen.analysis, seen.rec.calls)
    report = TFixupAdaptReport(chosen.method.name)
    remove_norms_(rw, source, args, seen.leaf_modules, report)
    adapt_t_fixup(source, rw, seen.analysis.residuals, generator, report)
    source.adapted_method = chosen.method
    loaded = load_original(source, state_dict) if state_dict is not None else WeightsLoaded()
    report.weights_loaded, report.weights_dropped = loaded.loaded, loaded.dropped
    report.warnings = [*seen.problems, *_notes(seen, []), *report.warnings]
    report.private = _private_readiness(source, args, private)
    warn_report(AdaptReport(warnings=report.warnings), stacklevel=4)
    return source, report


def _measure_and_report(seen: _Seen, rw: Rewriter, pairs: list[tuple[Residual, Branch]], untied: list[str],
                        report: InitReport, trunk: str, trunk_records: list[TrunkRecord], *,
                        state_dict: Mapping[str, Tensor] | None, private: bool,
                        gated: bool) -> tuple[AdaptReport | GateAdaptReport, list[str]]:
    """Measure the initialised copy (its stream, the activations kept, the weights loaded, the readiness for
    private training) and assemble adapt's report; returns it with the warnings adapt adds to the initialiser's."""
    source, args = seen.source, seen.args
    blocks = residual_blocks(source)  # none when the root itself computes every residual sum
    signal = stream_signal(source, args, blocks=blocks, train=False) if blocks else StreamSignal(1.0)
    branch_names = {id(b): n for n, b in find_branches(source)}
    nonlinear_after = _verify(seen, [(branch_names[id(b)], b) for _, b in pairs])
    loaded = load_original(source, state_dict) if state_dict is not None else WeightsLoaded()
    residuals = [ResidualRecord(branch_names[id(b)], r.add.name, r.fork.name, r.shortcut_kind,
                                [str(n.target) for n in r.layers], [str(n.target) for n in r.gates])
                 for r, b in pairs]
    new_warnings = [*seen.problems, *untied, *_notes(seen, rw.notes),
                    *_measured_warnings(trunk_records, signal, loaded)]
    readiness = _private_readiness(source, args, private)
    data = dict(vars(report))
    data["warnings"] = [*data["warnings"], *new_warnings]
    kind = GateAdaptReport if gated else AdaptReport
    result = kind(**data, residuals=residuals, norms_replaced=rw.norms, scalars_added=rw.added,
                  nonlinearities_before=len(seen.nonlinear_before), nonlinearities_after=len(nonlinear_after),
                  layer_scales=rw.layer_scales, fused_qkv=rw.fused_qkv, untied=untied,
                  weights_loaded=loaded.loaded, weights_dropped=loaded.dropped, trunk_rule=trunk,
                  trunk=trunk_records, stream_input_rms=signal.input_rms, stream=signal.stages, private=readiness)
    return result, new_warnings


def _initialise(source: nn.Module, chosen: Chosen, rw: Rewriter, generator: torch.Generator | None) -> InitReport:
    """Initialise the rewritten copy by the method: Fixup's rule (``fixup_init_``), or the gated method's
    initialiser with every layer scale the rewrite turned into a gate set back to its start."""
    if chosen.method.adapt != "gate":
        return fixup_init_(source, generator=generator, **chosen.init_kwargs)
    report = gate_init_(source, chosen.method, generator=generator, summary=chosen.method.summary,
                        **chosen.init_kwargs)
    warn_report(report)
    for handle in rw.gated_layer_scales:
        handle.reset_parameters()
    return report


def _measured_warnings(trunk_records: list[TrunkRecord], signal: StreamSignal, loaded: WeightsLoaded) -> list[str]:
    """The warnings of what was measured on the adapted copy: a trunk layer no rule could set, a stage whose stream
    leaves ``SIGNAL_BAND``, zero-started layers the loaded weights replaced."""
    out = [f"trunk layer {t.name!r} ({t.type}): {t.note}" for t in trunk_records if t.note]
    lo, hi = SIGNAL_BAND
    out += [f"the stream leaves [{lo}, {hi}]x the input's RMS at {s.name!r} ({s.ratio:.3g}x) at "
            "initialisation; see fixup.lab.stream_signal" for s in signal.outside()]
    if loaded.zeroed_overwritten:
        out.append(f"state_dict replaced the zero initialisation of {len(loaded.zeroed_overwritten)} layers "
                   f"({', '.join(loaded.zeroed_overwritten[:3])}): the branches no longer start at zero")
    return out


@dataclass
class _Seen:
    """What adapt recorded of the model, on a copy of it (``source``, the copy it returns once adapted)."""

    source: nn.Module
    args: tuple[Tensor, ...]
    leaf_modules: tuple[type[nn.Module], ...]
    swapped: list[str]  # the PyTorch Transformer modules switched to their non-fast path
    rec: Recording  # in eval mode: what the analysis reads
    other: Recording | None  # in train mode, to compare (None where the model refuses to run so)
    nonlinear_before: list[str]
    analysis: Analysis
    problems: list[str]  # what cannot be attributed (each a warning under strict=False)


def _record_model(model: nn.Module, args: tuple[Tensor, ...], strict: bool,
                  leaf_modules: tuple[type[nn.Module], ...],
                  applies: str = "Fixup applies to residual networks only") -> _Seen:
    """Record a copy of ``model`` on ``args`` and find its residual sums; an :class:`AdaptError` where it has none,
    or (``strict``) where something cannot be attributed."""
    name = type(model).__name__
    source = copy.deepcopy(model)
    swapped = V.slow_path_(source)
    # The analysis uses eval mode (no dropout or stochastic depth draws); train mode is recorded to compare.
    rec = in_mode(source, False, lambda: record(source, args, leaf_modules))
    try:
        other: Recording | None = in_mode(source, True, lambda: record(source, args, leaf_modules))
    except ValueError:
        other = None  # e.g. BatchNorm refuses a batch of one in train mode; nothing to compare
    modules = dict(source.named_modules())
    nonlinear_before = rec.nonlinearities(modules)
    analysis = analyse(rec.graph, modules)
    problems = [str(p) for p in analysis.problems]
    reads = _data_reads(rec)
    problems += [f"the forward takes a decision on tensor values ({r}); the adapted model would only take the "
                 "same branch for other inputs by chance. Compute it from shapes, or move it out of forward"
                 for r in reads]
    if problems and strict:
        raise AdaptError(f"fixup.adapt cannot account for {name} without miscounting:\n  - "
                         + "\n  - ".join(problems)
                         + "\nChange the model, or pass strict=False to adapt the residual sums it can attribute "
                           "and get the rest as warnings.")
    if not analysis.residuals:
        raise AdaptError(f"fixup.adapt found no residual sum y = x + F(x) with a weight layer on F in {name}; "
                         f"{applies}")
    return _Seen(source, args, leaf_modules, swapped, rec, other, nonlinear_before, analysis, problems)


def _rewrite(seen: _Seen, *, gated: bool, gate_biases: bool,
             untie_weights: bool) -> tuple[Rewriter, list[tuple[Residual, Branch]], list[str]]:
    """Rewrite the copy in place: the norms out, each residual sum's branch declared (with its scalars or its gate),
    the classifier and the trunk declared, the weights the rule sets untied. Returns the rewriter, each residual
    sum with its branch, and the untying warnings."""
    source, analysis = seen.source, seen.analysis
    rw = Rewriter(source, seen.rec.graph, analysis, seen.rec.calls)
    rw.norms_out(biases=gate_biases or not gated)  # gated and gate_biases=False: every norm removed
    declared: dict[str, list[Branch]] = {}
    pairs = []
    for r in analysis.residuals:
        container, branch = rw.branch(r, gated=gated)
        declared.setdefault(container, []).append(branch)
        pairs.append((r, branch))
    classifier = rw.classifier(analysis.classifier, bias=not gated)
    names = {id(m): n for n, m in source.named_modules()}
    touched = [layer.module if isinstance(layer, WeightSlice) else layer
               for _, b in pairs for layer in [*b.layers, *([b.shortcut] if b.shortcut is not None else [])]]
    untied = untie_(source, [*touched, *classifier], names, untie_weights)
    rw.declare(declared, classifier)
    trunk_modules = [source.get_submodule(str(n.target)) for n in analysis.trunk]
    source.trunk_layers = DeclaredTrunk([m for m in trunk_modules
                                         if isinstance(getattr(m, "weight", None), Tensor) and m.weight.dim() >= 2])
    source.trunk_tokens = DeclaredTokens(analysis.tokens)
    return rw, pairs, untied


def _verify(seen: _Seen, branches: list[tuple[str, Branch]]) -> list[str]:
    """Check the initialised copy: every branch outputs zero on the example input and no non-linearity was lost
    (an :class:`AdaptError` otherwise); returns its non-linearities."""
    source, args = seen.source, seen.args
    in_mode(source, False, lambda: _check_zero_branches(source, args, branches))
    after = in_mode(source, False, lambda: record(source, args, seen.leaf_modules))
    nonlinear_after = after.nonlinearities(dict(source.named_modules()))
    before = seen.nonlinear_before
    if len(nonlinear_after) < len(before):
        lost = [x for x in before if x not in nonlinear_after] or before[len(nonlinear_after):]
        raise AdaptError(f"adapting {type(source).__name__} would lose {len(before) - len(nonlinear_after)} of its "
                         f"{len(before)} non-linearities (e.g. {', '.join(lost[:3])}); it is not returned. "
                         "Please report this model.")
    return nonlinear_after


def _notes(seen: _Seen, rewrite_notes: list[str]) -> list[str]:
    """What the analysis and the rewrite chose that the user should know."""
    notes = [*seen.analysis.notes, *rewrite_notes]
    if seen.swapped:
        notes.append(f"PyTorch Transformer modules ({', '.join(seen.swapped[:3])}) run their documented "
                     "non-fast-path computation (a subclass of the same module), as the fused fast path reads the "
                     "norms")
    if seen.other is not None and _signature(seen.other) != _signature(seen.rec):
        notes.append("the forward computes differently in train mode than in eval mode (a Python branch on "
                     "self.training other than dropout modules); the residual sums were found in eval mode")
    return notes
