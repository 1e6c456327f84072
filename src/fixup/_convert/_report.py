"""What ``fixup.convert`` did: every normalisation layer and what became of it, the scalars, the function change.

:class:`ConvertReport` is data (``to_dict()``, JSON); ``str(report)`` is the table the CLI prints. Problems the
user should see are :class:`ConvertWarning` (a :class:`fixup.FixupWarning`), each kind its own subclass so that
it can be filtered by category.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .._adapt._graph import AdaptError
from ..report import FixupWarning

__all__ = ["ConvertError", "ConvertReport", "ConvertWarning", "NormFate", "SharedNormWarning",
           "StatisticsWarning", "TrainModeWarning"]


class ConvertError(AdaptError):
    """The model cannot be converted without changing its function in a way no option accounts for."""


class ConvertWarning(FixupWarning):
    """Something ``fixup.convert`` did that the user should know of; each kind below is a subclass."""


class TrainModeWarning(ConvertWarning):
    """The model was in train mode: ``convert`` preserves its eval-mode function (the running statistics)."""


class SharedNormWarning(ConvertWarning):
    """A normalisation module is called more than once or registered under several names: it stays one module."""


class StatisticsWarning(ConvertWarning):
    """A BatchNorm's running statistics are still at their initial values (mean 0, variance 1): never trained?"""


@dataclass
class NormFate:
    """One normalisation layer of the original model and what became of it.

    ``fate``: ``"folded"`` (into ``into``, the weight layer before it), ``"affine"`` (a per-channel
    :class:`ChannelAffine`: exact for BatchNorm, fitted on calibration data for LayerNorm/GroupNorm) or
    ``"dyt"`` (:class:`DynamicTanh`). ``change``: the RMS of (new - old) output over the RMS of the old output,
    on the data the layer saw (0 for BatchNorm, exact up to rounding; measured on calibration data otherwise).
    """

    name: str
    type: str
    fate: str
    why: str
    into: str = ""
    exact: bool = True
    change: float = 0.0
    calls: int = 1


@dataclass
class ConvertReport:
    """``fixup.convert``'s report. ``max_change``/``rms_change``: the converted model's outputs against the
    original's on held-out inputs, in eval mode, as the largest and the RMS absolute difference over the RMS of
    the original output; ``tolerance`` is what an exact conversion must stay within (``exact`` is then True)."""

    model: str
    method: str
    per_example_norms: str
    norms: list[NormFate] = field(default_factory=list)
    scalars_added: list[str] = field(default_factory=list)
    branches: list[str] = field(default_factory=list)      # residual branches declared (their blocks)
    classifier: list[str] = field(default_factory=list)
    max_change: float = 0.0
    rms_change: float = 0.0
    tolerance: float = 1e-5
    held_out: str = ""                                      # what the check ran on
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)      # what fixup.load_converted replays

    @property
    def exact(self) -> bool:
        """Every norm became an exact equivalent, and the outputs agree within the tolerance."""
        return all(n.exact for n in self.norms) and self.max_change <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "ConvertReport", **asdict(self), "exact": self.exact}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConvertReport:
        data = {k: v for k, v in data.items() if k not in ("kind", "exact")}
        data["norms"] = [NormFate(**n) for n in data.get("norms", [])]
        return cls(**data)

    def format(self, max_norms: int = 12) -> str:
        counts: dict[tuple[str, str], int] = {}
        for n in self.norms:
            counts[(n.type, n.fate)] = counts.get((n.type, n.fate), 0) + 1
        lines = [f"fixup.convert: {self.model}, method {self.method!r}",
                 f"normalisation layers: {len(self.norms)} ("
                 + (", ".join(f"{c} {t} -> {f}" for (t, f), c in counts.items()) or "none") + ")"]
        for n in self.norms[:max_norms]:
            where = f" into {n.into}" if n.into else ""
            change = "exact" if n.exact else f"change {n.change:.3g}"
            lines.append(f"  {n.name:<28} {n.type:<14} {n.fate}{where} ({change}); {n.why}")
        if len(self.norms) > max_norms:
            lines.append(f"  ... {len(self.norms) - max_norms} more")
        kind = "gates at 1" if self.method != "fixup" else "Scale at 1, Bias at 0"
        lines.append(f"residual branches: {len(self.branches)}; scalars added ({kind}): {len(self.scalars_added)}")
        lines.append(f"function change on {self.held_out}: max {self.max_change:.3g}, RMS {self.rms_change:.3g} "
                     f"x the output's RMS ({'exact' if self.exact else 'not exact'}: tolerance {self.tolerance:g})")
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
