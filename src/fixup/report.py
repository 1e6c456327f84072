"""The accounting report: what an initialiser of :mod:`fixup.init` did to a model, as data.

It is the "model contract" of an initialisation: enough for another implementation to be
checked against it (L, m and the factor per branch, which layers were zeroed, scaled or left
alone, the scalars present, the normalisation still there and its axes, epsilon, affine
parameters and running state).
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from torch import nn

__all__ = ["BranchRecord", "FixupReport", "FixupWarning", "GateRecord", "GateReport", "InitReport", "LSUVRecord",
           "LayerRecord", "NormRecord", "describe_norm", "layer_records", "some_of", "warn_report"]


@dataclass
class LayerRecord:
    """A weight layer: qualified name, module type, weight shape and the std it was drawn with."""

    name: str
    type: str
    shape: list[int]
    std: float

    def __str__(self) -> str:
        return f"{self.name} ({self.type} {'x'.join(map(str, self.shape))}, std {self.std:.4g})"


@dataclass
class BranchRecord:
    """One residual branch as initialised."""

    name: str
    kind: str
    m: int
    factor: float
    scaled: list[LayerRecord]
    zeroed: LayerRecord
    num_biases: int
    has_scale: bool
    shortcut: LayerRecord | None = None
    stream_bias: bool = False  # whether one of its biases sits on the residual stream (after the last layer)

    @property
    def scale(self) -> float:
        """Rule 2's factor for this branch's inner weights (the same as ``factor``)."""
        return self.factor


@dataclass
class GateRecord:
    """One residual branch of a gated method (SkipInit, ReZero): its weight layers as drawn and its gate."""

    name: str
    kind: str
    m: int
    layers: list[LayerRecord]
    gate: str  # the gate's qualified parameter name
    shortcut: LayerRecord | None = None


@dataclass
class NormRecord:
    """A normalisation layer still in the model: what it normalises over and what state it keeps."""

    name: str
    type: str
    axes: str
    eps: float | None
    affine: bool
    running_stats: bool


@dataclass
class LSUVRecord:
    """One weight layer as LSUV left it: output variance on the batch before and after rescaling."""

    name: str
    type: str
    shape: list[int]
    iterations: int
    variance_before: float
    variance: float
    converged: bool

    def __str__(self) -> str:
        mark = "" if self.converged else " (NOT within tolerance)"
        return (f"{self.name} ({self.type}): output variance {self.variance_before:.4g} -> {self.variance:.4g} "
                f"in {self.iterations} step(s){mark}")


def describe_norm(name: str, module: nn.Module) -> NormRecord | None:
    """A record for a normalisation module, or ``None`` if ``module`` is not one."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        axes, affine, running = "batch and spatial, per channel", module.affine, module.track_running_stats
    elif isinstance(module, nn.modules.instancenorm._InstanceNorm):
        axes, affine, running = "spatial, per example and channel", module.affine, module.track_running_stats
    elif isinstance(module, nn.GroupNorm):
        groups = module.num_groups
        axes = f"{module.num_channels // groups} channels x spatial, per example ({groups} groups)"
        affine, running = module.affine, False
    elif isinstance(module, nn.LayerNorm):
        axes = f"last {len(module.normalized_shape)} dim(s) {list(module.normalized_shape)}, per example"
        affine, running = module.elementwise_affine, False
    else:
        return None
    return NormRecord(name, type(module).__name__, axes, float(module.eps), bool(affine), bool(running))


class FixupWarning(UserWarning):
    """What an initialisation report marks as a warning, raised through :func:`warnings.warn`.

    Filter it by category (``warnings.simplefilter("ignore", fixup.FixupWarning)``), never by text.
    """


def warn_report(report: InitReport, stacklevel: int = 3) -> None:
    """Issue each of ``report.warnings`` as a :class:`FixupWarning`."""
    for message in report.warnings:
        warnings.warn(message, FixupWarning, stacklevel=stacklevel)


def layer_records(items: list[dict[str, Any]] | None) -> list[LayerRecord]:
    """Layer records back from their ``to_dict`` form (every report's ``from_dict`` reads its layers with it)."""
    return [LayerRecord(**d) for d in items or []]


