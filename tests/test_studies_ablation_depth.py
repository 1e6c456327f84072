"""The ablation study's rows at depth (the deep tier, issue 39): Fixup and each ablation under Figure 3's protocol at
1,000 layers, rule 2 also at 10,000; the plan, its order and estimate, the verdict of each claim on constructed
cell results, and the report's rows and detectable-effect sentence."""

from __future__ import annotations

import pytest

from fixup.studies import Store, ablation, ablation_depth, depth, make_grid, reproduce
from fixup.studies.claims import DIRECTION, NOT_REPRODUCED, NOT_RUN, UNRESOLVED
from fixup.studies.estimate import estimate_seconds
from fixup.studies.grid import AblationGrid, AblationRow
from fixup.studies.registry import STUDIES, get_study
from fixup.studies.reproduce import plan_all
from fixup.studies.runner import in_order

ABLATIONS = ("fixup_no_depth_scale", "fixup_scale_x0.1", "fixup_scale_x10", "fixup_no_bias", "fixup_no_scale",
             "fixup_zero_branch")
SMALL = ("fixup_scale_x0.1", "fixup_no_bias", "fixup_no_scale")  # n=10, with Fixup


@pytest.fixture(scope="module")
def grid():
    return make_grid("deep")


def test_the_deep_tier_plans_every_ablation_at_1000_layers_and_rule_2_at_10000(grid, tmp_path):
    cells = [t.cell for t in ablation.STUDY.plan(grid, Store(tmp_path)).tasks]
    seeds: dict[tuple[str, int], int] = {}
    for c in cells:
        seeds[(c.method, c.setting["depth"])] = seeds.get((c.method, c.setting["depth"]), 0) + 1
    assert seeds == {**{(m, 1000): 10 for m in ("fixup", *SMALL)},
                     **{(m, 1000): 3 for m in ABLATIONS if m not in SMALL},
                     ("fixup", 10000): 3, ("fixup_no_depth_scale", 10000): 3}
    figure3 = {(t.cell.method, t.cell.setting["depth"], t.cell.seed): t.cell
               for t in depth.plan(grid, Store(tmp_path / "d")).tasks}
    for c in cells:
        assert c.setting == {"depth": c.setting["depth"], "protocol": "figure3"}
        train = c.config["train"]
        # Figure 3's protocol exactly: a Figure 3 Fixup cell's config, but for the ablation's init
        reference = figure3[("fixup", c.setting["depth"], min(c.seed, 2))]
        assert {**reference.config["train"], "seed": c.seed, "init": train["init"]} == train
        assert train["init"] == c.method and train["norm"] == "fixup"
        assert (train["model"], train["width"], train["lr"], train["batch_size"], train["epochs"], train["grad_clip"]) \
            == ("wide_resnet", 1, 0.1, 32, 1, 0.0)
        assert c.cost == reference.cost
    assert "ablation" in [s for s in STUDIES if s not in grid.skipped]  # fixup reproduce --deep runs them


def test_the_other_tiers_keep_their_budget_rows_only(tmp_path):
    for mode in ("tiny", "quick"):
        g = make_grid(mode)
        cells = [t.cell for t in ablation.STUDY.plan(g, Store(tmp_path / mode)).tasks]
        assert len(cells) == len(g.ablation.methods) * g.seeds
        assert all("protocol" not in c.setting for c in cells)


def test_a_method_twice_at_one_depth_is_refused(grid, tmp_path):
    twice = AblationGrid(methods=(), at_depth=(AblationRow(1000, ("fixup", "fixup_no_bias")),
                                               AblationRow(1000, ("fixup_no_bias",), seeds=5)))
    from dataclasses import replace

    with pytest.raises(ValueError, match="fixup_no_bias at 1000 layers in two rows"):
        ablation.STUDY.plan(replace(grid, ablation=twice), Store(tmp_path))


