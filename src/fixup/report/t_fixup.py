"""T-Fixup's report (:mod:`fixup.init.t_fixup`): each stack's depth and factor, the layers it scaled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import InitReport, some_of
from .records import LayerRecord, layer_records

__all__ = ["TFixupReport"]


@dataclass
class TFixupReport(InitReport):
    """What ``t_fixup`` did: each stack's depth and factor, the layers it scaled and the embeddings."""

    method: str = "t_fixup"
    encoder_layers: int = 0
    decoder_layers: int = 0
    encoder_factor: float = 1.0
    decoder_factor: float = 1.0
    scaled: list[LayerRecord] = field(default_factory=list)  # the value, output and MLP weights, after scaling
    embeddings: list[LayerRecord] = field(default_factory=list)  # N(0, d^-1/2) times the stack's embedding factor
    classifier: list[LayerRecord] = field(default_factory=list)

    @classmethod
    def _fields_from(cls, data: dict[str, Any]) -> dict[str, Any]:
        out = super()._fields_from(data)
        for key in ("scaled", "embeddings", "classifier"):
            out[key] = layer_records(data.get(key))
        return out

    def format(self, max_branches: int = 12) -> str:
        """The report as a table."""
        lines = [f"Accounting report: method {self.method}: Xavier, no LayerNorm, no warm-up (Huang et al. 2020)"]
        lines.append(f"encoder: N = {self.encoder_layers}, value/output/MLP weights times 0.67 N^(-1/4) = "
                     f"{self.encoder_factor:.6g}")
        lines.append(f"decoder: N = {self.decoder_layers}, value/output/MLP weights times (9N)^(-1/4) = "
                     f"{self.decoder_factor:.6g}")
        lines.append(f"L = {self.num_branches} residual branches; weight layers scaled: {len(self.scaled)}: "
                     + some_of([f"{r.name} std {r.std:.4g}" for r in self.scaled], 4))
        lines.append("input embeddings, N(0, d^-1/2) times (9N)^(-1/4) of their stack: " + some_of(self.embeddings, 2))
        lines.append("classifier: " + (", ".join(map(str, self.classifier)) or "none declared"))
        if self.other_layers:
            lines.append(f"other weight layers (Xavier, unscaled): {len(self.other_layers)}: "
                         + some_of(self.other_layers, 3))
        if self.untouched:
            lines.append("left alone: " + some_of(self.untouched, 6))
        lines.append(f"scalar parameters: {self.num_scalars}")
        lines.extend(self._format_norms())
        lines.extend(self._format_tail())
        return "\n".join(lines)
