"""``fixup.adapt(model, x, method="nf_resnet")``: the NF-ResNet form (Brock, De & Smith, "Characterizing signal
propagation to close the performance gap in unnormalized ResNets", ICLR 2021) of a residual network written elsewhere.

On the residual sums the recording finds (:mod:`fixup._adapt._graph`), in the copy adapt returns:

* every normalisation is removed (a fused norm+activation keeps its activation), with no bias in its place;
* every ``nn.Conv2d`` becomes a :class:`fixup.nn.ScaledStdConv2d` with a learnable gain and a bias (the authors'
  ``WSConv2D`` has one), drawn as the library's NF-ResNet draws it (:func:`fixup.init.nf_resnet.draw_standardized_`),
  except the layers inside a squeeze-excite gate, which stay ordinary layers as in the NF-Nets' own SE blocks;
* each residual sum ``i`` becomes ``h + alpha * g * F(h / beta_i)``: whatever reads the block's input ``h`` on the
  branch (and a projection shortcut) reads ``h / beta_i``, beta_i the analytic std of ``h`` (``Var`` grows by
  alpha^2 per block and resets to 1 + alpha^2 after a block whose shortcut has a layer,
  :func:`fixup.models.nf_blocks.expected_stds`), and the branch's last layer is followed by ``alpha * g``, ``g`` a
  skip gain that starts at 0 (``nf_resnet``; ``nf_resnet_nozero`` has none). A pre-activation block whose
  projection reads the activated input (``a = act(norm(h)); shortcut = proj(a)``) divides ``h`` before that
  activation, as the library's own NF blocks do;
* every activation is multiplied by its gamma (:mod:`fixup._adapt._gammas`), in the branches and outside them (the
  stem, blocks without a skip), except one applied to the output of a residual sum whose shortcut is the stream
  itself (a post-activation ResNet's ReLU after the add: its input is the already activated stream, which it passes
  almost unchanged, and gamma would compound block after block), one inside a squeeze-excite gate, and one after
  the classifier. After a transition's sum (a projection shortcut, a fresh zero-mean signal) the activation takes
  its gamma; where that activation is a module the block also calls in its branch (torchvision's ``self.relu``) and
  is positively homogeneous, gamma goes on both operands of the sum instead.

Nothing is matched by name; the model's methods, attributes and the ``state_dict`` keys of its weight layers stay
(each convolution gains ``gain`` and, where it had none, ``bias``). The copy declares its method
(``model.adapted_method``), so that :func:`fixup.param_groups` leaves gains and biases undecayed and
:func:`fixup.adaptive_clip_grad_` clips every tensor but the classifier's weight, as the authors' recipe.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, fx, nn

from ..branch import Branch
from ..init._skeleton import module_names
from ..init.nf_resnet import draw_standardized_
from ..method import Method
from ..models.nf_blocks import NF_ALPHA, expected_stds
from ..nn import ScaledStdConv2d
from ..signal import residual_blocks, stream_signal
from . import _vocab as T
from ._gammas import activation_gamma, positively_homogeneous
from ._graph import AdaptError, Analysis, Residual, _Ancestry
from ._modules import bias_inputs
from ._nf_modules import NFBranchOut, NFFactor, gamma_output
from ._nf_report import NFActivation, NFAdaptReport, NFResidual
from ._record import Recording, record
from ._rewrite import Rewriter

__all__ = ["adapt_nf"]

SE_GAIN = 2.0  # the squeeze-excite output's factor, 1 / the gate's mean at initialisation (0.5): the authors' own
_NO_NF = ("Use method='fixup', 'skipinit' or 'rezero', which adapt any residual network (a Transformer also takes "
          "'t_fixup', or 'dyt' in its LayerNorms' place)")


@dataclass
class _Factors:
    """The constant factors to put before modules' inputs: module path -> input position -> (factor, what) list."""

    at: dict[str, dict[int, list[tuple[float, str]]]] = field(default_factory=dict)

    def add(self, reader: fx.Node, source: fx.Node, factor: float, what: str) -> None:
        positions = [i for i, a in enumerate(reader.args) if a is source]
        if not positions:
            raise AdaptError(f"{reader.target} reads {source.name!r} as a keyword argument; fixup.adapt cannot put "
                             f"{what} before it. {_NO_NF}")
        for i in positions:
            self.at.setdefault(str(reader.target), {}).setdefault(i, []).append((factor, what))


