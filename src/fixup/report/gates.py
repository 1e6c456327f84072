"""The gated methods' report (SkipInit, ReZero: :mod:`fixup.init.gates`): every branch with its gate."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .base import InitReport, some_of
from .records import GateRecord, LayerRecord, layer_records

__all__ = ["GateReport"]


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
