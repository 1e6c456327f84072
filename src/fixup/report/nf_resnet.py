"""The NF-ResNets' report (:mod:`fixup.init.nf_resnet`): every block's beta and alpha, the standardised layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..nn import RELU_GAMMA
from .base import InitReport, some_of
from .records import LayerRecord, NFBlockRecord, layer_records

__all__ = ["NFReport"]

SUMMARY = ("scaled weight standardisation, blocks h + alpha * F(h / beta) with beta the analytic std of h, "
           "gamma-scaled ReLUs, no normalisation")


@dataclass
class NFReport(InitReport):
    """What ``nf_resnet`` did: every block's beta and alpha, the standardised layers, gamma and the gains."""

    method: str = "nf_resnet"
    blocks: list[NFBlockRecord] = field(default_factory=list)
    classifier: list[LayerRecord] = field(default_factory=list)
    alpha: float = 0.2
    gamma: float = RELU_GAMMA
    output_std: float = 1.0  # the analytic std of the last block's output
    num_standardized: int = 0  # weight-standardised convolutions (each with a gain at 1 and a bias at 0)
    summary: str = SUMMARY

    @classmethod
    def _fields_from(cls, data: dict[str, Any]) -> dict[str, Any]:
        out = super()._fields_from(data)
        out["blocks"] = [NFBlockRecord(**{**b, "layers": layer_records(b["layers"]), "shortcut":
                                          None if b.get("shortcut") is None else LayerRecord(**b["shortcut"])})
                         for b in data.get("blocks", [])]
        out["classifier"] = layer_records(data.get("classifier"))
        return out

    def format(self, max_branches: int = 12) -> str:
        """The report as a table; at most ``max_branches`` blocks are listed one by one."""
        lines = [f"Accounting report: method {self.method}: {self.summary}"]
        gates = sum(b.gate is not None for b in self.blocks)
        lines.append(f"L = {self.num_branches} residual branches, each h + alpha * F(h / beta), alpha = {self.alpha:g}"
                     + (f", times a gain that starts at 0 ({gates} gains)" if gates else ""))
        betas = [b.beta for b in self.blocks] or [1.0]
        resets = sum(b.transition for b in self.blocks)
        lines.append(f"beta per block: from {min(betas):.4g} to {max(betas):.4g} (reset at {resets} transitions); "
                     f"the output's analytic std {self.output_std:.4g}")
        lines.append(f"weight-standardised convolutions: {self.num_standardized} (gain 1, bias 0; raw weights drawn "
                     f"N(0, 1/fan_in)); ReLUs scaled by gamma = {self.gamma:.6g}")
        lines.append("classifier: " + (", ".join(map(str, self.classifier)) or "none declared"))
        if self.other_layers:
            lines.append("other weight layers (He with fan_in): " + some_of(self.other_layers, 4))
        if self.untouched:
            lines.append("left alone: " + some_of(self.untouched, 6))
        lines.append(f"scalar parameters: {self.num_scalars}")
        lines.extend(self._format_norms())
        if self.blocks:
            lines.append("blocks:")
            for b in self.blocks[:max_branches]:
                local = ", ".join(r.name.removeprefix(b.name + ".") for r in b.layers)
                mark = " (transition)" if b.transition else ""
                gain = f"; gain {b.gate.removeprefix(b.name + '.')} = 0" if b.gate else ""
                short = f"; shortcut {b.shortcut.name.removeprefix(b.name + '.')}" if b.shortcut else ""
                lines.append(f"  {b.name:<22} {b.kind:<14} beta {b.beta:.4f}{mark}: [{local}]{gain}{short}")
            if len(self.blocks) > max_branches:
                lines.append(f"  ... {len(self.blocks) - max_branches} more (to_dict() or --json lists all)")
        lines.extend(self._format_tail())
        return "\n".join(lines)