def test_figure_3_runs_first_and_the_new_cells_feed_the_estimate(grid, tmp_path):
    store = Store(tmp_path)
    chosen = [get_study(s) for s in STUDIES if s not in grid.skipped]
    tasks, _ = plan_all(grid, store, chosen)
    ordered = [t.cell for t in in_order(tasks, grid.order)]
    alone = [t.cell for t in in_order(depth.plan(grid, store).tasks, grid.order)]
    assert [c for c in ordered if c.study == "depth"] == alone  # Figure 3's order, as before
    at = {c.key: i for i, c in enumerate(ordered)}
    for d in (1000, 10000):  # at each depth every Figure 3 cell comes before the ablations
        assert max(at[c.key] for c in alone if c.setting["depth"] == d) < min(
            at[c.key] for c in ordered if c.study == "ablation" and c.setting["depth"] == d)
    abl = [c for c in ordered if c.study == "ablation" and c.setting["depth"] == 1000]
    assert abl[0].method == "fixup" and {c.seed for c in abl[:7]} == {0} and len({c.method for c in abl[:7]}) == 7
    ab_tasks = [t for t in tasks if t.cell.study == "ablation"]
    rest = [t for t in tasks if t.cell.study != "ablation"]
    assert len(ab_tasks) == 55
    # one worker: the estimate is the sum of the cells', so the ablation cells add exactly theirs
    assert estimate_seconds(tasks, 1e-4, 1, grid.order) == pytest.approx(
        estimate_seconds(rest, 1e-4, 1, grid.order) + estimate_seconds(ab_tasks, 1e-4, 1, grid.order))
    assert estimate_seconds(ab_tasks, 1e-4, 1) > 0


def _rec(method: str, d: int, seed: int, acc: float | None = 0.65, loss: float | None = 1.0,
         outcome: str = "completed") -> dict:
    return {"study": "ablation", "method": method, "setting": {"depth": d, "protocol": "figure3"}, "seed": seed,
            "config": {}, "result": {"outcome": outcome, "diverged": outcome == "diverged",
                                     "test_acc": acc if outcome == "completed" else None,
                                     "train_loss": loss if outcome == "completed" else None,
                                     "history": [{"train_loss": loss, "test_acc": acc}]}}


# Fixup's spread between seeds, as at 1,000 layers in Figure 3 (67.9 ± 9.4%)
FIXUP_ACC = (0.60, 0.66, 0.72, 0.63, 0.69) * 2
FIXUP_LOSS = (1.20, 1.10, 1.00, 1.15, 1.05) * 2


def _records(grid, **rows) -> list[dict]:
    """Every planned cell of the rows at depth: Fixup as FIXUP_*, each ablation as ``rows[method]`` (a function of
    (depth, seed) giving _rec's keywords), or as Fixup where not given."""
    recs = []
    for (method, d), n in ablation_depth.planned(grid).items():
        for s in range(n):
            same = {"acc": FIXUP_ACC[s], "loss": FIXUP_LOSS[s]}
            kw = rows[method](d, s) if method in rows else same
            recs.append(_rec(method, d, s, **{**same, **kw}))
    return recs


def _rows(grid, recs) -> dict:
    return {r.claim: r for r in ablation.claims(ablation.summarise(recs, grid), grid)}


def test_failures_and_clear_differences_reproduce_the_direction(grid):
    rows = _rows(grid, _records(
        grid, fixup_no_depth_scale=lambda d, s: {"outcome": "diverged"},
        fixup_scale_x10=lambda d, s: {"outcome": "collapsed" if s == 0 else "completed", "acc": 0.5},
        fixup_zero_branch=lambda d, s: {"acc": 0.1 + 0.01 * s},
        **{"fixup_scale_x0.1": lambda d, s: {"loss": 2.0 + 0.05 * s}}))
    for cid in ("ablation_rule2_necessary", "ablation_scale_x10", "ablation_zero_branch", "ablation_scale_x0.1"):
        assert rows[cid].verdict == DIRECTION, (cid, rows[cid].why)
    rule2 = rows["ablation_rule2_necessary"]
    assert "at 10,000 layers (Figure 3's protocol)" in rule2.why and "diverged 3 of 3" in rule2.ours
    assert "at 1,000 layers" in rule2.ours and "at 10,000 layers" in rule2.ours  # both depths shown
    assert "Wide-ResNet-10000 width 1 (wide_resnet), not the paper's ResNet-110" in rule2.scale
    assert "45 steps" in rule2.scale and "n=3 seeds" in rule2.scale
    x01 = rows["ablation_scale_x0.1"]
    assert "at 1,000 layers" in x01.why and "training loss" in x01.why and "n=10 seeds" in x01.scale
    assert "this setting detects" not in x01.why  # a resolved row needs no detectable size


def test_the_opposite_beyond_the_interval_is_not_reproduced(grid):
    rows = _rows(grid, _records(grid, **{"fixup_scale_x0.1": lambda d, s: {"loss": 0.3 + 0.02 * s},
                                         "fixup_no_scale": lambda d, s: {"acc": 0.95 + 0.005 * s}}))
    assert rows["ablation_scale_x0.1"].verdict == NOT_REPRODUCED
    assert rows["ablation_no_scale"].verdict == NOT_REPRODUCED and "opposite" in rows["ablation_no_scale"].why


