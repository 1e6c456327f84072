"""The verdict rules of fixup.studies.claims, one test per rule, with constructed cell results; and the cases
issue 17 found (a hidden divergence, verdicts from incomplete cells, a verdict against its own row)."""

from __future__ import annotations

import json
import math

import pytest

from fixup.studies import ablation, depth, make_grid, regularisation
from fixup.studies.claims import (
    DIRECTION,
    NOT_REPRODUCED,
    NOT_RUN,
    REPRODUCED,
    UNRESOLVED,
    VERDICTS,
    Protocol,
    judge,
)
from fixup.studies.evidence import Cells, cells_from_results, ci_halfwidth
from fixup.studies.paper import CLAIMS
from fixup.studies.registry import STUDIES


def C(*values: float, planned: int | None = None, **failed: int) -> Cells:
    planned = planned if planned is not None else len(values) + sum(failed.values())
    return Cells(planned, tuple(values), failed)


# The verdicts exactly as report.md and results.json spell them: what readers and scripts match on.
LITERAL_VERDICTS = ("reproduced", "direction reproduced at reduced scale", "not reproduced",
                    "cannot be resolved at this scale", "not run")


def test_the_five_verdicts(tmp_path):
    assert VERDICTS == LITERAL_VERDICTS
    # Each rule gives its verdict as that literal string.
    groups = {"Fixup": C(0.9, 0.91), "BatchNorm": C(0.92, 0.9)}
    got = [judge(groups, holds=True, paper_scale=True).verdict,
           judge(groups, holds=True, paper_scale=False).verdict,
           judge(groups, holds=False, paper_scale=False, contrary=True, ci=0.05).verdict,
           judge(groups, holds=False, paper_scale=False, contrary=False, ci=0.05).verdict,
           judge({"Fixup": C(planned=2)}, holds=True, paper_scale=True).verdict]
    assert got == list(LITERAL_VERDICTS)
    # And the written report carries them: one constructed row per verdict, through write_report.
    from fixup.studies.base import StudyOutput
    from fixup.studies.claims import ClaimRow
    from fixup.studies.report import write_report

    claims = ["depth_fixup_trains_deep", "cifar10_resnet110", "ablation_scale_x0.1", "ablation_scale_x10",
              "ablation_no_bias"]
    rows = {c: ClaimRow(c, "ours", "scale", v, "why") for c, v in zip(claims, LITERAL_VERDICTS, strict=True)}
    outputs = {study: StudyOutput({}, [r for c, r in rows.items() if c.startswith(prefix)], "", [])
               for study, prefix in (("depth", "depth"), ("regularisation", "cifar10"), ("ablation", "ablation"))}
    grid = make_grid("quick")
    every_study = {s: outputs.get(s, StudyOutput({}, [], "", [])) for s in STUDIES if s not in grid.skipped}
    md_path, json_path = write_report(tmp_path, grid, every_study, {}, timing={}, skipped=grid.skipped)
    md = md_path.read_text()
    for verdict in LITERAL_VERDICTS:
        assert f"| **{verdict}** (why) |" in md
    counts = next(line for line in md.splitlines() if line.startswith("Verdicts: ")).split(". ")[0]
    n_claims = len(json.loads(json_path.read_text())["claims"])
    assert n_claims == len(CLAIMS) and md.count("| **not run**") == n_claims - 4  # every claim, in both
    assert sorted(counts.removeprefix("Verdicts: ").split(", ")) == sorted(
        [f"1 {v}" for v in LITERAL_VERDICTS[:4]] + [f"{n_claims - 4} not run"])
    # a run of chosen studies: report.md shows their claims only and says how many it leaves out;
    # results.json still lists every claim
    md_path, json_path = write_report(tmp_path, grid, outputs, {}, timing={}, skipped=grid.skipped)
    md = md_path.read_text()
    shown = sum(c.study in outputs for c in CLAIMS)
    assert md.count("| **") == shown and f"The paper's {len(CLAIMS) - shown} further claims" in md
    assert len(json.loads(json_path.read_text())["claims"]) == len(CLAIMS)
    by_claim = {r["claim"]: r["verdict"] for r in json.loads(json_path.read_text())["claims"]}
    assert [by_claim[c] for c in claims] == list(LITERAL_VERDICTS)
    assert by_claim["translation_wmt"] == "not run"
    with pytest.raises(ValueError, match="verdict must be one of"):
        ClaimRow("depth_fixup_trains_deep", "", "", "Reproduced")


