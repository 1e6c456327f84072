"""The scalar residual network of Fixup's analysis, with its first SGD steps computed exactly.

Zhang, Dauphin & Ma (ICLR 2019, section 3 and Appendix B) reason about a simplified network: L
residual blocks in sequence, each adding a branch that is a product of m scalar weights acting on a
positively homogeneous path. With a scalar input x (a ReLU path at a fixed input is linear with 0/1
gates; the active paths are what remains)::

    x_{l+1} = x_l + p_l x_l,   p_l = w_{l,1} w_{l,2} ... w_{l,m}
    f(x)    = x * prod_l (1 + p_l),           loss = (f - y)^2 / 2,   g = f - y.

The derivation this module makes executable:

* ``df/dw_{l,j} = x prod_{k != l}(1 + p_k) * prod_{i != j} w_{l,i}``. With the last weight ``w_{l,m} = 0``
  (rule 1) every p_l is 0, f = x, and the gradient of every *inner* weight (j < m) contains the factor
  ``w_{l,m} = 0``: it vanishes. Only the last weights move in the first step:
  ``w_{l,m} <- -eta g x a_l`` with ``a_l = w_{l,1} ... w_{l,m-1}`` the branch's path gain.
* The branch then contributes ``p_l = -eta g x a_l^2``: its path gain enters twice, once through the
  activation feeding the last weight and once through that weight's gradient. The new output is
  ``f' = x prod_l (1 - eta g x a_l^2)``, so to first order ``Δf = -eta g x^2 sum_l a_l^2``. Every term
  has the same sign: SGD's branch updates are aligned (the first-order change is
  ``-eta g |df/dθ|^2``, a sum of non-negative terms), they add like L, not sqrt(L).
* Fixup's factor ``s = L^(-1/(2m-2))`` on each inner weight gives ``a_l^2 = s^(2m-2) = 1/L``: the sum
  is 1, ``Δf/eta -> g x^2`` at every depth (exactly ``x((1 - eta g x^2 / L)^L - 1)``, which tends to
  ``x(exp(-eta g x^2) - 1)``). Unscaled inner weights (s = 1) give ``a_l^2 = 1``: ``(1 - eta g x^2)^L``,
  exponential in L. The sqrt(L)-motivated factor (per-branch budget eta/sqrt(L), chosen as if updates
  were independent) gives ``a_l^2 = L^(-1/2)`` and ``Δf ~ x(exp(-eta g x^2 sqrt(L)) - 1)``: still
  growing. With every weight zero each gradient holds at least one zero factor (m >= 2): nothing
  moves, in the first step or any later one. Fixup's inner weights start to move at the second step,
  once the last weights are non-zero.
* ``updates="random_sign"`` is the independence assumption made executable, not something SGD does:
  each branch's update is multiplied by its own random sign, so the branch contributions cancel like
  a random walk and Fixup's total shrinks as ``L^(-1/2)``.

Default target y = 2 above the initial output f = x = 1 (g = -1) makes the step push the output up, so
an over-large step shows as growth (to overflow, reported as ``inf``); below it the step would
collapse the output towards 0 instead (``|Δf| -> |x|``).

All branches are computed as one tensor of shape (L, m) in float64, so L = 10^6 takes well under a
second; overflow is reported as ``inf`` (or ``nan`` once inf - inf appears), never clipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..init import branch_scale
from .theory import independence_scale

__all__ = [
    "SCALAR_SCHEMES",
    "UPDATES",
    "ScalarConfig",
    "forward_variance",
    "scalar_init",
    "scalar_step",
    "scalar_sweep",
]

# Branch-weight schemes: (per-weight factor of the inner weights as a function of L and m, last weight zero?)
SCALAR_SCHEMES: tuple[str, ...] = ("fixup", "unscaled", "sqrt", "zero", "fixup_x0.1", "fixup_x10", "standard")
UPDATES: tuple[str, ...] = ("aligned", "random_sign")
DRAWS: tuple[str, ...] = ("constant", "gaussian")


@dataclass(frozen=True)
class ScalarConfig:
    """One experiment on the scalar network."""

    m: int = 2  # weights per branch (section 3's m); Fixup needs m >= 2
    eta: float = 0.1  # SGD learning rate (the paper's depth study uses 0.1, section 4.1)
    x: float = 1.0  # the scalar input
    y: float = 2.0  # the regression target; g = x - y = -1 at a zero-branch initialisation
    draw: str = "constant"  # inner weights equal to the factor ("constant") or N(0, factor^2) ("gaussian")
    updates: str = "aligned"  # "aligned": exact SGD; "random_sign": each branch's step times a random sign
    seed: int = 0  # for gaussian draws and random signs

    def __post_init__(self) -> None:
        if int(self.m) != self.m or self.m < 2:
            raise ValueError(f"m must be a whole number >= 2 (with m=1 the branch is only its zeroed last "
                             f"weight and there is nothing to scale), got {self.m!r}")
        if not (self.eta > 0 and math.isfinite(self.eta)):
            raise ValueError(f"eta must be a positive finite learning rate, got {self.eta!r}")
        if self.draw not in DRAWS:
            raise ValueError(f"draw must be one of {DRAWS}, got {self.draw!r}")
        if self.updates not in UPDATES:
            raise ValueError(f"updates must be one of {UPDATES}, got {self.updates!r}")


def _factor(scheme: str, L: int, m: int) -> tuple[float, bool]:
    """(inner-weight factor, last weight zeroed) for ``scheme``."""
    if scheme == "fixup":
        return branch_scale(L, m), True
    if scheme == "fixup_x0.1":
        return 0.1 * branch_scale(L, m), True
    if scheme == "fixup_x10":
        return 10.0 * branch_scale(L, m), True
    if scheme == "unscaled":
        return 1.0, True
    if scheme == "sqrt":
        return independence_scale(L, m), True
    if scheme == "zero":
        return 0.0, True
    if scheme == "standard":  # ordinary residual init: every weight of scale 1, none zeroed
        return 1.0, False
    raise ValueError(f"unknown scheme {scheme!r}; choose among {', '.join(SCALAR_SCHEMES)}")


def scalar_init(scheme: str, L: int, cfg: ScalarConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """Branch weights of shape (L, m), float64, for ``scheme``. Column m-1 is each branch's last weight."""
    if int(L) != L or L < 1:
        raise ValueError(f"L must be a positive whole number of residual branches, got {L!r}")
    factor, zero_last = _factor(scheme, int(L), cfg.m)
    if cfg.draw == "gaussian":
        w = torch.randn(int(L), cfg.m, dtype=torch.float64, generator=generator) * factor
    else:
        w = torch.full((int(L), cfg.m), factor, dtype=torch.float64)
    if zero_last:
        w[:, -1] = 0.0
    return w


