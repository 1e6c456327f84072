"""The report of ``fixup.adapt(..., method="nf_resnet")``: what it did to each layer, block and activation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..signal import SignalRecord
from ._report import NormChange, closing_lines

__all__ = ["NFActivation", "NFAdaptReport", "NFResidual"]


@dataclass
class NFResidual:
    """One residual sum in NF form: ``add = shortcut + alpha * g * F(h / beta)``."""

    branch: str  # the block that declares the branch
    add: str  # the recorded residual sum
    shortcut: str  # "identity", "parameter-free" or "projection"
    transition: bool  # its shortcut has a layer, which reads h / beta: the stream's variance resets to 1 + alpha^2
    beta: float  # the analytic std of the block's input h
    inputs: list[str]  # where h / beta enters: each module whose input is divided by beta
    layers: list[str]  # the branch's weight layers (standardised convolutions), in execution order
    gain: str | None  # the skip gain's parameter (starts at 0), or None (nf_resnet_nozero)


@dataclass
class NFActivation:
    """One activation scaled by its gamma, and where the factor sits."""

    node: str  # the recorded call
    type: str  # its module type or function
    gamma: float
    where: str  # "its output" or "the input of <modules>" (a module called more than once, or a function)


@dataclass
class NFAdaptReport:
    """What ``fixup.adapt(..., method="nf_resnet")`` did (Brock, De & Smith 2021 on the recorded residual sums)."""

    method: str
    alpha: float
    residuals: list[NFResidual] = field(default_factory=list)
    standardised: list[str] = field(default_factory=list)  # each convolution now a ScaledStdConv2d, as "path: how"
    activations: list[NFActivation] = field(default_factory=list)
    activations_kept: list[str] = field(default_factory=list)  # left as they are, each with why
    gates: list[str] = field(default_factory=list)  # each squeeze-excite output scaled by 2, and where
    norms_replaced: list[NormChange] = field(default_factory=list)
    classifier: list[str] = field(default_factory=list)  # drawn N(0, 0.01), bias 0
    other_layers: list[str] = field(default_factory=list)  # other weight layers (squeeze-excite's), He fan-in
    layer_scales: list[str] = field(default_factory=list)  # the model's own branch multipliers, set to 1
    output_std: float = 1.0  # the analytic std of the stream after the last residual sum (skip gains at 1)
    stream_input_rms: float = 1.0
    stream: list[SignalRecord] = field(default_factory=list)  # RMS per stage at initialisation, to the input's
    warnings: list[str] = field(default_factory=list)
    weights_loaded: list[str] = field(default_factory=list)
    weights_dropped: list[str] = field(default_factory=list)
    private: str = ""

    @property
    def num_branches(self) -> int:
        return len(self.residuals)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "num_branches": self.num_branches}

    def __str__(self) -> str:
        gate = "g, a skip gain from 0" if any(r.gain for r in self.residuals) else "no skip gain"
        lines = [f"Adapt report: method {self.method}, {self.num_branches} residual branches as h + {self.alpha:g} * "
                 f"g * F(h / beta) ({gate}; Brock et al. 2021), {len(self.standardised)} convolutions standardised, "
                 f"{len(self.activations)} activations scaled by gamma, {len(self.norms_replaced)} norms removed"]
        for r in self.residuals:
            lines.append(f"  {r.branch} ({r.add}, {r.shortcut}{', transition' if r.transition else ''}): "
                         f"beta {r.beta:.4g}; h / beta into {', '.join(r.inputs)}; layers {', '.join(r.layers)}")
        lines += [f"  standardised {s}" for s in self.standardised]
        lines += [f"  {a.node} ({a.type}): gamma {a.gamma:.4f} on {a.where}" for a in self.activations]
        lines += [f"  kept {a}" for a in self.activations_kept]
        lines += [f"  squeeze-excite {g}" for g in self.gates]
        lines += [f"  {n.name}: {n.type} removed ({n.why})" for n in self.norms_replaced]
        lines.append(f"classifier {', '.join(self.classifier) or '(none)'}: N(0, 0.01), bias 0; analytic std after "
                     f"the last block {self.output_std:.4g} (skip gains at 1)")
        if self.other_layers:
            lines.append(f"other weight layers (He, fan-in): {', '.join(self.other_layers)}")
        if self.layer_scales:
            lines.append(f"layer scales set to 1: {', '.join(self.layer_scales)}")
        if self.stream:
            lines.append("stream RMS at init, to the input's: " + ", ".join(f"{s.name} {s.ratio:.3g}x"
                                                                         for s in self.stream))
        return "\n".join([*lines, *closing_lines(self)])