def test_rule1_missing_data_is_not_run():
    j = judge({"Fixup": C(planned=3), "BatchNorm": C(0.9, 0.91, 0.9)}, holds=True, paper_scale=True)
    assert j.verdict == NOT_RUN and "Fixup has no finished cell" in j.why


def test_rule1_incomplete_seeds_never_give_a_verdict():
    # every number agrees with the claim, but one planned seed never finished (issue 17: "± 0.000 (n=1)")
    j = judge({"Fixup": C(0.9, planned=2), "x0.1": C(0.5, 0.52)}, holds=True, paper_scale=False)
    assert j.verdict == NOT_RUN and "1 of 2 planned seeds finished" in j.why


def test_rule2_a_failed_cell_of_a_method_that_should_train_refutes_and_is_named():
    fx = C(0.964, diverged=1)  # issue 17's hidden divergence: ResNet-110 Fixup, one seed went to NaN
    j = judge({"Fixup": fx, "BatchNorm": C(0.97, 0.96)}, holds=True, paper_scale=False, must_succeed=("Fixup",))
    assert j.verdict == NOT_REPRODUCED and "Fixup diverged 1 of 2" in j.why
    collapsed = judge({"Fixup": C(0.9, collapsed=1)}, holds=True, paper_scale=False, must_succeed=("Fixup",))
    assert "collapsed 1 of 2" in collapsed.why  # any outcome other than completed, by its name
    limited = judge({"Fixup": fx}, holds=False, paper_scale=False, must_succeed=("Fixup",), limit="4x the rate")
    assert limited.verdict == UNRESOLVED and "diverged 1 of 2" in limited.why


def test_rule3_holds_gives_reproduced_at_paper_scale_else_direction():
    groups = {"Fixup": C(0.9, 0.91), "BatchNorm": C(0.92, 0.9)}
    assert judge(groups, holds=True, paper_scale=True).verdict == REPRODUCED
    assert judge(groups, holds=True, paper_scale=False).verdict == DIRECTION


def test_rule4_not_reproduced_only_where_the_paper_effect_exceeds_the_interval():
    tight = {"Fixup": C(0.900, 0.901, 0.899), "He": C(0.900, 0.902, 0.898)}
    ci = ci_halfwidth(tight["Fixup"], tight["He"])
    assert ci < 0.0054
    j = judge(tight, holds=False, paper_scale=False, effect=0.0054, ci=ci)
    assert j.verdict == NOT_REPRODUCED and "exceeds" in j.why


def test_rule5_an_effect_inside_the_interval_cannot_be_resolved():
    # issue 17: 360 test images and two seeds cannot resolve a 0.5-point gap
    wide = {"Fixup": C(0.95, 0.97), "He": C(0.94, 0.97)}
    ci = ci_halfwidth(wide["Fixup"], wide["He"])
    j = judge(wide, holds=False, paper_scale=False, effect=0.0054, ci=ci)
    assert j.verdict == UNRESOLVED and "within this setting's 95% interval" in j.why


def test_rule5_a_stated_limit_of_the_setting_cannot_be_resolved():
    j = judge({"Fixup": C(0.9, 0.91), "no rule 2": C(0.92, 0.93)}, holds=False, paper_scale=False,
              effect=None, contrary=True, limit="at 32 layers rule 2's factor is mild")
    assert j.verdict == UNRESOLVED and j.why == "at 32 layers rule 2's factor is mild"


@pytest.mark.parametrize(("effect", "paper_effect", "named"), [
    (0.006, "", "the paper's effect 0.006"), (None, "a 0.3-point match", "the paper's effect: a 0.3-point match"),
    (None, "", "the paper gives no effect size")])