@dataclass
class InitReport:
    """What an initialisation did to a model: the part every method shares.

    ``str(report)`` is a table, ``to_dict()`` JSON. Fixup's report (:class:`FixupReport`) adds the
    branch accounting; a data-dependent method (LSUV) fills ``data_init`` once it has seen a batch.
    """

    method: str
    num_branches: int = 0
    # How the weights were drawn (e.g. "Xavier uniform").
    scheme: str = ""
    other_layers: list[LayerRecord] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)
    num_scalars: int = 0
    normalization: list[NormRecord] = field(default_factory=list)
    # Problems the user should see (also issued as FixupWarning); `notes` are choices made by design.
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fan_mode: str = "fan_out"
    # The multiplier on each residual block's output x + F(x) (1/sqrt(2) for that baseline, else 1).
    output_scale: float = 1.0
    # Tensors zeroed outside rule 1 (normalisation gains, branch weights of the zero-branch ablation).
    zeroed: list[str] = field(default_factory=list)
    # The data-dependent section: whether it is still to run, and what it did layer by layer.
    data_init_pending: bool = False
    data_init: list[LSUVRecord] = field(default_factory=list)

    @property
    def is_fixup(self) -> bool:
        """Whether this report describes Fixup or one of its variants."""
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, **asdict(self)}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def _fields_from(cls, data: dict[str, Any]) -> dict[str, Any]:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"kind"})
        if unknown:
            raise ValueError(f"{cls.__name__}.from_dict: unknown field(s) {unknown}; is this a report of "
                             "another version?")
        out = {k: v for k, v in data.items() if k in names}
        out["other_layers"] = layer_records(data.get("other_layers"))
        out["normalization"] = [NormRecord(**n) for n in data.get("normalization", [])]
        out["data_init"] = [LSUVRecord(**r) for r in data.get("data_init", [])]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InitReport:
        """The report ``to_dict`` wrote, as the class it was (``kind``), or as ``cls``."""
        kind = data.get("kind")
        for sub in (cls, *_subclasses(InitReport)):
            if sub.__name__ == kind and issubclass(sub, cls):
                return sub(**sub._fields_from(data))
        return cls(**cls._fields_from(data))

    def format(self, max_branches: int = 12) -> str:
        """The report as a table."""
        lines = [f"Initialisation report: method {self.method}, {self.scheme or 'He init with ' + self.fan_mode}"]
        lines.append(f"L = {self.num_branches} residual branches, not rescaled (no Fixup rule applies)")
        if self.output_scale != 1.0:
            lines.append(f"every residual block's output x + F(x) is multiplied by {self.output_scale:.6g}")
        layers = self.other_layers
        lines.append(f"weight layers initialised: {len(layers)}" + some_of(layers, 4, ": "))
        if self.zeroed:
            lines.append("zeroed: " + some_of(self.zeroed, 6))
        if self.untouched:
            lines.append("left alone: " + some_of(self.untouched, 6))
        lines.append(f"scalar parameters: {self.num_scalars}")
        lines.extend(self._format_norms())
        lines.extend(self._format_tail())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def _format_norms(self) -> list[str]:
        if not self.normalization:
            return ["normalisation still present: none"]
        lines = [f"normalisation still present: {len(self.normalization)} layers"]
        for kind, count in Counter((n.type, n.axes, n.eps, n.affine, n.running_stats)
                                   for n in self.normalization).items():
            t, axes, eps, affine, running = kind
            lines.append(f"  {count} x {t}: over {axes}, eps {eps:g}, affine {affine}, "
                         f"running statistics {running}")
        return lines

    def _format_tail(self) -> list[str]:
        lines = []
        if self.data_init_pending:
            lines.append("data-dependent initialisation: PENDING (fixup.init.data_init_(model, batch); "
                         "the training engine runs it on its first batch)")
        if self.data_init:
            bad = [r for r in self.data_init if not r.converged]
            lines.append(f"data-dependent initialisation: {len(self.data_init)} layers rescaled, "
                         + (f"{len(bad)} NOT within tolerance" if bad else "all within tolerance"))
            lines.extend(f"  {r}" for r in (bad or self.data_init)[:4])
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append("warnings: " + ("none" if not self.warnings else ""))
        lines.extend(f"  - {w}" for w in self.warnings)
        return lines


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def some_of(items: list[Any], k: int, prefix: str = "") -> str:
    """The first ``k`` of ``items`` joined for a report line, with how many more there are ("" for none)."""
    if not items:
        return ""
    more = f", ... {len(items) - k} more" if len(items) > k else ""
    return prefix + ", ".join(map(str, items[:k])) + more