class _NFRewrite:
    """Puts the recorded model (the copy) in NF-ResNet form, in place, and fills the report."""

    def __init__(self, model: nn.Module, rec: Recording, analysis: Analysis, method: Method) -> None:
        self.model, self.graph, self.an, self.calls = model, rec.graph, analysis, rec.calls
        self.rw = Rewriter(model, rec.graph, analysis, rec.calls)
        self.anc = _Ancestry(rec.graph)
        self.method, self.alpha = method, NF_ALPHA
        self.residuals = sorted(analysis.residuals, key=lambda r: self.rw.order[r.add])
        self.factors = _Factors()
        self.report = NFAdaptReport(method.name, self.alpha)
        self.gate_region = self._gate_region()
        self.pushed: dict[fx.Node, float] = {}  # a transition's sum -> the gamma of the activation after it, put on
        # the sum's operands (a homogeneous activation that no hook can reach: torchvision's shared ReLU)

    @property
    def modules(self) -> dict[str, nn.Module]:
        return self.rw.modules

    def _reads(self, reader: fx.Node) -> list[fx.Node]:
        return T.data_inputs(reader)

    def _once(self, node: fx.Node) -> bool:
        """A call of a module that the forward calls once (so a hook on it acts on this call only)."""
        return node.op == "call_module" and self.calls.get(str(node.target)) == 1

    def _gate_region(self) -> set[fx.Node]:
        """The nodes computing a squeeze-excite gate: between the signal a sigmoid multiplies and the sigmoid."""
        region: set[fx.Node] = set()
        for g in self.graph.nodes:
            if not T.is_gate(g, self.modules):
                continue
            for product in g.users:
                for signal in product.all_input_nodes:
                    if signal is not g and self.anc.has(g, signal):  # the gate is computed from the signal
                        region |= self.anc.between(signal, g)
        return region

    def check(self) -> None:
        """Refuse what has no NF form, before anything changes."""
        problems = []
        foreign = [(r, self.rw._kind(r)) for r in self.residuals]
        foreign = [(r, "attention" if kind == "attention" else "linear") for r, kind in foreign
                   if kind in ("attention", "mlp", "linear")]
        if foreign:
            counts = {k: sum(kind == k for _, kind in foreign) for k in ("attention", "linear")}
            names = {"attention": ("attention branch", "attention branches"),
                     "linear": ("branch of linear layers", "branches of linear layers")}
            what = " and ".join(f"{n} {names[k][n > 1]}" for k, n in counts.items() if n)
            r = foreign[0][0]
            problems.append(f"{len(foreign)} of its {len(self.residuals)} residual branches "
                            f"{'is' if len(foreign) == 1 else 'are'} not convolutional "
                            f"({what}; the first summed at {r.add.name!r} in {r.block or 'the root'}): NF-ResNets "
                            "standardise convolutions and define no other branch")
        for r in self.residuals:
            outer = [o for o in self.residuals if o is not r and r.add in o.data]
            if outer:
                problems.append(f"the residual sum {r.add.name!r} lies inside the branch of {outer[0].add.name!r}; "
                                "the analytic variance beta of nested sums is not the paper's")
        for n in self.graph.nodes:
            mod = T.module_of(n, self.modules)
            if isinstance(mod, (nn.Conv1d, nn.Conv3d)) or (isinstance(mod, nn.Conv2d) and not isinstance(
                    mod, ScaledStdConv2d) and type(mod).forward is not nn.Conv2d.forward):
                problems.append(f"{n.target} is a {type(mod).__name__}; the standardised convolution "
                                "(fixup.nn.ScaledStdConv2d) replaces plain nn.Conv2d layers only")
            elif isinstance(mod, nn.Conv2d) and not self._once(n):
                problems.append(f"{n.target} is called {self.calls.get(str(n.target))} times in one forward; "
                                "adapt cannot scale its inputs per call")
        if problems:
            raise AdaptError(f"fixup.adapt cannot put {type(self.model).__name__} in NF-ResNet form "
                             f"(method={self.method.name!r}):\n  - " + "\n  - ".join(dict.fromkeys(problems))
                             + f"\n{_NO_NF}.")

    def standardise(self) -> None:
        """Every plain ``nn.Conv2d`` outside the squeeze-excite gates becomes a ScaledStdConv2d (with a bias)."""
        for n in self.graph.nodes:
            mod, path = T.module_of(n, self.modules), str(n.target)
            if not isinstance(mod, nn.Conv2d) or isinstance(mod, ScaledStdConv2d) or n in self.gate_region:
                continue
            new = ScaledStdConv2d(mod.in_channels, mod.out_channels, mod.kernel_size, mod.stride, mod.padding,
                                  mod.dilation, mod.groups, bias=True, padding_mode=mod.padding_mode,
                                  device=mod.weight.device, dtype=mod.weight.dtype)
            self.rw._set(path, new)
            shape = f"{mod.in_channels} -> {mod.out_channels}, kernel {tuple(mod.kernel_size)}" + (
                f", groups {mod.groups}" if mod.groups > 1 else "")
            self.report.standardised.append(f"{path}: Conv2d({shape}) -> ScaledStdConv2d, gain 1"
                                            + (", bias added" if mod.bias is None else ""))

    def gates(self) -> None:
        """Each squeeze-excite output times 2, before whatever reads it: a gate (a sigmoid or hard sigmoid of a
        zero-mean signal) is 0.5 on average at initialisation, and nothing after it restores the scale once the norm
        that followed it is gone. The NF-Nets authors' blocks scale their squeeze-excite output by 2 for the same
        reason. Without it each gated block on the stream's path halves it (timm's EfficientNet-B0: 8e-5x after
        its seventh stage; with it, 1.0-1.5x at 128 and 224 pixels)."""
        for g in self.graph.nodes:
            if not T.is_gate(g, self.modules):
                continue
            for product in self._gate_output(g):
                readers = [u for u in product.users if product in self._reads(u)]
                if not readers or not all(self._once(u) for u in readers):
                    self.report.warnings.append(
                        f"the squeeze-excite output {product.name!r} keeps its mean of about 0.5x: it is not read by "
                        "modules called once, where adapt puts the authors' factor 2")
                    continue
                for u in readers:
                    self.factors.add(u, product, SE_GAIN, "squeeze-excite x2")
                self.report.gates.append(f"{product.name} (the gate {g.name}): x{SE_GAIN:g} on the input of "
                                         + ", ".join(str(u.target) for u in readers))

    def _gate_output(self, g: fx.Node) -> list[fx.Node]:
        """The products of the gate ``g`` with the signal it was computed from."""
        return [p for p in g.users if any(s is not g and self.anc.has(g, s) for s in p.all_input_nodes)]

    def activations(self) -> None:
        """Each activation times its gamma, where it applies (see the module's docstring)."""
        in_branch = set().union(*(r.data for r in self.residuals), *(self._chain(r) for r in self.residuals))
        classifier = self.an.classifier
        problems = []
        for n in self.graph.nodes:
            if not T.is_activation(n, self.modules) or n in self.gate_region:
                continue
            what = type(T.module_of(n, self.modules)).__name__ if n.op == "call_module" else T._name(n)
            if any(self.anc.has(n, c) for c in classifier):
                self.report.activations_kept.append(f"{n.name} ({what}): after the classifier")
                continue
            if n not in in_branch:
                why = self._outside_why(n)
                if why:
                    self.report.activations_kept.append(f"{n.name} ({what}): {why}")
                    continue
            try:
                gamma, what = activation_gamma(n, self.modules)
            except ValueError as err:
                problems.append(str(err))
                continue
            where = self._push_gamma(n, gamma) if n not in in_branch else ""
            self.report.activations.append(NFActivation(n.name, what, gamma,
                                                        where or self._place_gamma(n, gamma, what)))
        if problems:
            raise AdaptError(f"fixup.adapt cannot give every activation of {type(self.model).__name__} its gamma "
                             f"(method={self.method.name!r}):\n  - " + "\n  - ".join(problems))

    def _sum_read(self, n: fx.Node) -> fx.Node | None:
        """The residual sum ``n`` reads, through operations that only move values (removed norms too), if any."""
        adds = {r.add for r in self.residuals}
        p = self._reads(n)[0] if self._reads(n) else None
        while p is not None and p not in adds and T.is_passthrough(p, self.modules) and len(self._reads(p)) == 1:
            p = self._reads(p)[0]
        return p if p in adds else None

    def _outside_why(self, n: fx.Node) -> str:
        """Why an activation outside every branch keeps its scale, or "" where it takes its gamma. One that reads a
        residual sum whose shortcut is the stream itself (identity or parameter-free: a post-activation ResNet's
        ReLU after the add) passes the already activated stream almost unchanged, and gamma would multiply the
        stream block after block; one that reads a sum whose shortcut projects h / beta (a transition) sees a fresh
        zero-mean signal, as does every other activation (the stem's, a block's without a skip): they take it."""
        add = self._sum_read(n)
        if add is None or next(r for r in self.residuals if r.add is add).shortcut_kind == "projection":
            return ""
        return ("it reads a residual sum whose shortcut is the stream itself: gamma assumes a fresh zero-mean input, "
                "and after a post-activation ResNet's add it would multiply the stream block after block")

    def _push_gamma(self, n: fx.Node, gamma: float) -> str:
        """An activation after a transition's sum whose output no hook can scale alone (a module the block also
        calls inside its branch, as torchvision's ``self.relu``), if positively homogeneous: gamma goes on both
        operands of the sum instead (the shortcut's output, and the branch's alpha). Returns where, or ""."""
        if self._once(n) or not positively_homogeneous(n, self.modules):
            return ""
        add = self._sum_read(n)
        r = next((r for r in self.residuals if r.add is add), None)
        short = next((a for a in add.args if isinstance(a, fx.Node) and a is not r.branch_out), None) if r else None
        if short is None or not self._once(short):
            return ""
        path = str(short.target)
        self.rw._attach(self.modules[path], path, "nf_gamma", NFFactor(gamma, f"gamma ({n.name}, after the sum)"))
        self.modules[path].register_forward_hook(gamma_output)
        self.pushed[add] = gamma
        return f"the operands of {add.name} (the output of {path}, and the branch's alpha), as f(gamma x) = gamma f(x)"

    def _place_gamma(self, n: fx.Node, gamma: float, what: str) -> str:
        """Multiply ``n``'s output by gamma: a hook on its module where it is called once, else on its readers."""
        if self._once(n):
            path = str(n.target)
            mod = self.modules[path]
            self.rw._attach(mod, path, "nf_gamma", NFFactor(gamma, f"gamma ({what})"))
            mod.register_forward_hook(gamma_output)
            return f"the output of {path}"
        readers = [u for u in n.users if n in self._reads(u)]
        bad = [u for u in readers if not self._once(u)]
        if bad:
            raise AdaptError(f"the activation {what} at {n.name!r} is a function (or a module called several times) "
                             f"read by {T._name(bad[0])!r}, which is not a module called once; fixup.adapt cannot put "
                             "its gamma there. Write the activation as a module of its own (self.act = nn.ReLU()), "
                             f"called once. {_NO_NF}")
        for u in readers:
            self.factors.add(u, n, gamma, f"gamma ({what})")
        return f"the input of {', '.join(str(u.target) for u in readers)}"

    def _in_block(self, node: fx.Node, block: str) -> bool:
        stack = node.meta.get("nn_module_stack") or {}
        scope = next(reversed(stack.values()))[0] if stack else ""
        return scope == block or scope.startswith(block + ".")

    def _chain(self, r: Residual) -> list[fx.Node]:
        """A pre-activation block's norm and activation between its input and a fork its projection shares with
        the branch (``a = act(norm(h)); proj(a) + F(a)``), in order; empty for any other block."""
        if not r.block or r.shortcut_kind != "projection":
            return []
        chain, node = [], r.fork
        while self._in_block(node, r.block) and len(self._reads(node)) == 1 and (
                T.is_passthrough(node, self.modules) or T.is_norm(node, self.modules)
                or (T.is_activation(node, self.modules) and node not in self.gate_region)):
            chain.insert(0, node)
            node = self._reads(node)[0]
        return chain

    def residual(self, r: Residual, beta: float, transition: bool) -> Branch:
        """Put ``h / beta`` into the block and ``alpha * g`` after its branch; return the branch it declares."""
        chain = self._chain(r)
        if chain:
            entries = [(chain[0], self._reads(chain[0])[0])]
        else:
            entries = [(u, r.fork) for u in r.fork.users if u is not r.add and r.fork in self._reads(u)
                       and (u in r.data or (transition and self.anc.has(r.add, u)))]
        for reader, source in entries:
            if not self._once(reader):
                raise AdaptError(f"the block summed at {r.add.name!r} reads its input in {T._name(reader)!r}, which is "
                                 "not a module called once; fixup.adapt cannot divide that input by beta. "
                                 f"{_NO_NF}")
            self.factors.add(reader, source, 1.0 / beta, "1/beta")
        out = NFBranchOut(self.alpha, gated=self.method.gate, after=self.pushed.get(r.add, 1.0))
        self.rw._scale_ends(r, out)  # type: ignore[arg-type]  # attached as the end layers' fixup_scale
        layers, m = self.rw._layers(r)
        projection = T.module_of(r.projection, self.modules) if r.projection is not None else None
        names = module_names(self.model)
        if r.layer_scale is not None:
            self.report.layer_scales.append(str(r.layer_scale.target))
        gain = None if out.gain is None else f"{names[id(out.gain)]}.scale"
        self.report.residuals.append(NFResidual(
            self.rw._container(r), r.add.name, r.shortcut_kind, transition, beta,
            [str(reader.target) for reader, _ in entries], [names[id(x)] for x in layers if id(x) in names], gain))
        return Branch(layers=layers, kind=f"nf-{self.rw._kind(r)}", m=m, scale=out.gain, shortcut=projection,
                      ends=len(r.ends.layers) if r.ends is not None else 1)

    def apply_factors(self) -> None:
        """One constant factor module per module input, applied by a pre-hook (Fixup's input-scalar hook)."""
        for path, positions in self.factors.at.items():
            mod, names = self.modules[path], {}
            for i, parts in sorted(positions.items()):
                factor = math.prod(f for f, _ in parts)
                names[i] = self.rw._attach(mod, path, "nf_input", NFFactor(factor, " x ".join(w for _, w in parts)))
            mod.register_forward_pre_hook(functools.partial(bias_inputs, names))