def test_rule5_a_limited_row_names_what_its_setting_detects_and_the_papers_effect(effect, paper_effect, named):
    groups = {"Fixup": C(0.9, 0.91), "BatchNorm": C(0.92, 0.93)}
    ci = ci_halfwidth(groups["Fixup"], groups["BatchNorm"])
    j = judge(groups, holds=False, paper_scale=False, effect=effect, ci=ci, limit="3 epochs",
              paper_effect=paper_effect)
    assert j.verdict == UNRESOLVED and j.why.startswith("3 epochs; ")
    assert f"detects a difference beyond its 95% interval (±{ci:.3g})" in j.why and j.why.endswith(named)
    assert judge(groups, holds=False, paper_scale=False, ci=ci, limit="3 epochs", sizes=False).why == "3 epochs"


def test_rule3_a_claim_that_holds_names_what_its_stated_limit_left_untested():
    groups = {"Fixup": C(0.72, 0.63, 0.53), "BatchNorm": C(0.10, 0.11, 0.22)}
    j = judge(groups, holds=True, paper_scale=False, limit="BatchNorm itself does not learn")
    assert j.verdict == DIRECTION
    assert j.why == "the comparison holds with every seed; but BatchNorm itself does not learn"
    assert judge(groups, holds=True, paper_scale=False).why == "the comparison holds with every seed"


def test_rule4_a_qualitative_claim_is_refuted_only_by_the_opposite_beyond_the_interval():
    groups = {"Fixup": C(0.8, 0.81), "no bias": C(0.9, 0.91)}
    assert judge(groups, holds=False, paper_scale=False, contrary=True, ci=0.05).verdict == NOT_REPRODUCED
    assert judge(groups, holds=False, paper_scale=False, contrary=False, ci=0.05).verdict == UNRESOLVED


def test_a_match_whose_interval_reaches_across_its_margin_names_both_ends_in_the_rows_unit():
    groups = {"Fixup": C(0.020, 0.022), "BatchNorm": C(0.012, 0.012)}
    j = judge(groups, holds=False, contrary=False, paper_scale=False, ci=0.004, match=(0.009, 0.01),
              paper_effect="Fixup - BatchNorm -0.2 points", fmt=lambda x: f"{100 * x:.2f} points")
    assert j.verdict == UNRESOLVED
    assert "(0.50 points to 1.30 points) reaches across the margin of 1.00 points" in j.why
    assert "detects a difference beyond its 95% interval (±0.40 points); the paper's effect: Fixup - BatchNorm" in j.why
    # beyond the margin, the other way, it is refuted as before
    assert judge(groups, holds=False, contrary=True, paper_scale=False, ci=0.004,
                 match=(0.02, 0.01)).verdict == NOT_REPRODUCED


def test_failed_cells_are_never_dropped_silently_from_a_mean():
    c = cells_from_results([{"outcome": "completed", "test_acc": 0.9}, {"outcome": "diverged", "test_acc": None},
                            {"outcome": "collapsed", "test_acc": 0.1}], 4, lambda r: r["test_acc"])
    assert c.stat.n == 1 and c.stat.n_total == 3 and c.present == 3 and not c.complete
    text = c.format(1, 100, "%")
    assert text == "90.0% (n=1 of 4; collapsed 1 of 4, diverged 1 of 4, not finished 1 of 4)"
    assert Cells(2, (), {"diverged": 2}).format() == "— (n=0 of 2; diverged 2 of 2)"
    assert Cells.from_dict(c.to_dict()) == c


def test_confidence_interval_uses_students_t():
    a, b = C(1.0, 3.0), C(2.0, 2.0)  # std sqrt(2) and 0, n=2 each: df 2, t=4.303
    assert ci_halfwidth(a, b) == pytest.approx(4.3027 * math.sqrt(2 / 2), rel=1e-3)
    assert math.isinf(ci_halfwidth(C(1.0), C(2.0, 3.0)))  # one seed resolves nothing


