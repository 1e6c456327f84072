"""The branch protocol: how a model tells ``fixup_init_`` where its residual branches are.

A residual block computes ``y = shortcut(x) + F(x)``. The block itself declares ``F``: the weight
layers on F's path in execution order (the last one is zeroed by rule 1; where F ends in several parallel
paths, concatenated or summed, the last of each: ``Branch.ends``), the scalar biases and the
multiplier it carries (rule 3) and, where it has one, its shortcut projection (He-initialised, never
depth-scaled). A model declares its classifier. Nothing is found by matching parameter names.

A module takes part by defining ``residual_branches(self) -> Sequence[Branch]``; a model names its
classifier layers with ``classifier_layers(self) -> Sequence[nn.Module]``.

A branch layer is normally a module with a ``weight`` (``nn.Linear``, ``nn.Conv*``). Where several
weight layers are fused into one parameter, as the query, key and value projections in
``nn.MultiheadAttention.in_proj_weight``, each one is declared as a :class:`WeightSlice`: a block of
rows of that parameter, initialised with its own fan as if it were a separate layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from torch import Tensor, nn

from .nn import Bias, Gate, Scale

__all__ = [
    "WEIGHT_LAYERS",
    "Branch",
    "FixupClassifier",
    "ResidualBlock",
    "WeightSlice",
    "find_branches",
    "find_classifier",
]

# Module types whose ``weight`` is a weight layer in the sense of the paper (a linear map).
WEIGHT_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class WeightSlice:
    """Rows ``rows[0]:rows[1]`` of the parameter ``module.<param>``, declared as one weight layer.

    ``WeightSlice(mha, "in_proj_weight", (0, E), "in_proj_bias")`` is the query projection of an
    ``nn.MultiheadAttention`` with embedding size E (its keys are rows E:2E, its values 2E:3E).
    ``weight`` and ``bias`` are views into the module's parameters, so initialising them in place
    initialises the model; the module itself stays as it is (its fused kernels, its state_dict).

    Attributes:
        module: the module that owns the parameter.
        param: the parameter's attribute name on ``module``.
        rows: ``(start, stop)`` rows of the parameter along dim 0; ``None`` for the whole parameter.
        bias: the attribute name of the matching bias vector (sliced with ``bias_rows``), if any.
        bias_rows: rows of the bias; defaults to ``rows``.
    """

    module: nn.Module
    param: str
    rows: tuple[int, int] | None = None
    bias_param: str | None = None
    bias_rows: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        weight = getattr(self.module, self.param, None)
        if not isinstance(weight, Tensor):
            raise ValueError(f"{type(self.module).__name__} has no tensor parameter {self.param!r}; "
                             "a WeightSlice must name an existing weight parameter")
        if self.rows is not None and not (0 <= self.rows[0] < self.rows[1] <= weight.shape[0]):
            raise ValueError(f"rows {self.rows} are outside {self.param} (dim 0 has {weight.shape[0]} rows); "
                             "give (start, stop) with 0 <= start < stop <= rows")

    @property
    def weight(self) -> Tensor:
        """A view of the declared rows of the weight."""
        weight = getattr(self.module, self.param)
        return weight if self.rows is None else weight[self.rows[0]:self.rows[1]]

    @property
    def bias(self) -> Tensor | None:
        """A view of the matching rows of the bias vector, or ``None``."""
        if self.bias_param is None or getattr(self.module, self.bias_param, None) is None:
            return None
        bias = getattr(self.module, self.bias_param)
        rows = self.bias_rows or self.rows
        return bias if rows is None else bias[rows[0]:rows[1]]

    @property
    def key(self) -> tuple[int, str, tuple[int, int] | None]:
        """Identifies the declared weight: two slices with the same key are the same layer."""
        return (id(self.module), self.param, self.rows)

    def label(self) -> str:
        """``param[start:stop]``, appended to the owner's qualified name in reports."""
        return self.param if self.rows is None else f"{self.param}[{self.rows[0]}:{self.rows[1]}]"


