"""Claim rows of the report, and the written rules that give each its verdict.

The rules, applied in this order by :func:`judge` (each has a test with constructed cell results):

1. **Missing data -> "not run".** A figure the claim compares has no finished cell, or fewer finished
   cells than the grid planned (an interrupted or failing run): the row says which and how many.
2. **A failed cell of a method the claim says succeeds -> "not reproduced"** (diverged, collapsed or
   any outcome other than completed, named with k of n), unless the row states a limit of the setting
   (then rule 5). Failed cells are never dropped from a mean silently: :class:`Cells` prints them.
3. **The comparison holds -> "reproduced"** at the paper's scale, else **"direction reproduced at
   reduced scale"**. Only with every planned seed present (rule 1), and ``holds`` is the comparison the
   claim makes: e.g. "X fails *where a network of that depth can learn*" needs Fixup to learn at the same depth,
   rate and budget.
   A limit the row states is named beside the verdict: what the setting left untested (Figure 3 at a depth
   where BatchNorm itself does not learn tests Fixup's side of the claim, not the tracking).
4. **It does not hold, and the setting could have shown it -> "not reproduced".** The setting could
   have shown it when the paper's effect size is larger than the half-width of the 95% confidence
   interval this setting achieves for the comparison (from the measured spread between seeds, see
   :func:`fixup.studies.evidence.ci_halfwidth`). Where the paper gives no size (a qualitative claim),
   only a difference *the other way*, beyond that interval, refutes it.
5. **Otherwise -> "cannot be resolved at this scale"**, with the reason in a few words: the limit the
   study states (too few layers, too few epochs, ...) or the effect against the interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .evidence import Cells, ci_halfwidth

__all__ = ["DIRECTION", "NOT_REPRODUCED", "NOT_RUN", "PAPER_BATCH", "PAPER_LR", "REPRODUCED", "UNRESOLVED",
           "VERDICTS", "ClaimRow", "Judgement", "Protocol", "clearly_above", "clearly_below", "judge", "not_run"]

REPRODUCED = "reproduced"
DIRECTION = "direction reproduced at reduced scale"
NOT_REPRODUCED = "not reproduced"
UNRESOLVED = "cannot be resolved at this scale"
NOT_RUN = "not run"
VERDICTS = (REPRODUCED, DIRECTION, NOT_REPRODUCED, UNRESOLVED, NOT_RUN)

# The paper's CIFAR protocol (section 4.1-4.2): SGD at learning rate 0.1 with batch 128.
PAPER_LR = 0.1
PAPER_BATCH = 128


@dataclass(frozen=True)
class Protocol:
    """What a row actually ran, beside what the paper ran: every difference is named in the row."""

    model: str  # the model run, e.g. "ResNet-32 (resnet_cifar, depth 32)"
    paper_model: str  # the paper's model for this claim
    data: str
    steps: int  # optimiser steps per cell
    n: int  # seeds per figure
    lr: float | None = None  # None: not an SGD-at-0.1 protocol (translation, the scalar network)
    batch: int | None = None
    paper_lr: float = PAPER_LR
    paper_batch: int = PAPER_BATCH
    scalars: str = ""  # which of Fixup's scalars were trained, and at what rate

    @property
    def lr_ratio(self) -> float | None:
        """The per-example learning rate (lr / batch) relative to the paper's."""
        if self.lr is None or not self.batch:
            return None
        return (self.lr / self.batch) / (self.paper_lr / self.paper_batch)

    def describe(self) -> str:
        model = self.model if self.model == self.paper_model else f"{self.model}, not the paper's {self.paper_model}"
        parts = [model, self.data, f"{self.steps:,} steps"]
        if self.lr_ratio is not None:
            parts.append(f"per-example lr {self.lr_ratio:.3g}x the paper's (lr {self.lr:g} at batch {self.batch}; "
                         f"paper {self.paper_lr:g} at {self.paper_batch})")
        if self.scalars:
            parts.append(f"scalars {self.scalars}")
        parts.append(f"n={self.n} seeds")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lr_ratio": self.lr_ratio, "model_differs": self.model != self.paper_model}


@dataclass(frozen=True)
class Judgement:
    verdict: str
    why: str  # the rule applied and the numbers it used


@dataclass(frozen=True)
class ClaimRow:
    """One line of the report's claims table."""

    claim: str  # a :data:`fixup.studies.paper.CLAIMS` id
    ours: str
    scale: str
    verdict: str
    why: str = ""  # the rule applied, or why the claim was not run
    protocol: Mapping[str, Any] = field(default_factory=dict)  # Protocol.to_dict() of what ran

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    @classmethod
    def judged(cls, claim: str, ours: str, protocol: Protocol, judgement: Judgement, rule: str) -> ClaimRow:
        return cls(claim, ours, protocol.describe(), judgement.verdict, f"{judgement.why}; rule: {rule}",
                   protocol.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "protocol": dict(self.protocol)}


