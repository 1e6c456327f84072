"""Number checks for command-line options, run before any work starts: each error names the option and the fix."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable

__all__ = ["check_numbers"]


def _values(value: object) -> Iterable[float]:
    return value if isinstance(value, (list, tuple)) else [value]  # type: ignore[return-value]


def check_numbers(args: argparse.Namespace, *, positive: Iterable[str] = (), nonneg: Iterable[str] = (),
                  finite: Iterable[str] = ()) -> None:
    """Refuse option values (attribute names of ``args``; lists are checked element by element) that are
    not finite, not >= 1 / > 0 (``positive``), or negative (``nonneg``). ``None`` (not given) passes."""
    for name in [*positive, *nonneg, *finite]:
        value = getattr(args, name, None)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        values = list(_values(value))
        if not values:
            raise ValueError(f"{flag} is empty; give at least one value")
        for v in values:
            if not math.isfinite(v):
                raise ValueError(f"{flag} must be a finite number, got {v}")
            if name in positive and v <= 0:
                raise ValueError(f"{flag} must be {'>= 1' if isinstance(v, int) else '> 0'}, got {v}")
            if name in nonneg and v < 0:
                raise ValueError(f"{flag} must be >= 0, got {v}")
