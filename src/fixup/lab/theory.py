"""The arithmetic of Fixup, executable: the exponent, the first-step budgets and the lesson's fixtures.

Nothing here trains a network. The exponent is :func:`fixup.init.branch_scale` (reused, not
redefined); this module spells out what it buys (Zhang, Dauphin & Ma, ICLR 2019, section 3):

* a branch of m weight layers whose first m-1 layers are multiplied by ``s = L^(-1/(2m-2))`` has a
  path gain ``s^(m-1) = L^(-1/2)``;
* the first SGD step moves only the zeroed last layer, and the functional change it causes contains
  that path gain twice (once in the activation feeding the last layer, once in its gradient), so each
  branch spends ``eta * L^-1`` and, because branch updates are aligned (Appendix B), the L branches
  together spend ``eta``;
* had the updates been independent, L contributions of ``eta/L`` would add up to only ``eta/sqrt(L)``;
  a designer assuming independence would give each branch ``eta/sqrt(L)`` (path gain ``L^(-1/4)``),
  which under the real, aligned updates spends ``eta * sqrt(L)`` in total and grows with depth.

The scalar network in :mod:`fixup.lab.scalar` checks these proportionalities by exact computation.
The two fixtures of the lesson ("Initialization, normalization, and residual paths", SEEDS.md) are
reproduced digit for digit by :func:`lesson_lines`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..init import branch_scale

__all__ = [
    "LESSON_FAN_INS",
    "LESSON_ROWS",
    "Budget",
    "budget",
    "exponents",
    "independence_scale",
    "lesson_fixtures",
    "lesson_lines",
    "relu_std",
    "row_normalise",
]

# The lesson's first fixture: fan-ins 2, 8, 32, and 18 from its "check your understanding" question.
LESSON_FAN_INS: tuple[int, ...] = (2, 8, 32, 18)
# The lesson's second fixture: two rows normalised with population variance and eps 1e-5.
LESSON_ROWS: tuple[tuple[float, ...], ...] = ((1.0, 3.0), (10.0, 14.0))


def relu_std(fan_in: int) -> float:
    """He et al. (2015, section 2.2) standard deviation ``sqrt(2 / fan_in)`` for a ReLU layer."""
    if int(fan_in) != fan_in or fan_in < 1:
        raise ValueError(f"fan_in must be a positive whole number of summed inputs, got {fan_in!r}")
    return math.sqrt(2.0 / fan_in)


def row_normalise(row: list[float] | tuple[float, ...], eps: float = 1e-5) -> list[float]:
    """Normalise one row by its own mean and population variance, no gain or shift (layer-norm style)."""
    if len(row) == 0:
        raise ValueError("row_normalise needs a non-empty row")
    mean = sum(row) / len(row)
    variance = sum((v - mean) ** 2 for v in row) / len(row)
    return [(v - mean) / math.sqrt(variance + eps) for v in row]


def lesson_lines() -> list[str]:
    """The lesson's two fixtures, formatted exactly as its expected output shows.

    ``fan_in=2, relu_std=1.0000`` ... ``fan_in=18, relu_std=0.3333`` (the worked answer 1/3), then
    ``[-1.0, 1.0]`` twice: equal outputs from different rows, because normalisation discards the
    rows' location and scale.
    """
    lines = [f"fan_in={f}, relu_std={relu_std(f):.4f}" for f in LESSON_FAN_INS]
    lines += [str([round(v, 5) for v in row_normalise(row)]) for row in LESSON_ROWS]
    return lines


def lesson_fixtures() -> dict[str, Any]:
    """The lesson's two fixtures as numbers under names (what :func:`lesson_lines` formats)."""
    return {"relu_std": [{"fan_in": f, "relu_std": relu_std(f)} for f in LESSON_FAN_INS],
            "row_normalise": [{"row": list(row), "eps": 1e-5, "normalised": row_normalise(row)}
                              for row in LESSON_ROWS]}


def exponents(ms: tuple[int, ...] = (2, 3)) -> list[dict[str, Any]]:
    """Rule 2's exponent per branch length m: the factor is ``L ** exponent`` with ``exponent = -1/(2m-2)``,
    and the path gain ``factor ** (m-1)`` is ``L ** -1/2`` for every m."""
    return [{"m": m, "exponent": -1.0 / (2 * m - 2), "path_gain_exponent": -0.5} for m in ms]


def independence_scale(L: int, m: int) -> float:
    """The per-weight factor a designer assuming *independent* branch updates would pick.

    Independent updates of size d add up to ``d * sqrt(L)``, so the budget per branch would be
    ``eta / sqrt(L)``: a path gain of ``L^(-1/4)`` and a per-weight factor ``L^(-1/(4m-4))``. It is the
    "sqrt(L)-motivated" scheme of the scalar network.
    """
    if m < 2:
        raise ValueError(f"m must be at least 2 (a branch needs a layer before its zeroed last one), got {m!r}")
    return branch_scale(L, m) ** 0.5


@dataclass(frozen=True)
class Budget:
    """First-step budgets of a Fixup network with L branches of m layers, at learning rate eta.

    All "spend" figures are the functional change |Δf| of the first SGD step, in units where the
    loss gradient and the input are of order one (the constants the Θ-notation hides).
    """

    L: int
    m: int
    eta: float
    scale: float  # Fixup's per-weight factor L^(-1/(2m-2)) (rule 2)
    path_gain: float  # scale^(m-1) = L^(-1/2)
    per_branch: float  # eta * path_gain^2 = eta / L
    aligned_total: float  # L * per_branch = eta: what SGD's aligned updates spend
    independent_total: float  # sqrt(L) * per_branch = eta / sqrt(L): what independent updates would spend
    independence_scale: float  # L^(-1/(4m-4)): the factor an independence assumption would choose
    independence_aligned_total: float  # eta * sqrt(L): what that choice spends under aligned updates

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def budget(L: int, m: int = 2, eta: float = 0.1) -> Budget:
    """The first-step budgets of section 3 for ``L`` branches of ``m`` layers at learning rate ``eta``."""
    if not (eta > 0 and math.isfinite(eta)):
        raise ValueError(f"eta must be a positive finite learning rate, got {eta!r}")
    if m < 2:
        raise ValueError(f"m must be at least 2 (Fixup scales the layers before the zeroed last one), got {m!r}")
    s = branch_scale(L, m)
    gain = s ** (m - 1)
    per = eta * gain**2
    ind_s = independence_scale(L, m)
    return Budget(L=L, m=m, eta=eta, scale=s, path_gain=gain, per_branch=per, aligned_total=L * per,
                  independent_total=math.sqrt(L) * per, independence_scale=ind_s,
                  independence_aligned_total=L * eta * (ind_s ** (m - 1)) ** 2)
