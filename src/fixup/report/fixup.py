"""Fixup's report (:func:`fixup.fixup_init_`): the rule's accounting, branch by branch."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .base import InitReport, some_of
from .records import BranchRecord, LayerRecord, layer_records

__all__ = ["FixupReport"]


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
                            "also_zeroed": layer_records(b.get("also_zeroed")),
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
                             f"zeroed {', '.join(local(z) for z in [b.zeroed, *b.also_zeroed])}; "
                             f"{b.num_biases} biases{stream}, "
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
