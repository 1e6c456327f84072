"""The accounting report of an adapted model: ``FixupReport`` plus what the adaptation changed."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..report import FixupReport

__all__ = ["AdaptReport", "NormChange", "ResidualRecord"]


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
class AdaptReport(FixupReport):
    """``fixup.adapt``'s report: the rule's accounting, the residual sums found and the norms replaced."""

    traced_with: str = "torch.fx"
    residuals: list[ResidualRecord] = field(default_factory=list)
    norms_replaced: list[NormChange] = field(default_factory=list)
    scalars_added: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdaptReport:
        own = {f.name for f in fields(cls)} - {f.name for f in fields(FixupReport)}
        base = FixupReport.from_dict({k: v for k, v in data.items() if k not in own})
        return cls(**{f.name: getattr(base, f.name) for f in fields(FixupReport)},
                   traced_with=data.get("traced_with", "torch.fx"),
                   residuals=[ResidualRecord(**r) for r in data.get("residuals", [])],
                   norms_replaced=[NormChange(**n) for n in data.get("norms_replaced", [])],
                   scalars_added=list(data.get("scalars_added", [])))

    def format(self, max_branches: int = 12) -> str:
        lines = [super().format(max_branches), f"adaptation (traced with {self.traced_with}):"]
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
        return "\n".join(lines)