def test_protocol_names_every_difference_from_the_paper():
    p = Protocol(model="ResNet-32 (resnet_cifar)", paper_model="ResNet-110 (resnet_cifar)", data="digits",
                 steps=135, n=2, lr=0.1, batch=32, scalars="trained at 0.1x the rate")
    text = p.describe()
    assert "not the paper's ResNet-110" in text and "135 steps" in text and "n=2 seeds" in text
    assert "per-example lr 4x the paper's" in text and "scalars trained at 0.1x" in text
    assert p.to_dict()["lr_ratio"] == pytest.approx(4.0) and p.to_dict()["model_differs"]


# --- the study rows issue 17 found wrong ------------------------------------------------------------------

def _depth_record(method: str, d: int, seed: int, acc: float | None, outcome: str = "completed") -> dict:
    return {"study": "depth", "method": method, "setting": {"depth": d}, "seed": seed, "config": {},
            "result": {"outcome": outcome, "diverged": outcome == "diverged", "test_acc": acc}}


def test_baselines_fail_is_not_direction_when_fixup_and_batchnorm_fail_there_too():
    grid = make_grid("quick")
    recs = [_depth_record(m, d, s, acc) for d in grid.depth.depths for s in (0, 1) for m, acc in (
        ("fixup", 0.1 if d > 10 else 0.6), ("batchnorm", 0.2 if d > 10 else 0.7), ("lsuv", 0.1), ("sqrt2", 0.1),
        ("he", 0.7 if d == 10 else None))]
    recs = [r if r["result"]["test_acc"] is not None else {**r, "result": {"outcome": "diverged", "diverged": True,
                                                                           "test_acc": None}} for r in recs]
    rows = {r.claim: r for r in depth.claims(depth.summarise(recs, grid), grid)}
    row = rows["depth_baselines_fail"]
    assert row.verdict == UNRESOLVED and "Fixup does not learn beyond 100 layers either" in row.why
    assert rows["depth_fixup_trains_deep"].verdict == UNRESOLVED  # BatchNorm itself at 20%: nothing to track
    he = rows["no_norm_needs_small_rate"]
    assert he.verdict == UNRESOLVED and "diverged 2 of 2" in he.ours  # BatchNorm does not learn at 100+ either
    deepest = max(grid.depth.depths)
    assert f"Wide-ResNet width 1, depths 10-{deepest:,}, not the paper's" in row.scale and "45 steps" in row.scale


def _deep_depth_claims(accs: dict[str, float | None]) -> dict:
    """The deep grid's depth claims where every method scores as given beyond 100 layers (None: diverged)."""
    grid = make_grid("deep")
    recs = [_depth_record(m, d, s, acc if d > 100 else 0.7, "completed" if acc is not None or d <= 100 else "diverged")
            for d in grid.depth.depths for s in range(grid.seeds) for m, acc in accs.items()]
    return {r.claim: r for r in depth.claims(depth.summarise(recs, grid), grid)}


def test_baselines_fail_is_read_against_fixup_when_batchnorm_does_not_learn_deep():
    # the deep tier's case: LSUV and 1/sqrt(2) fail where Fixup learns at the same depth, rate and budget, and
    # BatchNorm itself does not learn in 45 steps; its row is named, and does not stand in the way of the verdict
    rows = _deep_depth_claims({"fixup": 0.65, "batchnorm": 0.2, "lsuv": None, "sqrt2": 0.1, "he": None})
    row = rows["depth_baselines_fail"]
    assert row.verdict == DIRECTION, row.why
    assert "BatchNorm itself does not learn at 1,000 and 10,000 layers" in row.why and "Fixup alone" in row.why
    # an LSUV that learns where Fixup does refutes the claim; where Fixup fails too, nothing is decided
    assert _deep_depth_claims({"fixup": 0.65, "batchnorm": 0.2, "lsuv": 0.6, "sqrt2": 0.1, "he": None}
                              )["depth_baselines_fail"].verdict == NOT_REPRODUCED
    assert _deep_depth_claims({"fixup": 0.1, "batchnorm": 0.6, "lsuv": None, "sqrt2": 0.1, "he": None}
                              )["depth_baselines_fail"].verdict == UNRESOLVED