def test_no_difference_is_unresolved_and_names_the_detectable_effect(grid):
    rows = _rows(grid, _records(grid))  # every ablation exactly as Fixup
    for cid in ("ablation_no_bias", "ablation_no_scale", "ablation_scale_x0.1", "ablation_rule2_necessary"):
        assert rows[cid].verdict == UNRESOLVED, cid
    no_bias = rows["ablation_no_bias"].why
    # Student's t (df 18) x sqrt(2 s^2 / 10), s the std of FIXUP_ACC (4.5 points): 4.2 points
    assert "this setting detects a difference in first-epoch test accuracy of ± 4.2 points" in no_bias
    assert "n=10 and 10" in no_bias and "the paper's effect: no size given, removing scalar biases 'degrades results'" \
        in no_bias
    assert "first-epoch training loss of ± 0.070" in rows["ablation_scale_x0.1"].why
    assert "n=3 and 3" in rows["ablation_rule2_necessary"].why


def test_a_failed_fixup_seed_refutes_and_an_unfinished_deepest_row_gives_no_verdict(grid):
    recs = [r for r in _records(grid, fixup_no_depth_scale=lambda d, s: {"outcome": "diverged"})
            if not (r["setting"]["depth"] == 10000 and r["seed"] == 2)]
    rows = _rows(grid, recs)
    rule2 = rows["ablation_rule2_necessary"]
    assert rule2.verdict == NOT_RUN and "2 of 3 planned seeds finished" in rule2.why  # 1,000 alone gives none
    recs = _records(grid, fixup=lambda d, s: {"outcome": "collapsed" if s == 1 else "completed"})
    assert _rows(grid, recs)["ablation_no_bias"].verdict == NOT_REPRODUCED


def test_the_budget_rows_keep_their_verdicts_and_name_the_detectable_effect():
    quick = make_grid("quick")

    def rec(method, seed, acc, loss=0.5):
        return {"study": "ablation", "method": method, "setting": {"depth": 32}, "seed": seed, "config": {},
                "result": {"outcome": "completed", "test_acc": acc, "train_loss": loss,
                           "history": [{"train_loss": loss, "test_acc": acc}] * 2}}

    recs = [rec(m, s, 0.88 + 0.02 * s) for m in ("fixup", *ABLATIONS) for s in (0, 1)]
    rows = _rows(quick, recs)
    assert rows["ablation_rule2_necessary"].verdict == UNRESOLVED
    assert "32 layers" in rows["ablation_rule2_necessary"].why and "fixup study ablation --deep" in rows[
        "ablation_rule2_necessary"].why
    assert "this setting detects a difference in final test accuracy of ± 6.1 points" in rows["ablation_no_bias"].why


def test_the_report_renders_the_rows_at_depth_and_the_detectable_sentence(grid, tmp_path):
    store = Store(tmp_path)
    recs = {(r["method"], r["setting"]["depth"], r["seed"]): r for r in _records(
        grid, fixup_no_depth_scale=lambda d, s: {"outcome": "diverged"})}
    for t in ablation.STUDY.plan(grid, store).tasks:
        c = t.cell
        store.start(c)
        store.finish(c, recs[(c.method, c.setting["depth"], c.seed)]["result"], 60.0)
    result = reproduce(grid, tmp_path, studies=["ablation"], plots=False, run=False)
    md = result.report.read_text()
    assert "Fixup and its ablations at depth, under Figure 3's protocol" in md
    assert "| Fixup | 1,000 | 66.0 ± 4.5% (n=10) | 1.100 ± 0.075 (n=10) |  |  |" in md
    assert "| no rule-2 factor | 10,000 | — (n=0 of 3; diverged 3 of 3) |" in md
    assert "| no scalar biases | 1,000 | 66.0 ± 4.5% (n=10) | 1.100 ± 0.075 (n=10) | 0.0 ± 4.2 (95%) | " \
           "0.000 ± 0.070 (95%) |" in md
    assert "this setting detects a difference in first-epoch test accuracy of ± 4.2 points" in md
    assert "| method | final test accuracy |" not in md  # the deep tier runs no budget rows: no empty table
    verdicts = {r.claim: r.verdict for r in result.outputs["ablation"].claims}
    assert verdicts["ablation_rule2_necessary"] == DIRECTION and verdicts["ablation_no_bias"] == UNRESOLVED
