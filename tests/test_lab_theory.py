"""The theory made executable: the lesson's fixtures, the budgets and the scalar network of section 3."""

import math

import pytest

from fixup.init import branch_scale
from fixup.lab.scalar import ScalarConfig, forward_variance, scalar_sweep
from fixup.lab.theory import budget, independence_scale, lesson_lines, relu_std


def test_lesson_fixtures_print_exactly():
    assert lesson_lines() == [
        "fan_in=2, relu_std=1.0000",
        "fan_in=8, relu_std=0.5000",
        "fan_in=32, relu_std=0.2500",
        "fan_in=18, relu_std=0.3333",
        "[-1.0, 1.0]",
        "[-1.0, 1.0]",
    ]
    assert relu_std(18) == pytest.approx(1 / 3, abs=1e-15)


@pytest.mark.parametrize("L", [1, 10, 1000, 10**6])
@pytest.mark.parametrize("m", [2, 3, 4])
def test_budget_aligned_total_is_eta_and_independent_choice_overspends(L, m):
    b = budget(L, m, eta=0.1)
    # Rule 2's factor, written out here rather than taken from the function that budget() calls.
    assert b.scale == pytest.approx(L ** (-1 / (2 * m - 2)), rel=1e-12)
    assert branch_scale(L, m) == pytest.approx(L ** (-1 / (2 * m - 2)), rel=1e-12)
    assert b.independence_scale == pytest.approx(L ** (-1 / (4 * m - 4)), rel=1e-12)
    assert b.path_gain == pytest.approx(L**-0.5)
    assert b.per_branch == pytest.approx(0.1 / L)
    assert b.aligned_total == pytest.approx(0.1)
    assert b.independent_total == pytest.approx(0.1 / math.sqrt(L))
    assert b.independence_aligned_total == pytest.approx(0.1 * math.sqrt(L))
    assert independence_scale(L, m) ** (2 * m - 2) == pytest.approx(L**-0.5)


def _by(records, scheme):
    return {r["L"]: r for r in records if r["scheme"] == scheme}


DEPTHS = [10, 100, 1000, 10**4, 10**5]


@pytest.mark.parametrize("m", [2, 3])
def test_scalar_fixup_step_is_depth_independent_and_unscaled_explodes(m):
    recs = scalar_sweep(DEPTHS, ["fixup", "unscaled", "sqrt"], ScalarConfig(m=m))
    fixup = [_by(recs, "fixup")[L]["df1_over_eta"] for L in DEPTHS]
    assert max(fixup) / min(fixup) < 1.2
    assert all(0.5 < v < 2.0 for v in fixup)  # of order one: exp(eta)-1 over eta ~ 1.05
    unscaled = _by(recs, "unscaled")
    assert unscaled[100]["df1"] > 1e3 * unscaled[10]["df1"]
    assert unscaled[10**5]["df1"] == math.inf or unscaled[10**5]["df1"] > 1e6 * unscaled[10]["df1"]
    sqrt = _by(recs, "sqrt")
    assert sqrt[10**4]["df1"] > 100 * sqrt[10]["df1"]  # the independence-motivated factor still grows


def test_scalar_first_step_moves_only_last_weights_and_all_zero_never_moves():
    recs = scalar_sweep([10, 1000], ["fixup", "zero"])
    for r in recs:
        assert r["inner_moved_step1"] == 0.0  # the zero last weight blocks every inner gradient
    for r in _by(recs, "zero").values():
        assert r["df1"] == 0.0 and r["df2"] == 0.0 and r["inner_moved_step2"] == 0.0
    for r in _by(recs, "fixup").values():
        assert r["inner_moved_step2"] > 0.0  # once the last weight moved, the inner ones learn


def test_scalar_first_order_prediction_matches_exact_step():
    cfg = ScalarConfig(m=2, eta=1e-6, draw="gaussian", seed=3)
    for r in scalar_sweep([10, 1000], ["fixup", "unscaled"], cfg):
        # Δf ≈ eta |g| x^2 Σ a_l^2 with g = x - y = -1, x = 1
        assert r["df1"] == pytest.approx(cfg.eta * r["sum_gain2"], rel=1e-3)


def test_random_sign_updates_cancel_like_sqrt_L():
    recs = scalar_sweep([100, 10**4, 10**6], ["fixup", "sqrt"], ScalarConfig(updates="random_sign"))
    fixup = _by(recs, "fixup")
    # independent contributions of eta/L add to ~eta/sqrt(L): two decades of L, one decade of Δf each
    assert fixup[10**6]["df1"] < 0.05 * fixup[100]["df1"]
    sqrt = _by(recs, "sqrt")
    assert 0.1 < sqrt[10**6]["df1"] / sqrt[100]["df1"] < 10


def test_scalar_sweep_of_a_million_branches_is_fast_and_reports_overflow():
    import time

    start = time.perf_counter()
    recs = scalar_sweep([10**6], ["fixup", "unscaled"])
    assert time.perf_counter() - start < 10
    fixup, unscaled = _by(recs, "fixup")[10**6], _by(recs, "unscaled")[10**6]
    assert fixup["df1_over_eta"] == pytest.approx(math.expm1(0.1) / 0.1, rel=1e-4)
    assert unscaled["df1"] == math.inf


def test_forward_variance_standard_grows_fixup_is_the_input():
    # Standard init: f = prod_l (1 + w1 w2) with w ~ N(0, 1). Written out independently of the module:
    # E[(1+p)^2] = 1 + E[w^2]^2 = 2 and E[(1+p)^4] = 1 + 6 E[p^2] + E[p^4] = 1 + 6 + 3*3 = 16 (odd moments
    # vanish), so E[f^2] = 2^L and Var[f^2] = 16^L - 4^L. The mean of n draws then has standard error
    # sqrt((16^L - 4^L) / n); we accept it within 4 standard errors (the tail is heavy, so small L only).
    draws = 100_000
    recs = forward_variance([1, 2, 3, 4], draws=draws)
    for r in recs:
        L = r["L"]
        se = math.sqrt((16.0**L - 4.0**L) / draws)
        assert abs(r["standard_mean_f2"] - 2.0**L) < 4 * se, (L, r["standard_mean_f2"], 2.0**L, se)
        assert abs(r["standard_exact"] - r["standard_mean_f2"]) < 4 * se  # the record's closed form, measured
        # Fixup: the last weight is zero, so every branch is 0 and f is the input, in every draw.
        assert r["fixup_max_abs_f_minus_x"] == 0.0 and r["fixup_mean_f2"] == 1.0
    # At depth the mean is dominated by rare draws, but growth is unmistakable.
    deep = forward_variance([1, 10], draws=4000)
    assert deep[1]["standard_mean_f2"] > 100 * deep[0]["standard_mean_f2"]


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="m must be"):
        ScalarConfig(m=1)
    with pytest.raises(ValueError, match="unknown scheme 'fixpu'"):
        scalar_sweep([10], ["fixpu"])