@dataclass
class Branch:
    """One residual branch F of a block ``y = shortcut(x) + F(x)``.

    Attributes:
        layers: the weight layers on F's path, in execution order: modules with a ``weight``, or
            :class:`WeightSlice` for a part of a fused parameter. The last ``ends`` are zeroed; the
            others are He-initialised and multiplied by ``L ** (-1 / (2m - 2))``.
        kind: a short name of the branch type ("basic", "bottleneck", "attention", "ffn", ...).
        m: the number of weight layers that multiply along the path. Defaults to ``len(layers)``;
            set it where parallel layers multiply, e.g. attention: queries, keys and values times
            the output projection count as m = 4 although they are four layers side by side; and
            where parallel paths are concatenated or summed, which do not multiply: m is then the
            most layers on one path (GhostNet's ghost module, a primary convolution and a cheap one on
            its output, concatenated, counts 2, as the two in series).
        ends: how many layers, at the end of ``layers``, rule 1 zeroes: 1 where the branch ends in one
            weight layer; the last layer of each path where it ends in a concatenation or a sum of
            several weight paths (those layers last in ``layers``, in execution order).
        biases: the scalar biases (rule 3) placed inside the branch, before its layers and activations.
        scale: the branch's scalar multiplier (rule 3) or its :class:`~fixup.nn.Gate` (SkipInit, ReZero), if any.
        shortcut: the shortcut's projection layer, if the shortcut is not the identity.
        stream_bias: the scalar bias added after the branch's last layer (and multiplier), whatever it is
            called: it shifts the residual stream itself. In a stage every such bias receives the same
            gradient, so :func:`fixup.param_groups` gives them together one scalar's learning rate.
    """

    layers: Sequence[nn.Module | WeightSlice]
    kind: str = "branch"
    m: int | None = None
    biases: Sequence[Bias] = field(default_factory=list)
    scale: Scale | None = None
    shortcut: nn.Module | None = None
    stream_bias: Bias | None = None
    ends: int = 1

    def __post_init__(self) -> None:
        if int(self.ends) != self.ends or self.ends < 1 or (self.layers and self.ends > len(self.layers)):
            raise ValueError(f"ends={self.ends!r} must be a whole number from 1 to the branch's {len(self.layers)} "
                             "layers: how many of its last layers rule 1 zeroes (1 unless the branch ends in "
                             "several parallel weight layers)")

    @property
    def zeroed(self) -> list[nn.Module | WeightSlice]:
        """The layers rule 1 zeroes: the last layer of each path that ends the branch."""
        return list(self.layers[-self.ends:]) if self.layers else []

    @property
    def inner(self) -> list[nn.Module | WeightSlice]:
        """The layers before them, which rule 2 scales."""
        return list(self.layers[:-self.ends])

    @property
    def depth(self) -> int:
        """The m of the paper: weight layers multiplying along the branch."""
        return self.m if self.m is not None else len(self.layers)

    @property
    def gate(self) -> Gate | None:
        """The branch's gate (a multiplier that starts at 0), or ``None``."""
        return self.scale if isinstance(self.scale, Gate) else None

    @property
    def all_biases(self) -> list[Bias]:
        """The branch's scalar biases, the stream bias (if any) last."""
        return [*self.biases, *([self.stream_bias] if self.stream_bias is not None else [])]


@runtime_checkable
class ResidualBlock(Protocol):
    """A module that owns one or more residual branches."""

    def residual_branches(self) -> Sequence[Branch]: ...


@runtime_checkable
class FixupClassifier(Protocol):
    """A model that names its classifier (zeroed by rule 1)."""

    def classifier_layers(self) -> Sequence[nn.Module]: ...


def find_branches(model: nn.Module) -> list[tuple[str, Branch]]:
    """Every declared residual branch of ``model``, with its block's qualified name, in module order."""
    found: list[tuple[str, Branch]] = []
    for name, module in model.named_modules():
        if callable(getattr(module, "residual_branches", None)):  # the protocol, without isinstance's cost
            branches = list(module.residual_branches())
            for i, branch in enumerate(branches):
                label = name or type(module).__name__
                found.append((label if len(branches) == 1 else f"{label}[{i}]", branch))
    return found


def find_classifier(model: nn.Module) -> list[nn.Module]:
    """The classifier layers ``model`` declares, or an empty list."""
    if isinstance(model, FixupClassifier):
        return list(model.classifier_layers())
    return []
