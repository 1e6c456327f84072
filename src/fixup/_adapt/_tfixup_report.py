"""The report of ``fixup.adapt(..., method="t_fixup")``: each stack with its N and factors, every layer scaled, every
embedding drawn, every LayerNorm removed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..report.records import LayerRecord
from ._report import NormChange, closing_lines

__all__ = ["TFixupAdaptReport", "TFixupStack"]


@dataclass
class TFixupStack:
    """One stack of Transformer layers on one residual stream, as T-Fixup scales it (Huang et al. 2020, 3.3)."""

    name: str  # the module path its layers share ("" for the root)
    layers: int  # N: the layers of the stack (one feed-forward sub-block each)
    sublayers: int  # per layer: 2 (self-attention, feed-forward) or 3 (self-attention, cross-attention, feed-forward)
    rule: str  # "encoder" (0.67 N^(-1/4)) or "decoder" ((9N)^(-1/4)): which of the paper's formulas
    factor: float  # on each value and output projection and both feed-forward weights
    embedding_factor: float  # (9N)^(-1/4), on the stack's input embeddings
    scaled: list[LayerRecord] = field(default_factory=list)  # each scaled layer, with the std it was drawn with
    embeddings: list[LayerRecord] = field(default_factory=list)  # the stack's input embeddings, with their std


@dataclass
class TFixupAdaptReport:
    """What ``fixup.adapt(..., method="t_fixup")`` did to a Transformer written elsewhere."""

    method: str
    stacks: list[TFixupStack] = field(default_factory=list)
    norms_removed: list[NormChange] = field(default_factory=list)
    xavier: list[LayerRecord] = field(default_factory=list)  # every other weight layer: Xavier, unscaled
    tied: list[str] = field(default_factory=list)  # weight layers sharing an embedding's table (drawn as it)
    untouched: list[str] = field(default_factory=list)  # weight layers or parameters left as they were, with why
    warnings: list[str] = field(default_factory=list)
    weights_loaded: list[str] = field(default_factory=list)
    weights_dropped: list[str] = field(default_factory=list)
    private: str = ""

    @property
    def num_branches(self) -> int:
        return sum(s.layers * s.sublayers for s in self.stacks)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "num_branches": self.num_branches}

    def __str__(self) -> str:
        lines = [f"Adapt report: method {self.method} (Huang et al. 2020, section 3.3), {len(self.stacks)} stack(s), "
                 f"{self.num_branches} residual sub-blocks, {len(self.norms_removed)} LayerNorm(s) removed; every "
                 "weight layer Xavier, input embeddings N(0, d^-1/2)"]
        for s in self.stacks:
            parts = "self-attention, cross-attention, feed-forward" if s.sublayers == 3 else \
                "self-attention, feed-forward"
            lines.append(f"stack {s.name or '(root)'}: N = {s.layers} layers of {s.sublayers} sub-blocks ({parts}); "
                         f"the paper's {s.rule} factor {s.factor:.4g}, embeddings x {s.embedding_factor:.4g}")
            lines += [f"  scaled {r}" for r in s.scaled]
            lines += [f"  embedding {r}" for r in s.embeddings]
        lines += [f"  {n.name}: {n.type} removed ({n.why})" for n in self.norms_removed]
        if self.xavier:
            lines.append(f"Xavier, unscaled: {', '.join(r.name for r in self.xavier)}")
        lines += [f"tied: {t}" for t in self.tied]
        lines += [f"untouched: {u}" for u in self.untouched]
        return "\n".join([*lines, *closing_lines(self)])