@dataclass
class FixupReport(InitReport):
    """What ``fixup_init_`` did, branch by branch: the Fixup section of the initialisation report."""

    method: str = "fixup"
    branches: list[BranchRecord] = field(default_factory=list)
    classifier: list[LayerRecord] = field(default_factory=list)
    depth_scaling: bool = True
    rescale: float = 1.0
    base_init: str = "he"
    # The He fan of the weight layers outside the branches (the stem); "fan_out" in reports written before it.
    stem_fan_mode: str = "fan_out"
    # The scalar bias after each branch's last layer, on the residual stream: how many, and how they learn
    # ("budget": together at one scalar's rate; "paper": each at the scalar rate; "none": absent).
    num_stream_biases: int = 0
    stream_bias: str = "none"

    @property
    def is_fixup(self) -> bool:
        return True

    @property
    def shortcuts(self) -> list[LayerRecord]:
        """Shortcut projections (He-initialised, not depth-scaled)."""
        return [b.shortcut for b in self.branches if b.shortcut is not None]

    @classmethod
    def _fields_from(cls, data: dict[str, Any]) -> dict[str, Any]:
        out = super()._fields_from(data)
        out["branches"] = [
            BranchRecord(**{**b, "scaled": layer_records(b["scaled"]), "zeroed": LayerRecord(**b["zeroed"]),
                            "shortcut": None if b.get("shortcut") is None else LayerRecord(**b["shortcut"])})
            for b in data.get("branches", [])
        ]
        out["classifier"] = layer_records(data.get("classifier"))
        return out

    def format(self, max_branches: int = 12) -> str:
        """The report as a table; at most ``max_branches`` branches are listed one by one."""
        base = f"He init with {self.fan_mode}" if self.base_init == "he" else "Xavier (Glorot) normal init"
        lines = [f"Accounting report: method {self.method}, {base}"]
        scaling = "depth scaling on" if self.depth_scaling else "depth scaling OFF (ablation)"
        if self.rescale != 1.0:
            scaling += f", factor x{self.rescale:g} (ablation)"
        lines.append(f"L = {self.num_branches} residual branches ({scaling})")
        groups = Counter((b.kind, b.m, round(b.factor, 12)) for b in self.branches)
        if groups:
            lines.append(f"  {'branch type':<14}{'m':>3}{'count':>8}  {'factor':<26}")
            for (kind, m, factor), count in groups.items():
                exponent = f"L^(-1/{2 * m - 2})" if m > 1 else "m=1: nothing to scale"
                lines.append(f"  {kind:<14}{m:>3}{count:>8}  {factor:<10.6g}{exponent}")
        zeroed = sum(1 for _ in self.branches)
        scaled = sum(len(b.scaled) for b in self.branches)
        lines.append(f"weight layers in branches: {scaled} scaled, {zeroed} zeroed (last of each branch)")
        lines.append("classifier zeroed: " + (", ".join(map(str, self.classifier)) or "none declared"))
        if self.shortcuts:
            lines.append(f"shortcut projections (He, not depth-scaled): {len(self.shortcuts)}")
        if self.other_layers:
            base = f"He with {self.stem_fan_mode}" if self.base_init == "he" else "Xavier"
            why = ("; with no normalisation the stem sets the stream's scale, which a fan-in draw keeps at the "
                   "input's (our correction)" if self.base_init == "he" and self.stem_fan_mode == "fan_in" else "")
            lines.append(f"other weight layers ({base}, not depth-scaled): " + some_of(self.other_layers, 4) + why)
        if self.untouched:
            lines.append("left alone: " + some_of(self.untouched, 6))
        biases = sum(b.num_biases for b in self.branches)
        scales = sum(b.has_scale for b in self.branches)
        lines.append(f"scalar parameters: {self.num_scalars} ({biases} branch biases, {scales} multipliers)")
        lines.append("stream biases (added after a branch's last layer, onto the residual stream): "
                     + _STREAM_TEXT[self.stream_bias].format(n=self.num_stream_biases))
        if self.zeroed:
            lines.append("also zeroed: " + some_of(self.zeroed, 6))
        lines.extend(self._format_norms())
        if self.branches:
            lines.append("branches:")
            for b in self.branches[:max_branches]:
                def local(layer: LayerRecord, block: str = b.name.split("[")[0]) -> str:
                    return layer.name.removeprefix(block + ".")  # the layer's name inside its block

                sc = ", ".join(f"{local(s)} std {s.std:.4g}" for s in b.scaled)
                stream = " (one on the stream)" if b.stream_bias else ""
                lines.append(f"  {b.name:<22} {b.kind:<11} m={b.m} factor {b.factor:.4g}: scaled [{sc}] "
                             f"zeroed {local(b.zeroed)}; {b.num_biases} biases{stream}, "
                             f"{'a' if b.has_scale else 'NO'} multiplier"
                             + (f"; shortcut {local(b.shortcut)}" if b.shortcut else ""))
            if len(self.branches) > max_branches:
                lines.append(f"  ... {len(self.branches) - max_branches} more (to_dict() or --json lists all)")
        lines.extend(self._format_tail())
        return "\n".join(lines)


