"""The accounting report of an adapted model: the method's report plus what the adaptation changed.

:class:`AdaptReport` is Fixup's (:class:`fixup.FixupReport`) with the adaptation; :class:`GateAdaptReport` a gated
method's (:class:`fixup.report.GateReport`: SkipInit, ReZero) with the same adaptation fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..report import FixupReport, GateReport
from ..signal import SignalRecord
from ._trunk import TrunkRecord

__all__ = ["AdaptReport", "GateAdaptReport", "NormChange", "ResidualRecord", "closing_lines"]


@dataclass
class NormChange:
    """A normalisation layer taken out: ``action`` is ``"bias"`` (now a scalar Bias) or ``"removed"``."""

    name: str
    type: str
    action: str
    why: str


@dataclass
class ResidualRecord:
    """A residual sum found in the traced graph and the branch declared for it."""

    branch: str           # the branch's name in the report (its block's qualified name)
    add: str              # the graph node of the sum
    fork: str             # the node both operands start from
    shortcut: str         # "identity", "parameter-free" or "projection"
    layers: list[str]     # weight layers of F in execution order (the last is zeroed)
    gates: list[str] = field(default_factory=list)  # squeeze-excite layers on a gate input


@dataclass
class _Adaptation:
    """What ``fixup.adapt`` found and changed, beside the method's own accounting (a mixin of the reports below)."""

    captured_with: str = "eager recording"
    residuals: list[ResidualRecord] = field(default_factory=list)
    norms_replaced: list[NormChange] = field(default_factory=list)
    scalars_added: list[str] = field(default_factory=list)
    # Activations, gates and softmaxes computed on the example input, before and after (they must match).
    nonlinearities_before: int = 0
    nonlinearities_after: int = 0
    layer_scales: list[str] = field(default_factory=list)   # parameters used as their branch's multiplier
    fused_qkv: list[str] = field(default_factory=list)      # layers declared as three (Q, K, V)
    untied: list[str] = field(default_factory=list)         # tied weights given their own copy
    weights_loaded: list[str] = field(default_factory=list)   # state_dict entries loaded (state_dict=...)
    weights_dropped: list[str] = field(default_factory=list)  # entries of it that no longer exist, and why
    trunk_rule: str = "none"                                   # the rule for the layers outside the branches
    trunk: list[TrunkRecord] = field(default_factory=list)     # each trunk layer, in execution order
    stream_input_rms: float = 1.0                              # the example input's RMS (1 for token ids)
    stream: list[SignalRecord] = field(default_factory=list)   # the stream's RMS at each stage, at initialisation
    private: str = ""  # ready for private training (Opacus), or why not: fixup.private.PrivateReport.summary()

    @classmethod
    def _fields_from(cls, data: dict[str, Any]) -> dict[str, Any]:
        out = super()._fields_from(data)  # type: ignore[misc]
        out["residuals"] = [ResidualRecord(**r) for r in data.get("residuals", [])]
        out["norms_replaced"] = [NormChange(**n) for n in data.get("norms_replaced", [])]
        out["trunk"] = [TrunkRecord(**t) for t in data.get("trunk", [])]
        out["stream"] = [SignalRecord(**s) for s in data.get("stream", [])]
        return out

    def format(self, max_branches: int = 12) -> str:
        lines = [super().format(max_branches), f"adaptation (captured by {self.captured_with}):"]  # type: ignore[misc]
        kinds: dict[str, int] = {}
        for r in self.residuals:
            kinds[r.shortcut] = kinds.get(r.shortcut, 0) + 1
        lines.append(f"  residual sums found: {len(self.residuals)} ("
                     + ", ".join(f"{n} {k} shortcut{'s' if n > 1 else ''}" for k, n in kinds.items()) + ")")
        for r in self.residuals[:max_branches]:
            gates = f"; gate layers {', '.join(r.gates)}" if r.gates else ""
            lines.append(f"  {r.branch:<24} {r.add} = {r.shortcut} shortcut from {r.fork} + [{', '.join(r.layers)}]"
                         + gates)
        if len(self.residuals) > max_branches:
            lines.append(f"  ... {len(self.residuals) - max_branches} more")
        counts: dict[tuple[str, str], int] = {}
        for n in self.norms_replaced:
            counts[(n.type, n.action)] = counts.get((n.type, n.action), 0) + 1
        lines.append("  normalisation taken out: " + (", ".join(
            f"{c} {t} {'-> scalar Bias' if a == 'bias' else 'removed'}" for (t, a), c in counts.items()) or "none"))
        lines.append(f"  scalars added: {len(self.scalars_added)}")
        lines.append(f"  non-linearities on the example input: {self.nonlinearities_before} before, "
                     f"{self.nonlinearities_after} after")
        for label, items in (("layer scale used as the branch multiplier", self.layer_scales),
                             ("fused Q/K/V layer counted as three", self.fused_qkv), ("untied", self.untied)):
            if items:
                more = f" (+{len(items) - 4})" if len(items) > 4 else ""
                lines.append(f"  {label}: " + ", ".join(items[:4]) + more)
        if self.trunk:
            lines.append(f"  trunk ({self.trunk_rule}): {len(self.trunk)} layers outside the branches; output RMS on "
                         "the example input, before -> after")
            for t in self.trunk[:max_branches]:
                lines.append(f"    {t.name:<30} {t.type:<10} {t.rms_before:.3g} -> {t.rms_after:.3g}"
                             + (f"  ({t.note})" if t.note else ""))
            if len(self.trunk) > max_branches:
                lines.append(f"    ... {len(self.trunk) - max_branches} more")
        if self.stream:
            lines.append(f"  stream RMS at initialisation, per stage, x the input's ({self.stream_input_rms:.3g}): "
                         + " ".join(f"{s.name}={s.ratio:.2f}" for s in self.stream))
        if self.private:
            lines.append(f"  {self.private}")
        if self.weights_loaded or self.weights_dropped:
            lines.append(f"  original weights: {len(self.weights_loaded)} entries loaded, "
                         f"{len(self.weights_dropped)} dropped")
        return "\n".join(lines)


@dataclass
class AdaptReport(_Adaptation, FixupReport):
    """``fixup.adapt``'s report: the rule's accounting, the residual sums found and what the adaptation changed."""


@dataclass
class GateAdaptReport(_Adaptation, GateReport):
    """``fixup.adapt(..., method="skipinit" | "rezero")``'s report: each branch's gate, and the adaptation."""


def closing_lines(report: Any) -> list[str]:
    """The last lines of a method's own report (DyT's, the NF form's): the original weights loaded, the
    warnings, whether the copy is ready for private training."""
    lines = []
    if report.weights_loaded or report.weights_dropped:
        lines.append(f"state_dict: {len(report.weights_loaded)} entries loaded, {len(report.weights_dropped)} "
                     "dropped")
    lines += [f"warning: {w}" for w in report.warnings]
    if report.private:
        lines.append(report.private)
    return lines
