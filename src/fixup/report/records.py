"""The records a report is made of: one per weight layer, residual branch, gate, NF block, normalisation layer or
LSUV step, each a dataclass that :meth:`fixup.report.InitReport.to_dict` writes and ``from_dict`` reads back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

__all__ = ["BranchRecord", "GateRecord", "LSUVRecord", "LayerRecord", "NFBlockRecord", "NormRecord", "describe_norm",
           "layer_records"]


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
    # The last layers of the branch's other paths, zeroed too, where it ends in a concatenation or a sum of paths.
    also_zeroed: list[LayerRecord] = field(default_factory=list)

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


@dataclass
class NFBlockRecord:
    """One NF block as initialised: its beta (the analytic std of its input) and its weight-standardised layers."""

    name: str
    kind: str
    beta: float
    transition: bool  # its shortcut projects the normalised input: the stream's variance resets to 1 + alpha^2
    layers: list[LayerRecord]
    gate: str | None = None  # the zero-started skip gain's parameter name (nf_resnet; None: nf_resnet_nozero)
    shortcut: LayerRecord | None = None


def layer_records(items: list[dict[str, Any]] | None) -> list[LayerRecord]:
    """Layer records back from their ``to_dict`` form (every report's ``from_dict`` reads its layers with it)."""
    return [LayerRecord(**d) for d in items or []]
