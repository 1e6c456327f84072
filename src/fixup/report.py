"""The accounting report: what ``fixup_init_`` did to a model, as data.

It is the "model contract" of an initialisation: enough for another implementation to be
checked against it (L, m and the factor per branch, which layers were zeroed, scaled or left
alone, the scalars present, the normalisation still there and its axes, epsilon, affine
parameters and running state).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

__all__ = ["BranchRecord", "FixupReport", "LSUVRecord", "LayerRecord", "NormRecord", "describe_norm"]


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


@dataclass
class FixupReport:
    """What an initialisation did, branch by branch. ``str(report)`` is a table, ``to_dict()`` JSON."""

    num_branches: int
    branches: list[BranchRecord]
    classifier: list[LayerRecord]
    other_layers: list[LayerRecord] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)
    num_scalars: int = 0
    normalization: list[NormRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    method: str = "fixup"
    fan_mode: str = "fan_out"
    depth_scaling: bool = True
    rescale: float = 1.0
    base_init: str = "he"
    # For methods other than Fixup: how the weights were drawn (e.g. "Xavier uniform"); empty means He.
    scheme: str = ""
    # The multiplier on each residual block's output x + F(x) (1/sqrt(2) for that baseline, else 1).
    output_scale: float = 1.0
    # Tensors zeroed outside rule 1 (normalisation gains, branch weights of the zero-branch ablation).
    zeroed: list[str] = field(default_factory=list)
    # What a data-dependent initialisation (LSUV) did, layer by layer, once it has run.
    data_init: list[LSUVRecord] = field(default_factory=list)

    @property
    def is_fixup(self) -> bool:
        """Whether this report describes Fixup or one of its ablations."""
        return self.method.startswith("fixup")

    @property
    def shortcuts(self) -> list[LayerRecord]:
        """Shortcut projections (He-initialised, not depth-scaled)."""
        return [b.shortcut for b in self.branches if b.shortcut is not None]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FixupReport:
        def layer(d: dict[str, Any] | None) -> LayerRecord | None:
            return None if d is None else LayerRecord(**d)

        fields = dict(data)
        fields["branches"] = [
            BranchRecord(**{**b, "scaled": [LayerRecord(**s) for s in b["scaled"]],
                            "zeroed": layer(b["zeroed"]), "shortcut": layer(b["shortcut"])})
            for b in data["branches"]
        ]
        fields["classifier"] = [LayerRecord(**c) for c in data["classifier"]]
        fields["other_layers"] = [LayerRecord(**c) for c in data.get("other_layers", [])]
        fields["normalization"] = [NormRecord(**n) for n in data.get("normalization", [])]
        fields["data_init"] = [LSUVRecord(**r) for r in data.get("data_init", [])]
        return cls(**fields)

    def format(self, max_branches: int = 12) -> str:
        """The report as a table; at most ``max_branches`` branches are listed one by one."""
        if not self.is_fixup:
            return self._format_plain()
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
            base = "He" if self.base_init == "he" else "Xavier"
            lines.append(f"other weight layers ({base}, not depth-scaled): "
                         + ", ".join(map(str, self.other_layers[:4]))
                         + (f", ... {len(self.other_layers) - 4} more" if len(self.other_layers) > 4 else ""))
        if self.untouched:
            lines.append("left alone: " + ", ".join(self.untouched[:6])
                         + (f", ... {len(self.untouched) - 6} more" if len(self.untouched) > 6 else ""))
        biases = sum(b.num_biases for b in self.branches)
        scales = sum(b.has_scale for b in self.branches)
        lines.append(f"scalar parameters: {self.num_scalars} ({biases} branch biases, {scales} multipliers)")
        if self.zeroed:
            lines.append("also zeroed: " + ", ".join(self.zeroed[:6])
                         + (f", ... {len(self.zeroed) - 6} more" if len(self.zeroed) > 6 else ""))
        lines.extend(self._format_norms())
        if self.branches:
            lines.append("branches:")
            for b in self.branches[:max_branches]:
                def local(layer: LayerRecord, block: str = b.name.split("[")[0]) -> str:
                    return layer.name.removeprefix(block + ".")  # the layer's name inside its block

                sc = ", ".join(f"{local(s)} std {s.std:.4g}" for s in b.scaled)
                lines.append(f"  {b.name:<22} {b.kind:<11} m={b.m} factor {b.factor:.4g}: scaled [{sc}] "
                             f"zeroed {local(b.zeroed)}; {b.num_biases} biases, "
                             f"{'a' if b.has_scale else 'NO'} multiplier"
                             + (f"; shortcut {local(b.shortcut)}" if b.shortcut else ""))
            if len(self.branches) > max_branches:
                lines.append(f"  ... {len(self.branches) - max_branches} more (to_dict() or --json lists all)")
        lines.append("warnings: " + ("none" if not self.warnings else ""))
        lines.extend(f"  - {w}" for w in self.warnings)
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

    def _format_plain(self) -> str:
        """The report of a method other than Fixup: every weight layer is drawn the same way."""
        lines = [f"Accounting report: method {self.method}, {self.scheme or 'He init with ' + self.fan_mode}"]
        lines.append(f"L = {self.num_branches} residual branches, not rescaled (no Fixup rule applies)")
        if self.output_scale != 1.0:
            lines.append(f"every residual block's output x + F(x) is multiplied by {self.output_scale:.6g}")
        layers = self.other_layers
        lines.append(f"weight layers initialised: {len(layers)}"
                     + (": " + ", ".join(map(str, layers[:4])) if layers else "")
                     + (f", ... {len(layers) - 4} more" if len(layers) > 4 else ""))
        if self.zeroed:
            lines.append("zeroed: " + ", ".join(self.zeroed[:6])
                         + (f", ... {len(self.zeroed) - 6} more" if len(self.zeroed) > 6 else ""))
        if self.untouched:
            lines.append("left alone: " + ", ".join(self.untouched[:6])
                         + (f", ... {len(self.untouched) - 6} more" if len(self.untouched) > 6 else ""))
        lines.append(f"scalar parameters: {self.num_scalars}")
        lines.extend(self._format_norms())
        if self.data_init:
            bad = [r for r in self.data_init if not r.converged]
            lines.append(f"data-dependent initialisation: {len(self.data_init)} layers rescaled, "
                         + (f"{len(bad)} NOT within tolerance" if bad else "all within tolerance"))
            lines.extend(f"  {r}" for r in (bad or self.data_init)[:4])
        lines.append("warnings: " + ("none" if not self.warnings else ""))
        lines.extend(f"  - {w}" for w in self.warnings)
        return "\n".join(lines)