def _rewrite(nf: _NFRewrite) -> list[nn.Module]:
    """Rewrite the copy; returns its classifier."""
    nf.check()
    nf.rw.norms_out(biases=False, removed_why="NF-ResNets have no normalisation, and no bias in its place")
    nf.report.norms_replaced = nf.rw.norms
    nf.standardise()
    nf.activations()
    nf.gates()
    transitions = [r.shortcut_kind == "projection" for r in nf.residuals]
    stds = expected_stds(transitions, nf.alpha)
    declared: dict[str, list[Branch]] = {}
    for r, beta, transition in zip(nf.residuals, stds, transitions):
        declared.setdefault(nf.rw._container(r), []).append(nf.residual(r, beta, transition))
    nf.report.output_std = stds[-1]
    nf.apply_factors()
    classifier = nf.rw.classifier(nf.an.classifier, bias=False)
    nf.rw.declare(declared, classifier)
    return classifier


def _small_maps(model: nn.Module, args: tuple[Tensor, ...]) -> list[tuple[str, str, str]]:
    """The standardised convolutions whose input map is smaller than their kernel on ``args``: (path, kernel, map)."""
    seen: list[tuple[str, str, str]] = []

    def hook(name: str, mod: ScaledStdConv2d) -> Any:
        def check(_m: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            (kh, kw), (h, w) = mod.kernel_size, inputs[0].shape[-2:]
            if h < kh or w < kw:
                seen.append((name, f"{kh}x{kw}", f"{h}x{w}"))
        return check

    handles = [m.register_forward_pre_hook(hook(n, m)) for n, m in model.named_modules()
               if isinstance(m, ScaledStdConv2d)]
    was = model.training
    try:
        with torch.no_grad():
            model.eval()(*args)
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return seen


def adapt_nf(model: nn.Module, args: tuple[Tensor, ...], rec: Recording, analysis: Analysis, method: Method, *,
             nonlinear_before: list[str], leaf_modules: tuple[type[nn.Module], ...],
             generator: torch.Generator | None) -> NFAdaptReport:
    """Put ``model`` (adapt's recorded copy) in NF-ResNet form in place, initialise it as the library's NF-ResNet and
    measure its stream; returns the report (the weights loaded and the readiness for Opacus are adapt's to add)."""
    nf = _NFRewrite(model, rec, analysis, method)
    classifier = _rewrite(nf)
    report = nf.report
    model.adapted_method = method  # what fixup.param_groups and AGC read: the method's recipe (fixup.method)
    names = module_names(model)
    with torch.no_grad():
        _, cls_records, rest = draw_standardized_(model, classifier, [names[id(c)] for c in classifier], generator)
        for r in analysis.residuals:
            if r.layer_scale is not None:
                model.get_parameter(str(r.layer_scale.target)).fill_(1.0)
    report.classifier = [c.name for c in cls_records]
    report.other_layers = [o.name for o in rest.other]
    report.warnings += [f"{u} left as it was drawn: not a weight layer NF-ResNets define" for u in rest.untouched]
    blocks = residual_blocks(model)  # none when the root itself computes every residual sum
    if blocks:
        signal = stream_signal(model, args, blocks=blocks, train=False)
        report.stream_input_rms, report.stream = signal.input_rms, signal.stages
        report.warnings += [f"the stream leaves [0.5, 2]x the input's RMS at {s.name!r} ({s.ratio:.3g}x) at "
                            "initialisation; see fixup.lab.stream_signal" for s in signal.outside()]
        small = _small_maps(model, args) if any(s.ratio < 0.5 for s in signal.stages) else []
        if small:
            name, kernel, size = small[0]
            report.warnings.append(
                f"the stream falls below 0.5x where the example's maps are smaller than the kernels: {len(small)} "
                f"standardised convolutions read a map smaller than their kernel (e.g. {name!r}, {kernel} on "
                f"{size}). A standardised kernel there sees few of its taps (one of nine for a 3x3 at 1x1), so the "
                "stream shrinks at each; measure it at the size the model will train on (fixup.lab.stream_signal), "
                "or train with method='fixup', 'skipinit' or 'rezero', which standardise nothing")
    was = model.training
    model.eval()
    try:
        after = record(model, args, leaf_modules).nonlinearities(dict(model.named_modules()))
    finally:
        model.train(was)
    if len(after) < len(nonlinear_before):
        raise AdaptError(f"adapting {type(model).__name__} to {method.name} would lose "
                         f"{len(nonlinear_before) - len(after)} of its {len(nonlinear_before)} non-linearities; it is "
                         "not returned. Please report this model.")
    return report
