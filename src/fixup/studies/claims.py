"""Claim rows of the report: our figure next to the paper's, the scale we ran at, and a verdict.

Verdicts (the issue's four): ``reproduced`` (the claim holds at the paper's scale), ``direction
reproduced at reduced scale`` (it holds, on smaller data, depth, epochs or seeds), ``not
reproduced``, and ``not run`` (with the reason). A difference counts only when it exceeds the
seeds' noise: ``|mean_a - mean_b| > sqrt(std_a^2 + std_b^2)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .stats import Stat

__all__ = ["DIRECTION", "NOT_REPRODUCED", "NOT_RUN", "REPRODUCED", "VERDICTS", "ClaimRow", "clearly_above",
           "clearly_below", "verdict"]

REPRODUCED = "reproduced"
DIRECTION = "direction reproduced at reduced scale"
NOT_REPRODUCED = "not reproduced"
NOT_RUN = "not run"
VERDICTS = (REPRODUCED, DIRECTION, NOT_REPRODUCED, NOT_RUN)


@dataclass(frozen=True)
class ClaimRow:
    """One line of the report's claims table."""

    claim: str  # a :data:`fixup.studies.paper.CLAIMS` id
    ours: str
    scale: str
    verdict: str
    why: str = ""  # the rule applied, or why the claim was not run

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(holds: bool, at_paper_scale: bool) -> str:
    if not holds:
        return NOT_REPRODUCED
    return REPRODUCED if at_paper_scale else DIRECTION


def _noise(a: Stat, b: Stat) -> float:
    return math.sqrt((a.std or 0.0) ** 2 + (b.std or 0.0) ** 2)


def clearly_above(a: Stat, b: Stat) -> bool:
    """``a`` exceeds ``b`` by more than their seeds' combined standard deviation."""
    if a.mean is None or b.mean is None:
        return False
    return a.mean - b.mean > _noise(a, b)


def clearly_below(a: Stat, b: Stat) -> bool:
    return clearly_above(b, a)