def not_run(claim: str, why: str, scale: str = "") -> ClaimRow:
    return ClaimRow(claim, "", scale, NOT_RUN, why)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def judge(groups: Mapping[str, Cells], *, holds: bool, paper_scale: bool, effect: float | None = None,
          ci: float | None = None, contrary: bool = False, must_succeed: Sequence[str] = (),
          limit: str = "", paper_effect: str = "", sizes: bool = True,
          match: tuple[float, float] | None = None, fmt: Callable[[float], str] | None = None) -> Judgement:
    """The verdict of a claim from the cells it compares (the module docstring's rules 1-5, in order).

    Args:
        groups: every figure the claim compares, by label.
        holds: the claim's comparison holds on these numbers.
        paper_scale: the row ran at the paper's scale (data, model, depth, schedule).
        effect: the paper's effect size in the comparison's units; None for a qualitative claim.
        ci: the half-width of the comparison's 95% confidence interval here.
        contrary: (qualitative claims) the opposite of the claim holds beyond that interval.
        must_succeed: labels of groups the claim says train (a failed cell among them refutes it).
        limit: why this setting cannot show the claim failing, in a few words ("" if it can); named beside a
            verdict that holds too, as what the setting left untested.
        paper_effect: the paper's effect in words, for a claim whose effect is no single size (a match); named
            with ``ci`` beside a limit.
        sizes: beside a limit, name the difference this setting can detect (``ci``) and the paper's effect; off for
            a caller that names them itself.
        match: (difference, margin) of an equivalence claim ("within ``margin``"), whose interval reaching across
            the margin is what leaves it unresolved: the reason then names both ends of the interval.
        fmt: how ``effect``, ``ci`` and ``match`` are written (their unit, e.g. points of error); default: 3
            significant digits.
    """
    fmt = fmt or _fmt
    missing = [f"{label} has no finished cell" for label, c in groups.items() if c.present == 0]
    if missing:
        return Judgement(NOT_RUN, "; ".join(missing))
    short = [f"{label}: {c.present} of {c.planned} planned seeds finished" for label, c in groups.items()
             if not c.complete]
    if short:
        return Judgement(NOT_RUN, "; ".join(short) + " (rerun to finish them)")
    failures = [f"{label} " + ", ".join(f"{name} {k} of {groups[label].planned}"
                                        for name, k in sorted(groups[label].failed.items()))
                for label in must_succeed if label in groups and groups[label].n_failed]
    if failures:
        what = "; ".join(failures)
        return (Judgement(UNRESOLVED, f"{what}, but {limit}") if limit
                else Judgement(NOT_REPRODUCED, f"{what} where the claim says it trains"))
    if holds:  # a limit still says what this setting could not test (it ran short, a reference did not learn)
        why = "the comparison holds with every seed"
        return Judgement(REPRODUCED if paper_scale else DIRECTION, f"{why}; but {limit}" if limit else why)
    if limit:
        return Judgement(UNRESOLVED, limit + (_sizes(ci, effect, paper_effect, fmt) if sizes else ""))
    ci = math.inf if ci is None else ci
    if match is not None and effect is None and not contrary and math.isfinite(ci):
        diff, margin = match
        return Judgement(UNRESOLVED, f"the difference's 95% interval ({fmt(diff - ci)} to {fmt(diff + ci)}) reaches "
                                     f"across the margin of {fmt(margin)}, so a match within it is neither shown nor "
                                     f"refuted{_sizes(ci, effect, paper_effect, fmt)}")
    if effect is None:
        if contrary:
            return Judgement(NOT_REPRODUCED, f"the opposite holds beyond the 95% interval (±{fmt(ci)})")
        return Judgement(UNRESOLVED, f"no difference beyond the 95% interval (±{fmt(ci)}); "
                                     + (f"the paper's effect: {paper_effect}" if paper_effect else
                                        "the paper gives no effect size to test against"))
    if abs(effect) > ci:
        return Judgement(NOT_REPRODUCED, f"the paper's effect ({fmt(abs(effect))}) exceeds this setting's 95% "
                                         f"interval (±{fmt(ci)}), yet it does not show")
    return Judgement(UNRESOLVED, f"the paper's effect ({fmt(abs(effect))}) is within this setting's 95% interval "
                                 f"(±{fmt(ci)})")


def _sizes(ci: float | None, effect: float | None, paper_effect: str, fmt: Callable[[float], str] = _fmt) -> str:
    """What a row left unresolved by its setting could still have detected, beside the paper's effect ("" where the
    row compares no two figures)."""
    if ci is None:
        return ""
    paper = (f"the paper's effect {fmt(abs(effect))}" if effect is not None else
             f"the paper's effect: {paper_effect}" if paper_effect else "the paper gives no effect size")
    return f"; this setting detects a difference beyond its 95% interval (±{fmt(ci)}); {paper}"


def clearly_above(a: Cells, b: Cells) -> bool:
    """``mean(a) - mean(b)`` exceeds the half-width of its 95% confidence interval."""
    sa, sb = a.stat, b.stat
    if sa.mean is None or sb.mean is None:
        return False
    return sa.mean - sb.mean > ci_halfwidth(a, b)


def clearly_below(a: Cells, b: Cells) -> bool:
    return clearly_above(b, a)