_STREAM_TEXT = {
    "budget": "{n}, sharing one scalar's learning rate (each at 1/{n} of it): our correction, since in a stage "
              "they all receive the same gradient and would otherwise move the stream (blocks per stage) times "
              "faster than one scalar; fixup.param_groups applies it",
    "paper": "{n}, each at the full scalar rate (the authors' parameterisation)",
    "none": "none (rule 3 taken literally)",
}


@dataclass
class GateReport(InitReport):
    """What a gated method (``skipinit``, ``rezero``) did, branch by branch: every branch ``x + alpha * F(x)`` with
    its weights drawn unscaled and its gate ``alpha`` at ``gate_init``."""

    method: str = "rezero"
    branches: list[GateRecord] = field(default_factory=list)
    classifier: list[LayerRecord] = field(default_factory=list)
    gate_init: float = 0.0
    base_init: str = "he"  # he | xavier | truncated_fan_in (skipinit: the authors' draw)
    stem_fan_mode: str = "fan_in"  # the He fan of the weight layers outside the branches
    summary: str = ""  # what the method does, in one line

    @classmethod
    def _fields_from(cls, data: dict[str, Any]) -> dict[str, Any]:
        out = super()._fields_from(data)
        out["branches"] = [
            GateRecord(**{**b, "layers": layer_records(b["layers"]),
                          "shortcut": None if b.get("shortcut") is None else LayerRecord(**b["shortcut"])})
            for b in data.get("branches", [])
        ]
        out["classifier"] = layer_records(data.get("classifier"))
        return out

    def format(self, max_branches: int = 12) -> str:
        """The report as a table; at most ``max_branches`` branches are listed one by one."""
        base = {"he": f"He with {self.fan_mode}", "truncated_fan_in": "truncated normal, std 1/sqrt(fan_in)"}.get(
            self.base_init, "Xavier (Glorot) normal")
        summary = f": {self.summary}" if self.summary else ""
        lines = [f"Accounting report: method {self.method}, {base} init{summary}"]
        lines.append(f"L = {self.num_branches} residual branches, each x + alpha * F(x) with its own gate alpha = "
                     f"{self.gate_init:g} (no depth scaling, no branch layer zeroed)")
        groups = Counter((b.kind, b.m) for b in self.branches)
        if groups:
            lines.append(f"  {'branch type':<14}{'m':>3}{'count':>8}")
            lines.extend(f"  {kind:<14}{m:>3}{count:>8}" for (kind, m), count in groups.items())
        drawn = sum(len(b.layers) for b in self.branches)
        lines.append(f"weight layers in branches: {drawn} drawn ({base}), none scaled or zeroed; gates: "
                     f"{len(self.branches)}, each {self.gate_init:g}")
        lines.append("classifier: " + (", ".join(map(str, self.classifier)) or "none declared"))
        shortcuts = [b.shortcut for b in self.branches if b.shortcut is not None]
        if shortcuts:
            lines.append(f"shortcut projections ({base}): {len(shortcuts)}")
        if self.other_layers:
            other = {"he": f"He with {self.stem_fan_mode}", "truncated_fan_in": base}.get(self.base_init, "Xavier")
            lines.append(f"other weight layers ({other}): " + some_of(self.other_layers, 4))
        if self.untouched:
            lines.append("left alone: " + some_of(self.untouched, 6))
        lines.append(f"scalar parameters: {self.num_scalars} ({len(self.branches)} gates)")
        lines.extend(self._format_norms())
        if self.branches:
            lines.append("branches:")
            for b in self.branches[:max_branches]:
                block = b.name.split("[")[0]
                drawn_layers = ", ".join(f"{r.name.removeprefix(block + '.')} std {r.std:.4g}" for r in b.layers)
                lines.append(f"  {b.name:<22} {b.kind:<11} m={b.m}: drawn [{drawn_layers}]; gate "
                             f"{b.gate.removeprefix(block + '.')} = {self.gate_init:g}"
                             + (f"; shortcut {b.shortcut.name.removeprefix(block + '.')}" if b.shortcut else ""))
            if len(self.branches) > max_branches:
                lines.append(f"  ... {len(self.branches) - max_branches} more (to_dict() or --json lists all)")
        lines.extend(self._format_tail())
        return "\n".join(lines)
