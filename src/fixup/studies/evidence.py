"""The cells behind one figure of the report, and how far apart two figures must be to count.

A :class:`Cells` group holds what the seeds of one (method, setting) gave: the finite values of the
cells that *completed*, the cells that ended any other way by outcome name (``diverged``,
``collapsed``, ...), and how many seeds were planned. Its text always says n, and how many of the
planned cells failed or are missing: a failed cell is never dropped silently from a mean.

A difference between two groups is judged against the half-width of its 95% confidence interval
(Student's t on the two means, ``t(0.975, n_a + n_b - 2) * sqrt(s_a^2/n_a + s_b^2/n_b)``): with two
seeds a side, t is 4.30, which is what two seeds can resolve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .stats import Stat, stat

__all__ = ["COMPLETED", "Cells", "cells_from_results", "ci_halfwidth", "outcome_of"]

COMPLETED = "completed"
CONFIDENCE = 0.95


def outcome_of(result: Mapping[str, Any]) -> str:
    """A cell result's outcome name; results written before ``outcome`` existed say ``diverged`` only."""
    outcome = result.get("outcome")
    if isinstance(outcome, str) and outcome:
        return outcome
    return "diverged" if result.get("diverged") else COMPLETED


@dataclass(frozen=True)
class Cells:
    """What the planned seeds of one figure gave: completed values, failures by outcome, and the plan."""

    planned: int  # seeds the grid planned for this figure
    values: tuple[float, ...] = ()  # finite values of the cells that completed
    failed: Mapping[str, int] = field(default_factory=dict)  # outcome name -> cells that ended that way
    no_value: int = 0  # completed cells without a finite value (counted in n's total, like a failure)

    @property
    def n_failed(self) -> int:
        return sum(self.failed.values())

    @property
    def present(self) -> int:
        """Cells that finished (completed or failed); the rest of ``planned`` never finished."""
        return len(self.values) + self.n_failed + self.no_value

    @property
    def complete(self) -> bool:
        return self.present >= self.planned

    @property
    def stat(self) -> Stat:
        return stat([*self.values, *([None] * (self.n_failed + self.no_value))])

    def format(self, digits: int = 1, scale: float = 1.0, unit: str = "", *, counts: bool = True) -> str:
        """``85.0 ± 2.0% (n=2)``, ``71.0% (n=1 of 2; diverged 1 of 2)``, ``— (n=0 of 2; diverged 2 of 2)``;
        ``counts=False`` leaves the parenthesis (:meth:`counts_text`) out, for a table that states it once."""
        s = self.stat
        if s.mean is None:
            text = "—"
        else:
            spread = f" ± {(s.std or 0.0) * scale:.{digits}f}" if len(self.values) > 1 else ""  # one value: no spread
            text = f"{s.mean * scale:.{digits}f}{spread}{unit}"
        return f"{text} ({self.counts_text()})" if counts else text

    def counts_text(self) -> str:
        """``n=2``, ``n=1 of 2; diverged 1 of 2``, ``n=0 of 2; not finished 2 of 2``."""
        of = f" of {self.planned}" if len(self.values) != self.planned else ""
        notes = [f"{name} {k} of {self.planned}" for name, k in sorted(self.failed.items()) if k]
        if self.no_value:
            notes.append(f"no value {self.no_value} of {self.planned}")
        if self.present < self.planned:
            notes.append(f"not finished {self.planned - self.present} of {self.planned}")
        return f"n={len(self.values)}{of}" + ("; " + ", ".join(notes) if notes else "")

    def to_dict(self) -> dict[str, Any]:
        return {"planned": self.planned, "values": list(self.values), "failed": dict(self.failed),
                "no_value": self.no_value, **{k: v for k, v in self.stat.to_dict().items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cells:
        return cls(int(data["planned"]), tuple(float(v) for v in data["values"]), dict(data.get("failed", {})),
                   int(data.get("no_value", 0)))


def cells_from_results(results: Iterable[Mapping[str, Any]], planned: int,
                       value: Callable[[Mapping[str, Any]], float | None]) -> Cells:
    """Group cell results: ``value(result)`` of every completed cell, the others counted by outcome."""
    values: list[float] = []
    failed: dict[str, int] = {}
    no_value = 0
    for r in results:
        outcome = outcome_of(r)
        if outcome != COMPLETED:
            failed[outcome] = failed.get(outcome, 0) + 1
            continue
        v = value(r)
        if v is None or not math.isfinite(v):
            no_value += 1
        else:
            values.append(float(v))
    return Cells(planned, tuple(values), failed, no_value)


def _t_quantile(df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.5 + CONFIDENCE / 2, df))


def difference_text(gap: float, ci: float, fmt: Callable[[float], str] = "{:.2f}".format) -> str:
    """``1.23 ± 4.56 (95%)``, the numbers written by ``fmt``; without an interval (:func:`ci_halfwidth` is inf
    when a side has fewer than two values) the text says so rather than printing ``± inf``."""
    interval = interval_text(ci, fmt)
    return f"{fmt(gap)} {interval} (95%)" if math.isfinite(ci) else f"{fmt(gap)} ({interval})"


def interval_text(ci: float, fmt: Callable[[float], str] = "{:.2f}".format) -> str:
    """``± 4.56``; ``no 95% interval: fewer than two seeds on a side`` where ``ci`` is inf."""
    return f"± {fmt(ci)}" if math.isfinite(ci) else "no 95% interval: fewer than two seeds on a side"


def ci_halfwidth(a: Cells | Stat, b: Cells | Stat | None = None) -> float:
    """Half-width of the 95% confidence interval of ``mean(a) - mean(b)`` (of ``mean(a)`` alone without ``b``).

    ``inf`` when a side has fewer than two values: one seed resolves nothing.
    """
    sa = a.stat if isinstance(a, Cells) else a
    sb = b.stat if isinstance(b, Cells) else b
    sides = [sa] if sb is None else [sa, sb]
    if any(s.n < 2 or s.std is None for s in sides):
        return math.inf
    df = sum(s.n for s in sides) - len(sides)
    return _t_quantile(df) * math.sqrt(sum((s.std or 0.0) ** 2 / s.n for s in sides))
