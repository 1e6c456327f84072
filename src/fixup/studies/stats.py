"""Mean ± standard deviation over seeds, with n, for every figure a study reports."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Stat", "group_records", "stat"]


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (ddof=1; 0 when n=1) of the finite values, and their count.

    ``n_total`` counts every seed, including those without a finite value (e.g. diverged runs).
    """

    mean: float | None
    std: float | None
    n: int
    n_total: int

    def format(self, digits: int = 1, scale: float = 1.0, unit: str = "", *, sig: bool = False) -> str:
        """``92.3 ± 1.2% (n=3)``; ``92.3% (n=1 of 3)`` (one value, no spread); ``— (n=0 of 3)`` when no seed has a
        value; ``sig``: significant digits."""
        if self.mean is None:
            return f"— (n=0 of {self.n_total})"
        of = f" of {self.n_total}" if self.n_total != self.n else ""
        spec = f".{digits}{'g' if sig else 'f'}"
        spread = f" ± {(self.std or 0.0) * scale:{spec}}" if self.n > 1 else ""  # one value has no spread
        return f"{self.mean * scale:{spec}}{spread}{unit} (n={self.n}{of})"

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "n": self.n, "n_total": self.n_total}


def stat(values: Iterable[float | None]) -> Stat:
    """The :class:`Stat` of ``values``; ``None`` and non-finite values count in ``n_total`` only."""
    values = list(values)
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return Stat(None, None, 0, len(values))
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1)) if len(finite) > 1 else 0.0
    return Stat(mean, std, len(finite), len(values))


def group_records(records: Sequence[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Group cell records by ``method`` and/or setting keys (e.g. ``"method", "depth"``), in sorted order."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rec in records:
        key = tuple(rec["method"] if k == "method" else rec["setting"].get(k) for k in keys)
        groups.setdefault(key, []).append(rec)
    return dict(sorted(groups.items(), key=lambda kv: tuple(_order(x) for x in kv[0])))


def _order(x: Any) -> tuple[int, Any]:
    return (0, x) if isinstance(x, (int, float)) and not isinstance(x, bool) else (1, str(x))
