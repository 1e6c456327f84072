"""What every initialisation report shares (:class:`InitReport`), and its warnings (:class:`FixupWarning`)."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .records import LayerRecord, LSUVRecord, NormRecord, layer_records

__all__ = ["FixupWarning", "InitReport", "some_of", "warn_report"]


class FixupWarning(UserWarning):
    """What an initialisation report marks as a warning, raised through :func:`warnings.warn`.

    Filter it by category (``warnings.simplefilter("ignore", fixup.FixupWarning)``), never by text.
    """


def warn_report(report: InitReport, stacklevel: int = 3) -> None:
    """Issue each of ``report.warnings`` as a :class:`FixupWarning`."""
    for message in report.warnings:
        warnings.warn(message, FixupWarning, stacklevel=stacklevel)


@dataclass
class InitReport:
    """What an initialisation did to a model: the part every method shares.

    ``str(report)`` is a table, ``to_dict()`` JSON. Fixup's report (:class:`FixupReport`) adds the
    branch accounting; a data-dependent method (LSUV) fills ``data_init`` once it has seen a batch.
    """

    method: str
    num_branches: int = 0
    # How the weights were drawn (e.g. "Xavier uniform").
    scheme: str = ""
    other_layers: list[LayerRecord] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)
    num_scalars: int = 0
    normalization: list[NormRecord] = field(default_factory=list)
    # Problems the user should see (also issued as FixupWarning); `notes` are choices made by design.
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fan_mode: str = "fan_out"
    # The multiplier on each residual block's output x + F(x) (1/sqrt(2) for that baseline, else 1).
    output_scale: float = 1.0
    # Tensors zeroed outside rule 1 (normalisation gains, branch weights of the zero-branch ablation).
    zeroed: list[str] = field(default_factory=list)
    # The data-dependent section: whether it is still to run, and what it did layer by layer.
    data_init_pending: bool = False
    data_init: list[LSUVRecord] = field(default_factory=list)

    @property
    def is_fixup(self) -> bool:
        """Whether this report describes Fixup or one of its variants."""
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, **asdict(self)}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def _fields_from(cls, data: dict[str, Any]) -> dict[str, Any]:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"kind"})
        if unknown:
            raise ValueError(f"{cls.__name__}.from_dict: unknown field(s) {unknown}; is this a report of "
                             "another version?")
        out = {k: v for k, v in data.items() if k in names}
        out["other_layers"] = layer_records(data.get("other_layers"))
        out["normalization"] = [NormRecord(**n) for n in data.get("normalization", [])]
        out["data_init"] = [LSUVRecord(**r) for r in data.get("data_init", [])]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InitReport:
        """The report ``to_dict`` wrote, as the class it was (``kind``), or as ``cls``."""
        kind = data.get("kind")
        for sub in (cls, *_subclasses(InitReport)):
            if sub.__name__ == kind and issubclass(sub, cls):
                return sub(**sub._fields_from(data))
        return cls(**cls._fields_from(data))

    def format(self, max_branches: int = 12) -> str:
        """The report as a table."""
        lines = [f"Initialisation report: method {self.method}, {self.scheme or 'He init with ' + self.fan_mode}"]
        lines.append(f"L = {self.num_branches} residual branches, not rescaled (no Fixup rule applies)")
        if self.output_scale != 1.0:
            lines.append(f"every residual block's output x + F(x) is multiplied by {self.output_scale:.6g}")
        layers = self.other_layers
        lines.append(f"weight layers initialised: {len(layers)}" + some_of(layers, 4, ": "))
        if self.zeroed:
            lines.append("zeroed: " + some_of(self.zeroed, 6))
        if self.untouched:
            lines.append("left alone: " + some_of(self.untouched, 6))
        lines.append(f"scalar parameters: {self.num_scalars}")
        lines.extend(self._format_norms())
        lines.extend(self._format_tail())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def _format_norms(self) -> list[str]:
        if not self.normalization:
            return ["normalisation still present: none"]
        lines = [f"normalisation still present: {len(self.normalization)} layers"]
        for kind, count in Counter((n.type, n.axes, n.eps, n.affine, n.running_stats)
                                   for n in self.normalization).items():
            t, axes, eps, affine, running = kind
            lines.append(f"  {count} x {t}: over {axes}, eps {eps:g}, affine {affine}, "
                         f"running statistics {running}")
        return lines

    def _format_tail(self) -> list[str]:
        lines = []
        if self.data_init_pending:
            lines.append("data-dependent initialisation: PENDING (fixup.init.data_init_(model, batch); "
                         "the training engine runs it on its first batch)")
        if self.data_init:
            bad = [r for r in self.data_init if not r.converged]
            lines.append(f"data-dependent initialisation: {len(self.data_init)} layers rescaled, "
                         + (f"{len(bad)} NOT within tolerance" if bad else "all within tolerance"))
            lines.extend(f"  {r}" for r in (bad or self.data_init)[:4])
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append("warnings: " + ("none" if not self.warnings else ""))
        lines.extend(f"  - {w}" for w in self.warnings)
        return lines


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def some_of(items: list[Any], k: int, prefix: str = "") -> str:
    """The first ``k`` of ``items`` joined for a report line, with how many more there are ("" for none)."""
    if not items:
        return ""
    more = f", ... {len(items) - k} more" if len(items) > k else ""
    return prefix + ", ".join(map(str, items[:k])) + more