def _cell(method: str, seed: int, acc: float | None, outcome: str = "completed", reg: str = "none",
          loss: float = 0.3) -> dict:
    ok = outcome == "completed"
    return {"study": "regularisation", "method": method, "setting": {"reg": reg}, "seed": seed,
            "config": {"train": {"lr": 0.1}},
            "result": {"outcome": outcome, "diverged": outcome == "diverged", "history": [],
                       "test_acc": acc if ok else None, "train_acc": acc if ok else None,
                       "train_loss": loss if ok else None}}


def test_resnet110_row_shows_the_divergence_and_gives_no_reproduction():
    grid = make_grid("quick")
    recs = [_cell("fixup", 0, 0.964), _cell("fixup", 1, None, "diverged"), _cell("batchnorm", 0, 0.97),
            _cell("batchnorm", 1, 0.972), _cell("he", 0, 0.95), _cell("he", 1, 0.951)]
    summary = regularisation.summarise(recs, grid)
    row = {r.claim: r for r in regularisation.claims(summary, grid)}["cifar10_resnet110"]
    assert row.verdict == NOT_REPRODUCED and "diverged 1 of 2" in row.ours and "diverged 1 of 2" in row.why
    assert "ResNet-14 (resnet_cifar), not the paper's ResNet-110" in row.scale
    md = regularisation.markdown(summary, grid)
    assert "diverged 1 of 2" in md


def test_a_few_epochs_cannot_show_fits_better_generalises_worse():
    grid = make_grid("quick")
    recs = [_cell(m, s, 0.97 + 0.001 * s, loss=0.1 + 0.01 * s) for m in ("fixup", "batchnorm") for s in (0, 1)]
    row = {r.claim: r for r in regularisation.claims(regularisation.summarise(recs, grid), grid)}
    assert row["fixup_fits_training_set"].verdict == UNRESOLVED and "3 epochs" in row["fixup_fits_training_set"].why
    wrn = row["wrn_mixup_cutout"]
    assert wrn.verdict == NOT_RUN and "Wide-ResNet-10 width 2" in wrn.scale and "not the paper's Wide-ResNet-28" in \
        wrn.scale


def test_a_few_epochs_cannot_refute_the_regularised_wide_resnet_match():
    grid = make_grid("quick")
    wrn = {"reg": "mixup+cutout", "net": "wrn-10-2"}
    recs = [dict(_cell(m, s, acc), setting=wrn) for m, acc in (("fixup", 0.69), ("batchnorm", 0.975)) for s in (0, 1)]
    row = {r.claim: r for r in regularisation.claims(regularisation.summarise(recs, grid), grid)}["wrn_mixup_cutout"]
    assert row.verdict == UNRESOLVED and "3 epochs" in row.why and "31.0" in row.ours


def test_ablation_rule2_at_32_layers_cannot_be_resolved_and_n1_gives_no_verdict():
    grid = make_grid("quick")

    def rec(method, seed, acc, loss=0.5):
        return {"study": "ablation", "method": method, "setting": {"depth": 32}, "seed": seed, "config": {},
                "result": {"outcome": "completed", "test_acc": acc, "train_loss": loss,
                           "history": [{"train_loss": loss, "test_acc": acc}] * 3}}

    recs = [rec("fixup", s, 0.86 + 0.01 * s) for s in (0, 1)] + [rec("fixup_no_depth_scale", s, 0.9 + 0.01 * s)
                                                                 for s in (0, 1)]
    recs += [rec("fixup_scale_x0.1", 0, 0.8, loss=2.0)]  # its second seed failed to finish
    rows = {r.claim: r for r in ablation.claims(ablation.summarise(recs, grid), grid)}
    assert rows["ablation_rule2_necessary"].verdict == UNRESOLVED and "32 layers" in rows[
        "ablation_rule2_necessary"].why
    assert rows["ablation_scale_x0.1"].verdict == NOT_RUN and "1 of 2 planned" in rows["ablation_scale_x0.1"].why
    assert "scalars trained at 0.1x the rate" in rows["ablation_scale_x0.1"].scale