def _forward(w: torch.Tensor, x: float) -> torch.Tensor:
    return x * (1.0 + w.prod(dim=1)).prod()  # x * prod_l (1 + p_l)


def scalar_step(w: torch.Tensor, cfg: ScalarConfig, signs: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """One SGD step on ``w`` computed with autograd; returns (new weights, f before the step)."""
    w = w.detach().clone().requires_grad_(True)
    f = _forward(w, cfg.x)
    loss = 0.5 * (f - cfg.y) ** 2
    (grad,) = torch.autograd.grad(loss, w)
    if signs is not None:
        grad = grad * signs[:, None]
    return (w - cfg.eta * grad).detach(), float(f.detach())


def _run(scheme: str, L: int, cfg: ScalarConfig) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(cfg.seed)
    w0 = scalar_init(scheme, L, cfg, gen)
    signs = None
    if cfg.updates == "random_sign":
        signs = torch.randint(0, 2, (int(L),), generator=gen, dtype=torch.float64) * 2 - 1
    w1, f0 = scalar_step(w0, cfg, signs)
    w2, f1 = scalar_step(w1, cfg, signs)
    with torch.no_grad():
        f2 = float(_forward(w2, cfg.x))
        inner1 = float((w1[:, :-1] - w0[:, :-1]).abs().max())
        inner2 = float((w2[:, :-1] - w0[:, :-1]).abs().max())
        gain2 = float((w0[:, :-1].prod(dim=1) ** 2).sum())
    df1 = abs(f1 - f0)
    return {
        "scheme": scheme, "L": int(L), "m": cfg.m, "updates": cfg.updates, "eta": cfg.eta,
        "factor": _factor(scheme, int(L), cfg.m)[0], "sum_gain2": gain2, "f0": f0, "f1": f1,
        "df1": df1, "df1_over_eta": df1 / cfg.eta, "df2": abs(f2 - f1),
        "inner_moved_step1": inner1, "inner_moved_step2": inner2,
    }


def scalar_sweep(depths: Sequence[int], schemes: Sequence[str] = ("fixup", "unscaled", "sqrt", "zero"),
                 cfg: ScalarConfig | None = None) -> list[dict[str, Any]]:
    """Δf of the first SGD step (and of the second) for every scheme at every depth L.

    Returns one flat record per (scheme, L): ``df1`` = |f(θ1) - f(θ0)|, ``df1_over_eta``, ``df2``,
    ``sum_gain2`` = Σ_l a_l^2 (the first-order prediction of Δf / (eta |g| x^2)), and the largest change
    of any inner weight after steps 1 and 2 (``inner_moved_step1``/``_step2``).
    """
    cfg = cfg or ScalarConfig()
    for s in schemes:
        _factor(s, 1, cfg.m)
    return [_run(s, int(L), cfg) for s in schemes for L in depths]


def forward_variance(depths: Sequence[int], m: int = 2, draws: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """Second moment of the output at initialisation, E[f^2]/x^2, for standard and Fixup branches.

    Standard residual initialisation (every weight N(0, 1)) gives ``E[(1 + p_l)^2] = 1 + E[p_l^2] = 2``
    per block, so ``E[f^2]/x^2 = 2^L`` exactly (section 2: variance grows exponentially). Fixup (inner
    weights N(0, s^2), last weight zero) gives f = x exactly. Both are drawn from the same model
    ``draws`` times; the empirical mean of a product of L random factors is dominated by rare draws,
    so its median is reported beside it (for large L the mean falls short of 2^L).
    """
    out = []
    for L in depths:
        gen = torch.Generator().manual_seed(seed)
        rec: dict[str, Any] = {"L": int(L), "m": m, "draws": draws, "standard_exact": 2.0 ** int(L)}
        for scheme in ("standard", "fixup"):
            factor, zero_last = _factor(scheme, int(L), m)
            w = torch.randn(draws, int(L), m, dtype=torch.float64, generator=gen) * factor  # (draws, L, m)
            if zero_last:
                w[..., -1] = 0.0
            f = (1.0 + w.prod(dim=2)).prod(dim=1)  # x = 1: (draws,)
            rec[f"{scheme}_mean_f2"] = float((f**2).mean())
            rec[f"{scheme}_median_f2"] = float((f**2).median())
            rec[f"{scheme}_max_abs_f_minus_x"] = float((f - 1.0).abs().max())
        out.append(rec)
    return out
